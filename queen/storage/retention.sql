-- Retention of stored segments and pruning of the dedup sidecar. Idempotent; applied after
-- schema.sql and consume.sql. Both run in bounded batches (one short transaction each) from
-- the retention loop, which one broker process at a time runs (an advisory lock).

-- The sidecar by partition and age: pruning finds exactly the rows outside a queue's window.
-- Within one partition rows arrive in time order, so inserts land at the right edge of that
-- partition's range (cheap, unlike the random key_hash index).
CREATE INDEX IF NOT EXISTS dedup_by_partition ON queen.dedup (partition_id, created_at);

-- Segments by partition and age: retention finds exactly the segments past a queue's time.
CREATE INDEX IF NOT EXISTS segments_by_age ON queen.segments (partition_id, created_at);

-- Partitions deleted (with their queue) whose sidecar rows are not pruned yet. The sidecar has
-- no foreign key; this list lets pruning find those rows by the index above.
CREATE TABLE IF NOT EXISTS queen.dropped_partitions (
    id         bigint PRIMARY KEY,
    dropped_at timestamptz NOT NULL DEFAULT now()
);

CREATE OR REPLACE FUNCTION queen.remember_dropped_partitions() RETURNS trigger
LANGUAGE plpgsql AS $fn$
BEGIN
    INSERT INTO queen.dropped_partitions (id)
    SELECT g.id FROM gone g
    ON CONFLICT (id) DO NOTHING;
    RETURN NULL;
END
$fn$;

DO $do$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_trigger
                   WHERE tgname = 'partitions_remember_dropped'
                     AND tgrelid = 'queen.partitions'::regclass) THEN
        CREATE TRIGGER partitions_remember_dropped
            AFTER DELETE ON queen.partitions
            REFERENCING OLD TABLE AS gone
            FOR EACH STATEMENT EXECUTE FUNCTION queen.remember_dropped_partitions();
    END IF;
END
$do$;

-- Counters of what retention and pruning removed, shared by every broker process.
CREATE TABLE IF NOT EXISTS queen.retention_totals (
    name  text PRIMARY KEY,
    value bigint NOT NULL DEFAULT 0
);

-- Offsets removed above a partition's lowest stored offset: what a clear, retention or
-- eviction took out while a write below it stayed (one held by a live lease, or not yet due),
-- and single messages deleted. Offsets are never reused, so next_offset minus a position
-- counts these too; the admin figures (admin.sql) subtract them. Rows below the partition's
-- lowest stored offset no longer matter (every figure starts at or above it) and are tidied
-- whenever that offset moves (queen.note_removed). Empty but for such gaps, so a figure costs
-- one probe of an empty index per partition. Created with the gaps a database held before:
-- between consecutive stored writes of a partition, and between its last stored write and
-- next_offset (one pass over the segments' offsets, once).
DO $do$
BEGIN
    IF to_regclass('queen.gaps') IS NULL THEN
        CREATE TABLE queen.gaps (
            partition_id bigint NOT NULL,
            first_offset bigint NOT NULL,
            last_offset  bigint NOT NULL,
            PRIMARY KEY (partition_id, first_offset),
            CHECK (last_offset >= first_offset)
        );
        INSERT INTO queen.gaps (partition_id, first_offset, last_offset)
        SELECT x.partition_id, x.prev_last + 1, x.first_offset - 1
        FROM (SELECT s.partition_id, s.first_offset,
                     lag(s.last_offset) OVER (PARTITION BY s.partition_id
                                              ORDER BY s.first_offset) AS prev_last
              FROM queen.segments s) x
        WHERE x.first_offset > x.prev_last + 1
        UNION ALL
        SELECT p.id, t.last_offset + 1, p.next_offset - 1
        FROM queen.partitions p
        CROSS JOIN LATERAL (SELECT s.last_offset FROM queen.segments s
                            WHERE s.partition_id = p.id
                            ORDER BY s.first_offset DESC LIMIT 1) t
        WHERE t.last_offset < p.next_offset - 1;
    END IF;
END
$do$;

-- Rows of deleted partitions go with them.
CREATE OR REPLACE FUNCTION queen.forget_gaps() RETURNS trigger
LANGUAGE plpgsql AS $fn$
BEGIN
    DELETE FROM queen.gaps WHERE partition_id IN (SELECT g.id FROM gone g);
    RETURN NULL;
END
$fn$;

DO $do$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_trigger
                   WHERE tgname = 'partitions_forget_gaps'
                     AND tgrelid = 'queen.partitions'::regclass) THEN
        CREATE TRIGGER partitions_forget_gaps
            AFTER DELETE ON queen.partitions
            REFERENCING OLD TABLE AS gone
            FOR EACH STATEMENT EXECUTE FUNCTION queen.forget_gaps();
    END IF;
