"""Link rates (``1gbit``, ``200mbit``, ``unlimited``) and lab specs (``hosts=2,link=1gbit,slots=1``)."""

from __future__ import annotations

import re
from dataclasses import dataclass

from dpcompare.errors import ConfigError

#: tc's rate units (bits per second); ``bps`` etc. (bytes) are left out on purpose: one spelling, no surprises
_UNITS = {"bit": 1, "kbit": 10**3, "mbit": 10**6, "gbit": 10**9, "tbit": 10**12}
_RATE = re.compile(r"^(\d+(?:\.\d+)?)(bit|kbit|mbit|gbit|tbit)$")
UNLIMITED = ("unlimited", "unshaped", "none")
#: below this tbf cannot hold one full-size frame per tick well; above, a veth cannot carry it anyway
MIN_BPS, MAX_BPS = 10_000, 400 * 10**9
NAME = re.compile(r"^[a-z0-9][a-z0-9_]{0,15}$")


def parse_rate(text: str) -> int | None:
    """``1gbit`` → 1_000_000_000 bit/s; ``unlimited`` → None (no shaping). ConfigError otherwise."""
    t = text.strip().lower()
    if t in UNLIMITED:
        return None
    m = _RATE.match(t)
    if not m:
        raise ConfigError(f"link rate {text!r}: write a number and a unit ({', '.join(_UNITS)}), e.g. 1gbit or "
                          "200mbit, or 'unlimited'")
    bps = int(round(float(m.group(1)) * _UNITS[m.group(2)]))
    if not MIN_BPS <= bps <= MAX_BPS:
        raise ConfigError(f"link rate {text!r}: choose between {format_rate(MIN_BPS)} and {format_rate(MAX_BPS)}")
    return bps


def format_rate(bps: int | float | None) -> str:
    """1e9 → ``1gbit``, 2e8 → ``200mbit``, None → ``unlimited`` (the spelling parse_rate reads back)."""
    if bps is None:
        return "unlimited"
    for unit, scale in sorted(_UNITS.items(), key=lambda u: -u[1]):
        if bps >= scale and (bps / scale) == round(bps / scale, 3):
            value = bps / scale
            return f"{value:g}{unit}"
    return f"{int(bps)}bit"


@dataclass(frozen=True)
class LabSpec:
    """What ``--lab hosts=N,link=RATE,slots=K[,name=NAME]`` asks for."""

    hosts: int = 2
    link: str = "unlimited"
    slots: int = 1
    name: str = "default"

    @property
    def link_bps(self) -> int | None:
        return parse_rate(self.link)


def check_name(name: str) -> str:
    if not NAME.match(name):
        raise ConfigError(f"lab name {name!r}: use 1-16 lowercase letters, digits or '_' (e.g. default, lab2)")
    return name


def check_hosts(hosts: int, slots: int) -> None:
    if not 1 <= hosts <= 64:
        raise ConfigError(f"--hosts {hosts}: a lab has 1 to 64 hosts")
    if not 1 <= slots <= 64:
        raise ConfigError(f"--slots {slots}: each host has 1 to 64 slots")


def parse_lab_spec(text: str) -> LabSpec:
    """``hosts=2,link=1gbit,slots=1`` → LabSpec; every key optional, unknown keys and bad values refused."""
    fields: dict[str, str] = {}
    for item in filter(None, (x.strip() for x in text.split(","))):
        key, sep, value = item.partition("=")
        if not sep or key not in ("hosts", "link", "slots", "name") or not value:
            raise ConfigError(f"--lab {text!r}: {item!r} is not KEY=VALUE with KEY one of hosts, link, slots, name "
                              "(e.g. hosts=2,link=1gbit)")
        fields[key] = value
    try:
        hosts, slots = int(fields.get("hosts", 2)), int(fields.get("slots", 1))
    except ValueError:
        raise ConfigError(f"--lab {text!r}: hosts and slots are whole numbers") from None
    spec = LabSpec(hosts=hosts, link=fields.get("link", "unlimited"), slots=slots,
                   name=check_name(fields.get("name", "default")))
    check_hosts(spec.hosts, spec.slots)
    parse_rate(spec.link)
    return spec


def spec_text(spec: LabSpec) -> str:
    """The ``--lab`` text that parses back to ``spec``."""
    return f"hosts={spec.hosts},link={spec.link},slots={spec.slots}" + (
        f",name={spec.name}" if spec.name != "default" else "")


def lab_spec_arg(text: str) -> LabSpec:
    """``--lab`` as an argparse type (a bad spec is argparse's one-line error, exit 2)."""
    import argparse

    try:
        return parse_lab_spec(text)
    except ConfigError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def spec_json(spec: LabSpec) -> dict[str, object]:
    """What results.json keeps as ``config.lab`` (the report's regime card reads hosts and link)."""
    return {"hosts": spec.hosts, "link": format_rate(parse_rate(spec.link)), "slots": spec.slots}
