"""How far an import is: a progress bar (``rich``) on a terminal, plain lines otherwise.

Lines go to standard error, so the report on standard output stays clean for scripts.
"""

from __future__ import annotations

import sys
import time
from typing import Protocol, TextIO


class Progress(Protocol):
    def start(self, total: int) -> None: ...

    def advance(self, where: str, count: int) -> None:
        """``count`` more messages of ``where`` ("queue/partition") were committed."""

    def partition_done(self, where: str, imported: int) -> None: ...

    def say(self, line: str) -> None: ...

    def finish(self) -> None: ...


class PlainProgress:
    """A line per partition finished, and one at most every ``every_s`` while a long
    partition is copied."""

    def __init__(self, stream: TextIO, every_s: float = 5.0) -> None:
        self.stream = stream
        self.every_s = every_s
        self.total = 0
        self.done = 0
        self._last = time.monotonic()

    def start(self, total: int) -> None:
        self.total = total
        self.say(f"importing {total} messages")

    def advance(self, where: str, count: int) -> None:
        self.done += count
        now = time.monotonic()
        if now - self._last >= self.every_s:
            self._last = now
            self.say(f"{self.done}/{self.total} messages ({where})")

    def partition_done(self, where: str, imported: int) -> None:
        self.say(f"{where}: {imported} messages ({self.done}/{self.total})")

    def say(self, line: str) -> None:
        print(f"queen import: {line}", file=self.stream, flush=True)

    def finish(self) -> None:
        pass


class RichProgress:
    """One bar for every message to import, naming the partition being copied."""

    def __init__(self, stream: TextIO) -> None:
        from rich.console import Console
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            TextColumn,
            TimeRemainingColumn,
        )
        from rich.progress import Progress as Bar

        self.console = Console(file=stream)
        self.bar = Bar(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeRemainingColumn(),
            console=self.console,
        )
        self.task = self.bar.add_task("messages", total=0)

    def start(self, total: int) -> None:
        self.bar.update(self.task, total=total)
        self.bar.start()

    def advance(self, where: str, count: int) -> None:
        self.bar.update(self.task, advance=count, description=where)

    def partition_done(self, where: str, imported: int) -> None:
        pass

    def say(self, line: str) -> None:
        self.bar.console.print(line)

    def finish(self) -> None:
        self.bar.stop()


def progress_for(stream: TextIO | None = None) -> Progress:
    stream = stream if stream is not None else sys.stderr
    return RichProgress(stream) if stream.isatty() else PlainProgress(stream)
