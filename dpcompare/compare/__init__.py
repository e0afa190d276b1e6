"""Comparison: the same training job under several arms, process counts and repeats, and its verdicts.

Holds ``dpcompare compare`` — :mod:`.plan` (arms, runs, blocks, the :class:`~.plan.Comparison`),
:mod:`.stopping` (when to stop), :mod:`.records` (summary.json → results.json), :mod:`.cmdline` (the flags it
reads and writes), :mod:`.runner` (the run loop), :mod:`.command` (the sub-command, --continue),
:mod:`.workers` (persistent workers), :mod:`.load` (the CPU other processes took during each run),
:mod:`.fault_runs` (a host taken down at a step, and what the run's step log says) — and ``dpcompare parity``. A
comparison starts training jobs as child processes through :mod:`dpcompare.launch.jobs`; only the persistent worker runs
:mod:`dpcompare.training` inside its own process (``training.command.main``).
:mod:`.script` makes both compare a user's Horovod script instead (``--script``: its arms run it on real
Horovod, on the native layer, or as its DDP port, through ``dpcompare script``).
May import: the top-level modules, launch, backends, models, data, report, training, lab, prediction and native.
It stands above every other room; nothing imports ``compare`` except ``cli``. Besides the worker, it reads
``training`` only for the trackers (:mod:`.trackers` groups a comparison's runs) and the step log's format.
"""
