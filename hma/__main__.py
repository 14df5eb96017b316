"""``python -m hma`` is ``hma``."""

import sys

from hma.cli import main

sys.exit(main())
