"""The dashboard's views as an operator reads them on big queues: a group's partitions sorted by
lag or by stuck state (the sort in the URL, checked), a queue's partitions filtered by name
with paging kept, the overview's lagging and stuck groups read in one statement, "processing"
counting the messages consumer groups hold leased, and views of 1,000 rows."""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import quote

import pytest

import queen.admin.groups
from queen.admin.groups import LAGGING_AFTER_S, GroupQuery
from queen.broker import Broker
from tests.conftest import Db
from tests.consuming import Api

ROW_PARTITION = re.compile(r'<td><a href="#/messages\?queue=[^"&]*&partition=([^"&]*)">')


def partitions_shown(html: str) -> list[str]:
    """The partitions of a view's table, in its order (one per row)."""
    return ROW_PARTITION.findall(html)


async def view(client: Any, path: str) -> tuple[int, str]:
    resp = await client.get(path)
    return resp.status_code, await resp.get_data(as_text=True)


def card(html: str, label: str) -> str:
    found = re.search(rf'<div class="k">{label}</div><div class="v[^"]*">([^<]*)</div>', html)
    assert found is not None, label
    return found.group(1)


async def cursors(db: Db, queue: str) -> list[tuple[Any, ...]]:
    return await db.rows(
        """SELECT c.consumer_group, c.partition_id, c.next_offset, c.lease_end,
                  c.lease_expires_at, c.delivered_at
           FROM queen.cursors c JOIN queen.queues q ON q.id = c.queue_id
           WHERE q.name = %s ORDER BY 1, 2""",
        queue,
    )


async def expire_group_leases(db: Db, group: str, queue: str) -> None:
    """The group's leases on the queue ran out three minutes ago (moved, not waited for)."""
    await db.rows(
        """UPDATE queen.cursors SET lease_expires_at = now() - interval '3 minutes'
           WHERE consumer_group = %s
             AND queue_id = (SELECT id FROM queen.queues WHERE name = %s) RETURNING 1""",
        group,
        queue,
    )


async def test_a_groups_partitions_sort_by_lag_and_by_stuck_state_named_in_the_url(
    api: Api, client: Any, db: Db, queue: str
) -> None:
    group = f"g-{queue}"  # groups are shared by the session's database
    await api.push(queue, "a", 1)
    await api.push(queue, "b", 1, 2, 3, 4)
    await api.push(queue, "c", 1, 2)
    await api.push(queue, "d", 1, 2, 3)
    assert len(await api.messages(queue, "d", batch=3, consumerGroup=group)) == 3
    await expire_group_leases(db, group, queue)  # d: its consumer went away holding all three
    page = f"/dashboard/view/group/{group}"

    status, html = await view(client, page)
    assert status == 200 and partitions_shown(html) == ["a", "b", "c", "d"]  # by name
    status, html = await view(client, f"{page}?sort=lag")
    assert status == 200 and partitions_shown(html) == ["b", "d", "c", "a"]  # most behind first
    status, html = await view(client, f"{page}?sort=stuck")
    assert status == 200 and partitions_shown(html) == ["d", "b", "c", "a"]  # stuck d first
    assert 'class="stuck"' in html and "lease expired" in html
    assert card(html, "stuck partitions") == "1"

    # the sort holds across pages (the whole queue is sorted, then paged), and the pager keeps it
    status, first = await view(client, f"{page}?sort=lag&limit=2")
    assert status == 200 and partitions_shown(first) == ["b", "d"]
    assert f"#/group/{group}?offset=2&limit=2&amp;sort=lag" in first
    status, second = await view(client, f"{page}?sort=lag&limit=2&offset=2")
    assert status == 200 and partitions_shown(second) == ["c", "a"]

    # the API reads the same sort
    status, detail = await api.get(f"/api/v1/consumer-groups/{group}?sort=stuck")
    assert status == 200
    assert [p["partition"] for p in detail[queue]["partitions"]] == ["d", "b", "c", "a"]

    # a sort not known: 400, nothing changed
    before = await cursors(db, queue)
    for bad in ("bogus", "lag;drop", "name%00"):
        status, said = await view(client, f"{page}?sort={bad}")
        assert status == 400, bad
        assert "sort must be one of name, lag, stuck" in said or "NUL" in said
    status, _ = await api.get(f"/api/v1/consumer-groups/{group}?sort=oldest")
    assert status == 400
    assert await cursors(db, queue) == before


