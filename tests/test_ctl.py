"""The ``queen`` operator commands against a live broker, run as a user runs them: output,
``--json``, ``-o`` and exit statuses (queenctl's: 0 ok, 1 usage, 2 the broker failed or is
unreachable, 3 authentication, 4 nothing to do; ours: 5 items refused), and queenctl's words,
flags and environment beside ours.

The commands run in a pipe, as scripts run them: without ``-o`` they print JSON there (as
queenctl does), so the tests that read a table ask for ``-o table``."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import click
import httpx
import pytest
import yaml

from queen.cli import _commands
from tests.ctl_env import (
    ADMIN,
    LiveBroker,
    closed_port,
    environ,
    json_lines,
    new_queue,
    start_broker,
    token,
)

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def live(pg_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveBroker]:
    yield from start_broker(pg_url, tmp_path_factory.mktemp("ctl") / "spool")


def http(live: LiveBroker) -> httpx.Client:
    return httpx.Client(base_url=live.url, headers={"Authorization": f"Bearer {ADMIN}"}, timeout=30)


def dead_letter(live: LiveBroker, queue: str, payloads: list[Any]) -> list[dict[str, Any]]:
    """Push ``payloads`` to ``queue`` (no retries) and fail each once: they go to the DLQ."""
    assert live.queen("queues", "configure", queue, "--set", "retryLimit=0").code == 0
    assert live.queen("push", queue, *(json.dumps(p) for p in payloads)).code == 0
    popped = json_lines(live.queen("pop", queue, "--batch", str(len(payloads))).out)
    assert len(popped) == len(payloads)
    failed = live.queen(
        "ack",
        "--status",
        "failed",
        "--error",
        "boom",
        stdin="".join(json.dumps(m) + "\n" for m in popped),
    )
    assert failed.code == 0, failed.err
    return popped


# --- the commands ours had, in their new statuses and output -------------------------------


def test_push_pop_ack_round_trip(live: LiveBroker) -> None:
    queue = new_queue()
    pushed = live.queen("push", queue, '{"n": 1}', '"two"', "--partition", "p1")
    assert pushed.code == 0, pushed.err
    assert pushed.out.strip() == "queued=2 duplicate=0 failed=0"  # queenctl's line
    piped = live.queen("push", queue, "--partition", "p1", "--json", stdin='{"n": 3}\n\n[4]\n')
    assert piped.code == 0
    assert [r["status"] for r in json.loads(piped.out)] == ["queued", "queued"]

    popped = live.queen("pop", queue, "--batch", "10")
    assert popped.code == 0, popped.err
    messages = json_lines(popped.out)
    assert [m["data"] for m in messages] == [{"n": 1}, "two", {"n": 3}, [4]]
    assert {m["partition"] for m in messages} == {"p1"}

    acked = live.queen("ack", stdin=popped.out)
    assert (acked.code, acked.out.strip()) == (0, "ok=4 failed=0"), acked.err
    again = live.queen("ack", stdin=popped.out)  # the lease is gone: refused, exit 5
    assert (again.code, again.out.strip()) == (5, "ok=0 failed=4")
    assert "Invalid or expired lease" in again.err

    described = json.loads(live.queen("queues", "describe", queue, "--json").out)
    assert described["totals"]["completed"] == 4
    assert described["totals"]["pending"] == 0
    empty = live.queen("pop", queue)  # nothing left: no output, exit 4 (queenctl's "empty")
    assert (empty.code, empty.out, empty.err) == (4, "", "")


def test_push_of_a_bad_line_pushes_nothing(live: LiveBroker) -> None:
    queue = new_queue()
    run = live.queen("push", queue, stdin='{"n": 1}\nnot json\n')
    assert run.code == 1
    assert run.err.startswith("queen: stdin line 2 is not JSON")
    assert run.out == ""
    missing = live.queen("queues", "describe", queue)
    assert missing.code == 2
    assert "404" in missing.err and "not found" in missing.err


def test_push_items_with_transaction_ids_reports_duplicates(
    live: LiveBroker, tmp_path: Path
) -> None:
    queue = new_queue()
    source = tmp_path / "items.jsonl"
    source.write_text(
        '{"payload": 1, "transactionId": "t-1", "partition": "a"}\n'
        '{"payload": 1, "transactionId": "t-1", "partition": "a"}\n'
    )
    run = live.queen("push", queue, "--items", "--file", str(source))
    assert run.code == 0, run.err
    assert run.out.strip() == "queued=1 duplicate=1 failed=0"
    assert "t-1" in run.err and "duplicate" in run.err  # the item not stored, on stderr
    not_an_item = live.queen("push", queue, "--items", "1")
    assert not_an_item.code == 1 and "payload" in not_an_item.err


def test_tail_follows_a_group_in_partition_order_and_acks(live: LiveBroker) -> None:
    queue = new_queue()
    for part, values in (("a", [1, 2, 3]), ("b", [10, 20])):
        assert live.queen("push", queue, *map(str, values), "--partition", part).code == 0
    run = live.queen(
        "tail", queue, "--group", "audit", "--subscription-mode", "all", "--ack", "--idle", "1"
    )
    assert run.code == 0, run.err
    messages = json_lines(run.out)
    by_partition: dict[str, list[Any]] = {}
    for m in messages:
        assert m["consumerGroup"] == "audit"
        by_partition.setdefault(m["partition"], []).append(m["data"])
    assert by_partition == {"a": [1, 2, 3], "b": [10, 20]}
    lag = json.loads(live.queen("lag", "--group", "audit", "--queue", queue, "--json").out)
    assert {(r["partition"], r["offsetLag"]) for r in lag} == {("a", 0), ("b", 0)}
    rest = live.queen("tail", queue, "--group", "audit", "--idle", "0.5")
    assert rest.code == 0 and rest.out == ""


def test_tail_stops_after_its_limit(live: LiveBroker) -> None:
    queue = new_queue()
    assert live.queen("push", queue, "1", "2", "3", "4").code == 0
    run = live.queen("tail", queue, "--limit", "3", "--ack")
    assert run.code == 0
    assert [m["data"] for m in json_lines(run.out)] == [1, 2, 3]


def test_lag_is_per_partition_largest_first(live: LiveBroker) -> None:
    queue = new_queue()
    for part, count in (("small", 1), ("big", 3), ("middle", 2)):
        payloads = [str(i) for i in range(count)]
        assert live.queen("push", queue, *payloads, "--partition", part).code == 0
    # the group takes a position on each partition (a pop, never acknowledged: nothing consumed)
    for part in ("small", "big", "middle"):
        assert live.queen("pop", queue, "--group", "behind", "--partition", part).code == 0
    rows = json.loads(live.queen("lag", "--group", "behind", "--json").out)
    mine = [(r["partition"], r["offsetLag"]) for r in rows if r["queue"] == queue]
    assert mine == [("big", 3), ("middle", 2), ("small", 1)]
    table = live.queen("lag", "--group", "behind", "--queue", queue, "-o", "table").out
    lines = table.splitlines()
    assert [line.split()[2] for line in lines[2:]] == ["big", "middle", "small"]
    assert lines[0].split()[:4] == ["group", "queue", "partition", "lag"]
    filtered = json.loads(live.queen("lag", "--queue", queue, "--min-lag", "2", "--json").out)
    assert {(r["consumerGroup"], r["partition"]) for r in filtered} >= {
        ("behind", "big"),
        ("behind", "middle"),
    }
    assert all(r["offsetLag"] >= 2 for r in filtered)


def test_queues_configure_list_describe_delete(live: LiveBroker) -> None:
    queue = new_queue()
    configured = live.queen(
        "queues", "configure", queue, "--set", "leaseTime=60", "--set", "retryLimit=2", "--json"
    )
    assert configured.code == 0, configured.err
    options = json.loads(configured.out)["options"]
    assert (options["leaseTime"], options["retryLimit"]) == (60, 2)
    listed = live.queen("queues", "list", "--limit", "1000", "-o", "table")
    assert any(line.split()[0] == queue for line in listed.out.splitlines())
    described = live.queen("queues", "describe", queue, "-o", "table").out
    assert described.startswith(f"queue               {queue}")
    bad = live.queen("queues", "configure", queue, "--set", "leaseTime")
    assert bad.code == 1 and "OPTION=VALUE" in bad.err

    unconfirmed = live.queen("queues", "delete", queue)  # stdin is not a terminal
    assert unconfirmed.code == 1
    assert "--yes" in unconfirmed.err
    assert live.queen("queues", "describe", queue).code == 0  # still there
    deleted = live.queen("queues", "delete", queue, "--yes")
    assert (deleted.code, deleted.out.strip()) == (0, f"deleted queue {queue}")
    gone = live.queen("queues", "delete", queue, "--yes")  # nothing to do: 4
    assert (gone.code, gone.out.strip()) == (4, f"no queue {queue}")


def test_queues_describe_shows_the_lease_time_and_retry_limit(live: LiveBroker) -> None:
    queue = new_queue()
    configure = ("queues", "configure", queue, "--set", "leaseTime=45", "--set", "retryLimit=7")
    assert live.queen(*configure).code == 0
    described = live.queen("queues", "describe", queue, "-o", "table")
    assert described.code == 0, described.err
    shown = {line.split("  ")[0].strip(): line for line in described.out.splitlines()}
    assert shown["lease time"].split()[-2:] == ["45", "s"], described.out
    assert shown["retry limit"].split()[-1] == "7"


def test_every_table_counts_pending_without_the_leased_messages(live: LiveBroker) -> None:
    """One queue's answer counts leased messages in its ``pending`` (as the original's does),
    the list of queues does not: the tables show the list's figure everywhere."""
    queue = new_queue()
    assert live.queen("push", queue, "1", "2", "3", "--partition", "p").code == 0
    assert live.queen("pop", queue, "--batch", "1").code == 0  # one leased
    assert (
        json.loads(live.queen("queues", "describe", queue, "--json").out)["totals"]["pending"] == 3
    )  # the answer itself is the original's

    described = live.queen("queues", "describe", queue, "-o", "table").out
    rows = {line.split("  ")[0].strip(): line for line in described.splitlines()}
    shown = rows["messages"].split(None, 1)[1].strip()
    assert shown == "total 3, pending 2, processing 1, completed 0, failed 0, deadLetter 0"
    partition = rows["p"].split()
    assert partition[2:5] == ["3", "2", "1"]  # total, pending, processing
    listed = live.queen("queues", "list", "--limit", "1000", "-o", "table").out
    (row,) = [line.split() for line in listed.splitlines() if line.split()[:1] == [queue]]
    assert row[5:7] == ["2", "1"]  # queue, namespace, task, partitions, total, pending, ...


