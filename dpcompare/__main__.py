"""``python -m dpcompare``: the same as the ``dpcompare`` command."""

from dpcompare.cli import entry

entry()
