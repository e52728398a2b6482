"""A sampler of the CPU a Python process spends, for ``python -m bench.profile``: on the bench's
servers' ``PYTHONPATH`` only, and only when ``QUEEN_BENCH_CPU_SAMPLES`` names a directory.

SIGUSR1 starts it: every 2 ms of the process's CPU time (``ITIMER_PROF``: user and system time,
not time spent ready to run while another process has the core) the main thread's stack is
counted. The interpreter runs the handler at its next check, after a call or a jump, or as a
function starts; a tick that finds a function just starting counts for its caller, where the
time went (objects freed or collected since the last check). SIGUSR2 stops it and writes the
counts to ``DIR/PID.txt`` in py-spy's raw format (``frame;frame;... count``, each frame
``function (file:line)``, files relative to the ``sys.path`` entry that holds them), so
:func:`bench.profile.shares` reads both. ``DIR/PID.ready`` says a process has the handlers (a
SIGUSR1 would end one without them).

With ``QUEEN_BENCH_SAMPLE=calls`` the signals switch ``cProfile`` on and off instead, and SIGUSR2
writes its statistics to ``DIR/PID.prof`` (every Python call counted, a coroutine's resumption
as one)."""

from __future__ import annotations

import dis
import os
import signal
import sys
from collections import Counter
from collections.abc import Callable
from types import CodeType, FrameType

INTERVAL_S = 0.002

Handler = Callable[[int, FrameType | None], None]


def _cpu_sampler(directory: str) -> tuple[Handler, Handler]:
    roots: list[str] = []  # sys.path's entries, longest first, once the process runs
    labels: dict[CodeType, str] = {}
    starts: dict[CodeType, int] = {}  # the offset of a function's first RESUME
    counts: Counter[str] = Counter()

    def label(code: CodeType) -> str:
        path = os.path.realpath(code.co_filename)
        for root in roots:
            if path.startswith(root):
                path = path[len(root) :]
                break
        text = labels[code] = f"{code.co_qualname} ({path}:{code.co_firstlineno})"
        return text

    def start_of(code: CodeType) -> int:
        found = (i.offset for i in dis.get_instructions(code) if i.opname == "RESUME")
        offset = starts[code] = next(found, -1)
        return offset

    def tick(_signum: int, frame: FrameType | None) -> None:
        if frame is not None and frame.f_back is not None:
            code = frame.f_code
            start = starts.get(code)
            if frame.f_lasti == (start_of(code) if start is None else start):
                frame = frame.f_back
        names = []
        while frame is not None:
            code = frame.f_code
            names.append(labels.get(code) or label(code))
            frame = frame.f_back
        counts[";".join(reversed(names))] += 1

    def start(_signum: int, _frame: FrameType | None) -> None:
        paths = {os.path.realpath(p or ".") + os.sep for p in sys.path}
        roots[:] = sorted(paths, key=len, reverse=True)
        labels.clear()
        counts.clear()
        signal.signal(signal.SIGPROF, tick)
        signal.setitimer(signal.ITIMER_PROF, INTERVAL_S, INTERVAL_S)

    def stop(_signum: int, _frame: FrameType | None) -> None:
        signal.setitimer(signal.ITIMER_PROF, 0)
        path = os.path.join(directory, f"{os.getpid()}.txt")
        with open(path + ".part", "w") as out:
            out.writelines(f"{stack} {n}\n" for stack, n in counts.items())
        os.replace(path + ".part", path)

    return start, stop


def _call_counter(directory: str) -> tuple[Handler, Handler]:
    import cProfile

    running: list[cProfile.Profile] = []

    def start(_signum: int, _frame: FrameType | None) -> None:
        running[:] = [cProfile.Profile()]
        running[0].enable()

    def stop(_signum: int, _frame: FrameType | None) -> None:
        if running:
            profile = running.pop()
            profile.disable()
            path = os.path.join(directory, f"{os.getpid()}.prof")
            profile.dump_stats(path + ".part")
            os.replace(path + ".part", path)

    return start, stop


def _install(directory: str, mode: str | None) -> None:
    start, stop = (_call_counter if mode == "calls" else _cpu_sampler)(directory)
    signal.signal(signal.SIGUSR1, start)
    signal.signal(signal.SIGUSR2, stop)
    with open(os.path.join(directory, f"{os.getpid()}.ready"), "w"):
        pass


if os.environ.get("QUEEN_BENCH_CPU_SAMPLES"):
    _install(os.environ["QUEEN_BENCH_CPU_SAMPLES"], os.environ.get("QUEEN_BENCH_SAMPLE"))