def test_seek_rereads_and_skips(live: LiveBroker) -> None:
    queue = new_queue()
    assert live.queen("push", queue, "1", "2").code == 0
    group = ["--group", "replay", "--subscription-mode", "all"]
    first = live.queen("tail", queue, *group, "--ack", "--idle", "0.5")
    assert [m["data"] for m in json_lines(first.out)] == [1, 2]

    back = live.queen("seek", "replay", queue, "--to", "2000-01-01T00:00:00Z")
    assert back.code == 0, back.err
    assert back.out.startswith(f"moved replay on {queue} to 2000-01-01T00:00:00.000Z")
    again = live.queen("tail", queue, *group, "--ack", "--idle", "0.5")
    assert [m["data"] for m in json_lines(again.out)] == [1, 2]

    assert live.queen("push", queue, "3").code == 0
    end = live.queen("seek", "replay", queue, "--to-end", "--json")
    assert json.loads(end.out)["seekToEnd"] is True
    assert live.queen("tail", queue, *group, "--idle", "0.5").out == ""
    both = live.queen("seek", "replay", queue, "--to-end", "--to", "2000-01-01T00:00:00Z")
    assert both.code == 1
    unknown = live.queen("seek", "replay", new_queue(), "--to-end")
    assert unknown.code == 2 and "404" in unknown.err


