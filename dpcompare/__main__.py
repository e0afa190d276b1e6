"""``python -m dpcompare``: the same as the ``dpcompare`` command."""

import sys

from dpcompare.cli import main

sys.exit(main())
