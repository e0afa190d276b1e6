"""docs/cli.md is generated from the parsers: every command and every flag is on it, and it does not drift."""

from __future__ import annotations

import argparse
import re

from dpcompare import cli

from conftest import ROOT


def test_cli_page_is_the_parsers() -> None:
    page = (ROOT / "docs" / "cli.md").read_text()
    assert page == cli.markdown(), "docs/cli.md differs from the parsers: run python scripts/cli_doc.py"
    for sp in cli.subcommands(cli.build_parser()):
        assert f"## {sp.prog}\n" in page
        for act in sp.options:
            if act.help != argparse.SUPPRESS and act.option_strings and act.dest != "help":
                assert f"`{act.option_strings[0]}" in page.split(f"## {sp.prog}\n")[1], (sp.prog, act.option_strings)


def test_help_starts_with_what_a_first_user_needs() -> None:
    from dpcompare.options import START

    p = cli.build_parser()
    firsts = {name: sp for name, sp in p.subcommands.items() if START in sp.sections}
    assert set(firsts) == {"train", "compare", "parity", "predict"}
    for name, sp in firsts.items():
        text = sp.format_help()
        assert text.index("start here:") < text.index("the training job:" if name != "predict" else "the network")
        assert "\noptions:" not in text and text.index("start here:") < text.index("--help")
        start = [a.option_strings[0] if a.option_strings else a.dest for a in sp.sections[START]]
        assert start[:2] == ["-h", "--config"] and "--out" in start, start
    predict = [a.option_strings[0] for a in firsts["predict"].sections[START] if a.option_strings]
    assert predict == ["-h", "--config", "--host-counts", "--link", "--latency", "--strategies", "--threshold", "--out"]
    shown = {
        f
        for sec in firsts["predict"].sections.values()
        for a in sec
        if a.help != "==SUPPRESS=="
        for f in a.option_strings
    }
    for flag in ("--host-counts", "--horovod-cycle-ms", "--grad-compression", "--bootstrap", "--overlap-from",
                 "--model-error"):
        assert flag in shown and flag in predict + [f for t, s in firsts["predict"].sections.items() if t != "options"
                                                    for a in s for f in a.option_strings]
    for stale in ("--hosts", "--cycle-ms", "--fp16", "--fusion-mb"):
        assert stale not in shown


def test_the_page_shows_zero_defaults_and_the_true_out_defaults() -> None:
    page = cli.markdown()
    assert "| `--max-steps N` | `0` |" in page and "| `--trace N` | `0` |" in page
    compare, parity = page.split("## dpcompare compare\n")[1], page.split("## dpcompare parity\n")[1]
    assert "| `--out OUT` | `runs/compare` | output folder |" in compare.split("\n## ")[0]
    assert "| `--out OUT` | `runs/parity` | output folder |" in parity.split("\n## ")[0]
    assert "runs/<strategy>-np<N>" not in compare.split("\n## ")[0] + parity.split("\n## ")[0]
    for sp in cli.subcommands(cli.build_parser()):
        if not sp.subcommands:
            assert sp.description, f"{sp.prog} has no description"


def test_no_help_or_example_uses_a_renamed_flag() -> None:
    """A command's epilog, description and option help show the new spelling of every flag it renamed (the old one
    still works, with a warning): `lab up --hosts`, `lab bench --out` and `compare --resume` once lingered there."""

    from dpcompare.options import Renamed

    parsers = cli.subcommands(cli.build_parser())
    texts = [t for sp in parsers for t in [sp.epilog or "", sp.description or ""] + [a.help or "" for a in sp.options]]
    stale = []
    for sp in parsers:
        for old in (a.option_strings[0] for a in sp.options if isinstance(a, Renamed) and not a.own):
            used = re.compile(rf"{re.escape(sp.prog)}\b[^\n#`.;()]*?{re.escape(old)}(?![\w-])")
            stale += [(sp.prog, old) for text in texts if used.search(text)]
    assert stale == []
