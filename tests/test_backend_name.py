"""``backend="fxremat"`` resolves however fxremat is found: installed (its entry point) or a
checkout on ``PYTHONPATH`` (no entry point: the import registers the name)."""

import subprocess
import sys


def _run(code: str) -> None:
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]


def test_the_entry_point_alone_resolves_the_name_without_importing_fxremat_first():
    _run("import torch, sys\n"
         "from torch._dynamo.backends import registry\n"
         "assert 'fxremat' not in sys.modules\n"
         "fn = registry.lookup_backend('fxremat')\n"  # loads the entry point, which imports fxremat
         "import fxremat\n"
         "assert fn is fxremat.fxremat_backend, fn\n"
         "torch.compile(torch.nn.Linear(2, 2), backend='fxremat')\n")


def test_a_checkout_without_entry_point_registers_the_name_on_import():
    _run("from torch._dynamo.backends import registry\n"
         "registry._lazy_import()\n"
         "registry._BACKENDS.pop('fxremat', None)\n"  # as on a machine that has the checkout only
         "import fxremat\n"
         "assert registry.lookup_backend('fxremat') is fxremat.fxremat_backend\n")


def test_importing_fxremat_after_dynamo_found_the_entry_point_keeps_one_registration():
    _run("import torch\n"
         "torch._dynamo.list_backends()\n"  # discovers the entry points
         "import fxremat\n"
         "from torch._dynamo.backends import registry\n"
         "assert registry.lookup_backend('fxremat') is fxremat.fxremat_backend\n")
