"""The README's first run as a user who is not root: ``queen serve`` with no settings at all, in
a fresh directory, starts the embedded PostgreSQL under ``.queen/pgdata`` and spools to
``.queen/buffers`` there, both as that user."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import trio

from queen.storage.embedded import EmbeddedPostgres
from tests.procs import BrokerProcess, spool_files

_USER = "queen_newcomer"


def newcomer() -> tuple[int, int]:
    """A user who is not root: a dedicated system user when the tests run as root, else the
    current user."""
    if os.geteuid() != 0:
        return os.getuid(), os.getgid()
    import pwd

    try:
        entry = pwd.getpwnam(_USER)
    except KeyError:
        if shutil.which("useradd") is None:
            pytest.skip("running as root without useradd: no other user to run as")
        subprocess.run(
            ["useradd", "--system", "--no-create-home", "-s", "/usr/sbin/nologin", _USER],
            check=True,
            capture_output=True,
        )
        entry = pwd.getpwnam(_USER)
    return entry.pw_uid, entry.pw_gid


@pytest.fixture
def home() -> Iterator[tuple[Path, int, int]]:
    """A fresh directory owned by the newcomer (outside pytest's tree, which may be closed to
    other users)."""
    uid, gid = newcomer()
    path = Path(tempfile.mkdtemp(prefix="queen-newcomer-"))
    os.chown(path, uid, gid)
    try:
        yield path, uid, gid
    finally:
        shutil.rmtree(path, ignore_errors=True)


async def test_first_run_as_a_user_who_is_not_root(
    home: tuple[Path, int, int], pg_server: EmbeddedPostgres | None
) -> None:
    # pg_server: started as root, the session's server let other users reach the embedded
    # PostgreSQL binaries, as a root install of the broker does (queen/storage/embedded.py).
    cwd, uid, gid = home
    script = Path(__file__).with_name("serve_as_user.py")
    keep = ("PATH", "LANG", "LC_ALL", "TZ", "PYTHONPATH")
    env = {k: v for k, v in os.environ.items() if k in keep}  # no QUEEN_, DATABASE_URL, ...
    env["HOME"] = str(cwd)
    # One process: workers re-execute the interpreter, and this one is root's (a user who
    # installs the broker has their own); tests/test_workers.py covers the default of one
    # process per core.
    env["QUEEN_WORKERS"] = "1"
    broker = BrokerProcess(
        env,
        argv=[sys.executable, str(script), str(uid), str(gid)],
        cwd=cwd,
        inherit_env=False,
    )
    async with trio.open_nursery() as nursery:
        await broker.start(nursery)
        try:
            started = next(line for line in broker.log if "listening on" in line)
            assert f"embedded PostgreSQL at {cwd}/.queen/pgdata" in started
            assert "spool: .queen/buffers" in started
            spool = cwd / ".queen" / "buffers"
            assert spool.stat().st_uid == uid
            assert (cwd / ".queen" / "pgdata").stat().st_uid == uid

            async with httpx.AsyncClient(base_url=broker.base, timeout=30) as http:
                item = {"queue": "orders", "partition": "cust-42", "payload": {"n": 1}}
                pushed = await http.post("/api/v1/push", json={"items": [item]})
                assert pushed.status_code == 201, "\n".join(broker.log[-40:])
                assert pushed.json()[0]["status"] == "queued"

                # The default spool directory is written by that user: maintenance mode
                # spools every push.
                on = await http.post("/api/v1/system/maintenance", json={"enabled": True})
                assert on.status_code == 200
                spooled = await http.post("/api/v1/push", json={"items": [item]})
                assert spooled.json()[0]["status"] == "buffered"
                (written,) = spool_files(spool)
                assert written.stat().st_uid == uid and written.stat().st_size > 0
                off = await http.post("/api/v1/system/maintenance", json={"enabled": False})
                assert off.status_code == 200
            await broker.wait_spool_empty(timeout_s=60)
        finally:
            await broker.stop()
    assert broker.proc is not None and broker.proc.returncode == 0, "\n".join(broker.log)
    assert not (cwd / ".queen" / "pgdata" / "postmaster.pid").exists()  # stopped its server