def test_seek_of_one_partition_names_it(live: LiveBroker) -> None:
    queue = new_queue()
    assert live.queen("push", queue, "1", "--partition", "p").code == 0
    assert live.queen("pop", queue, "--group", "g", "--partition", "p", "--ack").code == 0
    moved = live.queen("seek", "g", queue, "--to-end", "--partition", "p")
    assert moved.code == 0, moved.err
    assert moved.out.strip() == f"moved g on {queue}/p to the end"
    assert "None" not in moved.out


def test_dlq_list_and_delete(live: LiveBroker) -> None:
    queue = new_queue()
    [message] = dead_letter(live, queue, [{"order": 7}])
    listed = live.queen("dlq", "list", "--queue", queue, "--json")
    [entry] = json.loads(listed.out)["messages"]
    assert (entry["transactionId"], entry["errorMessage"], entry["data"]) == (
        message["transactionId"],
        "boom",
        {"order": 7},
    )
    table = live.queen("dlq", "list", "--queue", queue, "-o", "table").out
    assert message["transactionId"] in table and "boom" in table
    before = live.queen("dlq", "list", "--queue", queue, "--to", "2000-01-01T00:00:00Z", "--json")
    assert json.loads(before.out)["messages"] == []

    pid, tid = message["partitionId"], message["transactionId"]
    assert live.queen("dlq", "delete", pid, tid).code == 1  # no --yes, no terminal
    deleted = live.queen("dlq", "delete", pid, tid, "--yes")
    assert deleted.code == 0, deleted.err
    with http(live) as client:
        assert client.get(f"/api/v1/messages/{pid}/{tid}").status_code == 404
    assert json.loads(live.queen("dlq", "list", "--queue", queue, "--json").out)["messages"] == []
    gone = live.queen("dlq", "delete", pid, tid, "--yes")
    assert gone.code == 2 and "404" in gone.err


def test_dlq_retry_one_message(live: LiveBroker) -> None:
    """Needs ``POST /api/v1/messages/{partitionId}/{transactionId}/retry``."""
    queue = new_queue()
    [message] = dead_letter(live, queue, [{"order": 8}])
    pid, tid = message["partitionId"], message["transactionId"]
    retried = live.queen("dlq", "retry", pid, tid)
    assert retried.code == 0, retried.err
    assert retried.out.strip() == f"retried {tid}"
    [again] = json_lines(live.queen("pop", queue).out)
    assert (again["transactionId"], again["data"]) == (tid, {"order": 8})
    assert json.loads(live.queen("dlq", "list", "--queue", queue, "--json").out)["messages"] == []
    twice = live.queen("dlq", "retry", pid, tid)  # nothing left to retry
    assert twice.code == 4


def test_dlq_retry_a_queue(live: LiveBroker) -> None:
    """Needs ``POST /api/v1/dlq/retry``."""
    queue = new_queue()
    dead = dead_letter(live, queue, [1, 2])
    too_old = live.queen("dlq", "retry", "--queue", queue, "--to", "2000-01-01T00:00:00Z")
    assert (too_old.code, too_old.out.strip()) == (4, f"retried 0 dead letters of {queue}")
    retried = live.queen("dlq", "requeue", "--queue", queue)  # queenctl's word
    assert retried.code == 0, retried.err
    assert retried.out.strip() == f"retried 2 dead letters of {queue}"
    again = json_lines(live.queen("pop", queue, "--batch", "10").out)
    assert sorted(m["transactionId"] for m in again) == sorted(m["transactionId"] for m in dead)
    nothing = live.queen("dlq", "retry", "--queue", queue)
    assert nothing.code == 4
    mixed = live.queen("dlq", "retry", "1", "x", "--queue", queue)
    assert mixed.code == 1


def test_maintenance_on_status_off(live: LiveBroker) -> None:
    try:
        on = live.queen("maintenance", "on", "--both")
        assert on.code == 0, on.err
        assert on.out.splitlines() == ["push maintenance on", "pop maintenance on"]
        state = json.loads(live.queen("maintenance", "status", "--json").out)
        assert state["push"]["maintenanceMode"] is True
        assert state["pop"]["popMaintenanceMode"] is True
        # queenctl's words and document: `maintenance get [--pop]` prints one switch's answer
        got = json.loads(live.queen("maint", "get", "--pop", "-o", "json").out)
        assert got["popMaintenanceMode"] is True
    finally:
        off = live.queen("maintenance", "off", "--both")
    assert off.code == 0
    status = live.queen("maintenance", "status", "-o", "table").out.splitlines()
    assert status[:2] == ["push maintenance  off", "pop maintenance   off"]
    assert live.queen("maintenance", "on", "--pop", "--both").code == 1
    # queenctl asks for --yes to turn it on: taken, and nothing else changes
    try:
        assert live.queen("maintenance", "on", "--pop", "--yes").out.strip() == "pop maintenance on"
    finally:
        assert live.queen("maintenance", "off", "--pop", "-q").out == ""


