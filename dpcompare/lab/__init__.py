"""The lab: an emulated cluster on one machine (``dpcompare lab``).

N network namespaces ("hosts") joined through a bridge in a switch namespace, each host's link shaped in both
directions with the kernel's ``tbf`` qdisc; a state file, a hostfile and the remote agent that lets mpirun start
ranks in the hosts without ssh; a nccl-tests-style all-reduce/all-gather bench over gloo and MPI.

May import: the top-level modules and launch.
"""

from dpcompare.lab.core import IFACE, PREFIX, Host, Lab, lab_names, sweep
from dpcompare.lab.rates import LabSpec, format_rate, parse_lab_spec, parse_rate

__all__ = ["IFACE", "PREFIX", "Host", "Lab", "LabSpec", "format_rate", "lab_names", "parse_lab_spec",
           "parse_rate", "sweep"]
