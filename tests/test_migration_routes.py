"""The original dashboard's Migration page: its status route says nothing runs, and each action
answers 501 with a message naming ``queen import`` (the page shows it), changing nothing."""

from __future__ import annotations

from typing import Any

import pytest

from queen.auth import build_gate
from queen.broker import Broker
from queen.http.app import create_app
from tests.jwt_tools import SECRET, claims, hs256

TARGET = {"host": "db", "port": "5432", "database": "queen", "user": "u", "password": "p"}


async def test_the_status_is_idle_and_says_why(client: Any) -> None:
    resp = await client.get("/api/v1/migration/status")
    assert resp.status_code == 200
    body = await resp.get_json()
    assert body["status"] == "idle"
    assert body["currentStep"] == "" and body["elapsedSeconds"] == 0
    assert body["supported"] is False
    assert "queen import" in body["message"]


@pytest.mark.parametrize("action", ["test-connection", "start", "validate", "reset"])
async def test_every_action_is_501_naming_queen_import(client: Any, action: str) -> None:
    resp = await client.post(f"/api/v1/migration/{action}", json=TARGET)
    assert resp.status_code == 501
    body = await resp.get_json()
    assert "queen import" in body["error"]
    assert body["supported"] is False
    after = await (await client.get("/api/v1/migration/status")).get_json()
    assert after["status"] == "idle"


async def test_the_routes_need_the_admin_role(broker: Broker) -> None:
    gate = build_gate(broker.settings.with_changes(jwt_enabled=True, jwt_secret=SECRET))
    app = create_app(broker, gate=gate).test_client()
    reader = {"Authorization": f"Bearer {hs256(claims(roles=['read']))}"}
    admin = {"Authorization": f"Bearer {hs256(claims(roles=['admin']))}"}
    assert (await app.get("/api/v1/migration/status", headers=reader)).status_code == 403
    assert (await app.get("/api/v1/migration/status", headers=admin)).status_code == 200
    refused = await app.post("/api/v1/migration/start", json=TARGET, headers=reader)
    assert refused.status_code == 403
    assert (
        await app.post("/api/v1/migration/start", json=TARGET, headers=admin)
    ).status_code == 501
