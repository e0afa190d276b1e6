"""Progress on long work: a rich bar on a terminal with finished lines printed above it, plain lines
otherwise (logs, pipes, launcher-captured output), nothing with mode ``none``."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)


class ProgressLine:
    def __init__(self, total: int, label: str, mode: str = "auto", *, console: Console | None = None,
                 enabled: bool = True, bar_allowed: bool = True) -> None:
        self.console = console or Console(highlight=False)
        self.quiet = not enabled or mode == "none"
        use_bar = not self.quiet and (mode == "bar" or (mode == "auto" and self.console.is_terminal and bar_allowed))
        self.bar = (Progress(TextColumn(label), BarColumn(), MofNCompleteColumn(), TextColumn("{task.description}"),
                             TimeElapsedColumn(), TimeRemainingColumn(), console=self.console)
                    if use_bar else None)
        self.task = self.bar.add_task("", total=total) if self.bar else None

    @property
    def has_bar(self) -> bool:
        return self.bar is not None

    def __enter__(self) -> ProgressLine:
        if self.bar:
            self.bar.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.bar:
            self.bar.stop()

    def update(self, advance: int = 0, description: str | None = None) -> None:
        if self.bar:
            kw: dict[str, Any] = {"advance": advance}
            if description is not None:
                kw["description"] = description
            self.bar.update(self.task, **kw)

    def print(self, msg: str, markup: bool = False) -> None:
        if self.quiet:
            return
        (self.bar.console if self.bar else self.console).print(msg, soft_wrap=True, markup=markup, highlight=False)
