"""``python -m queen``: the ``queen`` command."""

import sys

from queen.cli import main

sys.exit(main())
