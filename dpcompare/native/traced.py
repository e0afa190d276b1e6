"""The collectives a script calls (``hvd.allreduce``...), each recorded in the timeline when one is written.

:mod:`.collectives` and :mod:`.scatter` compute; this module is what ``hvd`` and :mod:`.functions` hand out: the
same functions wrapped by :func:`.timeline.traced` (a flag test when no timeline is written).
"""

from __future__ import annotations

from dpcompare.native import collectives as c
from dpcompare.native import scatter as s
from dpcompare.native.timeline import traced, traced_synchronize

allreduce = traced("allreduce")(c.allreduce)
allreduce_ = traced("allreduce")(c.allreduce_)
allreduce_async = traced("allreduce")(c.allreduce_async)
allreduce_async_ = traced("allreduce")(c.allreduce_async_)
grouped_allreduce = traced("allreduce", grouped=True)(c.grouped_allreduce)
grouped_allreduce_ = traced("allreduce", grouped=True)(c.grouped_allreduce_)
grouped_allreduce_async = traced("allreduce", grouped=True)(c.grouped_allreduce_async)
grouped_allreduce_async_ = traced("allreduce", grouped=True)(c.grouped_allreduce_async_)
allgather = traced("allgather")(c.allgather)
allgather_async = traced("allgather")(c.allgather_async)
grouped_allgather = traced("allgather", grouped=True)(c.grouped_allgather)
grouped_allgather_async = traced("allgather", grouped=True)(c.grouped_allgather_async)
broadcast = traced("broadcast")(c.broadcast)
broadcast_ = traced("broadcast")(c.broadcast_)
broadcast_async = traced("broadcast")(c.broadcast_async)
broadcast_async_ = traced("broadcast")(c.broadcast_async_)
broadcast_object = traced("broadcast")(c.broadcast_object)
alltoall = traced("alltoall")(s.alltoall)
alltoall_async = traced("alltoall")(s.alltoall_async)
reducescatter = traced("reducescatter")(s.reducescatter)
reducescatter_async = traced("reducescatter")(s.reducescatter_async)
grouped_reducescatter = traced("reducescatter", grouped=True)(s.grouped_reducescatter)
grouped_reducescatter_async = traced("reducescatter", grouped=True)(s.grouped_reducescatter_async)
synchronize = traced_synchronize(c.synchronize)

__all__ = ["allgather", "allgather_async", "allreduce", "allreduce_", "allreduce_async", "allreduce_async_",
           "alltoall", "alltoall_async", "broadcast", "broadcast_", "broadcast_async", "broadcast_async_",
           "broadcast_object", "grouped_allgather", "grouped_allgather_async", "grouped_allreduce",
           "grouped_allreduce_", "grouped_allreduce_async", "grouped_allreduce_async_", "grouped_reducescatter",
           "grouped_reducescatter_async", "reducescatter", "reducescatter_async", "synchronize"]
