"""Training: one run of one strategy, the loop every strategy shares.

Holds the ``dpcompare train`` command, the loop, its step runner, evaluation and the run summary.
May import: the top-level modules (config, errors, files, checkpoint, trace, knobs, progress, versions),
``launch``, ``backends``, ``models`` and ``data``. Never ``compare`` or ``report``, and never a strategy by
name: the loop only talks to :class:`~dpcompare.backends.base.Strategy`.
"""