async def test_the_queue_page_filters_partitions_by_name_and_keeps_paging(
    api: Api, client: Any, queue: str
) -> None:
    for name in ("alpha-1", "alpha-2", "Beta-ALPHA", "gamma"):
        await api.push(queue, name, 1)
    page = f"/dashboard/view/queue/{queue}"

    status, html = await view(client, f"{page}?partition=alpha")
    assert status == 200
    assert partitions_shown(html) == ["Beta-ALPHA", "alpha-1", "alpha-2"]  # any case, name order
    assert 'name="partition" value="alpha"' in html
    status, html = await view(client, f"{page}?partition=nothing-like-it")
    assert status == 200 and partitions_shown(html) == []
    assert "No partition name holds" in html

    # paging keeps the filter (and the sort): the pager's and the sort links carry them
    status, first = await view(client, f"{page}?partition=alpha&limit=2&sort=name")
    assert status == 200 and partitions_shown(first) == ["Beta-ALPHA", "alpha-1"]
    assert "offset=2&limit=2&amp;sort=name&amp;partition=alpha" in first
    assert f"#/queue/{queue}?sort=pending&limit=2&amp;partition=alpha" in first
    status, second = await view(client, f"{page}?partition=alpha&limit=2&offset=2")
    assert status == 200 and partitions_shown(second) == ["alpha-2"]

    # the status route reads the same filter
    status, body = await api.get(f"/api/v1/status/queues/{queue}?partition=ALPHA-")
    assert status == 200 and [p["name"] for p in body["partitions"]] == ["alpha-1", "alpha-2"]

    # a filter no name could hold: 400
    for bad in ("%00", quote("x" * 256), "a%01b"):
        status, said = await view(client, f"{page}?partition={bad}")
        assert status == 400, bad
        assert "partition" in said
    status, html = await view(client, f"{page}?partition={quote('x' * 255)}")
    assert status == 200 and partitions_shown(html) == []


