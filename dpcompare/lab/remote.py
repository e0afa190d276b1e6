"""Remote access to a lab's hosts as launchers expect it: ssh, host names, and a host discovery script.

``horovodrun`` starts its remote workers with ``ssh HOST 'cd ...; env ... COMMAND'`` and, in elastic mode, asks
a discovery script which hosts are up. The lab gives it:

- an ``sshd`` in every host's namespace, listening on that host's lab address only (never in the root
  namespace), with a host key and an authorized client key made for the lab in its state folder
  (``ssh/``), all gone with ``lab down``;
- ``bin/ssh``, put first on the launcher's PATH: the system's ssh with the lab's client configuration (its key,
  its known hosts, a dead host noticed after 3 missed keep-alives of 1 s);
- ``discover.sh``, which prints the live hosts (``ADDRESS:SLOTS``) from ``live-hosts``, rewritten whenever a
  host's link goes down or up or the host dies. horovodrun ranks the hosts it discovers in a Python set's order
  (by string hash: any host may get rank 0, Horovod's coordinator), so a job started with
  ``DPCOMPARE_DISCOVERY_FIRST=FILE`` sees host 0 alone on its first call and the others a second later: rank 0
  lives on host 0, as mpirun's and the rendezvous host of torchrun do. (Losing the coordinator's host costs
  Horovod 0.28.1 over a minute here: its driver tries to notify the dead coordinator with blocking connects
  while it holds the lock the new rendezvous waits for.)
- ``/etc/netns/NAMESPACE/hosts``: inside a host (``ip netns exec`` binds it over ``/etc/hosts``) the machine's
  name resolves to the host's lab address, as a cluster node's does. Horovod 0.28.1's gloo contexts for
  process sets find their address by the host name; on the shared name (127.0.0.1) every rank advertised
  loopback and the job aborted.
"""

from __future__ import annotations

import contextlib
import shutil
import socket
import subprocess
from collections.abc import Sequence
from pathlib import Path

from dpcompare.errors import LaunchError
from dpcompare.files import atomic_write_text

SSHD = "/usr/sbin/sshd"
INSTALL_HINT = "apt-get install openssh-server openssh-client (scripts/setup.sh installs them)"
NETNS_ETC = Path("/etc/netns")

SSHD_CONFIG = """\
# dpcompare lab: one sshd per host namespace, on the host's lab address only
HostKey {dir}/host_ed25519
AuthorizedKeysFile {dir}/authorized_keys
PasswordAuthentication no
KbdInteractiveAuthentication no
PermitRootLogin prohibit-password
UsePAM no
StrictModes no
PrintMotd no
"""

SSH_CONFIG = """\
# dpcompare lab: the client side (bin/ssh passes -F this file)
Host *
  IdentityFile {dir}/id_ed25519
  IdentitiesOnly yes
  UserKnownHostsFile {dir}/known_hosts
  GlobalKnownHostsFile /dev/null
  BatchMode yes
  ServerAliveInterval 1
  ServerAliveCountMax 3
  ConnectTimeout 5
  LogLevel ERROR
"""


def sshd_problem() -> str | None:
    """Why this machine cannot give a lab ssh (one line), or None."""
    if not Path(SSHD).is_file() or shutil.which("ssh") is None or shutil.which("ssh-keygen") is None:
        return f"the lab's hosts need sshd and ssh for horovodrun: {INSTALL_HINT}"
    return None


#: a lab host's resolv.conf: no name server (there is none inside the lab), so that a lookup of a name not in its
#: hosts file fails at once instead of after the machine's resolver timeouts (torch's store looks up every client)
RESOLV_CONF = ("# a dpcompare lab host: no name server, the lab's hosts are in /etc/hosts\n"
               "options timeout:1 attempts:1\n")


def write_hosts_files(namespaces: Sequence[tuple[str, str]]) -> None:
    """For each (namespace, address): ``/etc/netns/NAMESPACE/hosts`` naming this machine by that address and every
    other lab host by its namespace's name (a peer's address resolves at once, both ways), and a resolv.conf
    without a name server (:data:`RESOLV_CONF`)."""
    name = socket.gethostname()
    for ns, address in namespaces:
        peers = "".join(f"{a} {n}\n" for n, a in namespaces if n != ns)
        atomic_write_text(NETNS_ETC / ns / "hosts", f"127.0.0.1 localhost\n{address} {name}\n{peers}")
        atomic_write_text(NETNS_ETC / ns / "resolv.conf", RESOLV_CONF)