def test_status_metrics_and_traces(live: LiveBroker) -> None:
    status = live.queen("status", "-o", "table")
    assert status.code == 0, status.err
    assert "status            healthy" in status.out
    both = json.loads(live.queen("--json", "status").out)
    assert both["health"]["database"] == "connected"
    totals = both["status"]["totals"]
    assert f"queues            {totals['queues']} ({totals['partitions']} partitions)" in status.out
    counted = both["status"]["messages"]  # the service's counters, not what the queues hold
    said = f"messages          since start: total {counted['total']}, pending {counted['pending']}"
    assert said in status.out
    figures = json.loads(live.queen("metrics", "--json").out)
    assert figures["counters"]["push_requests"] >= 0
    assert "queen_push_requests_total" in live.queen("metrics", "--prometheus").out

    queue = new_queue()
    assert live.queen("push", queue, "1").code == 0
    [m] = json_lines(live.queen("pop", queue, "--ack").out)
    name = f"trace-{queue}"
    with http(live) as client:
        recorded = client.post(
            "/api/v1/traces",
            json={
                "transactionId": m["transactionId"],
                "partitionId": m["partitionId"],
                "traceNames": [name],
                "data": {"step": "invoiced"},
            },
        )
        assert recorded.status_code == 201
    shown = live.queen("traces", "message", m["partitionId"], m["transactionId"], "-o", "table")
    assert shown.code == 0 and '{"step":"invoiced"}' in shown.out
    by_name = json.loads(live.queen("traces", "name", name, "--json").out)
    assert [t["data"] for t in by_name["traces"]] == [{"step": "invoiced"}]
    assert name in live.queen("traces", "names", "--limit", "1000", "-o", "table").out
    # queenctl's words: by-name, by-message, list; -o json prints the rows
    rows = json.loads(live.queen("traces", "by-name", name, "-o", "json").out)
    assert [t["data"] for t in rows] == [{"step": "invoiced"}]
    rows = json.loads(
        live.queen("traces", "by-message", m["partitionId"], m["transactionId"], "-o", "json").out
    )
    assert [t["data"] for t in rows] == [{"step": "invoiced"}]
    names = json.loads(live.queen("traces", "list", "--limit", "1000", "-o", "json").out)
    assert name in {n["trace_name"] for n in names}


def test_a_broker_that_is_down_exits_2(live: LiveBroker) -> None:
    url = f"http://127.0.0.1:{closed_port()}"
    for args in (["status"], ["queues", "list"], ["push", "q", "1"], ["ping"]):
        run = live.queen(*args, url=url)
        assert run.code == 2, (args, run.err)
        assert run.out == ""
        [line] = run.err.splitlines()
        assert line.startswith(f"queen: broker unreachable at {url}: connection refused")


def test_a_refused_token_exits_3_and_names_the_role(live: LiveBroker) -> None:
    queue = new_queue()
    assert live.queen("push", queue, "1").code == 0
    reader = token("read")
    delete = live.queen("queues", "delete", queue, "--yes", token=reader)
    assert delete.code == 3
    assert delete.err.strip() == (
        f"queen: permission refused for DELETE /api/v1/resources/queues/{queue}: "
        "the route needs the role admin, and the token does not hold it"
    )
    assert live.queen("queues", "describe", queue, token=reader).code == 0  # not deleted
    push = live.queen("push", queue, "2", token=reader)
    assert push.code == 3 and "the role write" in push.err
    anonymous = live.queen("queues", "list", token=None)
    assert anonymous.code == 3
    assert "authentication refused" in anonymous.err and "QUEEN_TOKEN" in anonymous.err
    forged = live.queen("queues", "list", token="not-a-jwt")
    assert forged.code == 3


def test_usage_errors_exit_1(live: LiveBroker) -> None:
    assert live.queen("no-such-command").code == 1
    assert live.queen("status", "--no-such-flag").code == 1
    assert live.queen("ack", "1", "tx").code == 1  # a lease id is missing
    bad_url = live.queen("status", url="ftp://example")
    assert bad_url.code == 1 and "http://" in bad_url.err
    assert live.queen("pop", "q", "--batch", "0").code == 1
    bad_output = live.queen("queues", "list", "-o", "xml")
    assert bad_output.code == 1 and "unknown output format" in bad_output.err
    assert live.queen("pop", "q", "--wait", "soon").code == 1
    assert live.queen("seek", "g", "q", "--to", "yesterday-ish").code == 1


# --- queenctl in our place: exit statuses, environment, output -------------------------------


def test_exit_statuses_mean_what_they_mean_to_queenctl(live: LiveBroker) -> None:
    """0 ok, 1 usage, 2 the broker failed or is unreachable, 3 authentication, 4 nothing to
    do; 5 (ours) items refused."""
    queue = new_queue()
    assert live.queen("push", queue, "1").code == 0  # 0
    assert live.queen("pop", queue, "--no-such-flag").code == 1  # usage
    assert live.queen("queues", "describe", new_queue()).code == 2  # not found
    assert live.queen("ping", url=f"http://127.0.0.1:{closed_port()}").code == 2  # unreachable
    assert live.queen("pop", queue, token=None).code == 3  # authentication
    [m] = json_lines(live.queen("pop", queue).out)
    assert live.queen("pop", queue).code == 4  # nothing to pop
    assert live.queen("push", queue, stdin="").code == 4  # nothing to push
    assert live.queen("ack", m["partitionId"], m["transactionId"], m["leaseId"]).code == 0
    stale = live.queen("ack", m["partitionId"], m["transactionId"], m["leaseId"])
    assert (stale.code, stale.out.strip()) == (5, "ack failed: Invalid or expired lease")


def test_pop_of_an_unknown_queue_exits_2(live: LiveBroker) -> None:
    unknown = live.queen("pop", new_queue())
    assert unknown.code == 2
    assert unknown.err.strip().endswith("not found")
    known_but_empty = new_queue()
    assert live.queen("queues", "configure", known_but_empty).code == 0
    assert live.queen("pop", known_but_empty).code == 4


def test_queen_server_is_read_after_queen_url(live: LiveBroker) -> None:
    closed = f"http://127.0.0.1:{closed_port()}"
    alone = live.queen("ping", env={"QUEEN_URL": "", "QUEEN_SERVER": live.url})
    assert alone.code == 0, alone.err
    url_wins = live.queen("ping", env={"QUEEN_SERVER": closed})  # QUEEN_URL is the broker
    assert url_wins.code == 0, url_wins.err
    server_second = live.queen("ping", url=closed, env={"QUEEN_SERVER": live.url})
    assert server_second.code == 2 and closed in server_second.err
    flag_wins = live.queen("--server", live.url, "ping", url=closed)
    assert flag_wins.code == 0, flag_wins.err
    after = live.queen("ping", "--server", live.url, url=closed)
    assert after.code == 0, after.err


