"""The lab: an emulated cluster on one machine (``dpcompare lab``).

N network namespaces ("hosts") joined through a bridge in a switch namespace, each host's link shaped in both
directions with the kernel's ``tbf`` qdisc; a state file, a hostfile and the remote agent that lets mpirun start
ranks in the hosts without ssh; an sshd inside each host, host names and a discovery script for horovodrun
(:mod:`.remote`); hosts that die and come back; a nccl-tests-style all-reduce/all-gather bench over gloo and MPI.
:class:`LabSpec` is what a lab is asked to be (parsed once, at the flag); :func:`session` runs inside one made for
the purpose; a :class:`Lab` is a :class:`~dpcompare.launch.jobs.Placement` for ``launch.jobs``' job lines.

May import: the top-level modules and launch.
"""

from dpcompare.lab.hosts import IFACE, PREFIX, Host, Lab, lab_names, session, sweep
from dpcompare.lab.spec import LabSpec, parse_lab_spec

__all__ = ["IFACE", "PREFIX", "Host", "Lab", "LabSpec", "lab_names", "parse_lab_spec", "session", "sweep"]
