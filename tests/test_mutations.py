"""The guarantees' tests catch their breakage.

Each row of :data:`MUTATIONS` breaks one guarantee of the broker in a copy of the source (one
literal edit of one file) and names the test that stands for that guarantee. That test must
fail on the broken copy; all of them must pass on an unbroken copy made the same way, so a
failure comes from the edit and not from the copying. A row whose text is no longer found
fails too: when the code it breaks is rewritten, the row is rewritten with it.

Each copy runs its tests in a pytest process of its own, on a new database of the session's
PostgreSQL server (the edited SQL is migrated into that database only).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.conftest import scratch_database

ROOT = Path(__file__).resolve().parent.parent
COPIED = ("queen", "tests", "pyproject.toml")
RUN_LIMIT_S = 240.0


@dataclass(frozen=True, slots=True)
class Mutation:
    guarantee: str
    path: str  # relative to the repository
    find: str  # found exactly once in that file
    replace: str
    catches: str  # the pytest node id that must fail
    says: str  # in what that test prints: the failure is the one the guarantee names


ACTORS = "queen/actors/partition.py"
SCHEMA = "queen/storage/schema.sql"
CONSUME = "queen/storage/consume.sql"
SQL_API = "queen/storage/sql_api.sql"
STREAMS = "queen/storage/streams.sql"
MUTATIONS: tuple[Mutation, ...] = (
    Mutation(
        "order in a partition: coalesced requests in arrival order",
        ACTORS,
        "else concat(batch)",
        "else concat(batch[::-1])",
        "tests/test_actors.py::test_requests_arriving_during_a_write_are_coalesced",
        "assert ['t5a'",
    ),
    Mutation(
        "order in a partition: frames stored in input order",
        SCHEMA,
        "p_txids[p.lo + 1 : p.lo + p.cnt],",
        "ARRAY(SELECT t.x FROM unnest(p_txids[p.lo + 1 : p.lo + p.cnt]) WITH ORDINALITY"
        " AS t (x, i) ORDER BY t.i DESC),",
        "tests/test_store_contract.py::test_writes_take_consecutive_offsets_in_input_order"
        "[postgres]",
        "assert [(0, 'c'",
    ),
    Mutation(
        "one write in flight per partition",
        ACTORS,
        "self._in_flight = batch",
        "self._in_flight = None",
        "tests/test_actors.py::test_one_write_in_flight_per_partition",
        "max_in_flight",
    ),
    Mutation(
        "exact deduplication: the probe finds stored history",
        SCHEMA,
        "hashtextextended(t.tx, d.pid)",
        "hashtextextended(t.tx, d.pid + 1)",
        "tests/test_store_contract.py::"
        "test_duplicates_of_history_name_the_original_within_one_partition[postgres]",
        "assert {} == {0:",
    ),
    Mutation(
        "the partition row lock orders writers across processes",
        SCHEMA,
        "ORDER BY p.id FOR UPDATE OF p)",
        "ORDER BY p.id)",
        "tests/test_partition_lock.py::"
        "test_two_brokers_racing_on_one_partition_keep_offsets_and_dedup_exact",
        'violates unique constraint "segments_pkey"',
    ),
    Mutation(
        "fsync before buffered",
        "queen/spool/writer.py",
        "                self.fsync(active.fd)",
        "                pass  # self.fsync(active.fd)",
        "tests/test_spool.py::"
        "test_an_append_is_answered_only_after_the_fsync_of_its_record_returned",
        "the append was answered and no fsync ran",
    ),
    Mutation(
        "nothing lost on replay: a failed chunk stays spooled",
        "queen/spool/replay.py",
        "        if not ok:",
        "        if False:",
        "tests/test_spool.py::"
        "test_frames_of_a_replay_write_that_fails_stay_spooled_until_a_pass_stores_them",
        "assert [] == ['a', 'b']",
    ),
    Mutation(
        "fences: a hold waits for each actor's grant",
        "queen/push/service.py",
        "route = await fence.granted.wait()",
        "route = Route.DATABASE",
        "tests/test_transaction.py::test_transaction_push_waits_for_the_partition_actors_write",
        "(2, 'live')] == ",
    ),
    Mutation(
        "turns: a write around the actors needs its turn",
        "queen/primitives.py",
        "    if type(turn) is not Turn:",
        "    return\n    if type(turn) is not Turn:",
        "tests/test_turns.py::test_a_partition_write_without_a_turn_is_refused_at_once"
        "[transaction]",
        "a write without its turn reached the database",
    ),
    Mutation(
        "lease exclusivity: a live lease is not claimed again",
        CONSUME,
        "OR p_lease_expires_at <= now())",
        "OR p_lease_expires_at IS NOT NULL)",
        "tests/test_consume_concurrency.py::"
        "test_consumers_of_one_group_never_share_a_message_or_a_partition",
        "success=False, error='Invalid or expired le",
    ),
    Mutation(
        "lease exclusivity: an ack needs the live lease",
        CONSUME,
        "NOT (v_live AND it.lease = cu.lease_id)",
        "NOT (v_live OR it.lease = cu.lease_id)",
        "tests/test_ack.py::test_a_stale_or_foreign_lease_is_refused_and_changes_nothing",
        "assert (True, None) == (False",
    ),
    Mutation(
        "every request answered: a failed hand-over answers failed",
        ACTORS,
        "except BaseException:",
        "except BaseException:\n            _answer(batch, QUEUED)",
        "tests/test_actors.py::test_crashing_actor_is_contained",
        "assert ['queued', 'queued'] == ['failed', 'queued']",
    ),
    Mutation(
        "an idle stop drops nothing",
        ACTORS,
        "            self._parking.task is None\n            or self._in_flight is not None\n"
        "            or self._inbox\n",
        "            self._in_flight is not None\n",
        "tests/test_actors.py::test_reaper_spares_an_actor_just_handed_a_request",
        "stop_if_idle",
    ),
    Mutation(
        "storage imports no layer above it",
        "queen/storage/retention.py",
        "from queen.storage.pool import ConnectionPool",
        "from queen.storage.pool import ConnectionPool\n\nif False:\n    import queen.actors",
        "tests/test_layers.py::test_no_module_imports_a_layer_above_its_own",
        "queen.storage.retention (storage) imports queen.actors (actors)",
    ),
    Mutation(
        "HTTP never imports storage",
        "queen/http/push.py",
        "from queen.http.access import producer_sub",
        "from queen.http.access import producer_sub\nimport queen.storage.postgres  # noqa",
        "tests/test_layers.py::test_no_package_imports_one_it_must_not_know",
        "HTTP calls services only, never storage",
    ),
    Mutation(
        "SQL only in storage",
        "queen/preflight.py",
        "from queen.spool.files import probe_writable",
        'from queen.spool.files import probe_writable\n\n_VERSION_SQL = "SHOW server_version"',
        "tests/test_layers.py::test_sql_is_written_only_in_storage",
        "SHOW server_version'",
    ),
    Mutation(
        "exact dedup of a push from SQL: first wins inside a call",
        SQL_API,
        "IF NOT EXISTS (SELECT 1 FROM unnest(v_leaders) WITH ORDINALITY AS u (l, o)"
        " WHERE u.l <> u.o)",
        "IF true",
        "tests/test_sql_api.py::test_a_push_from_sql_stores_what_http_would_and_dedups_against_it",
        'assert [a["status"] for a in answer] == ["queued", "duplicate", "duplicate"',
    ),
    Mutation(
        "a streams window closed once: an idle flush holds the partition's pops off",
        STREAMS,
        "    ELSIF p_ripe IS NOT NULL THEN   -- the flush will close these",
        "    ELSIF false THEN   -- the flush will close these",
        "tests/test_streams.py::test_an_idle_flush_holds_the_partition_from_its_read_to_its_cycle",
        "assert [(None, None, None)] == [(",
    ),
)


def _copy(into: Path) -> Path:
    """The source, as the tests see it, under ``into``."""
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "artifacts")
    for name in COPIED:
        source = ROOT / name
        if source.is_dir():
            shutil.copytree(source, into / name, ignore=ignore)
        else:
            shutil.copy2(source, into / name)
    return into


@pytest.fixture
def database(pg_url: str) -> Iterator[str]:
    """A new, empty database on the session's server, dropped afterwards."""
    with scratch_database(pg_url, "mutation") as url:
        yield url


