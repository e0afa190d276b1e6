"""Launch side: who am I (launcher environment), rendezvous, mpirun and Slurm command lines, failures, and
who starts and stops a job (:mod:`.jobs`: the one builder of a job's command line, start, stop, exit codes).

May import: the top-level modules only. Pure builders: nothing here starts a job except :mod:`.jobs` (for
compare and parity) and :mod:`.commands` (``dpcompare launch``) when asked to. :mod:`.openmpi` is a torch-free
table any module may read.
"""

from dpcompare.launch.env import LaunchEnv, detect_launch_env

__all__ = ["LaunchEnv", "detect_launch_env"]