END
$do$;

-- Book the ranges (p_pids[i], p_firsts[i]..p_lasts[i]) just removed from their partitions
-- (called after the removal, in the same transaction): each with a stored write below it is a
-- gap; failures recorded there and gaps now below their partition's lowest stored offset are
-- dropped. Pushes only add
-- above next_offset, so nothing can appear below a removed range meanwhile; two removals at
-- once can at worst leave a gap below the lowest offset, which no figure reads.
CREATE OR REPLACE FUNCTION queen.note_removed(
    p_pids bigint[], p_firsts bigint[], p_lasts bigint[]) RETURNS void
LANGUAGE plpgsql AS $fn$
BEGIN
    IF p_pids IS NULL OR cardinality(p_pids) = 0 THEN
        RETURN;
    END IF;
    INSERT INTO queen.gaps (partition_id, first_offset, last_offset)
    SELECT r.pid, r.first, r.last
    FROM unnest(p_pids, p_firsts, p_lasts) AS r (pid, first, last)
    WHERE EXISTS (SELECT 1 FROM queen.segments s
                  WHERE s.partition_id = r.pid AND s.first_offset < r.first)
    ON CONFLICT DO NOTHING;
    DELETE FROM queen.failures f   -- failed deliveries of messages no longer stored
    USING unnest(p_pids, p_firsts, p_lasts) AS r (pid, first, last)
    WHERE f.partition_id = r.pid AND f.msg_offset BETWEEN r.first AND r.last;
    DELETE FROM queen.gaps g
    USING (SELECT DISTINCT u.pid FROM unnest(p_pids) AS u (pid)) r
    WHERE g.partition_id = r.pid
      AND g.last_offset < coalesce(
          (SELECT s.first_offset FROM queen.segments s
           WHERE s.partition_id = r.pid ORDER BY s.first_offset LIMIT 1),
          (SELECT p.next_offset FROM queen.partitions p WHERE p.id = r.pid));
END
$fn$;

-- Remove the segments (p_pids[i], p_firsts[i]) that hold no message under a live lease, and
-- count them in queen.retention_totals under the two names given; what goes above a write
-- that stays is booked in queen.gaps. The cursors of the
-- partitions concerned are locked FOR SHARE first, in (partition, group) order, the consume
-- side's order: a pop holding one finishes first and its lease is then seen; a pop arriving
-- meanwhile skips the partition (SKIP LOCKED). Shared by retention, eviction and clearing.
CREATE OR REPLACE FUNCTION queen.remove_unleased_segments(
    p_pids bigint[], p_firsts bigint[], p_segments_name text, p_messages_name text,
    OUT segments bigint, OUT messages bigint)
LANGUAGE plpgsql AS $fn$
DECLARE
    v_pids   bigint[];
    v_firsts bigint[];
    v_lasts  bigint[];
BEGIN
    WITH candidates AS (
        SELECT v.partition_id, v.first_offset
        FROM unnest(p_pids, p_firsts) AS v(partition_id, first_offset)
    ),
    held AS MATERIALIZED (
        SELECT c.partition_id, c.next_offset, c.lease_end, c.lease_expires_at
        FROM queen.cursors c
        WHERE c.partition_id IN (SELECT DISTINCT partition_id FROM candidates)
        ORDER BY c.partition_id, c.consumer_group
        FOR SHARE
    ),
    gone AS (
        DELETE FROM queen.segments s
        USING candidates v
        WHERE s.partition_id = v.partition_id AND s.first_offset = v.first_offset
          AND NOT EXISTS (
              SELECT 1 FROM held h
              WHERE h.partition_id = s.partition_id
                AND h.lease_expires_at > now()
                AND s.last_offset >= h.next_offset
                AND s.first_offset < h.lease_end)
        RETURNING s.partition_id, s.first_offset, s.last_offset
    )
    SELECT count(*), coalesce(sum(gone.last_offset - gone.first_offset + 1), 0),
           array_agg(gone.partition_id), array_agg(gone.first_offset),
           array_agg(gone.last_offset)
    INTO segments, messages, v_pids, v_firsts, v_lasts
    FROM gone;

    IF segments > 0 THEN
        PERFORM queen.note_removed(v_pids, v_firsts, v_lasts);
        INSERT INTO queen.retention_totals AS t (name, value)
        VALUES (p_segments_name, segments), (p_messages_name, messages)
        ON CONFLICT (name) DO UPDATE SET value = t.value + excluded.value;
    END IF;
