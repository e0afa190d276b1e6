"""Every strategy by name, with its one-line summary, without importing any of them.

The command line lists and checks strategy names (``--help``, ``--strategies``) from here, so it does not
import torch. :func:`dpcompare.backends.registry.get` imports a strategy's module on first use and registers
the class named here, which takes its ``summary`` from this table (a strategy's module never imports the
registry). A new strategy is one line here plus its module.
"""

from __future__ import annotations

#: name → (``module:Class`` that defines it, one line for --help and reports)
STRATEGIES: dict[str, tuple[str, str]] = {
    "ddp": ("dpcompare.backends.ddp:DDPStrategy", "torch DistributedDataParallel (gloo on CPU, nccl on CUDA)"),
    "fsdp": ("dpcompare.backends.fsdp:FSDPStrategy",
             "FSDP2 fully_shard per layer and the root (parameters, gradients, optimizer state sharded)"),
    "horovod": ("dpcompare.backends.horovod:HorovodStrategy", "Horovod DistributedOptimizer (MPI or gloo controller)"),
    "single": ("dpcompare.backends.single:SingleStrategy", "one process, no communication (the baseline)"),
    "zero": ("dpcompare.backends.zero:ZeroStrategy",
             "ZeRO-1: DDP + torch ZeroRedundancyOptimizer (optimizer state sharded over processes)"),
}


def names() -> list[str]:
    return list(STRATEGIES)


#: the ending of a declaration that holds only for models with buffers (the report drops it for models without)
IF_BUFFERS = ", when the model has buffers"

#: name → {phase of the step: the communication the strategy does there}. Every collective a strategy issues is
#: declared here, so a report can say which communication sits in the phase that accounts for a difference.
COMMUNICATION: dict[str, dict[str, str]] = {
    "ddp": {
        "forward": "broadcast of rank 0's buffers (BatchNorm statistics) at the start of every forward "
                   "(broadcast_buffers=True)" + IF_BUFFERS,
        "backward": "bucketed all-reduce of the gradients, started from hooks on the model as each bucket "
                    "fills; whatever backward's remaining computation does not hide is waited for here",
    },
    "horovod": {
        "backward": "all-reduces enqueued from hooks in the optimizer as gradients are ready; Horovod's "
                    "background thread negotiates, fuses and reduces them (nothing is waited for here)",
        "optimizer": "step() waits for the fused all-reduces (synchronize()) before it updates",
    },
    "zero": {
        "forward": "DDP's buffer broadcast" + IF_BUFFERS,
        "backward": "DDP's bucketed gradient all-reduce",
        "optimizer": "each rank updates its shard of the parameters, then broadcasts it to the others",
    },
    "fsdp": {
        "forward": "all-gather of each layer's parameter shards before its forward",
        "backward": "all-gather of each layer's parameters again, and reduce-scatter of its gradients",
    },
    "single": {},
}
