"""The app's URL map: every route is reached by its own paths, and no rule (a multi-segment
placeholder in particular) matches a path that belongs to another rule of the same method."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import Any

from werkzeug.exceptions import HTTPException
from werkzeug.routing import Map, Rule

from queen.broker import Broker
from queen.http.app import create_app

# Values tried for every placeholder: plain, numeric, the literal words of the routes, (for
# placeholders that span segments) a value holding a slash, and one holding an encoded slash
# as the app routes it (queen.http.paths).
SAMPLES = (
    "x",
    "1",
    "queues",
    "seek",
    "subscription",
    "partitions",
    "partition",
    "clear",
    "messages",
    "by-name",
    "names",
    "a/b",
    "a%2Fb",
)
VERBS = ("GET", "POST", "PUT", "PATCH", "DELETE")


def _alone(rule: Rule, converters: Any) -> Any:
    """An adapter over a map holding only ``rule``."""
    only = Map([Rule(rule.rule, endpoint="only", methods=rule.methods)], converters=converters)
    return only.bind("localhost")


def _matches(adapter: Any, path: str, method: str) -> bool:
    try:
        adapter.match(path, method=method)
    except HTTPException:
        return False
    return True


def _own_paths(rule: Rule, method: str, converters: Any) -> Iterator[str]:
    """Concrete paths ``rule`` itself matches, built from every combination of samples."""
    alone = _alone(rule, converters)
    names = sorted(rule.arguments)
    for combo in itertools.product(SAMPLES, repeat=len(names)):
        path = rule.rule
        for name, value in zip(names, combo, strict=True):
            path = _replace(path, name, value)
        if _matches(alone, path, method):
            yield path


def _replace(rule_text: str, name: str, value: str) -> str:
    start = rule_text.index("<")
    while True:
        end = rule_text.index(">", start)
        inner = rule_text[start + 1 : end]
        if inner.split(":")[-1] == name:
            return rule_text[:start] + value + rule_text[end + 1 :]
        start = rule_text.index("<", end)


def _routes(broker: Broker) -> tuple[Any, list[tuple[str, Rule]]]:
    app = create_app(broker)
    pairs = [
        (method, rule)
        for rule in app.url_map.iter_rules()
        for method in sorted(rule.methods or ())
        if method in VERBS
    ]
    return app, pairs


async def test_every_route_is_reached_by_its_own_paths(broker: Broker) -> None:
    app, pairs = _routes(broker)
    adapter = app.url_map.bind("localhost")
    checked = 0
    for method, rule in pairs:
        paths = list(_own_paths(rule, method, app.url_map.converters))
        assert paths, f"no sample path reaches {method} {rule.rule}"
        for path in paths:
            reached, _ = adapter.match(path, method=method, return_rule=True)
            assert reached is rule, f"{method} {path} reaches {reached.rule}, not {rule.rule}"
            checked += 1
    assert checked > len(pairs)


async def test_no_rule_matches_another_rules_path(broker: Broker) -> None:
    app, pairs = _routes(broker)
    converters = app.url_map.converters
    captured = []
    for (method, rule), (other_method, other) in itertools.permutations(pairs, 2):
        if method != other_method or rule is other:
            continue
        alone = _alone(rule, converters)
        for path in _own_paths(other, method, converters):
            if _matches(alone, path, method):
                captured.append(f"{method} {rule.rule} matches {path} of {other.rule}")
    assert captured == []


async def test_a_group_named_with_slashes_is_still_one_group(broker: Broker) -> None:
    app = create_app(broker)
    adapter = app.url_map.bind("localhost")
    endpoint, args = adapter.match("/api/v1/consumer-groups/team/billing", method="DELETE")
    assert (endpoint, args) == ("groups.delete_consumer_group", {"group": "team/billing"})
    endpoint, args = adapter.match(
        "/api/v1/consumer-groups/team/billing/queues/orders", method="DELETE"
    )
    assert endpoint == "groups.delete_consumer_group_on_queue"
    assert args == {"group": "team/billing", "queue": "orders"}
    endpoint, args = adapter.match("/api/v1/traces/by-name/a/b", method="GET")
    assert (endpoint, args) == ("traces.traces_by_name", {"name": "a/b"})
    endpoint, args = adapter.match("/api/v1/traces/12/tx/with/slashes", method="GET")
    assert args == {"partition_id": 12, "transaction_id": "tx/with/slashes"}


async def test_names_with_slashes_reach_their_routes(broker: Broker) -> None:
    """Encoded (``%2F``, kept in its segment by queen.http.paths) everywhere; unquoted where
    the official clients send it so."""
    adapter = create_app(broker).url_map.bind("localhost")

    def match(path: str, method: str = "GET") -> tuple[str, dict[str, Any]]:
        endpoint, args = adapter.match(path, method=method)
        return str(endpoint), args

    assert match("/api/v1/pop/queue/a/b/partition/p/q") == (
        "consume.pop_partition",
        {"queue": "a/b", "partition": "p/q"},
    )
    assert match("/api/v1/pop/queue/a%2Fpartition%2Fb") == (
        "consume.pop_queue",
        {"queue": "a/partition/b"},
    )
    assert match("/api/v1/queues/a/clear/clear", "DELETE") == (
        "admin_api.clear_queue",
        {"queue": "a/clear"},
    )
    assert match("/api/v1/status/queues/a%2Fmessages") == (
        "admin_api.status_queue",
        {"queue": "a/messages"},
    )
    assert match("/api/v1/status/queues/a%2Fb/messages") == (
        "admin_api.status_queue_messages",
        {"queue": "a/b"},
    )
    assert match("/api/v1/consumer-groups/g%2Fqueues%2Fx/queues/a%2Fb", "DELETE") == (
        "groups.delete_consumer_group_on_queue",
        {"group": "g/queues/x", "queue": "a/b"},
    )
    assert match("/api/v1/messages/7/tx%2F1%252F") == (
        "admin_api.message",
        {"partition_id": "7", "transaction_id": "tx/1%2F"},
    )
