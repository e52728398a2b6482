"""``queen serve --workers N``: N broker processes behind one port, one database."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
import orjson
import psycopg
import pytest

from queen.server import worker_environ
from queen.serving.connection import LINGER_S
from queen.settings import Settings

pytestmark = pytest.mark.slow


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _process_ids(base: str, expected: int, deadline: float) -> set[int]:
    """Ask /metrics over fresh connections until ``expected`` processes have answered (a
    worker's answer lists every worker: ``queen_process_id{pid=...,worker=...}``)."""
    seen: set[int] = set()
    while len(seen) < expected and time.monotonic() < deadline:
        try:
            text = httpx.get(f"{base}/metrics", timeout=2).text
        except httpx.HTTPError:
            time.sleep(0.1)
            continue
        for line in text.splitlines():
            if line.startswith(("queen_process_id ", "queen_process_id{")):
                seen.add(int(float(line.split()[-1])))
        if len(seen) < expected:
            time.sleep(0.1)
    return seen


def _metrics_dir(worker_pid: int) -> Path:
    """The service's metrics directory, as the parent handed it to a worker."""
    environ = Path(f"/proc/{worker_pid}/environ").read_bytes()
    return Path(environ.split(b"PROMETHEUS_MULTIPROC_DIR=")[1].split(b"\0")[0].decode())


def _counter(text: str, name: str) -> float:
    for line in text.splitlines():
        if line.startswith(f"{name} "):
            return float(line.split()[1])
    raise AssertionError(f"{name} missing from /metrics")


def _sample(text: str, name: str) -> float | None:
    """A sample of /metrics; None when the scrape does not show it."""
    for line in text.splitlines():
        if line.startswith(f"{name} "):
            return float(line.split()[1])
    return None


def test_worker_environment_carries_every_setting() -> None:
    settings = Settings(port=7123, host="127.0.0.1", workers=3, actor_idle_timeout_s=2.5)
    env = worker_environ(settings, "postgresql://db/x", 1, base={"DATABASE_URL": "old"})
    assert env["QUEEN_PORT"] == "7123"
    assert env["QUEEN_HOST"] == "127.0.0.1"
    assert env["QUEEN_ACTOR_IDLE_TIMEOUT_S"] == "2.5"
    assert env["DATABASE_URL"] == "postgresql://db/x"
    assert env["QUEEN_WORKERS"] == "1"
    assert env["QUEEN_WORKER_ID"] == "1"
    assert Settings.from_env(env).port == 7123


def test_the_default_is_one_worker_per_core_at_most_four(monkeypatch: pytest.MonkeyPatch) -> None:
    for cores, expected in ((1, 1), (2, 2), (3, 3), (16, 4)):
        monkeypatch.setattr(os, "sched_getaffinity", lambda _pid, n=cores: set(range(n)))
        assert Settings(workers=0).processes() == expected
        assert Settings(workers=1).processes() == 1  # said explicitly: as said
        assert Settings(workers=6).processes() == 6
    assert Settings.from_env({}).workers == 0


def test_queen_serve_alone_runs_a_worker_per_core(pg_url: str, tmp_path: Path) -> None:
    port = _free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("QUEEN_")}
    env.update(DATABASE_URL=pg_url, QUEEN_HOST="127.0.0.1", QUEEN_PORT=str(port))
    env.update(FILE_BUFFER_DIR=str(tmp_path / "spool"), QUEEN_LOG_LEVEL="warning")
    cores = len(os.sched_getaffinity(0))  # the child's too
    expected = min(cores, 4)
    proc = subprocess.Popen([sys.executable, "-m", "queen.cli", "serve"], env=env)
    try:
        # every answer lists every worker: a third worker would be in the first one
        pids = _process_ids(f"http://127.0.0.1:{port}", expected, time.monotonic() + 60)
        assert len(pids) == expected, (cores, pids)
        if expected > 1:
            assert proc.pid not in pids  # the parent only watches
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0


