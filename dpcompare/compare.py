"""Placeholder: sub-command not written yet."""

from __future__ import annotations

import argparse


def register(sub: argparse._SubParsersAction, parser_class: type[argparse.ArgumentParser]) -> None:
    pass
