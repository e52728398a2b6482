"""``queen serve --check``: what the broker would find at start, checked and printed, without
serving.

Checks, in order, each printed as ``ok`` or ``FAIL`` with one line: the settings (flags,
environment, defaults), authentication's configuration, the database (reachable, its server
version), the schema (up to date, would be created or migrated, or refused: the original
broker's tables), and the spool directory (a file written, fsynced and removed). A failed
check names itself; the checks after a failed settings or database check are skipped.

The embedded database: when its data directory does not exist yet, nothing is created (the
broker would initialise it at start; the check says so). When it exists, the check takes its
lock as ``queen serve`` would (a running broker holding it fails the check, as ``queen serve``
would refuse to start), starts the server if it is not running, and stops it again before
returning, so no server is left running that the check started.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg

from queen.auth import AuthConfigError, build_gate
from queen.http import webapp
from queen.settings import Settings
from queen.spool.files import probe_writable
from queen.storage.database import external_database, missing_database
from queen.storage.embedded import DataDirInUse, EmbeddedPostgres
from queen.storage.postgres import SchemaState, schema_state, server_version


@dataclass(frozen=True, slots=True)
class Check:
    name: str
    ok: bool
    detail: str


Report = Callable[[Check], None]


def run_checks(overrides: dict[str, Any], *, out: Any = None) -> int:
    """Run every check, printing each as it ends; 0 when all pass, 1 otherwise."""
    stream = out or sys.stdout
    checks: list[Check] = []

    def report(check: Check) -> None:
        checks.append(check)
        mark = "ok  " if check.ok else "FAIL"
        print(f"{mark}  {check.name:<14} {check.detail}", file=stream, flush=True)

    check_all(overrides, report)
    failed = [c.name for c in checks if not c.ok]
    if failed:
        print(f"queen serve --check: failed: {', '.join(failed)}", file=stream)
        return 1
    print("queen serve --check: every check passed", file=stream)
    return 0


def check_all(overrides: dict[str, Any], report: Report) -> None:
    try:
        settings = Settings.from_env(**overrides)
    except ValueError as exc:
        report(Check("settings", False, str(exc)))
        return
    report(Check("settings", True, "flags, environment and defaults are valid"))
    try:
        gate = build_gate(settings)
    except AuthConfigError as exc:
        report(Check("authentication", False, str(exc)))
    else:
        report(Check("authentication", True, "on" if settings.jwt_enabled else "off"))
        del gate
    _check_database(settings, report)
    _check_spool(Path(settings.file_buffer_dir), report)
    if settings.webapp_root is not None:
        found = webapp.problem(settings.webapp_root)
        report(Check("dashboard", found is None, found or f"{settings.webapp_root}: servable"))


def _check_database(settings: Settings, report: Report) -> None:
    external = external_database(settings)
    if external is not None:
        conninfo, description = external
        _check_server(conninfo, description, settings, report)
        return
    missing = missing_database(settings)
    if missing is not None:
        report(Check("database", False, missing))
        return
    server = EmbeddedPostgres(settings.pg_data_dir)
    if not (server.data_dir / "PG_VERSION").exists():
        report(
            Check(
                "database",
                True,
                f"embedded PostgreSQL: no data directory at "
                f"{server.data_dir} yet; queen serve will initialise it",
            )
        )
        report(Check("schema", True, 'no schema "queen" yet: queen serve will create it'))
        return
    try:
        server.lock()
    except DataDirInUse as exc:
        report(Check("database", False, str(exc)))
        return
    try:
        was_running = server.is_running()
        try:
            conninfo = server.start()
        except Exception as exc:
            report(
                Check(
                    "database",
                    False,
                    f"{server.describe()} did not start: {exc} (its log: {server.log_file})",
                )
            )
            return
        if not was_running:
            how = "started for the check, stopped after it"
        elif server.owned:
            how = "left running by a broker that is gone; stopped after the check"
        else:
            how = "already running"
        _check_server(conninfo, f"{server.describe()} ({how})", settings, report)
    finally:
        if server.owned:
            server.stop()
        server.unlock()


def _check_server(conninfo: str, description: str, settings: Settings, report: Report) -> None:
    try:
        with psycopg.connect(
            conninfo,
            connect_timeout=max(1, round(settings.db_connect_timeout_s)),
            autocommit=True,
        ) as conn:
            version = server_version(conn)
            report(Check("database", True, f"{description}: PostgreSQL {version}"))
            state, detail = schema_state(conn)
    except psycopg.Error as exc:
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        report(Check("database", False, f"{description}: {reason}"))
        return
    report(Check("schema", state is not SchemaState.FOREIGN, detail))


def _check_spool(directory: Path, report: Report) -> None:
    name = f"spool {directory}"
    if directory.is_dir():
        try:
            probe_writable(directory)
        except OSError as exc:
            report(Check("spool", False, f"{name}: cannot write: {exc.strerror or exc}"))
            return
        report(Check("spool", True, f"{name}: writable"))
        return
    if directory.exists():
        report(Check("spool", False, f"{name}: exists and is not a directory"))
        return
    parent = directory.absolute().parent
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir() or not os.access(parent, os.W_OK | os.X_OK):
        report(
            Check(
                "spool", False, f"{name}: cannot be created ({parent} is not a writable directory)"
            )
        )
        return
    report(Check("spool", True, f"{name}: does not exist yet; queen serve will create it"))
