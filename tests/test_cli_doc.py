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


def test_no_help_or_example_uses_a_renamed_flag() -> None:
    """A command's epilog, description and option help show the new spelling of every flag it renamed (the old one
    still works, with a warning): `lab up --hosts`, `lab bench --out` and `compare --resume` once lingered there."""
    import re

    from dpcompare.options import Deprecated

    parsers = cli._commands(cli.build_parser())
    texts = [t for sp in parsers for t in [sp.epilog or "", sp.description or ""] + [a.help or "" for a in sp._actions]]
    stale = []
    for sp in parsers:
        for old in (a.option_strings[0] for a in sp._actions if isinstance(a, Deprecated) and not a.own):
            used = re.compile(rf"{re.escape(sp.prog)}\b[^\n#`.;()]*?{re.escape(old)}(?![\w-])")
            stale += [(sp.prog, old) for text in texts if used.search(text)]
    assert stale == []
