-- Queen on Trio: what `queen import` has brought over from an original Queen database, so that
-- a run that was stopped continues where it stopped and a second run imports nothing twice.
-- Idempotent; applied by the importer only (after the broker's own schema), never by `serve`.
--
-- Every id of the original is a UUID minted by that database, so the source ids alone are keys:
-- two originals never share one.

-- A queue this broker holds because it was imported (source_queue: the original's queues.id).
CREATE TABLE IF NOT EXISTS queen.imported_queues (
    source_queue uuid PRIMARY KEY,
    queue_id     bigint NOT NULL,
    imported_at  timestamptz NOT NULL DEFAULT now()
);

-- A partition being imported: how far its messages have been copied, in the original's order
-- (created_at, id). Written in the same transaction as the segments it accounts for.
CREATE TABLE IF NOT EXISTS queen.imported_partitions (
    source_partition uuid PRIMARY KEY,
    partition_id     bigint NOT NULL,
    last_created_at  timestamptz,
    last_id          uuid,
    messages         bigint NOT NULL DEFAULT 0
);

-- The cursor position an import wrote. A later import moves a cursor again only while it is
-- still exactly as the import left it (no pop, ack or seek of this broker has touched it).
CREATE TABLE IF NOT EXISTS queen.imported_cursors (
    partition_id   bigint NOT NULL,
    consumer_group text NOT NULL,
    next_offset    bigint NOT NULL,
    PRIMARY KEY (partition_id, consumer_group)
);

-- Dead letters already copied (source_id: the original's dead_letter_queue.id).
CREATE TABLE IF NOT EXISTS queen.imported_dead_letters (
    source_id uuid PRIMARY KEY,
    dlq_id    bigint NOT NULL
);
