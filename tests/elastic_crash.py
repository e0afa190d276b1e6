"""A script run with a fault injected (tests/test_native_elastic.py): ``python tests/elastic_crash.py SCRIPT ARGS``.

In the first run of the job's workers (``TORCHELASTIC_RESTART_COUNT`` 0), rank ``CRASH_RANK`` meets the fault at
its ``CRASH_STEP``-th optimizer step: ``CRASH_HOW`` ``error`` raises ``hvd.HorovodInternalError`` there, ``kill``
kills the worker (SIGKILL), ``host`` kills its torchrun agent and then itself, as a host losing power. Then the
script runs as ``__main__``.
"""

import os
import runpy
import signal
import sys

from torch.optim.optimizer import register_optimizer_step_post_hook

RANK, STEP, HOW = int(os.environ["CRASH_RANK"]), int(os.environ["CRASH_STEP"]), os.environ["CRASH_HOW"]
steps = 0


def fault(optimizer, args, kwargs):
    global steps
    steps += 1
    if steps != STEP or int(os.environ["RANK"]) != RANK or os.environ.get("TORCHELASTIC_RESTART_COUNT") != "0":
        return
    if HOW == "error":
        import horovod.torch as hvd

        raise hvd.HorovodInternalError("forced by tests/elastic_crash.py")
    if HOW == "host":
        os.kill(os.getppid(), signal.SIGKILL)
    os.kill(os.getpid(), signal.SIGKILL)


if os.environ.get("TORCHELASTIC_RESTART_COUNT") == "0":
    register_optimizer_step_post_hook(fault)
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
