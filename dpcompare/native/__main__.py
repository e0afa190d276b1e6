"""``python -m dpcompare.native [--as native|horovod|ddp] [--out DIR] [--seed N] train.py ARGS``: one rank of a
Horovod script on the native layer (or the real library, or a torchrun script), under the launcher you use."""

import sys

from dpcompare.native.runner import main

if __name__ == "__main__":
    sys.exit(main())
