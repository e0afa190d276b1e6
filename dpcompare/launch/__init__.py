"""Launch-side helpers: environment discovery, rendezvous, mpirun and Slurm command lines."""

from dpcompare.launch.env import LaunchEnv, detect_launch_env

__all__ = ["LaunchEnv", "detect_launch_env"]
