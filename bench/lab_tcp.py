#!/usr/bin/env python
"""Raw TCP through the lab's shaped link: one socket each way, both at once, Gbit/s per direction (docs/lab.md).

    sudo PYTHONPATH=$PWD .venv/bin/python bench/lab_tcp.py [--link 1gbit] [--seconds 5]

Two emulated hosts (namespaces ``dpc-tcp-*``, removed at the end); each runs a receiver, then each sends to the
other for ``--seconds``. A receiver counts from its first byte to the sender's close.
"""

from __future__ import annotations

import argparse
import subprocess
import sys

from quiet import wait_for_quiet

from dpcompare.lab import LabSpec, session
from dpcompare.lab.spec import link_bps

PORT = 5201
RECEIVE = ("import socket, time\ns = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n"
           f"s.bind(('0.0.0.0', {PORT})); s.listen(1); print('ready', flush=True)\nc, _ = s.accept(); n, t0 = 0, None\n"
           "while b := c.recv(1 << 20):\n    t0 = t0 or time.perf_counter(); n += len(b)\n"
           "print(n * 8 / (time.perf_counter() - t0) / 1e9)")
SEND = ("import socket, sys, time\nc = socket.create_connection((sys.argv[1], int(sys.argv[2])))\n"
        "buf, end = b'x' * (1 << 20), time.perf_counter() + float(sys.argv[3])\n"
        "while time.perf_counter() < end:\n    c.sendall(buf)\nc.close()")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--link", default="1gbit")
    p.add_argument("--seconds", type=float, default=5.0)
    a = p.parse_args()
    wait_for_quiet()
    with session(LabSpec(hosts=2, link_bps=link_bps(a.link), name="tcp")) as lab:
        assert lab is not None
        receivers = [subprocess.Popen(lab.in_host([sys.executable, "-c", RECEIVE], host=h), stdout=subprocess.PIPE,
                                      text=True) for h in (0, 1)]
        for r in receivers:
            assert r.stdout is not None and r.stdout.readline().strip() == "ready"
        senders = [subprocess.Popen(lab.in_host([sys.executable, "-c", SEND, lab.hosts[1 - h].address, str(PORT),
                                                 str(a.seconds)], host=h)) for h in (0, 1)]
        for s in senders:
            s.wait(timeout=a.seconds + 60)
        gbps = [float(r.communicate(timeout=60)[0]) for r in receivers]
    print(f"raw TCP at {a.link}, one socket each way at once: host1→host0 {gbps[0]:.2f} Gbit/s, "
          f"host0→host1 {gbps[1]:.2f} Gbit/s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
