"""Options derived from TrainConfig: every field has a flag, flags round-trip, resume reporting is derived."""

from __future__ import annotations

import argparse
import dataclasses

import pytest

from dpcompare import cli
from dpcompare.config import TrainConfig, resume_relevant
from dpcompare.options import add_config_options, changed_settings, config_from_args, flag_of, train_argv


def _parse_train(argv: list[str]) -> TrainConfig:
    return config_from_args(cli.build_parser().parse_args(["train", *argv]))


def _changed(f: dataclasses.Field) -> object:
    """A valid non-default value for any field, from its metadata (so new knobs are covered too)."""
    md, d = f.metadata, f.default
    if isinstance(d, bool):
        return not d
    if md["choices"] is not None:
        choices = md["choices"]() if callable(md["choices"]) else md["choices"]
        return next(c for c in choices if c != d)
    if isinstance(d, tuple):
        return tuple(x + 1 for x in d)
    if isinstance(d, float):
        return d * 2 + 0.5
    if isinstance(d, int):
        return d + 3
    # strings that the field's own parser checks (plug-in specs, model and dataset names) get a valid one
    return {"out": "runs/x y", "workload": "my_pkg.bench:workload", "model": "mlp",
            "dataset": "synthetic"}.get(f.name, "a value")


def _everything_changed() -> TrainConfig:
    return TrainConfig(**{f.name: _changed(f) for f in dataclasses.fields(TrainConfig)})


@pytest.mark.parametrize("cfg", [TrainConfig(), _everything_changed()], ids=["defaults", "everything-changed"])
def test_train_argv_round_trips_through_the_train_parser(cfg: TrainConfig) -> None:
    back = _parse_train(train_argv(cfg))
    assert dataclasses.asdict(back) == dataclasses.asdict(cfg)
    if cfg != TrainConfig():
        assert all(getattr(cfg, f.name) != f.default for f in dataclasses.fields(TrainConfig))


def test_defaults_are_left_out_and_skip_drops_fields() -> None:
    assert train_argv(TrainConfig()) == []
    assert train_argv(TrainConfig(epochs=2, lr=0.1), skip=("epochs",)) == ["--lr", "0.1"]
    assert train_argv(TrainConfig(tensorboard=False)) == ["--no-tensorboard"]


def test_every_field_is_a_flag_with_help() -> None:
    p = argparse.ArgumentParser()
    add_config_options(p)
    dests: dict = {}
    for a in p._actions:  # the test may look inside argparse; the product does not
        dests.setdefault(a.dest, a)  # a field's own flag, not an old spelling kept after it
    for f in dataclasses.fields(TrainConfig):
        assert f.name in dests, f"{f.name} has no flag"
        assert flag_of(f.name) in dests[f.name].option_strings
        assert dests[f.name].help, f"{f.name} has no help"


def test_help_states_defaults_and_choices_come_from_the_registries() -> None:
    p = argparse.ArgumentParser()
    add_config_options(p)
    text = p.format_help()
    from dpcompare import backends

    assert "learning rate (default: 0.05)" in text
    assert "{" + ",".join(backends.names()) + "}" in text.replace(" ", "").replace("\n", "")


def test_exclude_and_parser_specific_defaults() -> None:
    p = argparse.ArgumentParser()
    add_config_options(p, exclude=("strategy",), defaults={"out": "runs/compare"})
    a = p.parse_args([])
    assert not hasattr(a, "strategy") and a.out == "runs/compare"


@pytest.mark.parametrize("argv, words", [
    (["--lr", "nan"], "finite"), (["--lr", "-1"], "greater than 0"), (["--lr", "0"], "greater than 0"),
    (["--momentum", "-0.1"], "0 or more"), (["--timeout", "0"], "greater than 0"), (["--epochs", "-1"], "0 or more"),
])
def test_numeric_flags_are_validated(argv, words, capsys) -> None:
    with pytest.raises(SystemExit) as e:
        cli.build_parser().parse_args(["train", *argv])
    err = capsys.readouterr().err
    assert e.value.code == 2 and words in err and len(err.strip().splitlines()) == 1


def test_resume_report_is_derived_from_the_fields() -> None:
    rel = resume_relevant()
    assert {"world_size", "strategy", "lr", "batch_size", "model"} <= set(rel) and "out" not in rel
    old = {**TrainConfig().to_dict(), "world_size": 2}
    new = {**TrainConfig(lr=0.1, out="elsewhere").to_dict(), "world_size": 1}
    assert changed_settings(old, new) == ["world_size 2 → 1", "lr 0.05 → 0.1"]


def test_cli_module_only_dispatches() -> None:
    """The top-level parser has no option of its own but --help/--version, and every sub-command is one that a
    command module's ``register`` adds (none is cli's own)."""
    import importlib

    from dpcompare.options import Parser

    p = cli.build_parser()
    assert set(p.flags) == {"-h", "--help", "--version"}
    registered = Parser().add_subparsers()
    for name in cli.COMMAND_MODULES:
        importlib.import_module(name).register(registered, Parser)
    assert set(p.subcommands) == set(registered.choices) and "train" in p.subcommands
