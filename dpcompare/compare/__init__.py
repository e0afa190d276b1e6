"""Comparison: the same training job under several arms, process counts and repeats, and its verdicts.

Holds ``dpcompare compare`` (plan, schedule, records, the run loop, persistent workers) and
``dpcompare parity``. A comparison starts training jobs as child processes from their command lines;
only the persistent worker runs :mod:`dpcompare.training` inside its own process.
May import: the top-level modules, ``launch``, ``backends`` (catalog only, outside workers), ``report``
and, inside a worker, ``training``. Nothing imports ``compare`` except ``cli``.
"""
