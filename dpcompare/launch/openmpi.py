"""Open MPI's settings that dpcompare sets: the all-reduce algorithm of its tuned collectives, and whether a
rank waiting for a message yields its core (``--bind comm``).

A torch-free table (``--mpi-allreduce``'s choices come from here) read by Horovod's environment
(:mod:`dpcompare.backends.horovod`) and by ``lab bench``'s mpirun line.
"""

from __future__ import annotations

#: ``--mpi-allreduce``: name → Open MPI's coll_tuned_allreduce_algorithm number (0: Open MPI decides)
MPI_ALLREDUCE: dict[str, int] = {"default": 0, "linear": 1, "nonoverlapping": 2, "recursive-doubling": 3, "ring": 4,
                                 "segmented-ring": 5, "rabenseifner": 6}


def mpi_allreduce_mca(algorithm: str) -> dict[str, str]:
    """Open MPI's MCA parameters that force ``algorithm`` for MPI_Allreduce (tuned collectives, dynamic rules):
    ``--mca NAME VALUE`` on an mpirun line, or ``OMPI_MCA_NAME=VALUE`` in a rank's environment."""
    return {"coll_tuned_use_dynamic_rules": "1", "coll_tuned_allreduce_algorithm": str(MPI_ALLREDUCE[algorithm])}


#: Open MPI's MCA parameter, as a rank's environment variable (read at MPI_Init), that makes a rank waiting in MPI
#: yield its core between polls; Open MPI sets it only on an oversubscribed node, so with as many ranks as cores a
#: waiting rank (Horovod's background thread in an all-reduce) spins on a core its compute wants. ``--bind comm``
#: sets it to 1 on every rank unless the user set it.
YIELD_VAR = "OMPI_MCA_mpi_yield_when_idle"
