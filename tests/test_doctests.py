"""The docstrings of fxremat.passes: every module has an example, and every example runs.

The modules are found with pkgutil, so a new module of ``passes/`` is covered without a
change here. Also checked: the package docstring lists every module, and every public
function and class states its Parameters, Returns, Raises and Complexity (numpydoc
sections; Parameters only where it takes any).
"""

import doctest
import importlib
import inspect
import pkgutil
import re

import pytest

import fxremat.passes

MODULES = sorted(info.name for info in pkgutil.iter_modules(fxremat.passes.__path__))


def _module(name):
    return importlib.import_module(f"{fxremat.passes.__name__}.{name}")


def test_modules_are_found():
    assert {"checkmate", "mincut", "rotor", "schedule"} <= set(MODULES)


@pytest.mark.parametrize("name", MODULES)
def test_examples_run(name):
    module = _module(name)
    assert doctest.DocTestParser().get_examples(module.__doc__ or ""), f"passes.{name}'s docstring has no example"
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS)
    assert result.failed == 0, f"{result.failed} of {result.attempted} examples of passes.{name} failed (see above)"


def test_package_docstring_lists_every_module():
    listed = set(re.findall(r"^(\w+)\.py ", fxremat.passes.__doc__, re.M))
    assert listed == set(MODULES)


def _public(module):
    """``(name, object)`` for the public functions and classes defined in ``module``, and the
    public methods of those classes."""
    for name, obj in vars(module).items():
        if name.startswith("_") or getattr(obj, "__module__", None) != module.__name__:
            continue
        if inspect.isfunction(obj):
            yield name, obj
        elif inspect.isclass(obj):
            yield name, obj
            for attr, member in vars(obj).items():
                if not attr.startswith("_") and inspect.isfunction(member):
                    yield f"{name}.{attr}", member


def _takes_arguments(obj) -> bool:
    try:
        params = inspect.signature(obj).parameters
    except (TypeError, ValueError):
        return True
    return any(p != "self" for p in params)


@pytest.mark.parametrize("name", MODULES)
def test_public_docstrings_state_parameters_returns_raises_complexity(name):
    missing = {}
    for qualname, obj in _public(_module(name)):
        doc = obj.__doc__ or ""
        sections = set(re.findall(r"^\s*(\w+)\n\s*-{3,}\s*$", doc, re.M))
        wanted = ["Returns", "Raises", "Complexity"] + (["Parameters"] if _takes_arguments(obj) else [])
        lacking = [s for s in wanted if s not in sections]
        if lacking:
            missing[qualname] = lacking
    assert not missing, f"passes.{name}: docstrings without these sections: {missing}"