def _pytest(copy: Path, database: str, node_ids: list[str]) -> subprocess.CompletedProcess[str]:
    """Run ``node_ids`` in ``copy``: its own ``queen`` and ``tests`` are imported, not ours."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "QUEEN_TEST_"))}
    env.update(QUEEN_TEST_DATABASE_URL=database, PYTHONPATH=str(copy), PYTHONDONTWRITEBYTECODE="1")
    argv = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *node_ids]
    return subprocess.run(
        argv, cwd=copy, env=env, capture_output=True, text=True, timeout=RUN_LIMIT_S, check=False
    )


def _tail(done: subprocess.CompletedProcess[str]) -> str:
    return "\n".join((done.stdout + done.stderr).splitlines()[-25:])


def test_every_row_names_a_test_and_text_that_exist() -> None:
    assert MUTATIONS, "no mutations listed"
    for m in MUTATIONS:
        text = (ROOT / m.path).read_text()
        assert text.count(m.find) == 1, f"{m.guarantee}: {m.find!r} is not found once in {m.path}"
        assert m.replace != m.find, m.guarantee
        test_file, _, name = m.catches.partition("::")
        assert (ROOT / test_file).is_file(), m.catches
        function = name.split("[")[0]
        assert f"def {function}(" in (ROOT / test_file).read_text(), m.catches


@pytest.mark.slow
@pytest.mark.timeout(RUN_LIMIT_S + 30)
def test_the_unbroken_copy_passes_every_test_named(tmp_path: Path, database: str) -> None:
    copy = _copy(tmp_path / "source")
    done = _pytest(copy, database, sorted({m.catches for m in MUTATIONS}))
    assert done.returncode == 0, _tail(done)
    assert " passed" in done.stdout and " failed" not in done.stdout, _tail(done)


@pytest.mark.slow
@pytest.mark.timeout(RUN_LIMIT_S + 30)
@pytest.mark.parametrize("mutation", MUTATIONS, ids=[m.guarantee for m in MUTATIONS])
def test_breaking_a_guarantee_fails_its_test(
    mutation: Mutation, tmp_path: Path, database: str
) -> None:
    copy = _copy(tmp_path / "source")
    target = copy / mutation.path
    text = target.read_text()
    assert text.count(mutation.find) == 1, f"{mutation.find!r} is not found once"
    target.write_text(text.replace(mutation.find, mutation.replace))
    done = _pytest(copy, database, [mutation.catches])
    # 1: tests ran and some failed (2 would be an interruption, 4 a usage error, 5 nothing ran)
    assert done.returncode == 1, f"{mutation.catches} did not fail:\n{_tail(done)}"
    assert "1 failed" in done.stdout, _tail(done)
    assert mutation.says in done.stdout + done.stderr, _tail(done)
