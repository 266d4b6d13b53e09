"""``python -m app.region IMAGE --mpp 0.5 [options]``: region mode from the command line (:mod:`app.region.cli`)."""

from .cli import main

raise SystemExit(main())
