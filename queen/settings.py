"""Broker settings: one frozen dataclass, read from the environment and the command line.

Every field carries its environment variable, its default and a help line in its metadata, so
``queen serve --help`` and :func:`Settings.from_env` cannot drift apart. Units are in the names
(``_s`` seconds, ``_ms`` milliseconds, ``_bytes``).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

_ENV = "env"
_HELP = "help"


def _setting(default: Any, env: str, help: str) -> Any:
    return field(default=default, metadata={_ENV: env, _HELP: help})


@dataclass(frozen=True, slots=True)
class Settings:
    """Everything the broker can be told. Defaults are the production defaults."""

    host: str = _setting("0.0.0.0", "QUEEN_HOST", "address the HTTP server listens on")
    port: int = _setting(6632, "QUEEN_PORT", "TCP port the HTTP server listens on")
    workers: int = _setting(
        1, "QUEEN_WORKERS", "broker processes sharing the port (each one is a full broker)"
    )
    database_url: str | None = _setting(
        None,
        "DATABASE_URL",
        "PostgreSQL connection URL; when unset an embedded PostgreSQL is started",
    )
    pg_data_dir: str = _setting(
        ".queen/pgdata",
        "QUEEN_PG_DATA_DIR",
        "data directory of the embedded PostgreSQL (used only without DATABASE_URL)",
    )
    file_buffer_dir: str = _setting(
        "/var/lib/queen/buffers",
        "FILE_BUFFER_DIR",
        "spool directory: pushes that cannot reach PostgreSQL are kept here",
    )
    max_body_bytes: int = _setting(
        64 * 1024 * 1024, "QUEEN_MAX_BODY_BYTES", "largest accepted request body (413 above)"
    )
    db_pool_size: int = _setting(
        6, "QUEEN_DB_POOL_SIZE", "PostgreSQL connections held by one broker process"
    )
    write_concurrency: int = _setting(
        2, "QUEEN_WRITE_CONCURRENCY", "push transactions one broker process keeps in flight"
    )
    db_connect_timeout_s: float = _setting(
        3.0, "QUEEN_DB_CONNECT_TIMEOUT_S", "give up connecting to PostgreSQL after this long"
    )
    db_statement_timeout_ms: int = _setting(
        30_000, "QUEEN_DB_STATEMENT_TIMEOUT_MS", "server-side limit for one statement"
    )
    actor_idle_timeout_s: float = _setting(
        30.0, "QUEEN_ACTOR_IDLE_TIMEOUT_S", "a partition actor with no work stops after this long"
    )
    actor_inbox_size: int = _setting(
        1024, "QUEEN_ACTOR_INBOX_SIZE", "push requests one partition actor can hold waiting"
    )
    segment_max_items: int = _setting(
        10_000,
        "QUEEN_SEGMENT_MAX_ITEMS",
        "coalescing stops adding requests to a segment past this many items",
    )
    batch_max_items: int = _setting(
        20_000, "QUEEN_BATCH_MAX_ITEMS", "a push transaction stops growing past this many items"
    )
    batch_max_bytes: int = _setting(
        16 * 1024 * 1024,
        "QUEEN_BATCH_MAX_BYTES",
        "a push transaction stops growing past this many payload bytes",
    )
    batch_linger_ms: float = _setting(
        0.0,
        "QUEEN_BATCH_LINGER_MS",
        "extra wait for more writes before a transaction starts (0: natural batching only)",
    )
    batch_queue_size: int = _setting(
        4096, "QUEEN_BATCH_QUEUE_SIZE", "segment writes waiting for the batcher (backpressure)"
    )
    pop_default_batch: int = _setting(
        100, "QUEEN_POP_DEFAULT_BATCH", "messages one pop delivers when the client sets no batch"
    )
    pop_max_batch: int = _setting(
        10_000, "QUEEN_POP_MAX_BATCH", "largest batch a pop may ask for (400 above)"
    )
    pop_autopilot_partitions: int = _setting(
        4,
        "QUEEN_POP_AUTOPILOT_PARTITIONS",
        "partitions one pop may claim when the client leaves it to the broker (autopilot)",
    )
    pop_recheck_ms: float = _setting(
        1000.0,
        "QUEEN_POP_RECHECK_MS",
        "a waiting pop re-checks the database at least this often (expired leases, retry "
        "delays, delayed messages)",
    )
    system_state_cache_ms: float = _setting(
        1000.0,
        "QUEEN_SYSTEM_STATE_CACHE_MS",
        "admin switches (pop maintenance) are re-read from the database after this long",
    )
    shutdown_grace_s: float = _setting(
        10.0, "QUEEN_SHUTDOWN_GRACE_S", "on shutdown, in-flight pushes get this long to finish"
    )
    log_level: str = _setting("info", "QUEEN_LOG_LEVEL", "logging level")

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **overrides: Any) -> Settings:
        """Defaults, then the environment, then explicit ``overrides`` (the CLI flags)."""
        env = os.environ if environ is None else environ
        values: dict[str, Any] = {}
        for f in dataclasses.fields(cls):
            raw = env.get(f.metadata[_ENV])
            if raw is not None and raw != "":
                values[f.name] = _convert(f, raw)
        for name, value in overrides.items():
            if value is not None:
                values[name] = value
        settings = cls(**values)
        settings.validate()
        return settings

    def validate(self) -> None:
        """Reject settings that cannot work, naming the variable."""
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if isinstance(value, int | float) and not isinstance(value, bool):
                lowest = 0 if f.name in {"batch_linger_ms", "port"} else 1
                if f.name.endswith("_s") or f.name.endswith("_ms"):
                    lowest = 0
                if value < lowest:
                    raise ValueError(f"{f.metadata[_ENV]} must be >= {lowest}, got {value!r}")
        if self.database_url is not None and not self.database_url.strip():
            raise ValueError("DATABASE_URL is set but empty")

    def with_changes(self, **changes: Any) -> Settings:
        return dataclasses.replace(self, **changes)


def _convert(f: dataclasses.Field[Any], raw: str) -> Any:
    kind = _kind(f)
    try:
        if kind is int:
            return int(raw)
        if kind is float:
            return float(raw)
    except ValueError:
        raise ValueError(f"{f.metadata[_ENV]}={raw!r} is not a valid {kind.__name__}") from None
    return raw


def _kind(f: dataclasses.Field[Any]) -> type:
    text = str(f.type)
    if text.startswith("int"):
        return int
    if text.startswith("float"):
        return float
    return str


def describe() -> Iterator[tuple[str, str, type, Any, str]]:
    """Yield ``(field name, env var, type, default, help)`` for every setting."""
    for f in dataclasses.fields(Settings):
        yield f.name, f.metadata[_ENV], _kind(f), f.default, f.metadata[_HELP]
