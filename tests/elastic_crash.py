"""A script run with a fault injected (tests/test_native_elastic.py): ``python tests/elastic_crash.py SCRIPT ARGS``.

In the first run of the job's workers (``TORCHELASTIC_RESTART_COUNT`` 0), rank ``CRASH_RANK`` (``any``: every
worker this process's agent starts) meets the fault at its ``CRASH_STEP``-th call of an optimizer's step (torch's
global step hook, which the DistributedOptimizer's inner step also calls): ``CRASH_HOW`` ``error`` raises
``hvd.HorovodInternalError`` there, ``kill`` kills the worker (SIGKILL), ``host`` kills its torchrun agent and then
itself, as a host losing power. Without ``CRASH_HOW`` nothing happens. Then the script runs as ``__main__``.
"""

import os
import runpy
import signal
import sys

from torch.optim.optimizer import register_optimizer_step_post_hook

HOW = os.environ.get("CRASH_HOW")
RANK, STEP = os.environ.get("CRASH_RANK", "any"), int(os.environ.get("CRASH_STEP", "0"))
steps = 0


def fault(optimizer, args, kwargs):
    global steps
    steps += 1
    if steps != STEP or RANK not in ("any", os.environ["RANK"]):
        return
    if HOW == "error":
        import horovod.torch as hvd

        raise hvd.HorovodInternalError("forced by tests/elastic_crash.py")
    if HOW == "host":
        os.kill(os.getppid(), signal.SIGKILL)
    os.kill(os.getpid(), signal.SIGKILL)


if HOW and os.environ.get("TORCHELASTIC_RESTART_COUNT") == "0":
    register_optimizer_step_post_hook(fault)
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
