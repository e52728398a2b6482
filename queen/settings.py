"""Broker settings: one frozen dataclass, read from the environment and the command line.

Every field carries its environment variable, its default and a help line in its metadata, so
``queen serve --help`` and :func:`Settings.from_env` cannot drift apart. Units are in the names
(``_s`` seconds, ``_ms`` milliseconds, ``_bytes``).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from queen.cipher import parse_key

_ENV = "env"
MAX_DEFAULT_WORKERS = 4
_HELP = "help"


def _millis_to_seconds(raw: str) -> str:
    return str(float(raw) / 1000)


def _same(raw: str) -> str:
    return raw


def _log_level(raw: str) -> str:
    return {"trace": "debug", "warn": "warning"}.get(raw.lower(), raw.lower())


# Read when our variable is unset, so a deployment of the original keeps its settings.
ORIGINAL_NAMES: dict[str, tuple[str, Callable[[str], str], str]] = {
    # field: (the original's variable, to our unit, its unit)
    "host": ("HOST", _same, ""),
    "port": ("PORT", _same, ""),
    "log_level": ("LOG_LEVEL", _log_level, ""),
    "db_connect_timeout_s": ("DB_CONNECTION_TIMEOUT", _millis_to_seconds, "ms"),
    "db_statement_timeout_ms": ("DB_STATEMENT_TIMEOUT", _same, "ms"),
    "db_tcp_user_timeout_ms": ("DB_TCP_USER_TIMEOUT_MS", _same, "ms"),
    "retention_interval_s": ("RETENTION_INTERVAL", _millis_to_seconds, "ms"),
    "retention_batch_limit": ("RETENTION_BATCH_SIZE", _same, ""),
}


def _setting(default: Any, env: str, help: str, *, secret: bool = False) -> Any:
    return field(default=default, repr=not secret, metadata={_ENV: env, _HELP: help})


@dataclass(frozen=True, slots=True)
class Settings:
    """Everything the broker can be told. Defaults are the production defaults."""

    host: str = _setting("0.0.0.0", "QUEEN_HOST", "address the HTTP server listens on")
    port: int = _setting(6632, "QUEEN_PORT", "TCP port the HTTP server listens on")
    workers: int = _setting(
        0,
        "QUEEN_WORKERS",
        "broker processes sharing the port (each one is a full broker); 0: one per CPU core "
        f"this process may run on, at most {MAX_DEFAULT_WORKERS}",
    )
    database_url: str | None = _setting(
        None,
        "DATABASE_URL",
        "PostgreSQL connection URL; when unset, PG_HOST and the other PG_ settings, else an "
        "embedded PostgreSQL",
    )
    pg_host: str | None = _setting(
        None,
        "PG_HOST",
        "PostgreSQL host (or Unix socket directory) used when DATABASE_URL is unset; with "
        "neither set an embedded PostgreSQL is started",
    )
    pg_port: int = _setting(5432, "PG_PORT", "PostgreSQL port (with PG_HOST)")
    pg_user: str = _setting("postgres", "PG_USER", "PostgreSQL user (with PG_HOST)")
    pg_password: str = _setting("postgres", "PG_PASSWORD", "PostgreSQL password (with PG_HOST)")
    pg_db: str = _setting("postgres", "PG_DB", "PostgreSQL database name (with PG_HOST)")
    pg_data_dir: str = _setting(
        ".queen/pgdata",
        "QUEEN_PG_DATA_DIR",
        "data directory of the embedded PostgreSQL (used only without DATABASE_URL and PG_HOST)",
    )
    file_buffer_dir: str = _setting(
        ".queen/buffers",
        "FILE_BUFFER_DIR",
        "spool directory: pushes that cannot reach PostgreSQL are kept here (relative to the "
        "working directory, like QUEEN_PG_DATA_DIR; production: a directory on durable storage "
        "such as /var/lib/queen/buffers)",
    )
    max_body_bytes: int = _setting(
        64 * 1024 * 1024, "QUEEN_MAX_BODY_BYTES", "largest accepted request body (413 above)"
    )
    max_decoding_bytes: int = _setting(
        128 * 1024 * 1024,
        "QUEEN_MAX_DECODING_BYTES",
        "bytes of request bodies and pop answers one process holds at once while reading, "
        "decoding, handling and answering them (503 with Retry-After above; at least "
        "QUEEN_MAX_BODY_BYTES)",
    )
    keep_alive_timeout_s: float = _setting(
        75.0,
        "QUEEN_KEEP_ALIVE_TIMEOUT_S",
        "an HTTP connection that sends nothing for this long between requests is closed",
    )
    header_timeout_s: float = _setting(
        10.0,
        "QUEEN_HEADER_TIMEOUT_S",
        "a request's headers must be complete this long after their first byte, or the "
        "connection is closed",
    )
    body_timeout_s: float = _setting(
        30.0,
        "QUEEN_BODY_TIMEOUT_S",
        "a request's body that stops arriving for this long before it is complete gets the "
        "connection closed",
    )
    max_connections: int = _setting(
        0,
        "QUEEN_MAX_CONNECTIONS",
        "HTTP connections one broker process holds; at the cap the longest idle one is closed "
        "to make room, and a new one is answered 503 when every one is busy (0: the open files "
        "limit, raised to its hard limit at start, less a reserve of a tenth of it and at least "
        "100 descriptors)",
    )
    db_pool_size: int = _setting(
        10, "QUEEN_DB_POOL_SIZE", "PostgreSQL connections held by one broker process"
    )
    write_concurrency: int = _setting(
        4, "QUEEN_WRITE_CONCURRENCY", "push transactions one broker process keeps in flight"
    )
    db_connect_timeout_s: float = _setting(
        3.0, "QUEEN_DB_CONNECT_TIMEOUT_S", "give up connecting to PostgreSQL after this long"
    )
    db_tcp_user_timeout_ms: int = _setting(
        5_000,
        "QUEEN_DB_TCP_USER_TIMEOUT_MS",
        "a TCP connection to PostgreSQL whose data stays unacknowledged this long is dropped",
    )
    db_statement_timeout_ms: int = _setting(
        30_000, "QUEEN_DB_STATEMENT_TIMEOUT_MS", "server-side limit for one statement"
    )
    db_call_timeout_s: float = _setting(
        35.0,
        "QUEEN_DB_CALL_TIMEOUT_S",
        "client-side deadline of one database call (keep it a few seconds above the statement "
        "timeout); past it the connection is dropped and a push goes to the spool",
    )
    db_probe_timeout_s: float = _setting(
        2.0,
        "QUEEN_DB_PROBE_TIMEOUT_S",
        "a health probe of the database that gets no answer this long marks it down",
    )
    loop_retry_max_s: float = _setting(
        30.0,
        "QUEEN_LOOP_RETRY_MAX_S",
        "longest pause before a failed background loop (replay, retention, probe) is restarted",
    )
    actor_idle_timeout_s: float = _setting(
        30.0, "QUEEN_ACTOR_IDLE_TIMEOUT_S", "a partition actor with no work stops after this long"
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
    batch_spread_min_items: int = _setting(
        800,
        "QUEEN_BATCH_SPREAD_MIN_ITEMS",
        "when write slots are free, share the ready writes out over them, this many frames "
        "per transaction at least (0: everything ready goes into one transaction)",
    )
    batch_spread_min_writes: int = _setting(
        32,
        "QUEEN_BATCH_SPREAD_MIN_WRITES",
        "when write slots are free and too few frames are ready to share by frames, share "
        "many small writes out by count, this many per transaction at least (0: off)",
    )
    batch_queue_size: int = _setting(
        4096, "QUEEN_BATCH_QUEUE_SIZE", "segment writes waiting for the batcher (backpressure)"
    )
    spool_group_max_records: int = _setting(
        4096,
        "QUEEN_SPOOL_GROUP_MAX_RECORDS",
        "spool records made durable by one fsync at most (1: one fsync per write)",
    )
    spool_file_max_bytes: int = _setting(
        64 * 1024 * 1024, "QUEEN_SPOOL_FILE_MAX_BYTES", "a spool file is sealed at this size"
    )
    spool_file_max_age_s: float = _setting(
        1.0, "QUEEN_SPOOL_FILE_MAX_AGE_S", "a spool file with records is sealed after this long"
    )
    spool_replay_chunk_items: int = _setting(
        5000, "QUEEN_SPOOL_REPLAY_CHUNK_ITEMS", "frames replayed per step (progress is saved)"
    )
    spool_replay_tick_s: float = _setting(
        0.5, "QUEEN_SPOOL_REPLAY_TICK_S", "how often the replay loop looks at the spool"
    )
    spool_hold_s: float = _setting(
        2.0,
        "QUEEN_SPOOL_HOLD_S",
        "longest a push waits for its partition's spooled items to be replayed first",
    )
    db_outage_wait_s: float = _setting(
        20.0,
        "QUEEN_DB_OUTAGE_WAIT_S",
        "how long an ack waits for an unreachable database to come back before it is answered "
        "503 (a waiting pop waits for it until its own timeout, then answers empty)",
    )
    db_probe_min_s: float = _setting(
        0.05, "QUEEN_DB_PROBE_MIN_S", "first retry of an unreachable database"
    )
    db_probe_max_s: float = _setting(
        2.0,
        "QUEEN_DB_PROBE_MAX_S",
        "longest pause between probes of an unreachable database; pause between probes of a "
        "reachable one",
    )
    pop_default_batch: int = _setting(
        1,
        "QUEEN_POP_DEFAULT_BATCH",
        "messages a pop delivers when the client sets no batch and no autopilot",
    )
    pop_autopilot_batch: int = _setting(
        100,
        "QUEEN_POP_AUTOPILOT_BATCH",
        "messages a pop delivers when the client sets no batch and asks for autopilot",
    )
    pop_max_batch: int = _setting(
        10_000, "QUEEN_POP_MAX_BATCH", "largest batch a pop may ask for (400 above)"
    )
    pop_max_bytes: int = _setting(
        4 * 1024 * 1024,
        "QUEEN_POP_MAX_BYTES",
        "payload bytes one pop answer carries at most (fewer messages than the batch then; "
        "always at least one message, however big)",
    )
    pop_autopilot_partitions: int = _setting(
        32,
        "QUEEN_POP_AUTOPILOT_PARTITIONS",
        "most partitions one pop may claim when the client leaves it to the broker (autopilot;"
        " never more than the batch)",
    )
    pop_autopilot_spread: int = _setting(
        8,
        "QUEEN_POP_AUTOPILOT_SPREAD",
        "fewest claimable partitions of a group for which an autopilot pop claims more than one"
        " (with fewer it claims one and leaves the rest to the group's other consumers)",
    )
    pop_linger_ms: float = _setting(
        0.0,
        "QUEEN_POP_LINGER_MS",
        "a waiting pop that asked for more than one message and is woken by a push waits this"
        " long before it looks, so its answer carries what arrives meanwhile (0: look at once)",
    )
    pop_recheck_ms: float = _setting(
        1000.0,
        "QUEEN_POP_RECHECK_MS",
        "while something is pending behind a lease, a retry delay, a delay or a window buffer,"
        " a waiting pop re-checks the database at least this often (sooner when it ends sooner;"
        " with nothing pending it waits for a push)",
    )
    system_state_cache_ms: float = _setting(
        1000.0,
        "QUEEN_SYSTEM_STATE_CACHE_MS",
        "admin switches (pop maintenance) and the list of encrypted queues are re-read from "
        "the database after this long",
    )
    retention_interval_s: float = _setting(
        10.0,
        "QUEEN_RETENTION_INTERVAL_S",
        "how often expired segments are removed, messages past maxWaitTimeSeconds evicted "
        "and the dedup sidecar pruned (more often, down to once a second, while a queue's own "
        "retention or wait time is under four times this: a quarter of that time)",
    )
    retention_batch_limit: int = _setting(
        1000,
        "QUEEN_RETENTION_BATCH_LIMIT",
        "segments (or sidecar rows) removed per short transaction",
    )
    retention_max_batches: int = _setting(
        100, "QUEEN_RETENTION_MAX_BATCHES", "batches of each kind in one retention pass"
    )
    flow_flush_s: float = _setting(
        5.0,
        "QUEEN_FLOW_FLUSH_S",
        "how often each broker process saves its per-queue flow (the dashboard's per-queue "
        "series) to the database, where every process's is added up",
    )
    shutdown_grace_s: float = _setting(
        10.0, "QUEEN_SHUTDOWN_GRACE_S", "on shutdown, in-flight pushes get this long to finish"
    )
    gc_gen0_threshold: int = _setting(
        10_000,
        "QUEEN_GC_GEN0_THRESHOLD",
        "queen serve: Python's collector runs its youngest generation after this many "
        "allocations, and rarely the older ones (0 keeps Python's defaults)",
    )
    encryption_key: str | None = _setting(
        None,
        "QUEEN_ENCRYPTION_KEY",
        "AES-256-GCM key (64 hex characters) for queues configured with encryptionEnabled; "
        "without it those queues are stored in plaintext",
        secret=True,
    )
    log_level: str = _setting("info", "QUEEN_LOG_LEVEL", "logging level")
    jwt_enabled: bool = _setting(
        False, "JWT_ENABLED", "require a JWT on every non-public route (true or false)"
    )
    jwt_algorithm: str = _setting(
        "HS256",
        "JWT_ALGORITHM",
        "HS256, RS256, EdDSA, or auto (the token's own alg, among the configured keys)",
    )
    jwt_secret: str | None = _setting(None, "JWT_SECRET", "HS256 shared secret")
    jwt_public_key: str | None = _setting(
        None, "JWT_PUBLIC_KEY", "PEM public key (RSA for RS256, Ed25519 for EdDSA)"
    )
    jwt_jwks_url: str | None = _setting(
        None, "JWT_JWKS_URL", "URL of a JSON Web Key Set; keys are chosen by the token's kid"
    )
    jwt_jwks_refresh_interval_s: int = _setting(
        3600, "JWT_JWKS_REFRESH_INTERVAL", "seconds before the cached key set is fetched again"
    )
    jwt_jwks_timeout_ms: int = _setting(
        5000, "JWT_JWKS_TIMEOUT_MS", "give up fetching the key set after this long"
    )
    jwt_clock_skew_s: int = _setting(
        30, "JWT_CLOCK_SKEW", "seconds of leeway for the exp, nbf and iat claims"
    )
    jwt_issuer: str | None = _setting(None, "JWT_ISSUER", "required iss claim, when set")
    jwt_audience: str | None = _setting(
        None, "JWT_AUDIENCE", "audience the aud claim must contain, when set"
    )
    jwt_skip_paths: str = _setting(
        "/health,/metrics,/metrics/prometheus,/",
        "JWT_SKIP_PATHS",
        "comma-separated public paths (an entry ending in / covers the paths below it; "
        "/ is the dashboard's page, which holds no data and asks for a token)",
    )
    cors_origins: str = _setting(
        "",
        "QUEEN_CORS_ORIGINS",
        "comma-separated origins allowed to call the API from a browser (* for any; none by "
        "default)",
    )
    webapp_root: str | None = _setting(
        None,
        "WEBAPP_ROOT",
        "directory of a built dashboard (the original broker's app, built with npm run build) "
        "served at / and /assets/ instead of the broker's own dashboard, which moves to "
        "/dashboard/; unset: the broker's own dashboard at /",
    )

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **overrides: Any) -> Settings:
        """Defaults, then the environment, then explicit ``overrides`` (the CLI flags)."""
        env = os.environ if environ is None else environ
        values: dict[str, Any] = {}
        for f in dataclasses.fields(cls):
            raw = env.get(f.metadata[_ENV])
            if raw is not None and raw != "":
                values[f.name] = _convert(f, raw)
            elif f.name in ORIGINAL_NAMES:
                values.update(_from_original(f, env))
        for name, value in overrides.items():
            if value is not None:
                values[name] = value
        return cls(**values)

    def __post_init__(self) -> None:
        self.validate()

    def processes(self) -> int:
        """How many broker processes ``queen serve`` runs: ``workers``, or for 0 one per CPU
        core this process may run on, at most :data:`MAX_DEFAULT_WORKERS` (each holds up to
        ``db_pool_size`` + 2 connections, with the push listener's and the health probe's:
        four fit PostgreSQL's default ``max_connections`` with room for other clients)."""
        if self.workers:
            return self.workers
        try:
            cores = len(os.sched_getaffinity(0))
        except (AttributeError, OSError):
            cores = os.cpu_count() or 1
        return max(1, min(cores, MAX_DEFAULT_WORKERS))

    def validate(self) -> None:
        """Reject settings that cannot work, naming the variable."""
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if isinstance(value, int | float) and not isinstance(value, bool):
                lowest = 0 if f.name in _MAY_BE_ZERO else 1
                if f.name.endswith("_s") or f.name.endswith("_ms"):
                    lowest = 0
                if value < lowest:
                    raise ValueError(f"{f.metadata[_ENV]} must be >= {lowest}, got {value!r}")
        if self.db_pool_size <= self.write_concurrency:
            raise ValueError(
                "QUEEN_DB_POOL_SIZE must be larger than QUEEN_WRITE_CONCURRENCY: push "
                "transactions would take every connection and leave none for pops and acks"
            )
        for name in (
            "keep_alive_timeout_s",
            "header_timeout_s",
            "body_timeout_s",
            "db_call_timeout_s",
            "db_probe_timeout_s",
        ):
            if getattr(self, name) <= 0:
                variable = _FIELDS[name].metadata[_ENV]
                raise ValueError(f"{variable} must be > 0, got {getattr(self, name)!r}")
        if self.max_decoding_bytes < self.max_body_bytes:
            raise ValueError(
                "QUEEN_MAX_DECODING_BYTES must be at least QUEEN_MAX_BODY_BYTES: a body at the "
                "limit would always be refused"
            )
        if self.database_url is not None and not self.database_url.strip():
            raise ValueError("DATABASE_URL is set but empty")
        if self.encryption_key is not None:
            parse_key(self.encryption_key)
        if self.pg_host is not None and not self.pg_host.strip():
            raise ValueError("PG_HOST is set but empty")

    def with_changes(self, **changes: Any) -> Settings:
        return dataclasses.replace(self, **changes)


_MAY_BE_ZERO = {
    "workers",
    "max_connections",
    "batch_linger_ms",
    "batch_spread_min_items",
    "batch_spread_min_writes",
    "port",
    "gc_gen0_threshold",
}


def parse_value(name: str, raw: str) -> Any:
    """Convert the text of one setting (an environment value or a flag) to its type."""
    return _convert(_FIELDS[name], raw)


def _convert(f: dataclasses.Field[Any], raw: str) -> Any:
    kind = _kind(f)
    if kind is bool:
        # Exactly "true" turns a switch on; anything but "true"/"false" is a mistake to
        # report, not a silent "off".
        if raw in ("true", "false"):
            return raw == "true"
        raise ValueError(f"{f.metadata[_ENV]}={raw!r} must be true or false")
    try:
        if kind is int:
            return int(raw)
        if kind is float:
            return float(raw)
    except ValueError:
        raise ValueError(f"{f.metadata[_ENV]}={raw!r} is not a valid {kind.__name__}") from None
    return raw


def _from_original(f: dataclasses.Field[Any], env: Mapping[str, str]) -> dict[str, Any]:
    """``{name: value}`` from the original broker's variable for ``f``, if it is set."""
    variable, to_ours, _unit = ORIGINAL_NAMES[f.name]
    raw = env.get(variable)
    if raw is None or raw == "":
        return {}
    try:
        return {f.name: _convert(f, to_ours(raw))}
    except ValueError:
        raise ValueError(
            f"{variable}={raw!r} (the original broker's name for {f.metadata[_ENV]}) is not valid"
        ) from None


def _kind(f: dataclasses.Field[Any]) -> type:
    text = str(f.type)
    if text.startswith("bool"):
        return bool
    if text.startswith("int"):
        return int
    if text.startswith("float"):
        return float
    return str


_FIELDS = {f.name: f for f in dataclasses.fields(Settings)}


def describe() -> Iterator[tuple[str, str, type, Any, str]]:
    """Yield ``(field name, env var, type, default, help)`` for every setting."""
    for f in dataclasses.fields(Settings):
        text = f.metadata[_HELP]
        if f.name in ORIGINAL_NAMES:
            variable, _to_ours, unit = ORIGINAL_NAMES[f.name]
            text += f" (unset: the original broker's {variable}{', in ' + unit if unit else ''})"
        yield f.name, f.metadata[_ENV], _kind(f), f.default, text
