"""The store's writes around the partition actors need the push service's hold.

A transaction's pushes, a streaming cycle's sink pushes and a dead letter retry's copies write
partitions beside their actors; the store methods that make those writes take a
:class:`queen.primitives.Turn`, which only :meth:`queen.push.PushService.hold` yields. Without
one (or with one that is over, or that holds other partitions) the write is refused before
anything reaches the database, and mypy reports a call that passes none.
"""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any

import pytest
from mypy import api as mypy_api

from queen.consume.requests import transaction_request
from queen.model import PartitionKey
from queen.primitives import NoTurn, Turn
from queen.push import PushService
from queen.records import CycleRequest
from queen.settings import Settings
from queen.storage.admin import DeadLetterTarget, PgAdminStore
from queen.storage.consume import PgConsumeStore
from queen.storage.streams import PgStreamsStore
from queen.streams.requests import cycle_request
from tests.fakes import idle_push_service

ROOT = Path(__file__).resolve().parent.parent
KEY = PartitionKey("q", "p")


class UntouchedPool:
    """A connection pool that fails the test if a statement is sent."""

    sent = 0

    async def _sent(self, *args: Any, **kwargs: Any) -> Any:
        self.sent += 1
        raise AssertionError("a write without its turn reached the database")

    # every way a store sends a statement
    run = fetch_one = fetch_all = execute = query = _sent


@pytest.fixture
def pool() -> UntouchedPool:
    return UntouchedPool()


@pytest.fixture
def push(tmp_path: Path) -> PushService:
    return idle_push_service(Settings(database_url="memory://", file_buffer_dir=str(tmp_path)))


def _transaction() -> Any:
    item = {"queue": KEY.queue, "partition": KEY.partition, "payload": 1}
    return transaction_request({"operations": [{"type": "push", "items": [item]}]})


def _cycle() -> CycleRequest:
    return cycle_request(
        {
            "query_id": "00000000-0000-0000-0000-000000000001",
            "partition_id": 1,
            "state_ops": [],
            "push_items": [{"queue": KEY.queue, "partition": KEY.partition, "payload": 1}],
        }
    )


def _target() -> DeadLetterTarget:
    return DeadLetterTarget(1, 1, KEY.queue, KEY.partition)


def _writes(pool: UntouchedPool) -> dict[str, Any]:
    """Each partition write of the store, given a turn."""
    return {
        "transaction": lambda turn: PgConsumeStore(pool).transact(  # type: ignore[arg-type]
            _transaction(), None, turn
        ),
        "cycle": lambda turn: PgStreamsStore(pool).cycle(_cycle(), None, turn),  # type: ignore[arg-type]
        "retry": lambda turn: PgAdminStore(pool).retry_dead_letters(  # type: ignore[arg-type]
            [_target()], turn
        ),
    }


WRITES = ["transaction", "cycle", "retry"]


@pytest.mark.parametrize("write", WRITES)
async def test_a_partition_write_without_a_turn_is_refused_at_once(
    pool: UntouchedPool, write: str
) -> None:
    with pytest.raises(NoTurn, match="needs the push service's hold"):
        await _writes(pool)[write](None)
    assert pool.sent == 0


@pytest.mark.parametrize("write", WRITES)
async def test_a_turn_whose_hold_is_over_proves_nothing(
    pool: UntouchedPool, push: PushService, write: str
) -> None:
    async with push.hold([]) as turn:
        assert turn.live
    assert not turn.live
    with pytest.raises(NoTurn, match="is over"):
        await _writes(pool)[write](turn)
    assert pool.sent == 0


@pytest.mark.parametrize("write", WRITES)
async def test_a_turn_of_other_partitions_does_not_cover_the_write(
    pool: UntouchedPool, push: PushService, write: str
) -> None:
    async with push.hold([]) as turn:
        with pytest.raises(NoTurn, match="does not hold: q/p"):
            await _writes(pool)[write](turn)
    assert pool.sent == 0


def test_only_the_push_service_makes_turns() -> None:
    with pytest.raises(TypeError, match="push service's hold only"):
        Turn([KEY], object())
    with pytest.raises(RuntimeError, match="push service alone"):
        Turn.granter()  # the push service took the one grant when it was imported


def test_mypy_reports_a_partition_write_without_a_turn(tmp_path: Path) -> None:
    """The type checker asks for the turn: a call of each partition write without one is an
    error (one small file, checked against the project's strict settings)."""
    snippet = tmp_path / "no_turn.py"
    snippet.write_text(
        textwrap.dedent(
            """
            from queen.records import CycleRequest, TransactionRequest
            from queen.storage.admin import DeadLetterTarget, PgAdminStore
            from queen.storage.consume import PgConsumeStore
            from queen.storage.streams import PgStreamsStore


            async def around_the_actors(
                consume: PgConsumeStore,
                streams: PgStreamsStore,
                admin: PgAdminStore,
                tx: TransactionRequest,
                cycle: CycleRequest,
                targets: list[DeadLetterTarget],
            ) -> None:
                await consume.transact(tx, None)
                await streams.cycle(cycle, None)
                await admin.retry_dead_letters(targets)
            """
        )
    )
    out, err, status = mypy_api.run(
        [
            "--config-file",
            str(ROOT / "pyproject.toml"),
            "--cache-dir",
            str(tmp_path / "cache"),
            "--follow-imports",
            "silent",
            str(snippet),
        ]
    )
    assert status == 1, out + err
    missing = [line for line in out.splitlines() if 'Missing positional argument "turn"' in line]
    assert len(missing) == 3, out
