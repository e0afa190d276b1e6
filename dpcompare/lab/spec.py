"""What a lab is asked to be: :class:`LabSpec` (``--lab hosts=2,link=1gbit,slots=1``), parsed once at the flag.

The link rate is held in bits per second (None: unshaped) from the flag to tc; the one reading and writing of
rates is :func:`dpcompare.argtypes.parse_rate_bits` / :func:`~dpcompare.argtypes.format_rate_bits`.
"""

from __future__ import annotations

import argparse
import re
from dataclasses import dataclass
from typing import Any

from dpcompare.argtypes import format_rate_bits, parse_rate_bits
from dpcompare.errors import ConfigError

#: below this tbf cannot hold one full-size frame per tick well; above, a veth cannot carry it anyway
MIN_BPS, MAX_BPS = 10_000, 400 * 10**9
NAME = re.compile(r"^[a-z0-9][a-z0-9_]{0,15}$")
KEYS = ("hosts", "link", "slots", "name")


def check_name(name: str) -> str:
    if not NAME.match(name):
        raise ConfigError(f"lab name {name!r}: use 1-16 lowercase letters, digits or '_' (e.g. default, lab2)")
    return name


def link_bps(text: str) -> int | None:
    """A lab link's rate (``1gbit``, ``unlimited``) in bits per second, within what tbf and a veth can do."""
    return check_link(parse_rate_bits(text, unlimited=True), text)


def check_link(bps: int | None, text: str | None = None) -> int | None:
    """``bps`` when a lab's link can be shaped to it (None: unshaped), else a one-line refusal."""
    if bps is not None and not MIN_BPS <= bps <= MAX_BPS:
        raise ConfigError(f"link rate {text or format_rate_bits(bps)!r}: choose between {format_rate_bits(MIN_BPS)} "
                          f"and {format_rate_bits(MAX_BPS)}, or unlimited")
    return bps


@dataclass(frozen=True)
class LabSpec:
    """A lab of ``hosts`` hosts with ``slots`` MPI slots each, every link shaped to ``link_bps`` bits/s both ways
    (None: unshaped); refused in one line when it cannot be made."""

    hosts: int = 2
    link_bps: int | None = None
    slots: int = 1
    name: str = "default"

    def __post_init__(self) -> None:
        check_name(self.name)
        if not 1 <= self.hosts <= 64:
            raise ConfigError(f"--hosts {self.hosts}: a lab has 1 to 64 hosts")
        if not 1 <= self.slots <= 64:
            raise ConfigError(f"--slots {self.slots}: each host has 1 to 64 slots")
        check_link(self.link_bps)

    @property
    def link(self) -> str:
        """The link rate as the lab writes it (``1gbit``, ``unlimited``)."""
        return format_rate_bits(self.link_bps)

    def check_np(self, np: int) -> None:
        """Refuse, in one line, ``np`` ranks on fewer slots (the same words for compare, parity and launch)."""
        if np > self.hosts * self.slots:
            raise ConfigError(f"--np {np} but --lab {self.text()} has {self.hosts * self.slots} slot(s) "
                              f"({self.hosts} host(s) × slots={self.slots}); raise hosts= or slots= in --lab, "
                              "or lower --np")

    def text(self) -> str:
        """The ``--lab`` text that parses back to this spec."""
        return f"hosts={self.hosts},link={self.link},slots={self.slots}" + (
            f",name={self.name}" if self.name != "default" else "")

    def to_json(self) -> dict[str, Any]:
        """What results.json and parity.json keep as ``lab`` (the report's regime card reads hosts and link)."""
        return {"hosts": self.hosts, "link": self.link, "slots": self.slots}


def parse_lab_spec(text: str) -> LabSpec:
    """``hosts=2,link=1gbit,slots=1`` → LabSpec; every key optional, unknown keys and bad values refused."""
    fields: dict[str, str] = {}
    for item in filter(None, (x.strip() for x in text.split(","))):
        key, sep, value = item.partition("=")
        if not sep or key not in KEYS or not value:
            raise ConfigError(f"--lab {text!r}: {item!r} is not KEY=VALUE with KEY one of {', '.join(KEYS)} "
                              "(e.g. hosts=2,link=1gbit)")
        fields[key] = value
    try:
        hosts, slots = int(fields.get("hosts", 2)), int(fields.get("slots", 1))
    except ValueError:
        raise ConfigError(f"--lab {text!r}: hosts and slots are whole numbers") from None
    return LabSpec(hosts=hosts, link_bps=link_bps(fields.get("link", "unlimited")), slots=slots,
                   name=fields.get("name", "default"))


def _arg(parse: Any) -> Any:
    def convert(text: str) -> Any:
        try:
            return parse(text)
        except ConfigError as e:
            raise argparse.ArgumentTypeError(str(e)) from None
    convert.__name__ = parse.__name__
    return convert


#: ``--lab`` as an argparse type (a bad spec is argparse's one-line error, exit 2)
lab_spec_arg = _arg(parse_lab_spec)
#: a lab link's rate as an argparse type (``lab up --link``)
link_arg = _arg(link_bps)