def remove_hosts_files(prefix: str) -> list[str]:
    """Remove ``/etc/netns/PREFIX*`` (what :func:`write_hosts_files` made); what was removed."""
    removed = []
    for d in NETNS_ETC.glob(f"{prefix}*") if NETNS_ETC.is_dir() else []:
        shutil.rmtree(d, ignore_errors=True)
        removed.append(f"host files {d}")
    with contextlib.suppress(OSError):
        NETNS_ETC.rmdir()  # only when empty
    return removed


def prepare(directory: Path, addresses: Sequence[str]) -> None:
    """Keys, sshd's and the client's configuration, known hosts and ``bin/ssh`` in ``directory`` (the lab's)."""
    d = directory / "ssh"
    d.mkdir(mode=0o700, parents=True, exist_ok=True)
    for key in ("id_ed25519", "host_ed25519"):
        _run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "dpcompare-lab", "-f", str(d / key)])
    public_host_key = " ".join((d / "host_ed25519.pub").read_text().split()[:2])
    atomic_write_text(d / "authorized_keys", (d / "id_ed25519.pub").read_text())
    atomic_write_text(d / "known_hosts", "".join(f"{a} {public_host_key}\n" for a in addresses))
    atomic_write_text(d / "sshd_config", SSHD_CONFIG.format(dir=d))
    atomic_write_text(d / "ssh_config", SSH_CONFIG.format(dir=d))
    wrapper = directory / "bin" / "ssh"
    atomic_write_text(wrapper, f'#!/bin/sh\nexec {shutil.which("ssh")} -F {d / "ssh_config"} "$@"\n')
    wrapper.chmod(0o755)


# Open MPI names its session folder and shared-memory files after the machine's name, which every lab host shares:
# without a folder per host, one job's daemons share one session folder (the first to end removes the others'
# files in use: PMIx's NO-PERMISSIONS, segfaults) and its ranks on two hosts map one shared-memory segment.
OMPI_HOST_FOLDER_VARS = ("OMPI_MCA_orte_tmpdir_base", "OMPI_MCA_btl_vader_backing_directory")


def ompi_host_folder(directory: Path, namespace: str) -> Path:
    """The folder a lab host's Open MPI session and shared-memory files go to (gone with the lab's folder)."""
    return directory / "ompi" / namespace


def start_sshd(directory: Path, namespace: str, address: str) -> None:
    """Start sshd inside ``namespace``, listening on ``address`` only (its pid in ``ssh/sshd-NAMESPACE.pid``); what
    it starts gets the host's own Open MPI folder, as the lab's remote agent gives it (``hosts.AGENT``)."""
    Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # sshd's privilege separation folder
    d = directory / "ssh"
    ompi = ompi_host_folder(directory, namespace)
    ompi.mkdir(parents=True, exist_ok=True)
    _run(["ip", "netns", "exec", namespace, SSHD, "-f", str(d / "sshd_config"), "-o", f"ListenAddress={address}",
          "-o", f"PidFile={d / f'sshd-{namespace}.pid'}",
          "-o", "SetEnv=" + " ".join(f"{var}={ompi}" for var in OMPI_HOST_FOLDER_VARS)])


DISCOVER = """\
#!/bin/sh
# dpcompare lab: the hosts that are up (ADDRESS:SLOTS), for horovodrun's --host-discovery-script.
# With DPCOMPARE_DISCOVERY_FIRST=FILE the first call names host 0 alone, so that its rank 0 lives there.
if [ -n "$DPCOMPARE_DISCOVERY_FIRST" ] && [ ! -e "$DPCOMPARE_DISCOVERY_FIRST" ]; then
  : > "$DPCOMPARE_DISCOVERY_FIRST"
  grep -m 1 "^{first}:" {live}
  exit 0
fi
cat {live}
"""
#: the variable naming a job's first-call marker for ``discover.sh``
FIRST_CALL = "DPCOMPARE_DISCOVERY_FIRST"


def write_discovery(directory: Path, first: str, live: Sequence[str], slots: int) -> None:
    """``live-hosts`` (the hosts horovodrun may use now) and ``discover.sh``, which prints it (``first``: host 0's
    address)."""
    atomic_write_text(directory / "live-hosts", "".join(f"{a}:{slots}\n" for a in live))
    script = directory / "discover.sh"
    if not script.exists():
        atomic_write_text(script, DISCOVER.format(first=first.replace(".", "\\."), live=directory / "live-hosts"))
        script.chmod(0o755)


def _run(cmd: list[str]) -> None:
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        raise LaunchError(f"{' '.join(cmd[:4])} ...: {p.stderr.strip() or 'failed'}")