def test_two_workers_share_the_port_and_stop_on_sigterm(pg_url: str, tmp_path: Path) -> None:
    port = _free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("QUEEN_")}
    env["DATABASE_URL"] = pg_url
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "queen.cli",
            "serve",
            "--workers",
            "2",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--file-buffer-dir",
            str(tmp_path / "spool"),
            "--log-level",
            "warning",
        ],
        env=env,
    )
    try:
        base = f"http://127.0.0.1:{port}"
        pids = _process_ids(base, 2, time.monotonic() + 60)
        assert len(pids) == 2, "both workers answer on the port given as a flag"
        assert proc.pid not in pids
        queue = f"workers-{uuid.uuid4().hex[:8]}"
        body: dict[str, Any] = {"items": [{"queue": queue, "payload": 1, "transactionId": "a"}]}
        answer = httpx.post(f"{base}/api/v1/push", json=body, timeout=10)
        assert answer.status_code == 201
        assert answer.json()[0]["status"] == "queued"
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0


@pytest.mark.timeout(150)
def test_two_workers_answer_for_the_whole_service(pg_url: str, tmp_path: Path) -> None:
    """Pushes spread over both workers; every scrape, whichever worker answers, sums both
    and never goes back; per-process figures carry the worker's labels."""
    port = _free_port()
    proc = subprocess.Popen(
        _serve_argv(port, tmp_path / "spool", "--workers", "2"), env=_external_env(pg_url)
    )
    base = f"http://127.0.0.1:{port}"
    json_accept = {"Accept": "application/json"}
    try:
        pids = _process_ids(base, 2, time.monotonic() + 60)
        assert len(pids) == 2
        metrics_dir = _metrics_dir(min(pids))
        assert metrics_dir.is_dir()
        queue = f"sum-{uuid.uuid4().hex[:8]}"
        pushed: dict[int, int] = dict.fromkeys(pids, 0)
        sessions = 0
        # one keep-alive connection is one worker: ask it who it is, then push on it
        while min(pushed.values()) < 3 and sessions < 200:
            sessions += 1
            with httpx.Client(base_url=base, timeout=10) as client:
                who = client.get("/metrics", headers=json_accept).json()["processId"]
                for i in range(3):
                    item = {"queue": queue, "payload": i, "transactionId": f"{sessions}-{i}"}
                    answer = client.post("/api/v1/push", json={"items": [item]})
                    assert answer.status_code == 201
                assert client.get("/metrics", headers=json_accept).json()["processId"] == who
            pushed[who] += 3
        assert min(pushed.values()) >= 3, f"pushes never reached both workers: {pushed}"
        total = sum(pushed.values())
        readings: list[float] = []
        answered_by: set[int] = set()
        deadline = time.monotonic() + 30
        # every worker publishes at least once a second: poll until the sum is complete
        while not readings or readings[-1] < total:
            assert time.monotonic() < deadline, f"{readings[-5:]} never reached {total}"
            text = httpx.get(f"{base}/metrics", headers={"Connection": "close"}).text
            readings.append(_counter(text, "queen_push_requests_total"))
        for _ in range(40):  # scrape many times: always both workers' sum
            with httpx.Client(base_url=base, timeout=10) as client:
                text = client.get("/metrics/prometheus").text
                readings.append(_counter(text, "queen_push_requests_total"))
                assert readings[-1] == total
                assert _counter(text, "queen_push_items_queued_total") == total
                assert _counter(text, 'queen_cluster_push_requests_total{scope="cluster"}') == total
                workers = [
                    line for line in text.splitlines() if line.startswith("queen_process_id{")
                ]
                assert len(workers) == 2
                assert {'worker="0"' in line or 'worker="1"' in line for line in workers} == {True}
                assert "# HELP queen_push_requests_total " in text
                figures = client.get("/metrics", headers=json_accept).json()
                answered_by.add(figures["processId"])
                assert figures["counters"]["push_requests"] == total
                assert figures["messages"]["total"] == total
                assert figures["processes"] == 2
        assert readings == sorted(readings), "a counter went back between scrapes"
        assert answered_by == pids, "both workers answered the scrapes"
        # the rates: each worker's history reads the service, so its intervals add up to
        # every push, whichever worker keeps it (its first point predates the pushes)
        for _ in range(2):
            with httpx.Client(base_url=base, timeout=10) as client:
                assert client.post("/api/v1/stats/refresh").status_code == 200
                status = client.get("/api/v1/status").json()
                assert sum(p["ingested"] for p in status["throughput"]) == total
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0
    assert not metrics_dir.exists(), "the parent removes the metrics directory when it stops"