def test_without_a_url_the_broker_is_found_at_queen_port(live: LiveBroker) -> None:
    """As inside the broker's container: QUEEN_PORT says where ``queen serve`` listens."""
    port = live.url.rsplit(":", 1)[1]
    beside = live.queen("ping", env={"QUEEN_URL": "", "QUEEN_PORT": port})
    assert beside.code == 0, beside.err
    elsewhere = live.queen("ping", env={"QUEEN_URL": "", "QUEEN_PORT": str(closed_port())})
    assert elsewhere.code == 2


def test_a_queenctl_context_names_the_broker_and_its_token(
    live: LiveBroker, tmp_path: Path
) -> None:
    queue = new_queue()
    assert live.queen("push", queue, "1").code == 0
    closed = f"http://127.0.0.1:{closed_port()}"
    secret = tmp_path / "token"
    secret.write_text(ADMIN + "\n")
    config = tmp_path / "config.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "current-context": "down",
                "contexts": [
                    {"name": "down", "server": closed},
                    {"name": "live", "server": live.url, "token-ref": f"file://{secret}"},
                    {"name": "vault", "server": live.url, "token-ref": "keychain://live"},
                ],
            }
        )
    )
    env = {"QUEEN_URL": "", "QUEEN_CONFIG": str(config)}
    current = live.queen("ping", token=None, env=env)
    assert current.code == 2 and closed in current.err  # current-context: the broker that is down
    chosen = live.queen("queues", "describe", queue, "--context", "live", token=None, env=env)
    assert chosen.code == 0, chosen.err  # its server and its token (from the file)
    by_env = live.queen(
        "queues", "describe", queue, token=None, env={**env, "QUEEN_CONTEXT": "live"}
    )
    assert by_env.code == 0, by_env.err
    env_server_wins = live.queen(
        "ping", "--context", "live", token=None, env={**env, "QUEEN_SERVER": closed}
    )
    assert env_server_wins.code == 2
    flag = live.queen(
        "--config", str(config), "--context", "live", "ping", token=None, env={"QUEEN_URL": ""}
    )
    assert flag.code == 0, flag.err
    vault = live.queen("queues", "list", "--context", "vault", token=None, env=env)
    assert vault.code == 3 and "keychain" in vault.err  # told why there was no token
    unknown = live.queen("ping", "--context", "nope", env=env)
    assert unknown.code == 1 and "'nope' is not in" in unknown.err


def test_output_formats(live: LiveBroker) -> None:
    queue = new_queue()
    assert live.queen("push", queue, "1", "2", "--partition", "a").code == 0
    args = ("queues", "list", "--limit", "1000")
    # in a pipe, without -o: JSON, queenctl's document (for a list: its rows)
    piped = json.loads(live.queen(*args).out)
    assert queue in {q["name"] for q in piped}
    names = [q["name"] for q in piped]
    assert [q["name"] for q in json.loads(live.queen(*args, "-o", "json").out)] == names
    lines = json_lines(live.queen(*args, "-o", "ndjson").out)
    assert [q["name"] for q in lines] == names
    assert [q["name"] for q in yaml.safe_load(live.queen(*args, "-o", "yaml").out)] == names
    index = names.index(queue)
    picked = live.queen(*args, f"-o=jsonpath=[{index}].name")
    assert picked.out == f"{queue}\n"
    counted = live.queen(*args, "-o", f"jsonpath=[{index}].messages.total")
    assert counted.out == "2\n"
    # --json: the broker's answer as it came (a page)
    assert queue in {q["name"] for q in json.loads(live.queen(*args, "--json").out)["queues"]}
    table = live.queen(*args, "-o", "table").out.splitlines()
    assert table[0].split()[0] == "queue" and any(line.startswith(queue) for line in table)
    bare = live.queen(*args, "-o", "wide", "--no-headers").out.splitlines()
    assert bare[0].split()[0] != "queue" and any(line.startswith(queue) for line in bare)
    # a command that acts prints its line in a pipe; its answer with -o json
    assert live.queen("queues", "configure", queue).out.strip() == f"configured {queue}"
    assert json.loads(live.queen("queues", "configure", queue, "-o", "json").out)["queue"] == queue
    assert live.queen("queues", "configure", queue, "-q").out == ""


def test_ping_and_version(live: LiveBroker) -> None:
    ping = live.queen("ping")
    assert ping.code == 0, ping.err
    row = json.loads(ping.out)
    assert (row["status"], row["database"]) == ("healthy", "connected")
    assert row["latency"].endswith("ms") or row["latency"].endswith("s")
    assert live.queen("ping", "-o", "table").out.split()[:4] == [
        "status",
        "database",
        "version",
        "latency",
    ]
    short = live.queen("version", "--short", url=f"http://127.0.0.1:{closed_port()}")
    assert short.code == 0 and short.out.startswith("queen ")  # no broker asked
    full = live.queen("version")
    assert full.code == 0, full.err
    lines = full.out.splitlines()
    assert lines[0].startswith("queen ") and "status    healthy" in lines


def test_queue_words_clear_and_stats(live: LiveBroker) -> None:
    queue = new_queue()
    flags = ("--lease-time", "45", "--retry-limit", "7", "--max-size", "10", "--priority", "2")
    configured = live.queen("queue", "configure", queue, *flags, "--encrypt", "-o", "json")
    options = json.loads(configured.out)["options"]
    assert (options["leaseTime"], options["retryLimit"], options["maxSize"]) == (45, 7, 10)
    assert (options["priority"], options["encryptionEnabled"]) == (2, True)
    assert live.queen("queue", "configure", queue).code == 0  # back to the defaults
    assert live.queen("push", queue, "1", "2", "3").code == 0
    assert queue in {
        q["name"] for q in json.loads(live.queen("queue", "ls", "--limit", "1000").out)
    }
    assert json.loads(live.queen("q", "get", queue).out)["name"] == queue
    stats = json.loads(live.queen("queue", "stats").out)
    assert queue in {q["name"] for q in stats["queues"]}

    unconfirmed = live.queen("queue", "clear", queue)
    assert unconfirmed.code == 1
    cleared = live.queen("queue", "clear", queue, "--yes")
    assert cleared.code == 0, cleared.err
    assert cleared.out.strip() == f"3 messages removed from {queue}"
    assert live.queen("pop", queue).code == 4
    assert json.loads(live.queen("queue", "describe", queue).out)["name"] == queue  # kept
    unknown = live.queen("queue", "clear", new_queue(), "--yes")
    assert unknown.code == 2 and "not found" in unknown.err
    assert live.queen("queue", "rm", queue, "--yes").code == 0


