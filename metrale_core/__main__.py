"""``python -m metrale_core`` is ``met``."""

import sys

from metrale_core.cli.main import main

sys.exit(main())