async def test_the_overview_lists_lagging_and_stuck_groups_from_one_read(
    api: Api,
    client: Any,
    broker: Broker,
    db: Db,
    queue: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    stuck_group, lagging_group = f"gs-{queue}", f"gl-{queue}"
    for n in range(3):  # three partitions whose consumer went away holding their messages
        await api.push(queue, f"s{n}", 1)
        assert len(await api.messages(queue, f"s{n}", consumerGroup=stuck_group)) == 1
    await expire_group_leases(db, stuck_group, queue)
    other = f"{queue}-late"
    await api.push(other, "x", 1, 2)
    [m] = await api.messages(other, "x", batch=1, consumerGroup=lagging_group)
    await api.ack(m, group=lagging_group)
    await db.rows(  # the message it has still to receive was stored an hour ago
        """UPDATE queen.segments SET created_at = now() - interval '1 hour'
           WHERE partition_id = (SELECT p.id FROM queen.partitions p
                                 JOIN queen.queues q ON q.id = p.queue_id
                                 WHERE q.name = %s) RETURNING 1""",
        other,
    )
    # what the groups list says of every (group, queue) pair, read pair by pair
    every = await broker.admin.consumer_groups.standings(GroupQuery())
    lagging = sum(1 for g in every if g.max_time_lag_s > LAGGING_AFTER_S)
    stuck = sum(1 for g in every if g.stuck > 0)
    mine = {(g.name, g.queue): g for g in every}
    assert mine[stuck_group, queue].stuck == 3
    assert mine[lagging_group, other].stuck == 0
    assert mine[lagging_group, other].max_time_lag_s > LAGGING_AFTER_S

    # the overview reads them in one statement, never group by group
    store = broker.admin.consumer_groups.store
    reads: list[str] = []
    real_alerts = store.group_alerts

    async def group_alerts(**kwargs: Any) -> Any:
        reads.append("group_alerts")
        return await real_alerts(**kwargs)

    async def per_group(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("the overview read a group on its own")

    monkeypatch.setattr(store, "group_alerts", group_alerts)
    monkeypatch.setattr(store, "groups", per_group)
    monkeypatch.setattr(store, "group_partitions", per_group)
    # (the session's database holds other tests' groups: list them all)
    monkeypatch.setattr(queen.admin.groups, "ALERTS_SHOWN", 1000)
    status, html = await view(client, "/dashboard/view/overview")
    assert status == 200
    assert reads == ["group_alerts"]
    assert card(html, "lagging groups") == f"{lagging:,}"
    assert card(html, "stuck groups") == f"{stuck:,}"
    assert f'href="#/group/{stuck_group}?sort=stuck"' in html
    assert f'href="#/group/{lagging_group}?sort=lag"' in html
    alerts = html[html.index('<table id="group-alerts">') :]
    alerts = alerts[: alerts.index("</table>")]
    # stuck pairs first (the most stuck partitions first)
    assert alerts.index(stuck_group) < alerts.index(lagging_group)


async def test_processing_counts_the_messages_a_group_holds_leased(
    api: Api, client: Any, db: Db, queue: str
) -> None:
    group = f"g-{queue}"
    await api.push(queue, "p", 1, 2, 3, 4, 5)
    assert len(await api.messages(queue, "p", batch=3, consumerGroup=group)) == 3
    leased = await db.value(
        """SELECT sum(c.lease_end - c.next_offset) FROM queen.cursors c
           JOIN queen.queues q ON q.id = c.queue_id
           WHERE q.name = %s AND c.consumer_group = %s AND c.lease_expires_at > now()""",
        queue,
        group,
    )
    assert leased == 3  # the group's lease, in its cursor
    # queue mode holds none of them: the figure is the group's
    figures = await db.rows(
        """SELECT s.processing, s.most_processing FROM queen.admin_partition_stats(
               ARRAY(SELECT id FROM queen.queues WHERE name = %s)) s""",
        queue,
    )
    assert figures == [(0, 3)]
    status, html = await view(client, f"/dashboard/view/queue/{queue}")
    assert status == 200 and card(html, "processing") == "3"
    assert card(html, "pending") == "2"  # the overview's figure: the leased ones are not in it
    row = re.search(r'partition=p">p</a></td>(.*?)</tr>', html, re.S)
    assert row is not None
    cells = re.findall(r'<td class="n">([^<]*)</td>', row.group(1))
    assert cells[3:5] == ["2", "3"]  # low, next, cursor, pending, processing
    status, html = await view(client, f"/dashboard/view/overview?search={queue}")
    queue_row = re.search(rf">{queue}</a></td>(.*?)</tr>", html, re.S)
    assert queue_row is not None
    figures_shown = re.findall(r'<td class="n">([^<]*)</td>', queue_row.group(1))
    assert figures_shown[:4] == ["1", "5", "2", "3"]  # partitions, held, pending, processing


async def test_a_thousand_rows_come_whole_and_in_order(api: Api, client: Any, queue: str) -> None:
    names = [f"p{n:04d}" for n in range(1000)]
    deep = names[::100]  # ten partitions further behind than the rest
    items = [{"queue": queue, "partition": name, "payload": 1} for name in names]
    items += [{"queue": queue, "partition": name, "payload": k} for name in deep for k in range(5)]
    status, body = await api.post("/api/v1/push", {"items": items})
    assert status == 201, body
    group = f"g-{queue}"
    for m in await api.messages(queue, "p0999", consumerGroup=group):
        await api.ack(m, group=group)  # caught up on p0999: lag 0 there

    status, html = await view(client, f"/dashboard/view/group/{group}?sort=lag&limit=1000")
    assert status == 200
    shown = partitions_shown(html)
    assert len(shown) == 1000
    assert shown[:10] == deep  # six behind each, in name order
    rest = [n for n in names if n not in deep]
    assert shown[10:] == [n for n in rest if n != "p0999"] + ["p0999"]  # p0999: nothing due

    status, html = await view(client, f"/dashboard/view/queue/{queue}?sort=pending&limit=1000")
    assert status == 200
    shown = partitions_shown(html)
    assert len(shown) == 1000 and shown[:10] == deep
    assert card(html, "partitions") == "1,000"
    # (the session's database is shared: its thousand lagging partitions would crowd the lists
    # other tests read)
    status, _ = await api.delete(f"/api/v1/resources/queues/{queue}")
    assert status == 200