def test_every_scrape_shows_the_queues_as_the_database_holds_them(
    pg_url: str, tmp_path: Path
) -> None:
    """Per-queue gauges are the database's at the scrape, whichever worker answers: a queue
    that only grows never reads lower than it did, and reads what was pushed after every
    push."""
    port = _free_port()
    proc = subprocess.Popen(
        _serve_argv(port, tmp_path / "spool", "--workers", "2"), env=_external_env(pg_url)
    )
    base = f"http://127.0.0.1:{port}"
    queue = f"grows-{uuid.uuid4().hex[:8]}"
    depth = f'queen_queue_depth{{queue="{queue}"}}'
    lag = f'queen_consumer_group_lag{{consumer_group="g",queue="{queue}"}}'
    try:
        pids = _process_ids(base, 2, time.monotonic() + 60)
        assert len(pids) == 2
        configured = httpx.post(f"{base}/api/v1/configure", json={"queue": queue, "options": {}})
        assert configured.status_code == 200
        # g subscribes while the queue is empty: it lags by everything pushed after
        assert httpx.get(f"{base}/api/v1/pop/queue/{queue}?consumerGroup=g").status_code == 204
        pushed, answered_by = 0, set()
        readings: list[tuple[float, float]] = []
        for batch in range(8):
            items = [{"queue": queue, "payload": i} for i in range(batch + 1)]
            assert httpx.post(f"{base}/api/v1/push", json={"items": items}).status_code == 201
            pushed += len(items)
            for _ in range(5):  # a new connection each time: either worker answers
                with httpx.Client(base_url=base, timeout=10) as client:
                    who = client.get("/metrics", headers={"Accept": "application/json"})
                    answered_by.add(who.json()["processId"])
                    text = client.get("/metrics").text  # the same connection: that worker
                readings.append((_sample(text, depth), _sample(text, lag)))
                assert readings[-1] == (pushed, pushed), f"{pushed} pushed: {readings}"
        assert answered_by == pids, "both workers answered the scrapes"
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0


def _serve_argv(port: int, spool: Path, *extra: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "queen.cli",
        "serve",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--file-buffer-dir",
        str(spool),
        "--log-level",
        "warning",
        *extra,
    ]


def _external_env(pg_url: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("QUEEN_")}
    env["DATABASE_URL"] = pg_url
    return env


def _answer(sock: socket.socket) -> tuple[bytes, bytes]:
    """The head and body of the next answer on ``sock`` (its body has a Content-Length)."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        assert chunk, f"closed after {data!r}"
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
    while len(body) < length:
        chunk = sock.recv(65536)
        assert chunk, f"closed after {data!r}"
        body += chunk
    return head, body


@pytest.mark.timeout(120)
@pytest.mark.parametrize("workers", [1, 2])
def test_a_big_body_refused_while_it_arrives_gets_its_503_not_a_reset(
    pg_url: str, tmp_path: Path, workers: int
) -> None:
    """The body budget answers 503 as soon as a body's head arrives, and ends the server's
    side; most clients read only once they have sent their whole body. The server must read
    and drop the body for as long as it keeps coming (here longer than the pause that ends a
    lingering close), or the client meets a reset instead of its answer."""
    port = _free_port()
    env = _external_env(pg_url)
    env["QUEEN_MAX_BODY_BYTES"] = env["QUEEN_MAX_DECODING_BYTES"] = str(64 * 2**20)
    proc = subprocess.Popen(
        _serve_argv(port, tmp_path / "spool", "--workers", str(workers)), env=env
    )
    holders: dict[int, socket.socket] = {}
    try:
        assert len(_process_ids(f"http://127.0.0.1:{port}", workers, time.monotonic() + 60)) == (
            workers
        )
        # In every worker a 40 MB body, begun and never finished, holds that much of the
        # budget: a 50 MB body then fits in none.
        for _ in range(50):
            if len(holders) == workers:
                break
            holder = socket.create_connection(("127.0.0.1", port), timeout=10)
            holder.sendall(b"GET /metrics HTTP/1.1\r\nhost: x\r\naccept: application/json\r\n\r\n")
            pid = orjson.loads(_answer(holder)[1])["processId"]
            if pid in holders:
                holder.close()
                continue
            holder.sendall(
                b"POST /api/v1/push HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
                b"content-length: 40000000\r\nexpect: 100-continue\r\n\r\n"
            )
            # (the body is charged when its request starts, before this goes out)
            assert holder.recv(65536).startswith(b"HTTP/1.1 100 ")
            holders[pid] = holder
        assert len(holders) == workers
        body = b'{"items": [{"queue": "big", "payload": "' + b"x" * 50_000_000 + b'"}]}'
        with socket.create_connection(("127.0.0.1", port), timeout=10) as client:
            client.sendall(
                b"POST /api/v1/push HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
                b"content-length: " + str(len(body)).encode() + b"\r\n\r\n"
            )
            # A slow link: the body takes LINGER_S + 1 s to send, then the answer is read.
            step = 1 << 20
            pause = (LINGER_S + 1) / (len(body) / step)
            for offset in range(0, len(body), step):
                client.sendall(body[offset : offset + step])
                time.sleep(pause)
            head, answer = _answer(client)
        assert head.startswith(b"HTTP/1.1 503 "), head
        assert b"retry-after: 1" in head.lower() and b"retry later" in answer
    finally:
        for holder in holders.values():
            holder.close()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0


def _children(pid: int) -> set[int]:
    """The processes ``pid``'s main thread started (the workers: it forks them itself)."""
    try:
        text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    except FileNotFoundError:
        return set()
    return {int(part) for part in text.split()}