END
$fn$;

-- One batch of segment retention: at most p_limit segments, each removed whole. Only queues
-- with retention_enabled take part; without it both times are kept but remove nothing.
--
-- A segment goes when its queue has retention_s > 0 and it is older than that (whatever was
-- consumed), or when its queue has completed_retention_s > 0, it is older than that, and every
-- consumer group of the queue has moved its cursor in that partition past the segment's last
-- offset. A segment holding a message under a live lease is never removed: the cursors of the
-- partitions concerned are locked FOR SHARE (in (partition, group) order, the consume side's
-- order), so a pop either finished before (and its lease is seen) or skips the partition while
-- this short transaction runs. Returns the segments and messages removed.
CREATE OR REPLACE FUNCTION queen.retention_batch(
    p_limit integer, OUT segments bigint, OUT messages bigint)
LANGUAGE plpgsql AS $fn$
BEGIN
    WITH groups AS (   -- the consumer groups of each queue with completed retention
        SELECT DISTINCT c.queue_id, c.consumer_group
        FROM queen.cursors c
        JOIN queen.queues q
          ON q.id = c.queue_id AND q.retention_enabled AND q.completed_retention_s > 0
        UNION
        SELECT g.queue_id, g.consumer_group
        FROM queen.consumer_groups g
        JOIN queen.queues q
          ON q.id = g.queue_id AND q.retention_enabled AND q.completed_retention_s > 0
    ),
    done_below AS (    -- per partition: every group's cursor is at or past this offset
        SELECT p.id AS partition_id, min(coalesce(c.next_offset, 0)) AS done_below
        FROM queen.partitions p
        JOIN groups g ON g.queue_id = p.queue_id
        LEFT JOIN queen.cursors c
               ON c.partition_id = p.id AND c.consumer_group = g.consumer_group
        GROUP BY p.id
    ),
    candidates AS (
        SELECT x.partition_id, x.first_offset, x.last_offset
        FROM queen.partitions p
        JOIN queen.queues q ON q.id = p.queue_id
        LEFT JOIN done_below d ON d.partition_id = p.id
        CROSS JOIN LATERAL (
            SELECT s.partition_id, s.first_offset, s.last_offset
            FROM queen.segments s
            WHERE s.partition_id = p.id
              AND s.created_at < now() - make_interval(secs => least(
                      CASE WHEN q.retention_s > 0 THEN q.retention_s END,
                      CASE WHEN q.completed_retention_s > 0 THEN q.completed_retention_s END))
              AND ((q.retention_s > 0
                    AND s.created_at < now() - make_interval(secs => q.retention_s))
                   OR s.last_offset < d.done_below)
            LIMIT p_limit) x
        WHERE q.retention_enabled AND (q.retention_s > 0 OR q.completed_retention_s > 0)
        LIMIT p_limit
    )
    SELECT r.segments, r.messages INTO segments, messages
    FROM (SELECT array_agg(v.partition_id) AS pids, array_agg(v.first_offset) AS firsts
          FROM candidates v) c
    CROSS JOIN LATERAL queen.remove_unleased_segments(c.pids, c.firsts, 'segments', 'messages') r;
END
$fn$;

-- One batch of eviction (maxWaitTimeSeconds): at most p_limit segments, each removed whole.
--
-- A segment of a queue with max_wait_time_s > 0 is evicted when it is older than that and at
-- least one consumer group of the queue has not consumed it, or the queue has no consumer
-- group at all: whatever waited too long for a consumer is gone, for every group. A segment
-- every group has moved past stays (retention decides about it). A group's position in a
-- partition is its cursor; a group without a cursor there yet starts where its first pop would
-- (the first segment stored at or after its subscription, or the beginning). Eviction does
-- not depend on retention_enabled. Evicted messages are removed, not copied to the dead letter
-- queue. Live leases are respected exactly as in queen.retention_batch.
--
-- Per partition, only segments between the slowest group's position and the first segment
-- younger than the wait are read (both by index), so history every group has consumed and a
-- fresh backlog cost nothing.
CREATE OR REPLACE FUNCTION queen.evict_batch(
    p_limit integer, OUT segments bigint, OUT messages bigint)
