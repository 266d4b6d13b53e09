"""``python -m app.slides``: see :mod:`app.slides.cli`."""

import sys

from .cli import main

sys.exit(main())
