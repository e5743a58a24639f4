"""``python -m fxremat``: the ``fxremat`` command."""

from .cli import main

raise SystemExit(main())
