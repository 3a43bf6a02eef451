"""``python -m unstall ...`` is the ``unstall`` command."""

import sys

from .cli import main

sys.exit(main())
