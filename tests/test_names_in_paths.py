"""Queue, partition and group names holding ``/`` (or ``%``) in URL paths: push takes them (as
the original broker does), and every route that names a queue or a partition in its path
reaches them with the ``/`` sent as ``%2F``; the pop routes, one queue's resources and its
clear also take them unquoted, as the official clients send them. Through a real Hypercorn,
whose ``raw_path`` is what tells ``a%2Fb`` from ``a/b``."""

from __future__ import annotations

from collections.abc import AsyncIterator
from urllib.parse import quote

import httpx
import pytest
import trio

from queen.http.paths import routing_path, unescape
from queen.server import serve
from queen.settings import Settings
from tests.conftest import Db


def enc(name: str) -> str:
    return quote(name, safe="")


@pytest.fixture
async def http(settings: Settings) -> AsyncIterator[httpx.AsyncClient]:
    settings = settings.with_changes(host="127.0.0.1", port=0)
    async with trio.open_nursery() as nursery:
        port = await nursery.start(serve, settings)
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=30) as client:
            yield client
        nursery.cancel_scope.cancel()


async def push(http: httpx.AsyncClient, queue: str, partition: str, *txs: str) -> None:
    items = [
        {"queue": queue, "partition": partition, "transactionId": t, "payload": t} for t in txs
    ]
    resp = await http.post("/api/v1/push", json={"items": items})
    assert resp.status_code == 201, resp.text
    assert {r["queueName"] for r in resp.json()} == {queue}


async def popped(http: httpx.AsyncClient, path: str, group: str) -> list[str]:
    resp = await http.get(
        path,
        params={"batch": 10, "wait": "false", "consumerGroup": group, "autoAck": "true"},
    )
    assert resp.status_code in (200, 204), (path, resp.status_code, resp.text)
    return [] if resp.status_code == 204 else [m["data"] for m in resp.json()["messages"]]


async def held(db: Db, queue: str) -> int:
    return int(
        await db.value(
            """SELECT count(*) FROM queen.partitions p JOIN queen.queues q ON q.id = p.queue_id
               WHERE q.name = %s""",
            queue,
        )
    )


async def test_a_queue_with_slashes_is_pushed_popped_cleared_and_deleted(
    http: httpx.AsyncClient, db: Db, queue: str
) -> None:
    name, part = f"{queue}/eu/orders", "shop/42"
    await push(http, name, part, "a", "b")
    await push(http, name, "plain", "c")
    q, p = enc(name), enc(part)

    assert await popped(http, f"/api/v1/pop/queue/{q}/partition/{p}", "g1") == ["a", "b"]
    assert await popped(http, f"/api/v1/pop/queue/{q}", "g2") in (["a", "b"], ["c"])
    # unquoted, as the official clients send the pop path
    assert await popped(http, f"/api/v1/pop/queue/{name}/partition/{part}", "g3") == ["a", "b"]
    assert await popped(http, f"/api/v1/pop/queue/{name}/partition/plain", "g3") == ["c"]

    resources = await http.get(f"/api/v1/resources/queues/{q}")
    assert resources.status_code == 200 and resources.json()["name"] == name
    status = await http.get(f"/api/v1/status/queues/{q}")
    assert status.status_code == 200
    assert {x["name"] for x in status.json()["partitions"]} == {part, "plain"}
    listed = await http.get(f"/api/v1/status/queues/{q}/messages")
    assert sorted(m["transactionId"] for m in listed.json()) == ["a", "b", "c"]
    view = await http.get(f"/dashboard/view/queue/{q}")
    assert view.status_code == 200 and f'Queue <span class="mono">{name}</span>' in view.text
    # the page's own links and buttons name it as one segment
    assert f'data-action="/api/v1/queues/{q}/clear"' in view.text
    assert f'data-action="/api/v1/resources/queues/{q}"' in view.text
    assert f'href="#/messages?queue={q}&partition={p}"' in view.text

    seek = await http.post(
        f"/api/v1/consumer-groups/g1/queues/{q}/partitions/{p}/seek", json={"toEnd": True}
    )
    assert seek.status_code == 200 and seek.json()["partitionName"] == part
    seek = await http.post(f"/api/v1/consumer-groups/g1/queues/{q}/seek", json={"toEnd": True})
    assert seek.status_code == 200 and seek.json()["queueName"] == name
    gone = await http.delete(f"/api/v1/consumer-groups/g2/queues/{q}")
    assert gone.status_code == 200 and gone.json()["queueName"] == name

    cleared = await http.delete(f"/api/v1/queues/{q}/clear", params={"partition": part})
    assert cleared.status_code == 200, cleared.text
    assert await popped(http, f"/api/v1/pop/queue/{q}/partition/{p}", "g4") == []
    assert await popped(http, f"/api/v1/pop/queue/{q}/partition/plain", "g4") == ["c"]

    deleted = await http.delete(f"/api/v1/resources/queues/{q}")
    assert deleted.status_code == 200 and deleted.json() == {
        "deleted": True,
        "queue": name,
        "existed": True,
    }
    assert await held(db, name) == 0


async def test_an_encoded_slash_is_not_a_slash_nor_a_percent_sign(
    http: httpx.AsyncClient, queue: str
) -> None:
    slash, literal, percent = f"{queue}/x", f"{queue}%2Fx", f"{queue}%x"
    for name in (slash, literal, percent):
        await push(http, name, "Default", name)
    for name in (slash, literal, percent):
        assert await popped(http, f"/api/v1/pop/queue/{enc(name)}", "g") == [name]
    # unquoted, the slash separates segments: the first queue again
    await push(http, slash, "Default", "again")
    assert await popped(http, f"/api/v1/pop/queue/{slash}", "g") == ["again"]


async def test_a_partition_named_partition_is_reached_encoded(
    http: httpx.AsyncClient, queue: str
) -> None:
    name = f"{queue}/partition/x"
    await push(http, name, "partition", "one")
    assert await popped(http, f"/api/v1/pop/queue/{enc(name)}/partition/partition", "g") == ["one"]


def test_the_routing_path_keeps_what_was_encoded_inside_its_segment() -> None:
    assert routing_path("/a/b", b"/a/b") == "/a/b"
    assert routing_path("/q/a/b/c", b"/q/a%2Fb/c") == "/q/a%2Fb/c"
    assert routing_path("/q/a/b/c", b"/q/a%2fb/c") == "/q/a%2Fb/c"
    assert routing_path("/q/50%/x", b"/q/50%25/x") == "/q/50%25/x"
    assert routing_path("/q/é", b"/q/%C3%A9") == "/q/é"
    # a raw path that does not spell the decoded one: only the percent signs are kept
    assert routing_path("/q/a/b%", b"/q/a/b%") == "/q/a/b%25"
    assert routing_path("/q/a%2Fb", None) == "/q/a%252Fb"
    for value in ("a/b", "50%", "a%2Fb", "%25", "plain"):
        segment = value.replace("%", "%25").replace("/", "%2F")
        assert unescape(segment) == value