def test_groups_list_describe_delete(live: LiveBroker) -> None:
    queue = new_queue()
    assert live.queen("push", queue, "1", "2").code == 0
    assert live.queen("pop", queue, "--cg", "readers").code == 0
    listed = json.loads(live.queen("cg", "ls").out)
    mine = [g for g in listed if g["name"] == "readers" and g["queueName"] == queue]
    assert [g["lagMessages"] for g in mine] == [2]
    table = live.queen("groups", "list", "-o", "table").out
    assert any(line.split()[:2] == ["readers", queue] for line in table.splitlines())
    described = json.loads(live.queen("consumer-groups", "describe", "readers").out)
    assert [p["offsetLag"] for p in described[queue]["partitions"]] == [2]

    assert live.queen("cg", "delete", "readers").code == 1  # no --yes
    deleted = live.queen("cg", "delete", "readers", "--queue", queue, "--yes")
    assert deleted.code == 0, deleted.err
    assert deleted.out.strip() == f"deleted cg=readers on {queue}: 1 partitions"
    # its subscription record is kept (queenctl's default); --metadata deletes it too
    kept = json.loads(live.queen("cg", "ls").out)
    assert queue in {g["queueName"] for g in kept if g["name"] == "readers"}
    record = live.queen("group", "rm", "readers", "--queue", queue, "--metadata", "--yes")
    assert record.code == 0, record.err
    listed = json.loads(live.queen("cg", "ls").out)
    assert queue not in {g["queueName"] for g in listed if g["name"] == "readers"}
    again = live.queen("consumer-group", "delete", "readers", "--queue", queue, "--yes")
    assert again.code == 4  # nothing left to delete
    # the group's own lag and seek, in queenctl's words
    assert live.queen("cg", "lag", "--min-seconds", "100000").out.strip() == "[]"
    assert live.queen("cg", "seek", "readers", queue, "--to", "beginning").code == 0


def test_lease_extend(live: LiveBroker) -> None:
    """Needs ``POST /api/v1/lease/{leaseId}/extend``."""
    queue = new_queue()
    assert live.queen("queues", "configure", queue, "--lease-time", "30").code == 0
    assert live.queen("push", queue, "1").code == 0
    [m] = json_lines(live.queen("pop", queue).out)
    before = json.loads(live.queen("queue", "describe", queue).out)["partitions"][0]
    extended = live.queen("lease", "extend", m["leaseId"], "--seconds", "600")
    assert extended.code == 0, extended.err
    lease_id, arrow, until = extended.out.split()[1:]
    assert (lease_id, arrow) == (m["leaseId"], "->")
    after = json.loads(live.queen("queue", "describe", queue).out)["partitions"][0]
    assert after["leaseExpiresAt"] > before["leaseExpiresAt"]
    assert after["leaseExpiresAt"][:19] == until[:19]
    assert live.queen("ack", m["partitionId"], m["transactionId"], m["leaseId"]).code == 0
    stale = live.queen("lease", "extend", m["leaseId"])
    assert stale.code == 2 and "renew failed" in stale.err


def test_dlq_describe_and_drain(live: LiveBroker) -> None:
    queue = new_queue()
    dead = dead_letter(live, queue, [1, 2, 3])
    pid, tid = dead[0]["partitionId"], dead[0]["transactionId"]
    described = json.loads(live.queen("dlq", "describe", pid, tid).out)
    assert described["transactionId"] == tid
    assert json.loads(live.queen("dlq", "get", pid, tid).out)["transactionId"] == tid

    preview = live.queen("dlq", "drain", "--queue", queue, "--dry-run")
    assert preview.code == 0, preview.err
    assert preview.out.count("[dry-run] delete") == 3 and "processed=3 errors=0" in preview.out
    assert len(json.loads(live.queen("dlq", "ls", "--queue", queue).out)) == 3  # untouched
    assert live.queen("dlq", "drain", "--queue", queue).code == 1  # no --yes
    drained = live.queen("dlq", "drain", "--queue", queue, "--cg", "__QUEUE_MODE__", "--yes")
    assert (drained.code, drained.out.strip()) == (0, "processed=3 errors=0")
    assert json.loads(live.queen("dlq", "ls", "--queue", queue).out) == []
    with http(live) as client:
        assert client.get(f"/api/v1/messages/{pid}/{tid}").status_code == 404
    again = live.queen("dlq", "drain", "--queue", queue, "--yes")
    assert (again.code, again.out.strip()) == (4, "processed=0 errors=0")


def test_lag_min_seconds(live: LiveBroker) -> None:
    queue = new_queue()
    assert live.queen("push", queue, "1").code == 0
    assert live.queen("pop", queue, "--cg", "slow").code == 0
    far = live.queen("lag", "--queue", queue, "--min-seconds", "100000", "-o", "table")
    assert far.out.strip() == "no consumer group lag to show"
    assert json.loads(live.queen("lag", "--queue", queue, "--min-seconds", "100000").out) == []
    deadline = time.monotonic() + 20
    rows: list[dict[str, Any]] = []
    while not rows and time.monotonic() < deadline:  # until its message is a second old
        rows = json.loads(live.queen("lag", "--queue", queue, "--min-seconds", "1", "--json").out)
    assert [(r["consumerGroup"], r["offsetLag"]) for r in rows] == [("slow", 1)]
    lagging = json.loads(
        live.queen("lag", "--queue", queue, "--min-seconds", "1", "-o", "json").out
    )
    assert [(r["name"], r["partition"]) for r in lagging] == [("slow", "Default")]


