"""``dpcompare report DIR``: re-render the table, plots and report.html from DIR/results.json alone."""

from __future__ import annotations

import argparse
from typing import Any

from dpcompare.report import render


def _cmd_report(a: argparse.Namespace) -> int:
    render(a.dir, quiet=a.quiet, recompute=a.recompute)
    return 0


def register(sub: Any, parser_class: type[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("report", help="re-render a comparison's table, plots and report.html from its results.json",
                       description="Read DIR/results.json (written by `dpcompare compare --out DIR`) and write "
                                   "DIR/plots/*.png and DIR/report.html again, printing the table and verdicts. "
                                   "Needs no run folders, only results.json. The verdicts shown are the ones compare "
                                   "stored there (--recompute draws them again from the runs).",
                       epilog="examples:\n  dpcompare report runs/ab\n"
                              "  dpcompare report runs/ab --recompute --quiet   # verdicts drawn again, no table",
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("dir", metavar="DIR", help="the --out folder of a `dpcompare compare` run")
    p.add_argument("--quiet", action="store_true", help="write the files without printing the table")
    p.add_argument("--recompute", action="store_true",
                   help="compute the verdicts again from the runs instead of showing the ones compare stored in "
                        "results.json (they are recomputed anyway when none were stored)")
    p.set_defaults(func=_cmd_report)
