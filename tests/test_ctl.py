"""The ``queen`` operator commands against a live broker, run as a user runs them: output,
``--json`` and exit statuses (0 ok, 1 failed, 2 usage, 3 unreachable, 4 refused)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.ctl_env import ADMIN, LiveBroker, closed_port, json_lines, new_queue, start_broker, token

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


def test_push_pop_ack_round_trip(live: LiveBroker) -> None:
    queue = new_queue()
    pushed = live.queen("push", queue, '{"n": 1}', '"two"', "--partition", "p1")
    assert pushed.code == 0, pushed.err
    assert pushed.out.strip() == f"pushed 2 items to {queue}: 2 queued"
    piped = live.queen("push", queue, "--partition", "p1", "--json", stdin='{"n": 3}\n\n[4]\n')
    assert piped.code == 0
    assert [r["status"] for r in json.loads(piped.out)] == ["queued", "queued"]

    popped = live.queen("pop", queue, "--batch", "10")
    assert popped.code == 0, popped.err
    messages = json_lines(popped.out)
    assert [m["data"] for m in messages] == [{"n": 1}, "two", {"n": 3}, [4]]
    assert {m["partition"] for m in messages} == {"p1"}

    acked = live.queen("ack", stdin=popped.out)
    assert acked.code == 0, acked.err
    assert acked.out.count("yes") == 4
    again = live.queen("ack", stdin=popped.out)  # the lease is gone: refused, exit 1
    assert again.code == 1
    assert "Invalid or expired lease" in again.out

    described = json.loads(live.queen("queues", "describe", queue, "--json").out)
    assert described["totals"]["completed"] == 4
    assert described["totals"]["pending"] == 0
    assert live.queen("pop", queue).out == ""  # nothing left: no output, exit 0


def test_push_of_a_bad_line_pushes_nothing(live: LiveBroker) -> None:
    queue = new_queue()
    run = live.queen("push", queue, stdin='{"n": 1}\nnot json\n')
    assert run.code == 2
    assert run.err.startswith("queen: stdin line 2 is not JSON")
    assert run.out == ""
    missing = live.queen("queues", "describe", queue)
    assert missing.code == 1
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
    assert f"pushed 2 items to {queue}: 1 duplicate, 1 queued" in run.out
    assert "t-1" in run.out  # the duplicate is listed
    not_an_item = live.queen("push", queue, "--items", "1")
    assert not_an_item.code == 2 and "payload" in not_an_item.err


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
    table = live.queen("lag", "--group", "behind", "--queue", queue).out.splitlines()
    assert [line.split()[2] for line in table[2:]] == ["big", "middle", "small"]
    assert table[0].split()[:4] == ["group", "queue", "partition", "lag"]
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
    listed = live.queen("queues", "list", "--limit", "1000")
    assert any(line.split()[0] == queue for line in listed.out.splitlines())
    assert live.queen("queues", "describe", queue).out.startswith(f"queue             {queue}")
    bad = live.queen("queues", "configure", queue, "--set", "leaseTime")
    assert bad.code == 2 and "OPTION=VALUE" in bad.err

    unconfirmed = live.queen("queues", "delete", queue)  # stdin is not a terminal
    assert unconfirmed.code == 2
    assert "--yes" in unconfirmed.err
    assert live.queen("queues", "describe", queue).code == 0  # still there
    deleted = live.queen("queues", "delete", queue, "--yes")
    assert (deleted.code, deleted.out.strip()) == (0, f"deleted queue {queue}")
    assert live.queen("queues", "delete", queue, "--yes").code == 1  # no such queue now


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
    assert both.code == 2
    unknown = live.queen("seek", "replay", new_queue(), "--to-end")
    assert unknown.code == 1 and "404" in unknown.err


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
    table = live.queen("dlq", "list", "--queue", queue).out
    assert message["transactionId"] in table and "boom" in table
    before = live.queen("dlq", "list", "--queue", queue, "--to", "2000-01-01T00:00:00Z", "--json")
    assert json.loads(before.out)["messages"] == []

    pid, tid = message["partitionId"], message["transactionId"]
    assert live.queen("dlq", "delete", pid, tid).code == 2  # no --yes, no terminal
    deleted = live.queen("dlq", "delete", pid, tid, "--yes")
    assert deleted.code == 0, deleted.err
    with http(live) as client:
        assert client.get(f"/api/v1/messages/{pid}/{tid}").status_code == 404
    assert json.loads(live.queen("dlq", "list", "--queue", queue, "--json").out)["messages"] == []
    gone = live.queen("dlq", "delete", pid, tid, "--yes")
    assert gone.code == 1 and "404" in gone.err


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
    assert twice.code == 1


def test_dlq_retry_a_queue(live: LiveBroker) -> None:
    """Needs ``POST /api/v1/dlq/retry``."""
    queue = new_queue()
    dead = dead_letter(live, queue, [1, 2])
    too_old = live.queen("dlq", "retry", "--queue", queue, "--to", "2000-01-01T00:00:00Z")
    assert (too_old.code, too_old.out.strip()) == (1, f"retried 0 dead letters of {queue}")
    retried = live.queen("dlq", "retry", "--queue", queue)
    assert retried.code == 0, retried.err
    assert retried.out.strip() == f"retried 2 dead letters of {queue}"
    again = json_lines(live.queen("pop", queue, "--batch", "10").out)
    assert sorted(m["transactionId"] for m in again) == sorted(m["transactionId"] for m in dead)
    nothing = live.queen("dlq", "retry", "--queue", queue)
    assert nothing.code == 1
    mixed = live.queen("dlq", "retry", "1", "x", "--queue", queue)
    assert mixed.code == 2


def test_maintenance_on_status_off(live: LiveBroker) -> None:
    try:
        on = live.queen("maintenance", "on", "--both")
        assert on.code == 0, on.err
        assert on.out.splitlines() == ["push maintenance on", "pop maintenance on"]
        state = json.loads(live.queen("maintenance", "status", "--json").out)
        assert state["push"]["maintenanceMode"] is True
        assert state["pop"]["popMaintenanceMode"] is True
    finally:
        off = live.queen("maintenance", "off", "--both")
    assert off.code == 0
    status = live.queen("maintenance", "status").out.splitlines()
    assert status[:2] == ["push maintenance  off", "pop maintenance   off"]
    assert live.queen("maintenance", "on", "--pop", "--both").code == 2


def test_status_metrics_and_traces(live: LiveBroker) -> None:
    status = live.queen("status")
    assert status.code == 0, status.err
    assert "status            healthy" in status.out
    both = json.loads(live.queen("--json", "status").out)
    assert both["health"]["database"] == "connected"
    totals = both["status"]["totals"]
    assert f"queues            {totals['queues']} ({totals['partitions']} partitions)" in status.out
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
    shown = live.queen("traces", "message", m["partitionId"], m["transactionId"])
    assert shown.code == 0 and '{"step":"invoiced"}' in shown.out
    by_name = json.loads(live.queen("traces", "name", name, "--json").out)
    assert [t["data"] for t in by_name["traces"]] == [{"step": "invoiced"}]
    assert name in live.queen("traces", "names", "--limit", "1000").out


def test_a_broker_that_is_down_exits_3(live: LiveBroker) -> None:
    url = f"http://127.0.0.1:{closed_port()}"
    for args in (["status"], ["queues", "list"], ["push", "q", "1"]):
        run = live.queen(*args, url=url)
        assert run.code == 3, (args, run.err)
        assert run.out == ""
        [line] = run.err.splitlines()
        assert line.startswith(f"queen: broker unreachable at {url}: connection refused")


def test_a_refused_token_exits_4_and_names_the_role(live: LiveBroker) -> None:
    queue = new_queue()
    assert live.queen("push", queue, "1").code == 0
    reader = token("read")
    delete = live.queen("queues", "delete", queue, "--yes", token=reader)
    assert delete.code == 4
    assert delete.err.strip() == (
        f"queen: permission refused for DELETE /api/v1/resources/queues/{queue}: "
        "the route needs the role admin, and the token does not hold it"
    )
    assert live.queen("queues", "describe", queue, token=reader).code == 0  # not deleted
    push = live.queen("push", queue, "2", token=reader)
    assert push.code == 4 and "the role write" in push.err
    anonymous = live.queen("queues", "list", token=None)
    assert anonymous.code == 4
    assert "authentication refused" in anonymous.err and "QUEEN_TOKEN" in anonymous.err
    forged = live.queen("queues", "list", token="not-a-jwt")
    assert forged.code == 4


def test_usage_errors_exit_2(live: LiveBroker) -> None:
    assert live.queen("no-such-command").code == 2
    assert live.queen("ack", "1", "tx").code == 2  # a lease id is missing
    bad_url = live.queen("status", url="ftp://example")
    assert bad_url.code == 2 and "http://" in bad_url.err
    assert live.queen("pop", "q", "--batch", "0").code == 2
