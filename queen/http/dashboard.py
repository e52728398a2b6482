"""The dashboard (filled in below)."""

from __future__ import annotations

from quart import Blueprint

blueprint = Blueprint("dashboard", __name__)
