"""Command-line options derived from :class:`~dpcompare.config.TrainConfig`'s field metadata.

``add_config_options`` adds one flag per field, ``config_from_args`` reads them back, and ``train_argv``
is the inverse: the ``dpcompare train`` flags that rebuild a config, for the child jobs that ``compare``,
``parity`` and ``launch`` start. ``read_config`` reads a ``--config FILE.toml`` (any command's flags) and
``write_config`` writes the ``config.toml`` that reruns a run (every setting, defaults included; ``--print-config``
prints it). :class:`Parser` is every command's parser, on argparse's public API only: it keeps its options, flags,
--help sections and sub-commands itself; ``deprecate`` (:class:`Renamed`, :class:`Warned`) keeps an old flag's
spelling for a release.
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import sys
from collections.abc import Collection, Mapping, Sequence
from pathlib import Path
from typing import Any, NoReturn

from dpcompare.config import TrainConfig, resume_relevant
from dpcompare.errors import ConfigError
from dpcompare.files import atomic_write_text
from dpcompare.versions import __version__

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib  # tomllib's backport, Python 3.10 only

#: TrainConfig's fields by name, each with its command-line description (config.opt)
FIELDS = {f.name: f for f in dataclasses.fields(TrainConfig)}

# -- the parser: argparse's public API only, with the options, sections and sub-commands it was given ------------

#: the section of --help that lists what a first user needs (each command names its own flags for it)
START = "start here"


class Parser(argparse.ArgumentParser):
    """argparse whose errors are one line (exit 2, "did you mean" for an unknown flag), which keeps what it was
    given: its options in order (``options``), by flag (``flags``), by section (``sections``), its sub-commands.

    ``sections``: the sections of its --help in their order, each with the flags that go there, whichever group
    adds them (a TrainConfig field's own group, say). A command given sections lists its help flag and its
    positional arguments in the first one, which leads its help, and any flag no section names in a last one."""

    def __init__(self, *args: Any, sections: Mapping[str, Sequence[str]] | None = None, **kw: Any) -> None:
        self.options: list[argparse.Action] = []
        self.flags: dict[str, argparse.Action] = {}
        self.sections: dict[str, list[argparse.Action]] = {"positional arguments": [], "options": []}
        self.repeatable: set[str] = set()  # destinations that collect each use (action="append")
        self.subcommands: dict[str, Parser] = {}
        self.subcommand_dest: str | None = None
        self._groups: dict[str, Any] = {}
        self._ready = False  # argparse's own __init__ makes its two groups through add_argument_group
        self._placed = {flag: title for title, flags in (sections or {}).items() for flag in flags}
        self._lead = next(iter(sections), None) if sections else None
        super().__init__(*args, **{**kw, "add_help": False})
        self._ready = True
        for title in sections or {}:
            self.add_argument_group(title)
        if kw.get("add_help", True):
            self.add_argument("-h", "--help", action="help", help="show this help message and exit")

    def add_argument(self, *names: str, **kw: Any) -> argparse.Action:
        if self._lead is None:
            return self._add_to(None, names, kw)
        lead = not names[0].startswith("-") or names[0] == "-h"
        return self._add_to(self._lead if lead else self._placed.get(names[0], "other options"), names, kw)

    def add_argument_group(self, title: str | None = None, description: str | None = None, **kw: Any) -> Any:
        """The section ``title`` (one group per title: a second call adds to the first)."""
        if not self._ready:
            return super().add_argument_group(title, description, **kw)
        if title not in self._groups:
            group = super().add_argument_group(title, description, **kw)
            self.sections.setdefault(str(title), [])
            self._groups[str(title)] = _Section(self, group, str(title))
        return self._groups[str(title)]

    def add_mutually_exclusive_group(self, **kw: Any) -> Any:
        return _Section(self, super().add_mutually_exclusive_group(**kw), "options")

    def add_subparsers(self, **kw: Any) -> Any:
        sub = super().add_subparsers(**{"parser_class": Parser, **kw})
        self.subcommands, self.subcommand_dest = sub.choices, kw.get("dest")
        return sub

    def _add_to(self, title: str | None, names: Sequence[str], kw: dict[str, Any], via: Any = None) -> argparse.Action:
        title = title or self._placed.get(names[0])
        if title is not None and (via is None or via.title != title):
            return self.add_argument_group(title).add_argument(*names, **kw)
        act = (via.group if via is not None else super()).add_argument(*names, **kw)
        self.options.append(act)
        self.flags.update(dict.fromkeys(act.option_strings, act))
        default = "options" if act.option_strings else "positional arguments"
        self.sections[via.title if via is not None else default].append(act)
        if kw.get("action") in ("append", "extend"):
            self.repeatable.add(act.dest)
        return act

    def shorten_usage(self) -> None:
        """The usage line names only what must be given (the full list is below, by section)."""
        pos = [a.metavar or a.dest for a in self.options if not a.option_strings and a.help != argparse.SUPPRESS]
        self.usage = " ".join(["%(prog)s [options]", *(f"{m} [{m} ...]" for m in pos)])

    def chosen(self, ns: argparse.Namespace) -> Parser:
        """The (sub-)command's parser that ``ns`` was parsed by."""
        name = getattr(ns, self.subcommand_dest or "", None)
        return self.subcommands[name].chosen(ns) if name in self.subcommands else self

    def parse_args(self, args: Sequence[str] | None = None, namespace: Any = None) -> argparse.Namespace:  # type: ignore[override]
        ns, extras = self.parse_known_args(args, namespace)
        if extras:
            parser = self.chosen(ns)
            shown = [f for f, a in parser.flags.items() if a.help != argparse.SUPPRESS and f.startswith("--")]
            near = difflib.get_close_matches(extras[0].split("=")[0], shown, n=1) if extras[0].startswith("-") else []
            parser.error(f"unrecognized arguments: {' '.join(extras)}" + (f"; did you mean {near[0]}?" if near else ""))
        return ns

    def error(self, message: str) -> NoReturn:  # type: ignore[override]
        sys.stderr.write(f"{self.prog}: error: {message} (see {self.prog} --help)\n")
        sys.exit(2)


class _Section:
    """One titled group of a :class:`Parser`'s --help: what it adds, the parser records."""

    def __init__(self, parser: Parser, group: Any, title: str) -> None:
        self.parser, self.group, self.title = parser, group, title

    def add_argument(self, *names: str, **kw: Any) -> argparse.Action:
        return self.parser._add_to(None, names, kw, via=self)


def warn_renamed(old: str, new: str) -> None:
    sys.stderr.write(f"dpcompare: {old} is deprecated and goes in the next release; use {new}\n")


class Renamed(argparse.Action):
    """An old spelling of a flag, hidden from --help: it warns on stderr, naming the new spelling (``new``: the
    flag, with its value for a switch that became a choice: ``--grad-compression fp16``), then stores its value
    (a switch: its ``const``) into the new flag's destination."""

    own = False  # Warned: an option of its own (its own destination), only hidden and warning

    def __init__(self, option_strings: list[str], dest: str, new: str, **kw: Any) -> None:
        kw.setdefault("help", argparse.SUPPRESS)
        kw.setdefault("default", argparse.SUPPRESS)  # the new flag's default stands
        super().__init__(option_strings, dest, **kw)
        self.new = new

    def __call__(
        self, parser: Any, namespace: argparse.Namespace, values: Any, option_string: str | None = None
    ) -> None:
        warn_renamed(str(option_string), self.new)
        setattr(namespace, self.dest, self.const if self.nargs == 0 else values)


class Warned(Renamed):
    """A deprecated option that keeps its own destination: hidden, warning, then stored as :class:`Renamed` does."""

    own = True


def deprecate(p: Parser, old: str, new: str, const: Any = None) -> argparse.Action:
    """Keep ``old`` working for one release, hidden, with a one-line warning naming ``new``: as an alias of ``p``'s
    flag ``new``; with ``const``, as a switch that sets ``new``'s destination to it (``--fp16`` for
    ``--grad-compression fp16``)."""
    target = p.flags[new]
    if const is not None:
        return p.add_argument(old, action=Renamed, dest=target.dest, new=f"{new} {const}", nargs=0, const=const)
    kw = {"nargs": target.nargs, "const": target.const, "type": target.type, "choices": target.choices,
          "metavar": target.metavar}
    return p.add_argument(old, action=Renamed, dest=target.dest, new=new, **kw)


# -- TrainConfig's fields as flags -------------------------------------------------------------------------------


def flag_of(name: str) -> str:
    return FIELDS[name].metadata.get("flag") or "--" + name.replace("_", "-")


def setting_name(word: str) -> str | None:
    """The TrainConfig field a user's word names: the field itself (``batch_size``), its flag without the dashes
    (``batch-size``, ``min-steps``, ``trackers``) or an old spelling of that flag (``log``); None: no setting."""
    if word in FIELDS:
        return word
    for name, f in FIELDS.items():
        flags = [flag_of(name), *f.metadata.get("renamed_from", ())]  # not --no-x: x=true would mean the opposite
        if "--" + word in flags and not word.startswith("no-") or word.replace("-", "_") == name:
            return name
    return None


def bool_flag(name: str, default: bool) -> tuple[str, str]:
    """The flag that moves boolean field ``name`` away from ``default`` (the parser's, which may differ from
    the field's own), and its argparse action: ``--x`` (store_true) from False, ``--no-x`` (store_false) from True."""
    f = FIELDS[name]
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
    groups: dict[str, Any] = {}
    for name, f in FIELDS.items():
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
        kw["help"] = argparse.SUPPRESS if md["hidden"] or md.get("deprecated") else text
        if md.get("deprecated"):  # still works, hidden, warning: as its switch did
            kw.update(action=Warned, new=md["deprecated"], nargs=0, const=kw["action"] == "store_true")
        act = g.add_argument(flag, **kw)
        for old in md.get("renamed_from", ()):
            g.add_argument(old, action=Renamed, dest=name, new=flag, nargs=act.nargs, const=act.const, type=act.type,
                           choices=act.choices, metavar=act.metavar)


def config_from_args(a: argparse.Namespace, **override: Any) -> TrainConfig:
    kw = {name: getattr(a, name) for name in FIELDS if hasattr(a, name)}
    kw.update(override)
    return TrainConfig(**kw)


def train_argv(cfg: TrainConfig, skip: Sequence[str] = (), defaults: Mapping[str, Any] | None = None) -> list[str]:
    """``dpcompare train`` flags that rebuild ``cfg`` exactly; settings at their default are left out.

    ``defaults``: the defaults of the parser that reads the flags back, where they differ from the fields'
    (as given to :func:`add_config_options`).
    """
    argv: list[str] = []
    for name, f in FIELDS.items():
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
    return [f"{k} {old.get(k)!r} → {new.get(k)!r}" for k in resume_relevant() if k in old and old.get(k) != new.get(k)]


# -- configuration files: --config FILE.toml, and the config.toml every run writes ------------------------------

#: the file a run writes beside its results (results.json, summary.json, parity.json), read back by --config
CONFIG_FILE = "config.toml"
#: options a written configuration leaves out: each invocation's own choice (a rerun names its own --out)
NOT_IN_CONFIG = ("out", "overwrite", "progress", "config", "help", "resume_dir", "print_config", "plan")


def add_config_file_option(p: Any) -> None:
    p.add_argument("--config", metavar="FILE.toml",
                   help="read options from a TOML file (keys: the flags without their dashes, e.g. batch-size = 64; "
                        "the config.toml every run writes reruns it); flags on the command line win")
    p.add_argument("--print-config", action="store_true",
                   help="print the full resolved configuration (--config's file, the flags given, every other "
                        "option's default) as TOML, and exit without running")


def _action(p: Parser, key: str) -> argparse.Action | None:
    """The option a configuration key names: a flag without its dashes (``batch-size``), else a destination
    (``batch_size``), positional arguments included."""
    act = p.flags.get("--" + key)
    if act is not None:
        return act
    dest = key.replace("-", "_")
    return next((a for a in p.options if a.dest == dest and a.help != argparse.SUPPRESS), None) or \
        next((a for a in p.options if a.dest == dest), None)


def _convert(act: argparse.Action, value: Any) -> Any:
    text = value if isinstance(value, str) else str(value)
    out = act.type(text) if callable(act.type) else text
    if act.choices is not None and out not in act.choices:
        raise ValueError(f"not one of {', '.join(map(str, act.choices))}")
    return out


def _setting(p: Parser, act: argparse.Action, key: str, value: Any) -> tuple[str, Any] | None:
    """(destination, value) that ``key = value`` sets, converted as argparse would; None: leaves the default."""
    if act.nargs == 0:  # store_true, store_false, store_const
        if not isinstance(value, bool):
            raise ValueError("give true or false")
        if key.replace("-", "_") == act.dest and act.option_strings != ["--" + key]:
            return act.dest, value  # the destination itself: tensorboard = false
        return (act.dest, act.const) if value else None
    many = act.dest in p.repeatable or act.nargs in ("+", "*", argparse.REMAINDER)
    if many:
        return act.dest, [_convert(act, v) for v in (value if isinstance(value, list) else [value])]
    if isinstance(value, list):
        value = ",".join(map(str, value))  # np = [2, 4] is --np 2,4
    return act.dest, _convert(act, value)


def _key(act: argparse.Action) -> str:
    """The configuration key of an option: its first flag without the dashes, or a positional's name."""
    if isinstance(act, Renamed) and not act.own:
        return act.new.split()[0][2:]
    return act.option_strings[0][2:] if act.option_strings else act.dest


def _renamed_value(act: argparse.Action, value: Any) -> Any:
    """A deprecated switch's value under its new name: ``--fp16`` is ``grad-compression = "fp16"``."""
    const = getattr(act, "const", None)
    return const if isinstance(act, Renamed) and act.nargs == 0 and not isinstance(const, bool) else value


def read_config(p: Parser, path: str | Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """The settings a TOML file gives: as ``p``'s defaults (so that flags on the command line win), and as written
    (under each option's key, for the run's own config.toml). A file or a key that cannot be read is one line."""
    try:
        table = tomllib.loads(Path(path).read_text())
    except FileNotFoundError:
        raise ConfigError(f"--config {path}: no such file") from None
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as e:
        raise ConfigError(f"--config {path}: not a TOML file ({e})") from None
    defaults: dict[str, Any] = {}
    raw: dict[str, Any] = {}
    for key, value in table.items():
        act = _action(p, key)
        if act is None or key in ("config", "help"):
            raise ConfigError(f"--config {path}: {key} is no option of {p.prog} (see {p.prog} --help)")
        if isinstance(act, Renamed):
            warn_renamed(f"{path}: {key}", act.new)
        try:
            setting = _setting(p, act, key, value)
        except (ValueError, TypeError, argparse.ArgumentTypeError) as e:
            raise ConfigError(f"--config {path}: {key} = {value!r}: {e}") from None
        if setting is not None:
            defaults[setting[0]] = setting[1]
            raw[key if act.nargs == 0 and not isinstance(act, Renamed) else _key(act)] = _renamed_value(act, value)
    return defaults, raw


def _toml_value(text: str) -> Any:
    """A flag's value as written on a command line, as a TOML int or float where that reads back the same."""
    for kind in (int, float):
        try:
            if str(kind(text)) == text:
                return kind(text)
        except ValueError:
            pass
    return text


def _take(p: Parser, args: list[str], i: int) -> tuple[argparse.Action, list[Any], int]:
    """The option at ``args[i]`` (a flag, ``--``, or a positional's first value), its values, and the next index."""
    positionals = [a for a in p.options if not a.option_strings]
    if args[i] == "--" or not args[i].startswith("--"):
        rest = next((a for a in positionals if a.nargs == argparse.REMAINDER), None)
        act = rest if args[i] == "--" or not positionals else positionals[0]
        if act is None:
            raise ValueError(f"{args[i]!r}: {p.prog} takes no arguments that are not flags")
        start = i + (args[i] == "--")
        end = len(args) if act.nargs == argparse.REMAINDER else \
            next((k for k in range(i, len(args)) if args[k].startswith("--")), len(args))
        return act, args[start:end], end
    flag, has_inline, inline = args[i].partition("=")
    act = p.flags.get(flag)
    if act is None:
        raise ValueError(f"{args[i]!r} is no option of {p.prog}")
    if act.nargs == 0:
        return act, [True], i + 1
    if has_inline:
        return act, [inline], i + 1
    if act.nargs in ("+", "*"):
        end = next((k for k in range(i + 1, len(args)) if args[k].startswith("--")), len(args))
        return act, args[i + 1:end], end
    return act, args[i + 1:i + 2], i + 2


def config_settings(p: Parser, argv: Sequence[str]) -> dict[str, Any]:
    """A command line (``argv``, after the command's name, as ``p`` reads it) as configuration keys:
    ``--batch-size 64`` → ``batch-size = 64``, a switch → ``true``, a repeated or many-valued flag → an array."""
    settings: dict[str, Any] = {}
    args, i = list(argv), 0
    while i < len(args):
        token = args[i]
        act, values, i = _take(p, args, i)
        if act.dest in NOT_IN_CONFIG:
            continue
        key = _key(act)
        if act.nargs == 0 and not isinstance(act, Renamed):
            key = token[2:]  # a switch is written as given: no-single = true
        values = [_renamed_value(act, v) if v is True else _toml_value(v) for v in values]
        if act.dest in p.repeatable or not act.option_strings or act.nargs in ("+", "*"):
            settings[key] = [*settings.get(key, []), *values]
        else:
            settings[key] = values[0]
    return settings


def write_config(path: str | Path, p: Parser, settings: Mapping[str, Any]) -> Path:
    """``path`` (atomically): the TOML configuration ``settings`` (see :func:`config_settings`) that reruns a run
    with ``dpcompare COMMAND --config path``."""
    # lazy: needed only when a config is written
    import tomli_w


    head = (f"# {p.prog} {__version__}: every setting of this run, defaults included (a changed default does not "
            f"change a rerun). Rerun it with\n#   {p.prog} --config {path} --out NEW_FOLDER\n"
            "# (flags given beside --config win)\n")
    return atomic_write_text(path, head + tomli_w.dumps(full_settings(p, settings)))


def _plain(value: Any) -> Any:
    """A default as TOML writes it and ``--config`` reads it back: a number, a string, a boolean or a list."""
    if isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, list | tuple):
        items = [_plain(v) for v in value]
        return items if all(isinstance(v, int | float | str) and not isinstance(v, bool) for v in items) else \
            ",".join(map(str, items))
    return str(value)


def default_settings(p: Parser) -> dict[str, Any]:
    """Every option of ``p`` at its default, as configuration keys (a switch: false); left out: an option without
    a default (None; TOML has no null) and one whose default stands for a choice made later, which the option
    itself does not take (compare's --repeats 0: 3 blocks, or 1 per seed)."""
    out: dict[str, Any] = {}
    for act in p.options:
        if act.dest in NOT_IN_CONFIG or act.help == argparse.SUPPRESS:
            continue
        if act.nargs == 0:
            out[_key(act)] = False
        elif act.default not in (None, argparse.SUPPRESS, []):
            try:
                _setting(p, act, _key(act), _plain(act.default))
            except (ValueError, TypeError, argparse.ArgumentTypeError):
                continue
            out[_key(act)] = _plain(act.default)
    return out


def full_settings(p: Parser, settings: Mapping[str, Any]) -> dict[str, Any]:
    """``settings`` (configuration keys, see :func:`config_settings`) with every other option at its default."""
    given = dict(settings)
    return {**{k: v for k, v in default_settings(p).items() if k not in given}, **given}


def print_config(a: argparse.Namespace) -> int:
    """``--print-config``: the full resolved configuration ``a`` was given (its --config file's settings, its
    flags', every other option's default) as TOML on stdout; nothing runs."""
    # lazy: needed only when a config is written
    import tomli_w

    p = a.commands[a.command]
    sys.stdout.write(f"# {p.prog}: the resolved configuration (dpcompare {a.command} --config FILE reads it)\n"
                     + tomli_w.dumps(full_settings(p, given_settings(a) or {})))
    return 0


def given_settings(a: argparse.Namespace) -> dict[str, Any] | None:
    """The settings a command was given, its --config file's and its flags' (these win), as configuration keys;
    None when it was not started from the command line."""
    if not hasattr(a, "argv"):
        return None
    return {**a.config_raw, **config_settings(a.commands[a.command], a.argv)}


def write_train_config(path: str | Path, cfg: TrainConfig) -> Path:
    """``dpcompare train``'s config.toml: the run's settings that differ from the defaults (not where it writes)."""
    p = Parser(prog="dpcompare train")
    add_config_options(p)
    return write_config(path, p, config_settings(p, train_argv(cfg, skip=("out", "overwrite", "progress", "resume"))))