def _reaped(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


@pytest.mark.timeout(150)
def test_a_killed_worker_is_started_again_while_the_other_serves(
    pg_url: str, tmp_path: Path
) -> None:
    port = _free_port()
    base = f"http://127.0.0.1:{port}"
    proc = subprocess.Popen(
        _serve_argv(port, tmp_path / "spool", "--workers", "2"),
        env=_external_env(pg_url),
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        pids = _process_ids(base, 2, time.monotonic() + 60)
        assert len(pids) == 2
        victim, survivor = sorted(pids)
        os.kill(victim, signal.SIGKILL)
        # the survivor answers meanwhile: the service did not stop with the victim
        queue = f"restart-{uuid.uuid4().hex[:8]}"
        item = {"queue": queue, "payload": 1, "transactionId": "after-kill"}
        answer = httpx.post(f"{base}/api/v1/push", json={"items": [item]}, timeout=10)
        assert answer.status_code == 201
        assert answer.json()[0]["status"] == "queued"
        deadline = time.monotonic() + 60
        replacement: set[int] = set()
        while not replacement and time.monotonic() < deadline:
            replacement = _process_ids(base, 2, deadline) - {victim, survivor}
        assert len(replacement) == 1, "a new worker took the killed one's place"
        assert _children(proc.pid) == {survivor} | replacement
        assert _reaped(victim)
        assert proc.poll() is None
    finally:
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 0, stderr[-2000:]
    assert f"(pid {victim}) exited with code -9; starting it again" in stderr


@pytest.mark.timeout(150)
def test_a_worker_that_keeps_dying_at_start_stops_the_service(pg_url: str, tmp_path: Path) -> None:
    port = _free_port()
    proc = subprocess.Popen(
        _serve_argv(port, tmp_path / "spool", "--workers", "2"),
        env=_external_env(pg_url),
        stderr=subprocess.PIPE,
        text=True,
    )
    killed: set[int] = set()
    try:
        deadline = time.monotonic() + 90
        while proc.poll() is None and time.monotonic() < deadline:
            # every worker is killed as soon as it exists, so none lives long
            for pid in _children(proc.pid) - killed:
                os.kill(pid, signal.SIGKILL)
                killed.add(pid)
            time.sleep(0.02)
        _, stderr = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 2, stderr[-2000:]
    assert "exited with code -9, 3 times in a row within 30 s of its start" in stderr
    # one worker was started three times, the other at least once: both were stopped, reaped
    assert len(killed) >= 4
    assert all(_reaped(pid) for pid in killed)


@pytest.mark.parametrize("workers", [1, 2])
def test_a_second_broker_on_a_taken_port_exits_with_port_in_use(
    pg_url: str, tmp_path: Path, workers: int
) -> None:
    port = _free_port()
    first = subprocess.Popen(
        _serve_argv(port, tmp_path / "spool-1", "--workers", str(workers)),
        env=_external_env(pg_url),
    )
    try:
        base = f"http://127.0.0.1:{port}"
        pids = _process_ids(base, workers, time.monotonic() + 60)
        assert len(pids) == workers
        for second_workers in ("1", "2"):
            second = subprocess.run(
                _serve_argv(port, tmp_path / "spool-2", "--workers", second_workers),
                env=_external_env(pg_url),
                capture_output=True,
                text=True,
                timeout=60,
                check=False,
            )
            assert second.returncode == 2, second.stderr
            assert f"port {port} on 127.0.0.1 is in use" in second.stderr
        # every answer still comes from the first broker's processes
        assert _process_ids(base, workers + 1, time.monotonic() + 3) == pids
    finally:
        first.send_signal(signal.SIGTERM)
        assert first.wait(timeout=60) == 0


@pytest.mark.timeout(150)
def test_workers_outlive_the_thread_that_started_them(pg_url: str, tmp_path: Path) -> None:
    """The parent-death signal follows the thread that forked a worker: the workers must not
    be stopped when an idle pooled thread ends (Trio's end after 10 s)."""
    port = _free_port()
    proc = subprocess.Popen(
        _serve_argv(port, tmp_path / "spool", "--workers", "2"), env=_external_env(pg_url)
    )
    try:
        pids = _process_ids(f"http://127.0.0.1:{port}", 2, time.monotonic() + 60)
        assert len(pids) == 2
        watch_until = time.monotonic() + 13  # past the 10 s a pooled thread idles
        while time.monotonic() < watch_until:
            assert proc.poll() is None, "the service stopped on its own"
            assert all(Path(f"/proc/{pid}").exists() and not _zombie(pid) for pid in pids)
            time.sleep(0.5)
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0


def test_killed_parent_takes_its_workers_with_it(pg_url: str, tmp_path: Path) -> None:
    port = _free_port()
    parent = subprocess.Popen(
        _serve_argv(port, tmp_path / "spool", "--workers", "2"), env=_external_env(pg_url)
    )
    pids = _process_ids(f"http://127.0.0.1:{port}", 2, time.monotonic() + 60)
    assert len(pids) == 2
    metrics_dir = _metrics_dir(min(pids))
    parent.kill()
    parent.wait(timeout=10)
    deadline = time.monotonic() + 30
    alive = set(pids)
    while alive and time.monotonic() < deadline:  # orphans: nobody to wait() on them but init
        alive = {pid for pid in alive if Path(f"/proc/{pid}").exists() and not _zombie(pid)}
        time.sleep(0.05)
    assert not alive, "a worker outlived its parent and keeps the port"
    shutil.rmtree(metrics_dir)  # a parent killed outright cannot remove it
    # the port is free again for the next broker
    with socket.socket() as again:
        again.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        again.bind(("127.0.0.1", port))


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return False


@pytest.mark.timeout(150)
def test_workers_killed_under_pushes_come_back_and_fail_no_push(
    pg_url: str, tmp_path: Path
) -> None:
    """Twice, while clients push, the longest-running worker is killed: its replacement
    comes up on a database whose schema is current, applies none of it, and no push is
    answered ``failed`` (only the requests the killed worker was serving are cut)."""
    from tests.test_schema_start import CATALOG

    def catalog() -> list[tuple[Any, ...]]:
        with psycopg.connect(pg_url, autocommit=True) as conn:
            return conn.execute(CATALOG).fetchall()

    port = _free_port()
    base = f"http://127.0.0.1:{port}"
    proc = subprocess.Popen(
        _serve_argv(port, tmp_path / "spool", "--workers", "2"),
        env=_external_env(pg_url),
        stderr=subprocess.PIPE,
        text=True,
    )
    statuses: Counter[str] = Counter()
    lock = threading.Lock()
    stop = threading.Event()
    run = uuid.uuid4().hex[:8]

    def push(task: int) -> None:
        n = 0
        while not stop.is_set():
            with httpx.Client(base_url=base, timeout=30) as client:  # a new one after a cut
                while not stop.is_set():
                    n += 1
                    item = {
                        "queue": f"kill-{run}-{task}",
                        "partition": f"p{n % 4}",
                        "payload": n,
                        "transactionId": f"{task}-{n}",
                    }
                    try:
                        answer = client.post("/api/v1/push", json={"items": [item]})
                    except httpx.TransportError:
                        with lock:
                            statuses["cut"] += 1
                        break
                    with lock:
                        if answer.status_code == 201:
                            statuses.update(r["status"] for r in answer.json())
                        else:
                            statuses[f"http {answer.status_code}"] += 1

    def answered() -> int:
        with lock:
            return sum(count for status, count in statuses.items() if status != "cut")

    def more(n: int = 20) -> None:
        goal, deadline = answered() + n, time.monotonic() + 30
        while answered() < goal:
            assert time.monotonic() < deadline, f"pushes stopped being answered: {statuses}"
            time.sleep(0.01)

    pushers = [threading.Thread(target=push, args=(task,)) for task in range(3)]
    try:
        workers = sorted(_process_ids(base, 2, time.monotonic() + 60))
        assert len(workers) == 2
        before = catalog()
        for thread in pushers:
            thread.start()
        for _ in range(2):
            more()
            victim = workers.pop(0)  # the longest running: each worker id in turn
            os.kill(victim, signal.SIGKILL)
            deadline = time.monotonic() + 60
            replacement: set[int] = set()
            while not replacement and time.monotonic() < deadline:
                replacement = _process_ids(base, 2, deadline) - {victim, *workers}
            assert len(replacement) == 1, "a new worker took the killed one's place"
            workers += replacement
        more()
        assert proc.poll() is None
    finally:
        stop.set()
        for thread in pushers:
            if thread.is_alive():
                thread.join(60)
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 0, stderr[-2000:]
    assert "failed" not in statuses and set(statuses) <= {"queued", "cut"}, statuses
    assert "deadlock" not in stderr, stderr[-2000:]
    assert catalog() == before, "a restarted worker applied the schema again"


def test_ctrl_c_stops_the_workers_quietly_even_twice(pg_url: str, tmp_path: Path) -> None:
    """Ctrl-C at a terminal sends SIGINT to the whole foreground process group. The workers
    must not get it besides the parent's request to stop (a signal arriving while a worker
    drained ended it with a ``KeyboardInterrupt`` traceback), and a second, impatient Ctrl-C
    while the service stops must not interrupt it either: exit 0, and the stop logs no
    traceback."""
    port = _free_port()
    proc = subprocess.Popen(
        _serve_argv(port, tmp_path / "spool", "--workers", "2", "--log-level", "info"),
        env=_external_env(pg_url),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its own group, as a shell gives a foreground job
    )
    assert proc.stderr is not None
    log: list[str] = []

    def read() -> None:
        for line in proc.stderr or ():
            log.append(line)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        deadline = time.monotonic() + 60
        while sum("listening on" in line for line in log) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert sum("listening on" in line for line in log) == 2, log
        workers = _children(proc.pid)
        assert len(workers) == 2
        # the terminal's SIGINT goes to the foreground group: the parent's alone
        assert all(os.getpgid(pid) != os.getpgid(proc.pid) for pid in workers)
        before = len(log)
        os.killpg(proc.pid, signal.SIGINT)
        pressed = time.monotonic()
        deadline = pressed + 30
        while sum("shutting down" in line for line in log) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        with contextlib.suppress(ProcessLookupError):  # already gone: nothing to press
            os.killpg(proc.pid, signal.SIGINT)
        code = proc.wait(timeout=30)
        stopped_s = time.monotonic() - pressed
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    reader.join(timeout=10)
    proc.stderr.close()
    stopping = "".join(log[before:])
    assert "Traceback" not in stopping and "KeyboardInterrupt" not in stopping, stopping
    assert code == 0, stopping
    assert stopped_s < 10, (stopped_s, stopping)


def _flow_totals(client: httpx.Client, queue: str) -> tuple[dict[str, int], int, str]:
    """queue-ops's totals of ``queue`` over the last hour, queue-lag's pops, and whose
    figures they are (the scope header), asked on ``client``'s connection."""
    ops = client.get(f"/api/v1/analytics/queue-ops?queue={queue}")
    lag = client.get(f"/api/v1/analytics/queue-lag?queue={queue}")
    assert ops.status_code == lag.status_code == 200
    keys = ("pushMessages", "popMessages", "popEmpty", "ackSuccess", "ackFailed")
    totals = {k: sum(int(row[k]) for row in ops.json()["series"]) for k in keys}
    assert ops.headers["x-queen-flow-scope"] == lag.headers["x-queen-flow-scope"]
    return (
        totals,
        sum(int(row["popCount"]) for row in lag.json()),
        ops.headers["x-queen-flow-scope"],
    )


@pytest.mark.timeout(150)
def test_the_per_queue_flow_is_every_worker_s_whichever_answers(
    pg_url: str, tmp_path: Path
) -> None:
    """Pushes, pops, empty pops and acks land on both workers (a new connection each time);
    queue-ops and queue-lag, asked again and again of either worker, give the same totals:
    what was done."""
    port = _free_port()
    env = _external_env(pg_url) | {"QUEEN_FLOW_FLUSH_S": "0.2"}
    proc = subprocess.Popen(_serve_argv(port, tmp_path / "spool", "--workers", "2"), env=env)
    base = f"http://127.0.0.1:{port}"
    json_accept = {"Accept": "application/json"}
    queue = f"flow-{uuid.uuid4().hex[:8]}"
    done = dict.fromkeys(("pushMessages", "popMessages", "popEmpty", "ackSuccess", "ackFailed"), 0)
    try:
        pids = _process_ids(base, 2, time.monotonic() + 60)
        assert len(pids) == 2
        worked: dict[int, int] = dict.fromkeys(pids, 0)
        sessions = 0
        while min(worked.values()) < 2 and sessions < 200:
            sessions += 1
            with httpx.Client(base_url=base, timeout=10) as client:
                who = client.get("/metrics", headers=json_accept).json()["processId"]
                items = [
                    {"queue": queue, "partition": f"p{sessions}", "payload": i} for i in range(3)
                ]
                assert client.post("/api/v1/push", json={"items": items}).status_code == 201
                done["pushMessages"] += 3
                popped = client.get(f"/api/v1/pop/queue/{queue}?batch=2&wait=false")
                assert popped.status_code == 200
                messages = popped.json()["messages"]
                done["popMessages"] += len(messages)
                for m in messages:
                    ack = {
                        "transactionId": m["transactionId"],
                        "partitionId": m["partitionId"],
                        "leaseId": m["leaseId"],
                        "status": "completed",
                    }
                    answer = client.post("/api/v1/ack", json=ack)
                    assert answer.status_code == 200
                    done["ackSuccess" if answer.json()[0]["success"] else "ackFailed"] += 1
                # the partition just pushed is leased by no one: this pop takes what is left
                # of it, and the next finds nothing there
                path = f"/api/v1/pop/queue/{queue}/partition/p{sessions}?batch=10&wait=false"
                rest = client.get(path)
                assert rest.status_code == 200
                done["popMessages"] += len(rest.json()["messages"])
                assert client.get(path).status_code == 204
                done["popEmpty"] += 1
                assert client.get("/metrics", headers=json_accept).json()["processId"] == who
            worked[who] += 1
        assert min(worked.values()) >= 2, f"the work never reached both workers: {worked}"
        # every worker flushes every 0.2 s: ask until each worker has given the whole sum
        # (then each has saved all it did: the other added it up)
        complete: set[int] = set()
        deadline = time.monotonic() + 30
        while complete != pids:
            with httpx.Client(base_url=base, timeout=10) as client:
                who = client.get("/metrics", headers=json_accept).json()["processId"]
                totals, lag_pops, scope = _flow_totals(client, queue)
            if totals == done and lag_pops == done["popMessages"]:
                complete.add(who)
            assert time.monotonic() < deadline, f"{totals} (queue-lag {lag_pops}) never {done}"
        answered_by: set[int] = set()
        for _ in range(20):  # either worker, always the sum
            with httpx.Client(base_url=base, timeout=10) as client:
                answered_by.add(client.get("/metrics", headers=json_accept).json()["processId"])
                totals, lag_pops, scope = _flow_totals(client, queue)
            assert (totals, lag_pops, scope) == (done, done["popMessages"], "every-process")
        assert answered_by == pids, "both workers answered the reads"
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0