LANGUAGE plpgsql AS $fn$
BEGIN
    WITH waiting AS (   -- partitions of queues with a wait, holding messages
        SELECT p.id AS partition_id, p.queue_id, p.next_offset,
               now() - make_interval(secs => q.max_wait_time_s) AS cutoff
        FROM queen.queues q
        JOIN queen.partitions p ON p.queue_id = q.id
        WHERE q.max_wait_time_s > 0 AND p.next_offset > 0
    ),
    groups AS (         -- the consumer groups of each queue concerned
        SELECT DISTINCT c.queue_id, c.consumer_group
        FROM queen.cursors c
        WHERE c.queue_id IN (SELECT DISTINCT w.queue_id FROM waiting w)
        UNION
        SELECT g.queue_id, g.consumer_group
        FROM queen.consumer_groups g
        WHERE g.queue_id IN (SELECT DISTINCT w.queue_id FROM waiting w)
    ),
    slowest AS (        -- per partition: every group is at or past this offset
        SELECT w.partition_id, w.cutoff,
               coalesce(min(coalesce(
                   c.next_offset,
                   CASE WHEN cg.subscribed_at IS NULL THEN 0
                        ELSE coalesce((SELECT s.first_offset FROM queen.segments s
                                       WHERE s.partition_id = w.partition_id
                                         AND s.created_at >= cg.subscribed_at
                                       ORDER BY s.created_at LIMIT 1),
                                      w.next_offset)
                   END)), 0) AS done_below,
               w.next_offset
        FROM waiting w
        LEFT JOIN groups g ON g.queue_id = w.queue_id
        LEFT JOIN queen.cursors c
               ON c.partition_id = w.partition_id AND c.consumer_group = g.consumer_group
        LEFT JOIN queen.consumer_groups cg
               ON cg.queue_id = w.queue_id AND cg.consumer_group = g.consumer_group
        GROUP BY w.partition_id, w.cutoff, w.next_offset
    ),
    candidates AS (
        SELECT x.partition_id, x.first_offset
        FROM slowest d
        CROSS JOIN LATERAL (
            SELECT coalesce((SELECT max(s.first_offset) FROM queen.segments s
                             WHERE s.partition_id = d.partition_id
                               AND s.first_offset <= d.done_below), 0) AS low,
                   coalesce((SELECT s.first_offset FROM queen.segments s
                             WHERE s.partition_id = d.partition_id AND s.created_at >= d.cutoff
                             ORDER BY s.created_at LIMIT 1), d.next_offset) AS high
        ) b
        CROSS JOIN LATERAL (
            SELECT s.partition_id, s.first_offset
            FROM queen.segments s
            WHERE s.partition_id = d.partition_id
              AND s.first_offset >= b.low AND s.first_offset < b.high
              AND s.last_offset >= d.done_below
              AND s.created_at < d.cutoff
              AND NOT EXISTS (   -- leased now: skipped before the limit, checked again below
                  SELECT 1 FROM queen.cursors h
                  WHERE h.partition_id = s.partition_id
                    AND h.lease_expires_at > now()
                    AND s.last_offset >= h.next_offset
                    AND s.first_offset < h.lease_end)
            ORDER BY s.first_offset
            LIMIT p_limit) x
        WHERE d.done_below < d.next_offset
        LIMIT p_limit
    )
    SELECT r.segments, r.messages INTO segments, messages
    FROM (SELECT array_agg(v.partition_id) AS pids, array_agg(v.first_offset) AS firsts
          FROM candidates v) c
    CROSS JOIN LATERAL queen.remove_unleased_segments(c.pids, c.firsts, 'evicted_segments', 'evicted_messages') r;
END
$fn$;

