"""Every strategy by name, with its one-line summary, without importing any of them.

The command line lists and checks strategy names (``--help``, ``--strategies``) from here, so it does not
import torch. :func:`dpcompare.backends.registry.get` imports a strategy's module on first use; the module
registers its class, which takes its ``summary`` from this table. A new strategy is one line here plus its
module.
"""

from __future__ import annotations

#: name → (the module that defines and registers it, one line for --help and reports)
STRATEGIES: dict[str, tuple[str, str]] = {
    "ddp": ("dpcompare.backends.ddp", "torch DistributedDataParallel (gloo on CPU, nccl on CUDA)"),
    "fsdp": ("dpcompare.backends.fsdp",
             "FSDP2 fully_shard per layer and the root (parameters, gradients, optimizer state sharded)"),
    "horovod": ("dpcompare.backends.horovod", "Horovod DistributedOptimizer (MPI or gloo controller)"),
    "single": ("dpcompare.backends.single", "one process, no communication (the baseline)"),
    "zero": ("dpcompare.backends.zero",
             "ZeRO-1: DDP + torch ZeroRedundancyOptimizer (optimizer state sharded over processes)"),
}


def names() -> list[str]:
    return list(STRATEGIES)
