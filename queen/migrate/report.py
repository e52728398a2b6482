"""The import's report: one line per queue, then what was written (plain text, aligned)."""

from __future__ import annotations

from queen.migrate.run import ImportReport

_HEAD = (
    "queue",
    "partitions",
    "messages",
    "imported before",
    "to import",
    "groups",
    "queue mode",
    "dead letters",
)


def render(report: ImportReport) -> str:
    rows = [_HEAD] + [
        (
            q.name,
            str(q.partitions),
            str(q.messages),
            str(q.imported),
            str(q.to_import),
            str(q.groups),
            "yes" if q.queue_mode else "no",
            str(q.dead_letters) + (f"  ({q.note})" if q.note else ""),
        )
        for q in report.queues
    ]
    widths = [max(len(r[i]) for r in rows) for i in range(len(_HEAD) - 1)]
    lines = [
        "  ".join(
            [r[0].ljust(widths[0])]
            + [v.rjust(w) for v, w in zip(r[1:-1], widths[1:], strict=True)]
            + [r[-1]]
        ).rstrip()
        for r in rows
    ]
    total = report.to_import
    if report.dry_run:
        lines.append(
            f"dry run: would import {total} messages of {len(report.queues)} queues "
            "and their positions; nothing was written"
        )
    else:
        lines.append(f"imported {total} messages of {len(report.queues)} queues")
        if report.positions is not None:
            p = report.positions
            lines.append(
                f"positions: {p.cursors_written} cursors written, {p.cursors_kept} left as "
                f"this broker moved them; {p.groups} consumer groups; {p.dead_letters} "
                "dead letters; leases released"
            )
    lines.extend(report.notes)
    return "\n".join(lines) + "\n"
