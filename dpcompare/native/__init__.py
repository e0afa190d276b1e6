"""Horovod scripts, unchanged, on native PyTorch: a ``horovod.torch`` built on torch.distributed, and its tools.

Holds the compatibility layer a script reaches through ``import horovod.torch as hvd`` with no Horovod installed
(:mod:`.hvd`, the module that import resolves to; :mod:`.state` process facts, :mod:`.process_sets`,
:mod:`.collectives`, the ranks' agreement on each collective as Horovod's negotiation does it, join and the stall
inspector :mod:`.negotiation`, :mod:`.scatter` (reduce-scatter, all-to-all), :mod:`.adasum`, the timeline
:mod:`.timeline` and the traced collectives a script gets :mod:`.traced`, :mod:`.fusion` and :mod:`.optimizer` the
DistributedOptimizer, :mod:`.functions`; what it refuses and what to use instead in :mod:`.calls`), the import
hook that points ``horovod`` at it (:mod:`.hook`), the runner that starts a
script under the layer, real Horovod or as a DDP port and records its optimizer steps and final weights
(:mod:`.runner`, :mod:`.record`; ``python -m dpcompare.native``), the run's summary (:mod:`.summary`),
``dpcompare script`` and ``dpcompare migrate`` (:mod:`.command`; reading a script :mod:`.migrate`, the DDP port
writer :mod:`.port`, with its pass for Horovod Elastic :mod:`.port_elastic`).

May import: the top-level modules and launch. Nothing imports it but ``cli`` and ``compare``. This file imports
nothing, so that ``dpcompare --help`` stays torch-free.
"""
