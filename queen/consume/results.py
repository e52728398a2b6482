"""What a pop delivers, and its wire shape."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import orjson

from queen.consume.policy import iso_of_uuid7, iso_utc
from queen.intake import decode_json
from queen.records import Delivered, Sizing


@dataclass(slots=True)
class PopResult:
    """The answer of one pop. Empty ``delivered`` means "nothing to deliver" (HTTP 204).

    ``lease_id`` is shared by every claimed partition; it is ``""`` with ``autoAck``, and
    ``lease_expires_at`` is then None. ``sizing`` is set when the request left its sizing to
    the broker (``autopilot``).
    """

    consumer_group: str
    lease_id: str = ""
    lease_expires_at: datetime | None = None
    delivered: list[Delivered] = field(default_factory=list)
    sizing: Sizing | None = None

    def __bool__(self) -> bool:
        return bool(self.delivered)

    @property
    def partitions_claimed(self) -> int:
        return len({d.partition_id for d in self.delivered})

    @property
    def messages(self) -> list[dict[str, Any]]:
        """The messages as the HTTP answer carries them, with ``data`` decoded."""
        return [self._message(d, decode_json(d.payload.encode())) for d in self.delivered]

    def as_dict(self) -> dict[str, Any]:
        """The HTTP answer body with decoded payloads (for the embedding API)."""
        return self._body(self.messages)

    def wire(self) -> dict[str, Any]:
        """The HTTP answer body; payloads are passed through as stored JSON, not re-encoded."""
        return self._body([self._message(d, orjson.Fragment(d.payload)) for d in self.delivered])

    def _message(self, d: Delivered, data: Any) -> dict[str, Any]:
        return {
            "id": d.message_id,
            "transactionId": d.transaction_id,
            "partitionId": str(d.partition_id),
            "leaseId": self.lease_id,
            "data": data,
            "createdAt": iso_of_uuid7(d.message_id),
            "producerSub": d.producer_sub,
            "traceId": d.trace_id,
            "partition": d.partition,
            "queue": d.queue,
            "consumerGroup": self.consumer_group,
            "retryCount": d.retry_count,
            "offset": d.offset,
        }

    def _body(self, messages: list[dict[str, Any]]) -> dict[str, Any]:
        first = self.delivered[0] if self.delivered else None
        body: dict[str, Any] = {
            "success": True,
            "queue": first.queue if first else None,
            "partition": first.partition if first else None,
            "partitionId": str(first.partition_id) if first else None,
            "leaseId": self.lease_id,
            "leaseExpiresAt": iso_utc(self.lease_expires_at) if self.lease_expires_at else None,
            "consumerGroup": self.consumer_group,
            "partitionsClaimed": self.partitions_claimed,
            "messages": messages,
        }
        if self.sizing is not None:
            body["autopilot"] = {
                "partitions": self.sizing.partitions,
                "batch": self.sizing.batch,
                "waitMs": 0,
            }
        return body
