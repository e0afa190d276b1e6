"""Training: one run of one workload under one strategy, the loop every strategy shares.

Holds the ``dpcompare train`` command (:mod:`.command`), the loop (:mod:`.loop`: :func:`~.loop.train` and
its :class:`~.loop.Run`), the step runner (:mod:`.step`), the optimizer, learning-rate schedule and clipping
norm (:mod:`.optim`), evaluation and the metric curve (:mod:`.evaluation`), the run summary (:mod:`.summary`)
and the experiment trackers (:mod:`.trackers`; ``--trackers``' table of them is ``argtypes.TRACKERS``, so that no
top-level module reads this room).

May import: the top-level modules, launch, backends, models and data. Never ``compare`` or ``report``, and
never a strategy by name: the loop only talks to :class:`~dpcompare.backends.base.Strategy`; nor a task by
name: it only talks to a :class:`~dpcompare.data.workload.Workload`.
"""
