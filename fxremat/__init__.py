"""fxremat: memory-budgeted rematerialization for torch.compile.

    torch.compile(model, backend="fxremat", options={"memory_budget": "6GiB"})
"""

from __future__ import annotations

import importlib.util
import os
import sys

__version__ = "0.1.0"


def _map_source_passes() -> None:
    # Installed, ``passes/`` is the subpackage fxremat.passes (setuptools package-dir).
    # In a source checkout (PYTHONPATH=.) it sits beside this folder: map it the same way.
    # The checkout's own ``passes/`` comes first: an editable install of another checkout
    # would otherwise map fxremat.passes to that one's (the solvers of one tree, the torch
    # integration of another).
    here = os.path.dirname(os.path.abspath(__file__))
    if "fxremat.passes" in sys.modules:
        return
    beside = os.path.join(os.path.dirname(here), "passes")
    init = os.path.join(beside, "__init__.py")
    if os.path.isfile(init) and os.path.isfile(os.path.join(os.path.dirname(here), "pyproject.toml")):
        spec = importlib.util.spec_from_file_location("fxremat.passes", init, submodule_search_locations=[beside])
        module = importlib.util.module_from_spec(spec)
        sys.modules["fxremat.passes"] = module
        spec.loader.exec_module(module)
        globals()["passes"] = module


_map_source_passes()

from . import _compat  # noqa: E402
from ._compat import check_torch  # noqa: E402  (fails early on too old a torch)
from .backend import FxrematPartitioner, fxremat_backend  # noqa: E402
from .options import OptionError, Options, parse_bytes  # noqa: E402
from .plans import BudgetError, BudgetWarning, Plan  # noqa: E402
from . import inspect  # noqa: E402
from .planning import plan_model as plan  # noqa: E402
from .report import explain  # noqa: E402

_compat.register_backend("fxremat", fxremat_backend)  # also without the entry point (a checkout on PYTHONPATH)

__all__ = [
    "BudgetError", "BudgetWarning", "FxrematPartitioner", "OptionError", "Options", "Plan",
    "check_torch", "explain", "fxremat_backend", "inspect", "parse_bytes", "plan",
]