-- One batch of sidecar pruning: at most p_limit rows outside their queue's current window
-- (all rows of a queue whose window is 0), or of a deleted partition. Returns the rows removed.
CREATE OR REPLACE FUNCTION queen.prune_dedup_batch(p_limit integer, OUT removed bigint)
LANGUAGE plpgsql AS $fn$
BEGIN
    WITH expired AS (
        SELECT x.ctid
        FROM queen.partitions p
        JOIN queen.queues q ON q.id = p.queue_id
        CROSS JOIN LATERAL (
            SELECT d.ctid FROM queen.dedup d
            WHERE d.partition_id = p.id
              AND d.created_at < now() - make_interval(secs => q.dedup_window_seconds)
            LIMIT p_limit) x
        LIMIT p_limit
    ),
    orphaned AS (
        SELECT x.ctid
        FROM queen.dropped_partitions g
        CROSS JOIN LATERAL (
            SELECT d.ctid FROM queen.dedup d WHERE d.partition_id = g.id LIMIT p_limit) x
        LIMIT p_limit
    ),
    gone AS (
        DELETE FROM queen.dedup d
        WHERE d.ctid = ANY (ARRAY(SELECT ctid FROM expired UNION ALL SELECT ctid FROM orphaned))
        RETURNING 1
    )
    SELECT count(*) INTO removed FROM gone;

    -- A dropped partition with no sidecar row left is forgotten.
    DELETE FROM queen.dropped_partitions g
    WHERE NOT EXISTS (SELECT 1 FROM queen.dedup d WHERE d.partition_id = g.id);

    IF removed > 0 THEN
        INSERT INTO queen.retention_totals AS t (name, value)
        VALUES ('sidecar_rows', removed)
        ON CONFLICT (name) DO UPDATE SET value = t.value + excluded.value;
    END IF;
END
$fn$;

-- What one queue holds: partitions, segments, messages, sidecar rows, and its time settings.
CREATE OR REPLACE FUNCTION queen.queue_holdings(p_queue text)
RETURNS TABLE (queue_id bigint, namespace text, task text, dedup_window_seconds integer,
               retention_s integer, completed_retention_s integer, partitions bigint,
               segments bigint, messages bigint, sidecar_entries bigint)
LANGUAGE sql STABLE AS $fn$
    SELECT q.id, q.namespace, q.task, q.dedup_window_seconds, q.retention_s,
           q.completed_retention_s,
           (SELECT count(*) FROM queen.partitions p WHERE p.queue_id = q.id),
           seg.segments,
           seg.messages,
           (SELECT coalesce(sum(d.n), 0)::bigint
            FROM queen.partitions p
            CROSS JOIN LATERAL (SELECT count(*) AS n FROM queen.dedup x
                                WHERE x.partition_id = p.id) d
            WHERE p.queue_id = q.id)
    FROM queen.queues q
    CROSS JOIN LATERAL (
        SELECT count(*) AS segments,
               coalesce(sum(s.last_offset - s.first_offset + 1), 0)::bigint AS messages
        FROM queen.partitions p JOIN queen.segments s ON s.partition_id = p.id
        WHERE p.queue_id = q.id) seg
    WHERE q.name = p_queue
$fn$;

-- One batch of trace retention: at most p_limit traces whose partition holds no segment
-- stored before them. A trace is recorded after its message was stored, so such a trace's
-- message is gone, whichever rule removed it. Returns the traces removed.
CREATE OR REPLACE FUNCTION queen.trace_retention_batch(p_limit integer, OUT removed bigint)
LANGUAGE plpgsql AS $fn$
BEGIN
    WITH expired AS (
        SELECT x.id
        FROM queen.partitions p
        CROSS JOIN LATERAL (
            SELECT t.id FROM queen.traces t
            WHERE t.partition_id = p.id
              AND t.created_at < coalesce((SELECT min(s.created_at) FROM queen.segments s
                                           WHERE s.partition_id = p.id), 'infinity')
            LIMIT p_limit) x
        LIMIT p_limit
    ),
    gone AS (
        DELETE FROM queen.traces t WHERE t.id IN (SELECT e.id FROM expired e) RETURNING 1
    )
    SELECT count(*) INTO removed FROM gone;

    IF removed > 0 THEN
        INSERT INTO queen.retention_totals AS t (name, value)
        VALUES ('traces', removed)
        ON CONFLICT (name) DO UPDATE SET value = t.value + excluded.value;
    END IF;
END
$fn$;