def test_tail_reads_in_a_group_of_its_own(live: LiveBroker) -> None:
    """queenctl tails in its own consumer group: the queue's consumers (queue mode) must
    still get every message, not find their partitions leased by the tail."""
    queue = new_queue()
    assert live.queen("push", queue, "1", "2").code == 0
    tailed = live.queen("tail", queue, "-n", "2")
    assert tailed.code == 0, tailed.err
    consumers = json_lines(live.queen("pop", queue, "--batch", "10").out)
    assert [m["data"] for m in consumers] == [1, 2]  # nothing of theirs was taken
    seen = [(m["data"], m["consumerGroup"]) for m in json_lines(tailed.out)]
    assert seen == [(1, "queenctl-tail"), (2, "queenctl-tail")]
    # without --follow, tail stops after one batch (--batch)
    assert live.queen("push", queue, "3", "4", "5").code == 0
    one_batch = live.queen(
        "tail", queue, "--cg", "other", "--from", "all", "--batch", "2", "--auto-ack"
    )
    assert [m["data"] for m in json_lines(one_batch.out)] == [1, 2]
    followed = live.queen(
        "tail", queue, "--cg", "other", "-f", "--idle-millis", "500", "--auto-ack"
    )
    assert [m["data"] for m in json_lines(followed.out)] == [3, 4, 5]


def test_push_with_queenctl_flags(live: LiveBroker) -> None:
    queue = new_queue()
    data = live.queen("push", queue, "--data", '{"id": 1}', "--transaction-id", "tx-data")
    assert data.out.strip() == "queued=1 duplicate=0 failed=0", data.err
    keyed = live.queen(
        "push",
        queue,
        "--partition-key",
        "user.id",
        "--trace-id",
        "0198e4c2-0000-7000-8000-000000000001",
        stdin='{"user": {"id": 42}, "n": 1}\n{"user": {"id": "x"}, "n": 2}\n{"n": 3}\n',
    )
    assert keyed.out.strip() == "queued=3 duplicate=0 failed=0", keyed.err
    wrapped = live.queen(
        "push",
        queue,
        "--wrapped",
        stdin='{"data": {"n": 4}, "partition": "w", "transactionId": "tx-w"}\n',
    )
    assert wrapped.out.strip() == "queued=1 duplicate=0 failed=0", wrapped.err
    dry = live.queen("push", queue, "--dry-run", stdin="1\n2\n")
    assert (dry.code, dry.out.strip()) == (0, "queued=2 duplicate=0 failed=0")
    nothing = live.queen("push", queue, stdin="\n")
    assert (nothing.code, nothing.out.strip()) == (4, "queued=0 duplicate=0 failed=0")

    found = {}
    for partition in ("Default", "42", "x", "w"):
        for m in json_lines(live.queen("pop", queue, "--partition", partition, "-n", "10").out):
            tid = m["transactionId"]
            found[tid if tid.startswith("tx-") else m["data"]["n"]] = m["partition"]
    assert found == {"tx-data": "Default", 1: "42", 2: "x", 3: "Default", "tx-w": "w"}
    assert live.queen("push", queue, "--wrapped", "1").code == 1  # not an item


def test_pop_and_ack_with_queenctl_flags(live: LiveBroker) -> None:
    queue = new_queue()
    assert live.queen("push", queue, "1", "2", "3").code == 0
    two = json_lines(live.queen("pop", queue, "--cg", "c", "-n", "2").out)
    assert [(m["data"], m["consumerGroup"]) for m in two] == [(1, "c"), (2, "c")]
    m = two[0]
    one = live.queen(
        "ack",
        m["transactionId"],
        "--partition-id",
        m["partitionId"],
        "--lease-id",
        m["leaseId"],
        "--cg",
        "c",
    )
    assert (one.code, one.out.strip()) == (0, "ack ok"), one.err
    batch = live.queen(
        "ack", "--batch", "-", "--cg", "c", "--failed", stdin=json.dumps(two[1]) + "\n"
    )
    assert (batch.code, batch.out.strip()) == (0, "ok=1 failed=0"), batch.err
    # server-side ack: no lease, the message is consumed as it is handed out
    auto = json_lines(live.queen("pop", queue, "--auto-ack", "-n", "5").out)
    assert [msg["data"] for msg in auto] == [1, 2, 3] and all(not msg["leaseId"] for msg in auto)
    assert live.queen("pop", queue).code == 4
    # --wait: bare (10 s, or --timeout), a duration, false
    started = time.monotonic()
    waited = live.queen("pop", queue, "--wait", "0.6")
    assert waited.code == 4 and time.monotonic() - started >= 0.6
    started = time.monotonic()
    bare = live.queen("pop", queue, "--timeout", "0.7s", "--wait")
    assert bare.code == 4 and time.monotonic() - started >= 0.7
    assert live.queen("pop", queue, "--wait=false").code == 4
    assert live.queen("pop", "--namespace", f"ns-{queue}").code == 4  # pop by namespace


