"""``dpcompare predict``: a performance model of one training step per strategy, from one traced run.

A traced run (``dpcompare train --trace N``) gives the compute of a step: forward, the backward timeline of
gradient-ready moments with each gradient's bytes, the optimizer (:mod:`.profile`). An α-β (Hockney) network
model prices each collective at n ranks on a link (:mod:`.network`). A schedule per strategy places the
collectives where the library runs them and says how much of them the step waits for (:mod:`.ddp`,
:mod:`.horovod`, :mod:`.zero`, :mod:`.fsdp`, named by each strategy's line in the torch-free
``backends.catalog`` and looked up in :mod:`.strategies`). :mod:`.overlap` corrects what a schedule hides by
what a slow-link trace measured, or states the assumption. :mod:`.sweep` evaluates them over host counts (step
time, exposed and hidden communication, throughput, scaling efficiency against one host, the crossover, the knob
that would help), each figure with a bootstrap band from the traced steps' and the bench repeats' own noise and,
where Open MPI showed two speeds, the step in each, and a 90 % interval: the band widened by the model's own
error as a validation measured it (:mod:`.interval`); :mod:`.output` prints, plots and writes it.
docs/predict.md states the model and its limits.

May import: the top-level modules and report. Never a strategy, torch or training: a prediction reads
trace.json and summary.json as data.
"""
