"""A live broker for the ``queen`` operator command tests, and a way to run the command.

The broker is a real ``queen serve`` process (authentication on, HS256) over the session's
PostgreSQL; the commands run as a user runs them: ``python -m queen ...`` in a subprocess,
with ``QUEEN_URL`` and ``QUEEN_TOKEN`` in the environment.
"""

from __future__ import annotations

import os
import queue as queues
import re
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jwt

from tests.jwt_tools import SECRET

_LISTENING = re.compile(r"listening on http://127\.0\.0\.1:(\d+)")
ROOT = Path(__file__).resolve().parent.parent


def environ(**extra: str) -> dict[str, str]:
    """This environment, with this tree's package first on the path whatever the cwd."""
    path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    return {**os.environ, "PYTHONPATH": path, **extra}


def token(*roles: str, sub: str = "ops") -> str:
    return jwt.encode(
        {"sub": sub, "roles": list(roles), "exp": int(time.time()) + 3600}, SECRET, "HS256"
    )


ADMIN = token("read", "write", "admin")


@dataclass
class Run:
    code: int
    out: str
    err: str

    def lines(self) -> list[str]:
        return [line for line in self.out.splitlines() if line.strip()]


@dataclass
class LiveBroker:
    url: str
    proc: subprocess.Popen[str]
    log: list[str] = field(default_factory=list)

    def queen(
        self,
        *args: str,
        token: str | None = ADMIN,
        stdin: str | None = None,
        url: str | None = None,
        env: dict[str, str] | None = None,
        timeout_s: float = 60,
    ) -> Run:
        """Run ``queen ARGS`` with ``QUEEN_URL`` (``url``, else this broker's) and
        ``QUEEN_TOKEN`` (``token``; ``None``: none), then ``env`` (a value ``""`` removes that
        variable). No queenctl config is read unless ``env`` names one."""
        full = environ(QUEEN_URL=url or self.url)
        for name in ("QUEEN_TOKEN", "QUEEN_SERVER", "QUEEN_CONTEXT"):
            full.pop(name, None)
        full["QUEEN_CONFIG"] = str(Path(os.devnull).parent / "nonexistent" / "config.yaml")
        if token is not None:
            full["QUEEN_TOKEN"] = token
        for name, value in (env or {}).items():
            if value:
                full[name] = value
            else:
                full.pop(name, None)
        done = subprocess.run(
            [sys.executable, "-m", "queen", *args],
            input=stdin if stdin is not None else "",
            capture_output=True,
            text=True,
            env=full,
            timeout=timeout_s,
            check=False,
        )
        return Run(done.returncode, done.stdout, done.stderr)


def start_broker(pg_url: str, spool: Path) -> Iterator[LiveBroker]:
    env = environ(
        DATABASE_URL=pg_url,
        FILE_BUFFER_DIR=str(spool),
        QUEEN_HOST="127.0.0.1",
        QUEEN_PORT="0",
        JWT_ENABLED="true",
        JWT_SECRET=SECRET,
        QUEEN_SYSTEM_STATE_CACHE_MS="100",
    )
    proc = subprocess.Popen(
        [sys.executable, "-m", "queen", "serve"],
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stderr is not None
    lines: queues.Queue[str | None] = queues.Queue()
    log: list[str] = []

    def read() -> None:
        assert proc.stderr is not None
        for line in proc.stderr:
            log.append(line.rstrip("\n"))
            lines.put(line)
        lines.put(None)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    deadline = time.monotonic() + 60
    port = 0
    try:
        while not port:
            line = lines.get(timeout=max(0.1, deadline - time.monotonic()))
            if line is None:
                raise RuntimeError("queen serve exited before listening:\n" + "\n".join(log))
            match = _LISTENING.search(line)
            if match:
                port = int(match.group(1))
        yield LiveBroker(f"http://127.0.0.1:{port}", proc, log)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        reader.join(timeout=10)
        proc.stderr.close()


def closed_port() -> int:
    """A port nothing listens on (bound, then closed)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    return port


def new_queue() -> str:
    return f"ctl-{uuid.uuid4().hex[:10]}"


def json_lines(text: str) -> list[Any]:
    import json

    return [json.loads(line) for line in text.splitlines() if line.strip()]