def test_messages_partitions_namespaces_and_replay(live: LiveBroker) -> None:
    queue = new_queue()
    assert (
        live.queen("queues", "configure", queue, "--namespace", f"ns-{queue}", "--task", "t").code
        == 0
    )
    assert live.queen("push", queue, "1", "2", "--partition", "p").code == 0
    listed = json.loads(live.queen("msg", "ls", "--queue", queue).out)
    assert sorted(m["partition"] for m in listed) == ["p", "p"]
    pid, tid = listed[0]["partitionId"], listed[0]["transactionId"]
    assert json.loads(live.queen("messages", "get", pid, tid).out)["transactionId"] == tid
    assert json.loads(live.queen("msgs", "traces", pid, tid).out) == []
    assert live.queen("messages", "delete", pid, tid, "--yes").code == 0
    assert live.queen("messages", "get", pid, tid).code == 2

    parts = json.loads(live.queen("partition", "ls", queue).out)
    assert "p" in {p["name"] for p in parts}
    inside = json.loads(live.queen("p", "describe", queue, "p").out)
    assert len(inside["messages"]) == 1
    namespaces = json.loads(live.queen("namespace", "list").out)
    assert f"ns-{queue}" in {n["namespace"] for n in namespaces}
    assert "t" in {t["task"] for t in json.loads(live.queen("task", "ls").out)}
    ours = json.loads(live.queen("status", "--namespace", f"ns-{queue}").out)
    assert [r["queue"] for r in ours] == [queue] and ours[0]["pending"] >= 1
    # the queue table of status is that of queue stats, with the lag column after it
    shown = live.queen("status", "--namespace", f"ns-{queue}", "-o", "table").out.splitlines()
    with_lag = shown[shown.index("") + 1 :]
    stats = live.queen("queue", "stats", "--namespace", f"ns-{queue}", "-o", "table").out
    assert with_lag[0].split() == [*stats.splitlines()[0].split(), "lag"]
    assert with_lag[2].split()[:-1] == stats.splitlines()[2].split()

    # replay / partition seek: queenctl's words for seek, with its times
    [kept] = json_lines(live.queen("pop", queue, "--cg", "r", "--ack").out)
    assert live.queen("pop", queue, "--cg", "r").code == 4
    replayed = live.queen("replay", queue, "--cg", "r", "--to", "beginning")
    assert replayed.out.strip() == f"replayed cg=r queue={queue} to=beginning", replayed.err
    [again] = json_lines(live.queen("pop", queue, "--cg", "r").out)
    assert again["transactionId"] == kept["transactionId"]
    dry = live.queen("replay", queue, "--cg", "r", "--to", "15m ago", "--dry-run")
    assert dry.code == 0 and dry.out.startswith("[dry-run] would seek cg=r")
    to_end = live.queen("partition", "seek", queue, "p", "--cg", "r")
    assert to_end.out.strip() == f"seek cg=r queue={queue} partition=p to=end"


QUEENCTL_WORDS = (
    "ping",
    "version",
    "status",
    "lag",
    "push",
    "pop",
    "tail",
    "ack",
    "replay",
    "metrics",
    "queue list",
    "queue ls",
    "queues describe",
    "q get",
    "queue show",
    "queue configure",
    "queue delete",
    "queue rm",
    "queue stats",
    "queue clear",
    "partition list",
    "partitions ls",
    "p describe",
    "partition get",
    "partition show",
    "partition seek",
    "messages list",
    "msg ls",
    "msgs get",
    "messages describe",
    "messages show",
    "messages delete",
    "messages rm",
    "messages traces",
    "cg list",
    "cg ls",
    "consumer-group describe",
    "consumer-groups get",
    "cg show",
    "cg lag",
    "cg seek",
    "cg delete",
    "cg rm",
    "cg refresh-stats",
    "dlq list",
    "dlq ls",
    "dlq describe",
    "dlq get",
    "dlq drain",
    "dlq requeue",
    "namespace list",
    "namespaces ls",
    "ns list",
    "task list",
    "tasks ls",
    "maintenance get",
    "maint on",
    "maint off",
    "traces names",
    "traces list",
    "traces ls",
    "traces by-name",
    "traces by-message",
    "lease extend",
)


def test_every_queenctl_word_reaches_a_command() -> None:
    """queenctl's command words (its command tree, aliases included) each reach one of ours;
    our own words stay."""
    root = _commands()
    for words in (*QUEENCTL_WORDS, "queues list", "groups list", "maintenance status", "seek"):
        command: click.Command | None = root
        for word in words.split():
            assert isinstance(command, click.Group), words
            command = command.get_command(click.Context(command), word)
            assert command is not None, f"queen {words}: no command {word!r}"
        assert not isinstance(command, click.Group), f"queen {words} is a group"


def test_ctrl_c_while_waiting_exits_130_and_a_tail_0(tmp_path: Path) -> None:
    """Ctrl-C (SIGINT to the process group) during a long poll: ``pop`` stops with 130 and one
    line, ``tail`` (stopped by Ctrl-C as queenctl's is) with 0; no traceback either way. The
    "broker" is a socket that takes the request and never answers."""
    for args, expected in ((["pop", "q", "--wait", "30"], 130), (["tail", "q", "-f"], 0)):
        with socket.socket() as server:
            server.bind(("127.0.0.1", 0))
            server.listen()
            server.settimeout(30)
            url = f"http://127.0.0.1:{server.getsockname()[1]}"
            proc = subprocess.Popen(
                [sys.executable, "-m", "queen", *args],
                env={**environ(QUEEN_URL=url), "QUEEN_CONFIG": str(tmp_path / "none.yaml")},
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                start_new_session=True,
            )
            try:
                conn, _ = server.accept()
                with conn:
                    conn.settimeout(30)
                    assert conn.recv(65536).startswith(b"GET /api/v1/pop/queue/q?")
                    os.killpg(proc.pid, signal.SIGINT)
                    out, err = proc.communicate(timeout=30)
            finally:
                if proc.poll() is None:
                    proc.kill()
                    proc.communicate()
        assert proc.returncode == expected, (args, err)
        assert "Traceback" not in err, err
        assert out == ""
        if expected == 130:
            assert err.strip() == "queen: interrupted"


def test_status_says_why_the_spool_is_not_healthy(live: LiveBroker) -> None:
    """A broker whose spool cannot be written: ``queen status`` names the reason it reports."""
    problem = "spool write failed: No space left on device"
    answers = {
        "/health": {
            "status": "degraded",
            "database": "connected",
            "spool": {"healthy": False, "problem": problem, "pendingItems": 0, "files": 0},
            "loops": {},
        },
        "/api/v1/status": {"totals": {"queues": 0, "partitions": 0}, "messages": {}},
    }

    class Canned(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = json.dumps(answers.get(self.path.split("?")[0], {})).encode()
            self.send_response(200 if self.path.split("?")[0] in answers else 404)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Canned)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        shown = live.queen("status", "-o", "table", url=f"http://127.0.0.1:{server.server_port}")
    finally:
        server.shutdown()
        server.server_close()
    assert shown.code == 2, shown.err
    assert f"spool problem     {problem}" in shown.out
