"""A Horovod script for tests/test_native_liveness.py: a slow step, then all-reduces until the job ends.

``liveness_peer.py SLOW_S MODE``: rank 1 sleeps SLOW_S inside the first step (slow but alive: its heartbeat goes
on), then every rank prints ``ready PID``. MODE ``loop``: all-reduce forever (the test stops rank 1 as a host
lost with its link down would be: silent, its sockets open); ``finish``: rank 0 ends at once, rank 1 SLOW_S later.
"""

import os
import sys
import time

import horovod.torch as hvd
import torch

hvd.init()
slow, mode = float(sys.argv[1]), sys.argv[2]
if hvd.rank() == 1:
    time.sleep(slow)  # a slow step: the other rank waits in the all-reduce meanwhile
hvd.allreduce(torch.ones(1), name="slow")
print(f"ready {os.getpid()}", flush=True)
if mode == "finish":
    if hvd.rank() == 1:
        time.sleep(slow)  # ends well after rank 0 (whose process held the job's store)
    sys.exit(0)
while True:
    hvd.allreduce(torch.ones(1), name="loop")
