"""Command-line options derived from :class:`~dpcompare.config.TrainConfig`'s field metadata.

``add_config_options`` adds one flag per field, ``config_from_args`` reads them back, and ``train_argv``
is the inverse: the ``dpcompare train`` flags that rebuild a config, for the child jobs that ``compare``,
``parity`` and ``launch`` start.
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Collection, Mapping, Sequence
from typing import Any

from dpcompare.config import TrainConfig

_FIELDS = {f.name: f for f in dataclasses.fields(TrainConfig)}


def flag_of(name: str) -> str:
    return _FIELDS[name].metadata.get("flag") or "--" + name.replace("_", "-")


def bool_flag(name: str, default: bool) -> tuple[str, str]:
    """The flag that moves boolean field ``name`` away from ``default`` (the parser's, which may differ from
    the field's own), and its argparse action: ``--x`` (store_true) from False, ``--no-x`` (store_false) from True."""
    f = _FIELDS[name]
    if default == f.default:
        return flag_of(name), "store_false" if default else "store_true"
    dashed = name.replace("_", "-")
    return (f"--no-{dashed}", "store_false") if default else (f"--{dashed}", "store_true")


def _default_text(value: Any) -> str:
    if isinstance(value, tuple | list):
        return ",".join(map(str, value))
    return f"{value:g}" if isinstance(value, float) else str(value)


def add_config_options(p: argparse.ArgumentParser, exclude: Collection[str] = (),
                       defaults: Mapping[str, Any] | None = None, helps: Mapping[str, str] | None = None) -> None:
    """One flag per TrainConfig field (but ``exclude``), grouped as in ``--help``.

    ``defaults`` replaces a field's default in this parser (e.g. ``compare``'s own ``--out``; a boolean whose
    default is turned around gets the opposite flag, see :func:`bool_flag`); ``helps`` replaces its help text.
    ``train_argv(cfg, defaults=...)`` with the same ``defaults`` writes flags this parser reads back.
    """
    defaults, helps = defaults or {}, helps or {}
    groups: dict[str, argparse._ArgumentGroup] = {}
    for name, f in _FIELDS.items():
        if name in exclude:
            continue
        md = f.metadata
        g = groups.get(md["group"]) or groups.setdefault(md["group"], p.add_argument_group(md["group"]))
        default = defaults.get(name, f.default)
        text = helps.get(name) or md["help"]
        text = text() if callable(text) else text
        kw: dict[str, Any] = {"dest": name, "default": default}
        flag = flag_of(name)
        if isinstance(f.default, bool):
            flag, kw["action"] = bool_flag(name, default)
        else:
            if md["type"]:
                kw["type"] = md["type"]
            if md["choices"] is not None:
                kw["choices"] = md["choices"]() if callable(md["choices"]) else md["choices"]
            if md["metavar"]:
                kw["metavar"] = md["metavar"]
            if default is not None and "default:" not in text:
                text += f" (default: {_default_text(default)})"
        kw["help"] = argparse.SUPPRESS if md["hidden"] else text
        g.add_argument(flag, **kw)


def config_from_args(a: argparse.Namespace, **override: Any) -> TrainConfig:
    kw = {name: getattr(a, name) for name in _FIELDS if hasattr(a, name)}
    kw.update(override)
    return TrainConfig(**kw)


def train_argv(cfg: TrainConfig, skip: Sequence[str] = (), defaults: Mapping[str, Any] | None = None) -> list[str]:
    """``dpcompare train`` flags that rebuild ``cfg`` exactly; settings at their default are left out.

    ``defaults``: the defaults of the parser that reads the flags back, where they differ from the fields'
    (as given to :func:`add_config_options`).
    """
    argv: list[str] = []
    for name, f in _FIELDS.items():
        value = getattr(cfg, name)
        default = (defaults or {}).get(name, f.default)
        if name in skip or value == default:
            continue
        flag = flag_of(name)
        if isinstance(f.default, bool):
            argv.append(bool_flag(name, default)[0])  # the flag flips the parser's default, and value != default
        elif value is None:
            raise ValueError(f"{name}=None cannot be written as {flag}")
        else:
            argv += [flag, _default_text(value) if isinstance(value, tuple | list) else str(value)]
    return argv


def changed_settings(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[str]:
    """Resume-relevant settings that differ between a checkpoint's run and this one, as ``k old → new``."""
    from dpcompare.config import resume_relevant

    return [f"{k} {old.get(k)!r} → {new.get(k)!r}" for k in resume_relevant() if k in old and old.get(k) != new.get(k)]
