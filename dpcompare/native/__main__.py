"""``python -m dpcompare.native [--as native|horovod|ddp] [--out DIR] [--seed N] train.py ARGS``: one rank of a
Horovod script on the native layer (or the real library, or a torchrun script), under the launcher you use."""

from dpcompare.launch.jobs import leave
from dpcompare.native.runner import main

if __name__ == "__main__":
    leave(main(), script=True)  # the script's threads and atexit handlers, not the interpreter's teardown
