"""docs/cli.md is generated from the parsers: every command and every flag is on it, and it does not drift."""

from __future__ import annotations

import argparse

from dpcompare import cli

from conftest import ROOT


def test_cli_page_is_the_parsers() -> None:
    page = (ROOT / "docs" / "cli.md").read_text()
    assert page == cli.markdown(), "docs/cli.md differs from the parsers: run python scripts/cli_doc.py"
    for sp in cli._commands(cli.build_parser()):
        assert f"## {sp.prog}\n" in page
        for act in sp._actions:
            if act.help != argparse.SUPPRESS and act.option_strings and act.dest != "help":
                assert f"`{act.option_strings[0]}" in page.split(f"## {sp.prog}\n")[1], (sp.prog, act.option_strings)


def test_help_starts_with_what_a_first_user_needs() -> None:
    p = cli.build_parser()
    for name, first in cli.FIRST.items():
        sp = p._subparsers._group_actions[0].choices[name]
        text = sp.format_help()
        assert text.index("start here:") < text.index("the training job:" if name != "predict" else "the network")
        start = next(g for g in sp._action_groups if g.title == cli.START)
        assert [a.option_strings[0] for a in start._group_actions] == list(first)
