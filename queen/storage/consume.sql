-- Queen on Trio consume side: queue options, consumer cursors and leases, failures, the dead
-- letter queue and subscriptions. Idempotent; applied after schema.sql and system.sql.
--
-- Lock order (see docs/architecture.md): a transaction that takes both kinds of row locks takes
-- cursor rows first, in (partition_id, consumer_group) order, and partition rows after, in id
-- order (queen.push_frames). Push transactions take partition rows only; pops take cursor rows
-- only, with SKIP LOCKED. None of the tables below has a foreign key, so writing them never
-- takes a KEY SHARE lock on a partition or queue row that a push holds; rows of a deleted
-- queue are removed by the queues_forget trigger (ids are never reused, so a late straggler
-- can never match a live partition).

-- Queue options (POST /api/v1/configure). Defaults are the contract's.
ALTER TABLE queen.queues
    ADD COLUMN IF NOT EXISTS lease_time_s          integer NOT NULL DEFAULT 300,
    ADD COLUMN IF NOT EXISTS retry_limit           integer NOT NULL DEFAULT 3,
    ADD COLUMN IF NOT EXISTS retry_delay_ms        integer NOT NULL DEFAULT 1000,
    ADD COLUMN IF NOT EXISTS max_size              integer NOT NULL DEFAULT 0,
    ADD COLUMN IF NOT EXISTS ttl_s                 integer NOT NULL DEFAULT 3600,
    ADD COLUMN IF NOT EXISTS dead_letter_queue     boolean NOT NULL DEFAULT false,
    ADD COLUMN IF NOT EXISTS dlq_after_max_retries boolean NOT NULL DEFAULT false,
    ADD COLUMN IF NOT EXISTS priority              integer NOT NULL DEFAULT 0,
    ADD COLUMN IF NOT EXISTS delayed_processing_s  integer NOT NULL DEFAULT 0,
    ADD COLUMN IF NOT EXISTS window_buffer_s       integer NOT NULL DEFAULT 0,
    ADD COLUMN IF NOT EXISTS retention_s           integer NOT NULL DEFAULT 0,
    ADD COLUMN IF NOT EXISTS completed_retention_s integer NOT NULL DEFAULT 0,
    ADD COLUMN IF NOT EXISTS retention_enabled     boolean NOT NULL DEFAULT false,
    ADD COLUMN IF NOT EXISTS max_wait_time_s       integer NOT NULL DEFAULT 0,
    ADD COLUMN IF NOT EXISTS encryption_enabled    boolean NOT NULL DEFAULT false,
    ADD COLUMN IF NOT EXISTS updated_at            timestamptz NOT NULL DEFAULT now();
-- The few queues that are encrypted, read by every broker process every few seconds.
CREATE INDEX IF NOT EXISTS queues_encrypted ON queen.queues (name) WHERE encryption_enabled;

-- One row per (partition, consumer group): where the group stands in that partition.
--   next_offset        every offset below it is done (acked or moved to the DLQ)
--   acked              offsets at or above next_offset already done (acks out of order)
--   lease_*            the live lease, if any: messages [next_offset, lease_end) were handed
--                      to lease_id until lease_expires_at; an expired lease is simply free
--   not_before         a failed ack's retry delay: the partition waits until then
--   delivered_at       last pop; the least recently served partition is claimed first
--   parked             nothing was past the cursor a while after it was last served: a pop's
--                      walk of the whole queue leaves it out (see "Parking" below)
CREATE TABLE IF NOT EXISTS queen.cursors (
    partition_id     bigint NOT NULL,
    consumer_group   text NOT NULL,
    queue_id         bigint NOT NULL,
    next_offset      bigint NOT NULL DEFAULT 0,
    acked            bigint[] NOT NULL DEFAULT '{}',
    lease_id         uuid,
    lease_end        bigint,
    lease_expires_at timestamptz,
    not_before       timestamptz,
    delivered_at     timestamptz,
    created_at       timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (partition_id, consumer_group)
) WITH (fillfactor = 70);
DROP INDEX IF EXISTS queen.cursors_by_queue;
CREATE INDEX IF NOT EXISTS cursors_by_queue_group ON queen.cursors (queue_id, consumer_group);
CREATE INDEX IF NOT EXISTS cursors_by_group ON queen.cursors (consumer_group);
CREATE INDEX IF NOT EXISTS cursors_by_lease ON queen.cursors (lease_id) WHERE lease_id IS NOT NULL;
-- Parking. A pop on one queue walks its group's cursors least recently served first and stops
-- at the first ones with messages, instead of sorting them all. A partition served and then
-- written no more would stay at the front of that order, and every walk would read past it: so
-- at most once a second per (queue, group) a pop parks the cursors with nothing past them that
-- were last served over five seconds before, and unparks the parked ones with something past
-- them again, looking at a thousand of them a time, in partition order, from where the last
-- sweep stopped (queen.pop, "the sweep"). The walk follows the unparked cursors only, so its
-- cost does not grow with the partitions that have nothing to give. A parked cursor with
-- messages is still found: a pop of its partition by name (the partition route, a hint: the
-- partitions pushed while pops waited) claims it, which unparks it; a walk that finds nothing
-- unparks every parked cursor with something past it and walks again; seek and a new
-- subscription start unpark what they move. Otherwise it waits, behind partitions that are
-- claimable, for the sweep that reaches it: within a second for each thousand parked cursors
-- of its group on the queue. Parked is a hint, never a condition of delivery: no pop of a
-- partition by name, no ripe scan and no walk across queues reads it.
ALTER TABLE queen.cursors ADD COLUMN IF NOT EXISTS parked boolean NOT NULL DEFAULT false;
DROP INDEX IF EXISTS queen.cursors_by_queue_group_served;
CREATE INDEX IF NOT EXISTS cursors_by_queue_group_active
    ON queen.cursors (queue_id, consumer_group, delivered_at NULLS FIRST, partition_id)
    WHERE NOT parked;
CREATE INDEX IF NOT EXISTS cursors_parked_by_queue_group
    ON queen.cursors (queue_id, consumer_group, partition_id) WHERE parked;

-- Which partitions a group has looked at: a pop creates the missing cursors of partitions
-- created since its group's mark only. Every partition whose creating transaction id is below
-- `covered` was seen by a pop of the group (and got its cursor if it held messages), except
-- that the mark never passes a partition seen still empty. A group without a row looks at
-- every partition of the queue once.
-- `scanned` is the pop's own mark: it passes the partitions seen still empty too, which are
-- kept in `empties` and looked at again by every look until they hold messages. A queue's
-- "Default" partition, which clients naming their partitions never write, holds `covered`
-- back for good; were a pop to look from `covered`, it would read every partition created
-- since at each look. (NULL `scanned`, a row of an earlier build: from `covered`.)
-- (Added by a block that looks for the column first: a table that has it is not altered.)
DO $do$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_attribute
                   WHERE attrelid = 'queen.partitions'::regclass AND attname = 'created_xid'
                     AND NOT attisdropped) THEN
        ALTER TABLE queen.partitions ADD COLUMN created_xid xid8 DEFAULT pg_current_xact_id();
    END IF;
END
$do$;
CREATE INDEX IF NOT EXISTS partitions_by_queue_created ON queen.partitions (queue_id, created_xid);
CREATE TABLE IF NOT EXISTS queen.cursor_marks (
    queue_id       bigint NOT NULL,
    consumer_group text NOT NULL,
    covered        xid8 NOT NULL,
    PRIMARY KEY (queue_id, consumer_group)
);
ALTER TABLE queen.cursor_marks
    ADD COLUMN IF NOT EXISTS scanned xid8,
    ADD COLUMN IF NOT EXISTS empties bigint[] NOT NULL DEFAULT '{}',
    ADD COLUMN IF NOT EXISTS swept_at timestamptz,   -- the group's last sweep (Parking, above)
    ADD COLUMN IF NOT EXISTS swept_past bigint NOT NULL DEFAULT 0;   -- and where it stopped

-- When each group last found a queue with nothing to deliver: a pop of one queue as a whole
-- (named, no partition named) that delivered nothing writes now() here, at most once a second per
-- (queue, group), and the row goes when the group's place there is moved back or forgotten
-- (seek, a new subscription start, the group's or the queue's deletion). No pop reads it: it
-- is a record for operators and for tools that read this table, with the column names and
-- key an original Queen database has (queue mode is the group '__QUEUE_MODE__'; names as
-- text, so no name a pop accepts is too long for it). Rows are keyed by name, so a queue
-- deleted and made again starts without one.
CREATE TABLE IF NOT EXISTS queen.consumer_watermarks (
    queue_name         text NOT NULL,
    consumer_group     text NOT NULL DEFAULT '__QUEUE_MODE__',
    last_empty_scan_at timestamptz NOT NULL DEFAULT 'epoch',
    updated_at         timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (queue_name, consumer_group)
);

-- Failed deliveries not yet resolved: how often the message at msg_offset failed for a group.
CREATE TABLE IF NOT EXISTS queen.failures (
    partition_id   bigint NOT NULL,
    consumer_group text NOT NULL,
    msg_offset     bigint NOT NULL,
    queue_id       bigint NOT NULL,
    attempts       integer NOT NULL,
    last_error     text,
    PRIMARY KEY (partition_id, consumer_group, msg_offset)
);

-- The dead letter queue: a copy of every message given up on, per consumer group.
CREATE TABLE IF NOT EXISTS queen.dlq (
    id             bigserial PRIMARY KEY,
    queue_id       bigint NOT NULL,
    partition_id   bigint NOT NULL,
    consumer_group text NOT NULL,
    msg_offset     bigint NOT NULL,
    message_id     uuid NOT NULL,
    transaction_id text NOT NULL,
    payload        text NOT NULL,
    producer_sub   text,
    trace_id       uuid,
    error_message  text,
    retry_count    integer NOT NULL,
    failed_at      timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE INDEX IF NOT EXISTS dlq_by_queue ON queen.dlq (queue_id, failed_at DESC, id DESC);

-- Where a named consumer group starts on a queue, fixed when it first pops there.
-- subscribed_at NULL: from the beginning; else the first message stored at or after it.
CREATE TABLE IF NOT EXISTS queen.consumer_groups (
    queue_id          bigint NOT NULL,
    consumer_group    text NOT NULL,
    subscription_mode text NOT NULL,
    subscribed_at     timestamptz,
    created_at        timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (queue_id, consumer_group)
);
CREATE INDEX IF NOT EXISTS consumer_groups_by_name ON queen.consumer_groups (consumer_group);

-- Consumer rows of deleted queues go with them.
CREATE OR REPLACE FUNCTION queen.forget_queues() RETURNS trigger
LANGUAGE plpgsql AS $fn$
BEGIN
    DELETE FROM queen.cursors WHERE queue_id IN (SELECT g.id FROM gone g);
    DELETE FROM queen.cursor_marks WHERE queue_id IN (SELECT g.id FROM gone g);
    DELETE FROM queen.failures WHERE queue_id IN (SELECT g.id FROM gone g);
    DELETE FROM queen.dlq WHERE queue_id IN (SELECT g.id FROM gone g);
    DELETE FROM queen.consumer_groups WHERE queue_id IN (SELECT g.id FROM gone g);
    DELETE FROM queen.consumer_watermarks WHERE queue_name IN (SELECT g.name FROM gone g);
    RETURN NULL;
END
$fn$;
CREATE OR REPLACE TRIGGER queues_forget AFTER DELETE ON queen.queues
    REFERENCING OLD TABLE AS gone FOR EACH STATEMENT EXECUTE FUNCTION queen.forget_queues();

-- Every write that advances a partition (a push, from any broker process or route) tells
-- listeners which partitions of which queues got messages: one notification per queue per
-- transaction, sent at commit, on channel queen_pushed: a JSON array of the queue's name and
-- the names of its partitions written (the name alone, "the queue as a whole", when they do
-- not fit a notification). Waiting pops in other broker processes wake on it, and look at
-- those partitions. Channel queen_push still carries the queue's name alone, for brokers of
-- an earlier build on the same database.
CREATE OR REPLACE FUNCTION queen.notify_push() RETURNS trigger
LANGUAGE plpgsql AS $fn$
BEGIN
    PERFORM pg_notify('queen_push', w.name),
            pg_notify('queen_pushed',
                      CASE WHEN octet_length(w.parts) <= 7900 THEN w.parts
                           ELSE jsonb_build_array(w.name)::text END)
    FROM (SELECT q.name, (jsonb_build_array(q.name) || jsonb_agg(DISTINCT b.name))::text AS parts
          FROM bumped b JOIN queen.queues q ON q.id = b.queue_id
          GROUP BY q.name) w;
    RETURN NULL;
END
$fn$;
CREATE OR REPLACE TRIGGER partitions_notify_push AFTER UPDATE ON queen.partitions
    REFERENCING NEW TABLE AS bumped FOR EACH STATEMENT EXECUTE FUNCTION queen.notify_push();

-- The same notification, of the queues as a whole, for writes that move cursors back or away
-- (seek, a new subscription start, a deleted group): a waiting pop elsewhere that found
-- nothing pending looks again.
CREATE OR REPLACE FUNCTION queen.notify_queues(p_queue_ids bigint[]) RETURNS void
LANGUAGE plpgsql AS $fn$
BEGIN
    PERFORM pg_notify('queen_push', q.name),
            pg_notify('queen_pushed', jsonb_build_array(q.name)::text)
    FROM queen.queues q WHERE q.id = ANY (p_queue_ids);
END
$fn$;

-- Advance a cursor over the done offsets contiguous with p_next; the rest stay pending.
-- PL/pgSQL, not SQL: a SQL function returning a record is planned again at every call on
-- PostgreSQL 15-17 (it cannot be inlined), which cost more than the pop or ack around it.
CREATE OR REPLACE FUNCTION queen.cursor_advance(
    p_next bigint, p_done bigint[], OUT next_offset bigint, OUT rest bigint[])
LANGUAGE plpgsql IMMUTABLE AS $fn$
DECLARE
    x bigint;
BEGIN
    next_offset := p_next;
    rest := '{}';
    IF p_done IS NULL OR cardinality(p_done) = 0 THEN
        RETURN;
    END IF;
    FOREACH x IN ARRAY p_done LOOP   -- the usual case: sorted from p_next, no gap
        EXIT WHEN x IS DISTINCT FROM next_offset;
        next_offset := x + 1;
    END LOOP;
    IF x IS DISTINCT FROM next_offset - 1 OR cardinality(p_done) <> next_offset - p_next THEN
        -- out of order, repeated or with gaps: sort them
        next_offset := p_next;
        FOR x IN SELECT DISTINCT u.v FROM unnest(p_done) AS u (v)
                 WHERE u.v >= p_next ORDER BY u.v LOOP
            EXIT WHEN x <> next_offset;
            next_offset := x + 1;
        END LOOP;
        rest := ARRAY(SELECT DISTINCT u.v FROM unnest(p_done) AS u (v)
                      WHERE u.v >= next_offset ORDER BY u.v);
    END IF;
END
$fn$;

-- Create or reconfigure a queue. Every option is overwritten (the caller fills defaults), and
-- the queue's "Default" partition is made to exist.
CREATE OR REPLACE FUNCTION queen.configure_queue(
    p_name text, p_namespace text, p_task text, p_options jsonb,
    OUT queue_id bigint, OUT partition_id bigint)
LANGUAGE plpgsql AS $fn$
#variable_conflict use_column
DECLARE
    o jsonb := p_options;
BEGIN
    INSERT INTO queen.queues AS q (
        name, namespace, task, dedup_window_seconds, lease_time_s, retry_limit, retry_delay_ms,
        max_size, ttl_s, dead_letter_queue, dlq_after_max_retries, priority,
        delayed_processing_s, window_buffer_s, retention_s, completed_retention_s,
        retention_enabled, max_wait_time_s, encryption_enabled, updated_at)
    VALUES (
        p_name, p_namespace, p_task, (o->>'dedupWindowSeconds')::int, (o->>'leaseTime')::int,
        (o->>'retryLimit')::int, (o->>'retryDelay')::int, (o->>'maxSize')::int,
        (o->>'ttl')::int, (o->>'deadLetterQueue')::boolean,
        (o->>'dlqAfterMaxRetries')::boolean, (o->>'priority')::int,
        (o->>'delayedProcessing')::int, (o->>'windowBuffer')::int,
        (o->>'retentionSeconds')::int, (o->>'completedRetentionSeconds')::int,
        (o->>'retentionEnabled')::boolean, (o->>'maxWaitTimeSeconds')::int,
        (o->>'encryptionEnabled')::boolean, now())
    ON CONFLICT (name) DO UPDATE SET
        namespace = EXCLUDED.namespace, task = EXCLUDED.task,
        dedup_window_seconds = EXCLUDED.dedup_window_seconds,
        lease_time_s = EXCLUDED.lease_time_s, retry_limit = EXCLUDED.retry_limit,
        retry_delay_ms = EXCLUDED.retry_delay_ms, max_size = EXCLUDED.max_size,
        ttl_s = EXCLUDED.ttl_s, dead_letter_queue = EXCLUDED.dead_letter_queue,
        dlq_after_max_retries = EXCLUDED.dlq_after_max_retries, priority = EXCLUDED.priority,
        delayed_processing_s = EXCLUDED.delayed_processing_s,
        window_buffer_s = EXCLUDED.window_buffer_s, retention_s = EXCLUDED.retention_s,
        completed_retention_s = EXCLUDED.completed_retention_s,
        retention_enabled = EXCLUDED.retention_enabled,
        max_wait_time_s = EXCLUDED.max_wait_time_s,
        encryption_enabled = EXCLUDED.encryption_enabled, updated_at = now()
    RETURNING q.id INTO queue_id;
    partition_id := queen.ensure_partition(p_name, 'Default');
END
$fn$;

-- Delete a queue and everything of it. Cursor rows go first, in key order, so this never
-- takes the two kinds of lock in the opposite order to an ack-and-push transaction.
CREATE OR REPLACE FUNCTION queen.delete_queue(p_name text) RETURNS boolean
LANGUAGE plpgsql AS $fn$
DECLARE
    v_id bigint;
BEGIN
    SELECT id INTO v_id FROM queen.queues WHERE name = p_name;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    PERFORM 1 FROM queen.cursors WHERE queue_id = v_id
    ORDER BY partition_id, consumer_group FOR UPDATE;
    DELETE FROM queen.cursors WHERE queue_id = v_id;
    DELETE FROM queen.queues WHERE id = v_id;
    RETURN FOUND;
END
$fn$;

-- The part of one segment within offsets [p_from, p_upto), for a read that unnests only that
-- slice of a write: lo, the first offset in it, and a..z, the subscripts of its parallel
-- arrays (lower bound p_lower) that hold lo..p_upto - 1; past the arrays' end the slice is
-- simply shorter, or empty. One SELECT, IMMUTABLE, not STRICT: inlined where it is used.
CREATE OR REPLACE FUNCTION queen.segment_range(
    p_first bigint, p_lower integer, p_from bigint, p_upto bigint)
RETURNS TABLE (lo bigint, a integer, z integer)
LANGUAGE sql IMMUTABLE AS $fn$
    SELECT greatest(p_first, p_from),
           (greatest(p_first, p_from) - p_first + p_lower)::integer,
           least(p_upto - 1 - p_first + p_lower, 2147483647)::integer
$fn$;

-- Where a group stands in one partition, for queen.pop: the one statement of when its cursor
-- there is claimable. pending: messages past the cursor (p_end, the partition's next offset;
-- p_next, the cursor's). claimable: pending, no live lease, no retry delay still running, the
-- window buffer quiet (the newest segment at least p_window_s old) and, with delayed
-- processing, the segment holding the cursor's next offset at least p_delay_s old. ripe_at:
-- when a pending cursor may become claimable (each wait's end, the latest; a wait it cannot
-- date, a partition without the segment it looks for, is none). Every walk of queen.pop and
-- both of its ripe scans read this and nothing else. A set-returning SQL function of one
-- SELECT, STABLE, not STRICT, with no SET clause and no SECURITY DEFINER, so that the planner
-- inlines it (CROSS JOIN LATERAL) into each walk as if its conditions were written there:
-- each condition is a qual of its own, the segment look-ups run only when their queue option
-- is set, and each walk keeps its plan (tests/test_pop_claimable.py checks that it is
-- inlined). A scalar SQL function holding sub-SELECTs is never inlined: called once per
-- cursor, it would run every look-up each time.
CREATE OR REPLACE FUNCTION queen.cursor_claim(
    p_partition_id bigint, p_end bigint, p_next bigint, p_lease_expires_at timestamptz,
    p_not_before timestamptz, p_window_s integer, p_delay_s integer)
RETURNS TABLE (pending boolean, claimable boolean, ripe_at timestamptz)
LANGUAGE sql STABLE AS $fn$
    SELECT p_end > p_next,
           p_end > p_next
           AND (p_lease_expires_at IS NULL OR p_lease_expires_at <= now())
           AND (p_not_before IS NULL OR p_not_before <= now())
           AND (p_window_s = 0
                OR (SELECT s.created_at FROM queen.segments s
                    WHERE s.partition_id = p_partition_id
                    ORDER BY s.first_offset DESC LIMIT 1)
                   <= now() - make_interval(secs => p_window_s))
           AND (p_delay_s = 0
                OR (SELECT s.created_at FROM queen.segments s
                    WHERE s.partition_id = p_partition_id AND s.first_offset <= p_next
                    ORDER BY s.first_offset DESC LIMIT 1)
                   <= now() - make_interval(secs => p_delay_s)),
           greatest(
               coalesce(p_lease_expires_at, now()),
               coalesce(p_not_before, now()),
               CASE WHEN p_window_s = 0 THEN now()
                    ELSE (SELECT s.created_at FROM queen.segments s
                          WHERE s.partition_id = p_partition_id
                          ORDER BY s.first_offset DESC LIMIT 1)
                         + make_interval(secs => p_window_s) END,
               CASE WHEN p_delay_s = 0 THEN now()
                    ELSE (SELECT s.created_at FROM queen.segments s
                          WHERE s.partition_id = p_partition_id AND s.first_offset <= p_next
                          ORDER BY s.first_offset DESC LIMIT 1)
                         + make_interval(secs => p_delay_s) END)
$fn$;

-- Unpark those of the group's cursors of partitions p_partitions that are parked and have
-- something past them; cursors another transaction holds are skipped. Returns how many. Each
-- listed partition's row, then its cursor if due (locked as it is read), are read through their
-- keys, one partition after the other (lateral look-ups the planner keeps apart); each cursor
-- locked is then updated through its key. No statement scans the group's cursors and tests each against the
-- list, which costs cursors x partitions listed (a generic plan expecting one row did: 0.2 s a
-- look beside 10,000 parked cursors). For queen.pop (Parking, at the cursors table).
CREATE OR REPLACE FUNCTION queen.unpark_listed(p_partitions bigint[], p_group text)
RETURNS integer
LANGUAGE plpgsql SET plan_cache_mode = force_generic_plan AS $fn$
DECLARE
    v_locked bigint[];
    v_pid    bigint;
BEGIN
    v_locked := ARRAY(
        SELECT u.pid FROM unnest(p_partitions) AS u (pid)
        CROSS JOIN LATERAL (SELECT p.next_offset FROM queen.partitions p
                            WHERE p.id = u.pid OFFSET 0) p
        CROSS JOIN LATERAL (SELECT 1 FROM queen.cursors c
                            WHERE c.partition_id = u.pid AND c.consumer_group = p_group
                              AND c.parked AND c.next_offset < p.next_offset
                            FOR UPDATE SKIP LOCKED) l);
    FOREACH v_pid IN ARRAY v_locked LOOP
        UPDATE queen.cursors cu SET parked = false
        WHERE cu.partition_id = v_pid AND cu.consumer_group = p_group;
    END LOOP;
    RETURN cardinality(v_locked);
END
$fn$;

-- Unpark the group's parked cursors on one queue that have something past them, looking at
-- those after partition p_past in partition order, at most p_limit of them (NULL: all). Cursors
-- another transaction holds are skipped. unparked: how many; last_seen: the last partition
-- looked at when p_limit were, else 0 (the next look starts over). For queen.pop (Parking, at
-- the cursors table).
CREATE OR REPLACE FUNCTION queen.unpark_cursors(
    p_queue_id bigint, p_group text, p_past bigint, p_limit integer)
RETURNS TABLE (unparked integer, last_seen bigint)
LANGUAGE plpgsql SET plan_cache_mode = force_generic_plan AS $fn$
DECLARE
    v_due  bigint[];
    v_seen bigint;
    v_last bigint;
BEGIN
    -- one read of the slice in partition order (the parked cursors' index), each partition's
    -- row through its key; only those due are unparked
    SELECT array_agg(s.pid) FILTER (WHERE s.due), count(*), max(s.pid)
    INTO v_due, v_seen, v_last
    FROM (SELECT c.partition_id AS pid, p.next_offset > c.next_offset AS due
          FROM queen.cursors c
          CROSS JOIN LATERAL (SELECT p.next_offset FROM queen.partitions p
                              WHERE p.id = c.partition_id OFFSET 0) p
          WHERE c.queue_id = p_queue_id AND c.consumer_group = p_group AND c.parked
            AND c.partition_id > p_past
          ORDER BY c.partition_id
          LIMIT p_limit) s;
    RETURN QUERY
    SELECT CASE WHEN v_due IS NULL THEN 0 ELSE queen.unpark_listed(v_due, p_group) END,
           CASE WHEN p_limit IS NULL OR v_seen < p_limit THEN 0::bigint ELSE v_last END;
END
$fn$;

-- A group's pending cursors on queues p_queues, for queen.pop's look that found nothing, in
-- one read of them: ripe_in_s, the seconds until the earliest may become claimable
-- (queen.cursor_claim's ripe_at; NULL: none is pending), and parked, the parked ones among
-- them (NULL: none), which the look unparks before it walks again (Parking, at the cursors
-- table). A set-returning SQL function of one SELECT: inlined where it is used.
CREATE OR REPLACE FUNCTION queen.group_ripe(p_queues bigint[], p_group text)
RETURNS TABLE (ripe_in_s double precision, parked bigint[])
LANGUAGE sql STABLE AS $fn$
    SELECT extract(epoch FROM min(k.ripe_at) - now())::double precision,
           array_agg(cu.partition_id) FILTER (WHERE cu.parked)
    FROM queen.cursors cu
    CROSS JOIN LATERAL (SELECT p.next_offset FROM queen.partitions p
                        WHERE p.id = cu.partition_id OFFSET 0) p
    JOIN queen.queues q ON q.id = cu.queue_id
    CROSS JOIN LATERAL queen.cursor_claim(cu.partition_id, p.next_offset,
                                          cu.next_offset, cu.lease_expires_at,
                                          cu.not_before, q.window_buffer_s,
                                          q.delayed_processing_s) k
    WHERE cu.queue_id = ANY (p_queues)
      AND cu.consumer_group = p_group
      AND k.pending
$fn$;

-- One candidate of a pop's walk, as queen.pop fetches it.
DO $do$ BEGIN
    IF to_regtype('queen.pop_candidate') IS NULL THEN
        CREATE TYPE queen.pop_candidate AS (
            pid bigint, nxt bigint, acked bigint[], pname text, qname text,
            lease_time_s integer, delayed_processing_s integer);
    END IF;
END $do$;

-- Pop: claim up to p_max_partitions partitions of the queue(s) in scope for p_group and lease
-- up to p_batch messages from them (a budget shared by all claimed partitions), in offset
-- order per partition. One row per delivered message.
--
-- p_spread (1: no condition) is the fewest claimable partitions in scope for which the pop
-- claims more than one: with fewer, it claims one, and leaves the others to the group's
-- other consumers. Once a first claim leaves room in the batch, the walk fetches that many
-- candidates ahead before it claims a second.
--
-- The payloads delivered add up to at most p_max_bytes (octets), also shared by all claimed
-- partitions: a partition's messages are taken in offset order while they fit, so what is
-- left of it stays unleased (with autoAck, the cursor stays before it) for the next pop. The
-- pop's first message is always taken, however big: a message larger than the budget is
-- delivered alone. A partition whose next message does not fit what is left is left as it is.
--
-- Scope: p_queue (and optionally p_partition), or, with p_queue NULL, every queue whose
-- namespace and task match the non-empty filters. A named group's start on a queue is fixed
-- the first time it pops there (p_sub_start: 'all', 'now' or 'at' p_sub_at). With p_auto_ack
-- the cursor moves past what is delivered and no lease is taken.
--
-- A partition is claimable when it has messages past the cursor, no live lease, no pending
-- retry delay, its window buffer is quiet and (with delayed processing) its next message is
-- old enough: queen.cursor_claim, which every walk below reads. Claiming locks the cursor
-- row FOR UPDATE SKIP LOCKED: concurrent pops of one group never wait for each other and
-- never take the same partition. A candidate with
-- nothing stored from its cursor on (removed by a clear, retention or eviction) is no claim:
-- its cursor moves to the partition's end and the next candidate is taken.
--
-- With p_ripe and nothing delivered, one more row (partition_id NULL) says when to look again:
-- ripe_in_s NULL when the group has nothing pending in scope (only a push, or a cursor moved
-- by seek or group deletion, can change that: each notifies), else the seconds until the
-- earliest pending partition may become claimable (its lease expires, its retry delay or
-- window buffer passes, its next message is old enough; 0: it may be claimable now, held by
-- a concurrent pop; queen.cursor_claim's ripe_at).
--
-- p_hint (names of partitions, with p_partition NULL) narrows the look to those partitions:
-- the candidates, the cursors made and the ripe row are theirs only. The broker passes the
-- partitions pushed (or released) since a look of the same kind found nothing, so a look costs
-- what those partitions hold, not what the scope's other, idle partitions number.
--
-- Every walk reaches a partition row through its key (a lateral subquery the planner keeps
-- apart): a plan joining the group's cursors against a scan of the queue's partitions costs
-- cursors x partitions, which is what a cached generic plan picked once the table had grown.
-- The queries are written so that their generic plans are the plans wanted, and the function
-- keeps them (plan_cache_mode): a custom plan made again at every call cost more than the look.
-- (The earlier signatures, without p_spread, p_hint, p_ripe or p_max_bytes, are left in
-- place: a broker of a previous build on the same database keeps popping through them during
-- a rolling upgrade.)
CREATE OR REPLACE FUNCTION queen.pop(
    p_queue text, p_partition text, p_namespace text, p_task text, p_group text,
    p_batch integer, p_max_partitions integer, p_auto_ack boolean,
    p_sub_start text, p_sub_at timestamptz, p_lease_id uuid, p_ripe boolean,
    p_max_bytes bigint, p_hint text[], p_spread integer)
RETURNS TABLE (partition_id bigint, queue_name text, partition_name text, msg_offset bigint,
               message_id uuid, transaction_id text, payload text, producer_sub text,
               trace_id uuid, retry_count integer, lease_expires_at timestamptz,
               ripe_in_s double precision)
LANGUAGE plpgsql SET plan_cache_mode = force_generic_plan AS $fn$
#variable_conflict use_column
DECLARE
    v_queues    bigint[];
    v_left      integer := p_batch;
    v_bytes     bigint := coalesce(p_max_bytes, 9223372036854775807);   -- octets left
    c           queen.pop_candidate;
    v_buf       queen.pop_candidate[] := '{}';   -- candidates fetched ahead (p_spread)
    v_ahead     integer := 0;
    v_taken     integer := 0;
    v_found     integer := 0;   -- candidates fetched
    v_seg_first bigint;
    v_seg_last  bigint;
    v_from      bigint;
    v_until     bigint;
    v_upto      bigint;
    v_gap       record;
    v_n         integer;
    v_qid       bigint;
    v_mark      xid8;
    v_scanned   xid8;
    v_listed    bigint[];
    v_still     bigint[];
    v_horizon   xid8;
    v_seen      integer;
    v_empty     xid8;
    v_made      integer := 0;
    v_claimed   integer := 0;
    v_cands     refcursor;
    v_names     text[] := CASE WHEN p_partition IS NOT NULL THEN ARRAY[p_partition]
                               ELSE p_hint END;
    v_pids      bigint[];   -- the named partitions' ids
    v_q         record;
    v_wm_at     timestamptz;
    v_round     integer := 0;   -- walks made (a second one after unparking)
    v_swept     timestamptz;    -- the group's last sweep of the queue (one queue)
    v_swept_past bigint := 0;   -- and the partition it stopped after
    v_ripe_in   double precision;   -- the ripe row's answer (queen.group_ripe)
    v_parked    bigint[];           -- and the parked cursors it found pending
    v_ripe_read boolean := false;   -- read after the last walk
BEGIN
    IF p_queue IS NOT NULL THEN
        SELECT ARRAY[q.id] INTO v_queues FROM queen.queues q WHERE q.name = p_queue;
    ELSE
        SELECT array_agg(q.id ORDER BY q.id) INTO v_queues FROM queen.queues q
        WHERE (p_namespace = '' OR q.namespace = p_namespace) AND (p_task = '' OR q.task = p_task);
    END IF;
    IF v_queues IS NULL THEN
        RETURN;
    END IF;

    IF p_group <> '__QUEUE_MODE__' THEN
        INSERT INTO queen.consumer_groups (queue_id, consumer_group, subscription_mode,
                                           subscribed_at)
        SELECT qid, p_group, p_sub_start,
               CASE p_sub_start WHEN 'now' THEN now() WHEN 'at' THEN p_sub_at END
        FROM unnest(v_queues) AS qid
        ORDER BY qid
        ON CONFLICT DO NOTHING;
    END IF;

    -- Cursors of this group for partitions that hold messages and have none yet: on the
    -- partition route that one partition (with a hint, the hinted ones); otherwise the
    -- partitions created since the group's mark (every partition on the group's first look
    -- at the queue).
    IF v_names IS NOT NULL THEN
        -- (every query below is bounded by these ids on both sides of its joins: a plan
        -- made while the statistics said a group had few cursors cannot read all of them)
        v_pids := ARRAY(SELECT p.id FROM queen.partitions p
                        WHERE p.queue_id = ANY (v_queues) AND p.name = ANY (v_names));
        INSERT INTO queen.cursors (partition_id, consumer_group, queue_id, next_offset)
        SELECT p.id, p_group, p.queue_id,
               CASE WHEN g.subscribed_at IS NULL THEN 0
                    ELSE coalesce((SELECT sg.first_offset FROM queen.segments sg
                                   WHERE sg.partition_id = p.id
                                     AND sg.created_at >= g.subscribed_at
                                   ORDER BY sg.first_offset LIMIT 1),
                                  p.next_offset)
               END
        FROM queen.partitions p
        LEFT JOIN queen.consumer_groups g
               ON g.queue_id = p.queue_id AND g.consumer_group = p_group
        WHERE p.id = ANY (v_pids) AND p.next_offset > 0
          AND NOT EXISTS (SELECT 1 FROM queen.cursors x
                          WHERE x.partition_id = ANY (v_pids) AND x.consumer_group = p_group
                            AND x.partition_id = p.id)
        ORDER BY p.id
        ON CONFLICT DO NOTHING;
        GET DIAGNOSTICS v_made = ROW_COUNT;
    ELSE
        FOREACH v_qid IN ARRAY v_queues LOOP
            v_mark := NULL;
            v_scanned := NULL;
            v_listed := '{}';
            SELECT m.covered, coalesce(m.scanned, m.covered), m.empties, m.swept_at,
                   m.swept_past
            INTO v_mark, v_scanned, v_listed, v_swept, v_swept_past
            FROM queen.cursor_marks m
            WHERE m.queue_id = v_qid AND m.consumer_group = p_group;
            -- Taken before the look: every transaction below it has ended, so the look
            -- (a later snapshot) sees every partition it created.
            v_horizon := pg_snapshot_xmin(pg_current_snapshot());
            WITH seen AS (
                SELECT p.id, p.queue_id, p.next_offset, p.created_xid,
                       p.created_xid >= coalesce(v_scanned, '0'::xid8) AS fresh
                FROM queen.partitions p
                WHERE p.queue_id = v_qid AND p.created_xid >= coalesce(v_scanned, '0'::xid8)
                UNION
                SELECT p.id, p.queue_id, p.next_offset, p.created_xid,
                       p.created_xid >= coalesce(v_scanned, '0'::xid8)
                FROM queen.partitions p
                WHERE p.id = ANY (v_listed) AND p.queue_id = v_qid
            ),
            made AS (
                INSERT INTO queen.cursors (partition_id, consumer_group, queue_id, next_offset)
                SELECT s.id, p_group, s.queue_id,
                       CASE WHEN g.subscribed_at IS NULL THEN 0
                            ELSE coalesce((SELECT sg.first_offset FROM queen.segments sg
                                           WHERE sg.partition_id = s.id
                                             AND sg.created_at >= g.subscribed_at
                                           ORDER BY sg.first_offset LIMIT 1),
                                          s.next_offset)
                       END
                FROM seen s
                LEFT JOIN queen.consumer_groups g
                       ON g.queue_id = s.queue_id AND g.consumer_group = p_group
                WHERE s.next_offset > 0
                  AND NOT EXISTS (SELECT 1 FROM queen.cursors x
                                  WHERE x.partition_id = s.id AND x.consumer_group = p_group)
                ORDER BY s.id
                ON CONFLICT DO NOTHING
                RETURNING 1
            )
            SELECT (SELECT count(*) FROM made)::integer, count(*) FILTER (WHERE s.fresh)::integer,
                   min(s.created_xid) FILTER (WHERE s.next_offset = 0),
                   coalesce(array_agg(s.id ORDER BY s.id) FILTER (WHERE s.next_offset = 0), '{}')
            INTO v_n, v_seen, v_empty, v_still
            FROM seen s;
            v_made := v_made + v_n;
            -- `covered` moves only past what was looked at, never past a partition still
            -- empty; `scanned` past what was looked at, the empty ones listed. Written only
            -- when a partition was created since, or a listed one is no longer empty: pops
            -- of one group do not queue on the row at every look.
            IF v_seen > 0 OR v_still <> v_listed THEN
                INSERT INTO queen.cursor_marks AS m (queue_id, consumer_group, covered, scanned,
                                                     empties)
                VALUES (v_qid, p_group, least(v_horizon, v_empty), v_horizon, v_still)
                ON CONFLICT (queue_id, consumer_group) DO UPDATE SET
                    covered = greatest(m.covered, excluded.covered),
                    scanned = greatest(m.scanned, excluded.scanned),
                    -- what this look saw still empty, and what others listed meanwhile
                    empties = ARRAY(SELECT DISTINCT e
                                    FROM unnest(m.empties || excluded.empties) AS u (e)
                                    WHERE e = ANY (excluded.empties) OR e <> ALL (v_listed)
                                    ORDER BY e);
            END IF;
        END LOOP;
    END IF;
    IF v_made > 0 THEN   -- plans kept on a tiny cursors table would read all of it
        PERFORM queen.refresh_statistics('{queen.cursors}');
    END IF;

    -- The sweep (Parking, at the cursors table): a look at one queue as a whole, at most once
    -- a second per (queue, group), by the pop that takes the group's marks row (the others
    -- skip it; the row is read above, and locked only when a sweep is due). Cursors another
    -- transaction holds are left for the next sweep.
    IF v_names IS NULL AND cardinality(v_queues) = 1 AND v_mark IS NOT NULL
       AND (v_swept IS NULL OR v_swept <= now() - interval '1 second') THEN
        UPDATE queen.cursor_marks m SET swept_at = now()
        WHERE m.queue_id = v_queues[1] AND m.consumer_group = p_group
          AND (m.swept_at IS NULL OR m.swept_at <= now() - interval '1 second')
          AND m.ctid = (SELECT x.ctid FROM queen.cursor_marks x
                        WHERE x.queue_id = v_queues[1] AND x.consumer_group = p_group
                        FOR UPDATE SKIP LOCKED);
        IF FOUND THEN
            -- the parked cursors, 1,000 a sweep in partition order, from where the last
            -- stopped: each sweep's work is bounded, and every parked cursor is looked at
            -- once in as many seconds as it has thousands of parked neighbours
            SELECT u.last_seen INTO v_swept_past
            FROM queen.unpark_cursors(v_queues[1], p_group, v_swept_past, 1000) u;
            UPDATE queen.cursor_marks m SET swept_past = v_swept_past
            WHERE m.queue_id = v_queues[1] AND m.consumer_group = p_group;
            WITH t AS (
                SELECT c.partition_id FROM queen.cursors c
                CROSS JOIN LATERAL (SELECT p.next_offset FROM queen.partitions p
                                    WHERE p.id = c.partition_id OFFSET 0) p
                WHERE c.queue_id = v_queues[1] AND c.consumer_group = p_group AND NOT c.parked
                  AND p.next_offset <= c.next_offset
                  AND (c.delivered_at IS NULL OR c.delivered_at < now() - interval '5 seconds')
                FOR UPDATE OF c SKIP LOCKED
            )
            UPDATE queen.cursors cu SET parked = true
            WHERE cu.partition_id = ANY (ARRAY(SELECT t.partition_id FROM t))
              AND cu.consumer_group = p_group;
        END IF;
    END IF;

    -- The candidates, least recently served first. Named partitions (the partition route, a
    -- hint) are found by name; on one queue the walk follows an index of the group's unparked
    -- cursors and stops at the first ones with messages; across queues, priority comes first.
    <<walks>>
    LOOP
        v_round := v_round + 1;
        v_found := 0;
        IF v_names IS NOT NULL THEN
            OPEN v_cands FOR
            SELECT cu.partition_id AS pid, cu.next_offset AS nxt, cu.acked, p.name AS pname,
                   q.name AS qname, q.lease_time_s, q.delayed_processing_s
            FROM queen.partitions p
            JOIN queen.cursors cu ON cu.partition_id = p.id
            CROSS JOIN LATERAL (SELECT x.name, x.lease_time_s, x.delayed_processing_s,
                                       x.window_buffer_s, x.priority
                                FROM queen.queues x WHERE x.id = p.queue_id OFFSET 0) q
            CROSS JOIN LATERAL queen.cursor_claim(p.id, p.next_offset, cu.next_offset,
                                                  cu.lease_expires_at, cu.not_before,
                                                  q.window_buffer_s, q.delayed_processing_s) k
            WHERE p.id = ANY (v_pids)
              AND cu.partition_id = ANY (v_pids) AND cu.consumer_group = p_group
              AND k.claimable
            ORDER BY q.priority DESC, cu.delivered_at NULLS FIRST, cu.partition_id
            LIMIT greatest(p_max_partitions, p_spread) + 4   -- room for partitions found empty
            FOR UPDATE OF cu SKIP LOCKED;
        ELSIF cardinality(v_queues) = 1 THEN
            SELECT q.name, q.lease_time_s, q.delayed_processing_s, q.window_buffer_s INTO v_q
            FROM queen.queues q WHERE q.id = v_queues[1];
            OPEN v_cands FOR
            SELECT cu.partition_id AS pid, cu.next_offset AS nxt, cu.acked, p.name AS pname,
                   v_q.name AS qname, v_q.lease_time_s, v_q.delayed_processing_s
            FROM queen.cursors cu
            CROSS JOIN LATERAL (SELECT p.name, p.next_offset FROM queen.partitions p
                                WHERE p.id = cu.partition_id OFFSET 0) p
            CROSS JOIN LATERAL queen.cursor_claim(cu.partition_id, p.next_offset, cu.next_offset,
                                                  cu.lease_expires_at, cu.not_before,
                                                  v_q.window_buffer_s, v_q.delayed_processing_s) k
            WHERE cu.queue_id = v_queues[1]
              AND cu.consumer_group = p_group
              AND NOT cu.parked
              AND k.claimable
            ORDER BY cu.delivered_at NULLS FIRST, cu.partition_id
            LIMIT greatest(p_max_partitions, p_spread) + 4   -- room for partitions found empty
            FOR UPDATE OF cu SKIP LOCKED;
        ELSE
            OPEN v_cands FOR
            SELECT cu.partition_id AS pid, cu.next_offset AS nxt, cu.acked, p.name AS pname,
                   q.name AS qname, q.lease_time_s, q.delayed_processing_s
            FROM queen.cursors cu
            CROSS JOIN LATERAL (SELECT p.name, p.next_offset FROM queen.partitions p
                                WHERE p.id = cu.partition_id OFFSET 0) p
            JOIN queen.queues q ON q.id = cu.queue_id
            CROSS JOIN LATERAL queen.cursor_claim(cu.partition_id, p.next_offset, cu.next_offset,
                                                  cu.lease_expires_at, cu.not_before,
                                                  q.window_buffer_s, q.delayed_processing_s) k
            WHERE cu.queue_id = ANY (v_queues)
              AND cu.consumer_group = p_group
              AND k.claimable
            ORDER BY q.priority DESC, cu.delivered_at NULLS FIRST, cu.partition_id
            LIMIT greatest(p_max_partitions, p_spread) + 4   -- room for partitions found empty
            FOR UPDATE OF cu SKIP LOCKED;
        END IF;
        LOOP
            -- before the fetch: a fetched candidate is a locked row
            EXIT WHEN v_left <= 0 OR v_bytes <= 0 OR v_claimed >= p_max_partitions;
            -- A second partition only when the walk finds at least p_spread candidates: the
            -- first claim left room in the batch, so the rest are fetched ahead (locked, as every
            -- candidate is) and claimed from there; with fewer, the pop stops at one.
            IF v_claimed = 1 AND p_spread > v_found AND v_ahead = 0 THEN
                LOOP
                    EXIT WHEN v_found >= p_spread;
                    FETCH v_cands INTO c;
                    EXIT WHEN NOT FOUND;
                    v_found := v_found + 1;
                    v_ahead := v_ahead + 1;
                    v_buf[v_ahead] := c;
                END LOOP;
                EXIT WHEN v_found < p_spread;
            END IF;
            IF v_taken < v_ahead THEN
                v_taken := v_taken + 1;
                c := v_buf[v_taken];
            ELSE
                FETCH v_cands INTO c;
                EXIT WHEN NOT FOUND;
                v_found := v_found + 1;
            END IF;

            -- The first stored offset at or after the cursor (retention, eviction, a clear or a
            -- deleted message may have left a gap).
            v_from := c.nxt;
            SELECT s.first_offset, s.last_offset INTO v_seg_first, v_seg_last
            FROM queen.segments s
            WHERE s.partition_id = c.pid AND s.first_offset <= v_from
            ORDER BY s.first_offset DESC LIMIT 1;
            IF NOT FOUND OR v_seg_last < v_from THEN
                SELECT s.first_offset INTO v_seg_first
                FROM queen.segments s
                WHERE s.partition_id = c.pid AND s.first_offset > v_from
                ORDER BY s.first_offset LIMIT 1;
                IF NOT FOUND THEN
                    -- Nothing is stored from the cursor on: it moves to the end, so the partition
                    -- is not pending for the group any more. One statement reads both the
                    -- partition's end and its segments: a push committed meanwhile is seen in
                    -- both, and then the cursor stays.
                    WITH moved AS (
                        UPDATE queen.cursors cu SET next_offset = p.next_offset, acked = '{}'
                        FROM queen.partitions p
                        WHERE cu.partition_id = c.pid AND cu.consumer_group = p_group
                          AND p.id = c.pid AND p.next_offset > cu.next_offset
                          AND NOT EXISTS (SELECT 1 FROM queen.segments s
                                          WHERE s.partition_id = c.pid AND s.first_offset > v_from)
                        RETURNING cu.next_offset
                    )
                    DELETE FROM queen.failures f   -- of messages no longer stored
                    USING moved
                    WHERE f.partition_id = c.pid AND f.consumer_group = p_group
                      AND f.msg_offset < moved.next_offset;
                    CONTINUE;   -- not a claim: the next candidate may take its place
                END IF;
                v_from := v_seg_first;
            END IF;
            v_claimed := v_claimed + 1;

            -- Nothing at or past v_upto is needed: the budget, plus offsets already acked.
            v_upto := v_from + v_left + cardinality(c.acked);
            -- Offsets removed inside that reach (a deleted message; a clear, retention or eviction
            -- that kept a write below them: queen.gaps, usually empty) hold no message, so the
            -- reach grows by as many. v_from is a stored offset: no gap holds it.
            IF EXISTS (SELECT 1 FROM queen.gaps g
                       WHERE g.partition_id = c.pid AND g.first_offset > v_from
                         AND g.first_offset < v_upto) THEN
                FOR v_gap IN SELECT g.first_offset, g.last_offset FROM queen.gaps g
                             WHERE g.partition_id = c.pid AND g.first_offset > v_from
                             ORDER BY g.first_offset LOOP
                    EXIT WHEN v_gap.first_offset >= v_upto;
                    v_upto := v_upto + (v_gap.last_offset - v_gap.first_offset + 1);
                END LOOP;
            END IF;
            IF c.delayed_processing_s > 0 THEN   -- stop at the first segment not yet visible
                SELECT s.first_offset INTO v_until
                FROM queen.segments s
                WHERE s.partition_id = c.pid AND s.first_offset >= v_seg_first
                  AND s.created_at > now() - make_interval(secs => c.delayed_processing_s)
                ORDER BY s.first_offset LIMIT 1;
                IF FOUND THEN
                    v_upto := least(v_upto, v_until);
                END IF;
            END IF;

            -- One read of the messages: they are taken in offset order while their payloads fit
            -- what is left of the byte budget (the pop's first message always fits); the octets
            -- taken are left in a transaction-local setting for the budget's next turn.
            RETURN QUERY
            -- Of each write, only the frames in [v_from, v_upto) are unnested (b.lo: the first
            -- offset taken from it; b.a, b.z: the subscripts of that range), so a pop of a few
            -- messages from a write of thousands does not make a row of every frame.
            WITH cand AS (
                SELECT b.lo + u.i - 1 AS off, u.mid, u.tx, u.pl, u.sub, u.tr,
                       octet_length(u.pl) AS len
                FROM queen.segments s
                CROSS JOIN LATERAL queen.segment_range(s.first_offset,
                                                       array_lower(s.message_ids, 1), v_from,
                                                       v_upto) b
                CROSS JOIN LATERAL unnest(s.message_ids[b.a : b.z], s.transaction_ids[b.a : b.z],
                                          s.payloads[b.a : b.z], s.producer_subs[b.a : b.z],
                                          s.trace_ids[b.a : b.z])
                     WITH ORDINALITY AS u (mid, tx, pl, sub, tr, i)
                WHERE s.partition_id = c.pid AND s.first_offset >= v_seg_first
                  AND s.first_offset < v_upto
                  AND b.lo + u.i - 1 <> ALL (c.acked)
                ORDER BY 1
                LIMIT v_left
            ),
            pick AS (
                SELECT w.off, w.mid, w.tx, w.pl, w.sub, w.tr, w.len
                FROM (
                    SELECT cand.*,
                           sum(cand.len) OVER (ORDER BY cand.off ROWS UNBOUNDED PRECEDING) AS upto,
                           row_number() OVER (ORDER BY cand.off ROWS UNBOUNDED PRECEDING) AS rn
                    FROM cand
                ) w
                WHERE w.upto <= v_bytes OR (w.rn = 1 AND v_left = p_batch)
            ),
            taken AS (
                SELECT set_config('queen.pop_taken_bytes', coalesce(sum(pick.len), 0)::text, true)
                FROM pick
            ),
            adv AS (
                SELECT a.next_offset, a.rest
                FROM queen.cursor_advance(
                    v_from,
                    CASE WHEN p_auto_ack THEN c.acked || ARRAY(SELECT pick.off FROM pick)
                         ELSE c.acked END) a
            ),
            mark AS (
                UPDATE queen.cursors cu SET
                    next_offset = adv.next_offset,
                    acked = adv.rest,
                    lease_id = CASE WHEN p_auto_ack THEN NULL ELSE p_lease_id END,
                    lease_end = CASE WHEN p_auto_ack THEN NULL
                                     ELSE (SELECT max(pick.off) + 1 FROM pick) END,
                    lease_expires_at = CASE WHEN p_auto_ack THEN NULL
                                            ELSE now() + make_interval(secs => c.lease_time_s) END,
                    not_before = NULL,
                    delivered_at = clock_timestamp(),
                    parked = false
                FROM adv
                WHERE cu.partition_id = c.pid AND cu.consumer_group = p_group
                  AND EXISTS (SELECT 1 FROM pick)
                RETURNING cu.lease_expires_at
            ),
            tidy AS (   -- with autoAck, failures behind the cursor are resolved
                DELETE FROM queen.failures f
                USING adv
                WHERE p_auto_ack AND f.partition_id = c.pid AND f.consumer_group = p_group
                  AND f.msg_offset < adv.next_offset
            ),
            -- A message's earlier failures are looked up only when something within reach
            -- failed before: one probe of the range, not one per message, in the usual case.
            failed AS (
                SELECT EXISTS (SELECT 1 FROM queen.failures f
                               WHERE f.partition_id = c.pid AND f.consumer_group = p_group
                                 AND f.msg_offset >= v_from
                                 AND f.msg_offset < v_upto) AS any_failed
            )
            SELECT c.pid, c.qname, c.pname, pick.off, pick.mid, pick.tx, pick.pl, pick.sub,
                   pick.tr,
                   CASE WHEN (SELECT failed.any_failed FROM failed)
                        THEN coalesce((SELECT f.attempts FROM queen.failures f
                                       WHERE f.partition_id = c.pid AND f.consumer_group = p_group
                                         AND f.msg_offset = pick.off), 0)
                        ELSE 0 END,
                   (SELECT m.lease_expires_at FROM mark m), NULL::double precision
            FROM pick
            CROSS JOIN taken
            ORDER BY pick.off;
            GET DIAGNOSTICS v_n = ROW_COUNT;
            v_left := v_left - v_n;
            IF v_n > 0 THEN
                v_bytes := v_bytes - current_setting('queen.pop_taken_bytes')::bigint;
            END IF;
        END LOOP;
        CLOSE v_cands;
        -- A walk of one queue that claimed nothing: the parked cursors with something past them
        -- are unparked, and it walks again (once). A look that says when to look again reads
        -- every pending cursor of the group for that anyway: the same read lists the parked
        -- ones, and it is the answer unless the look walks again.
        EXIT walks WHEN v_claimed > 0 OR v_round > 1 OR v_names IS NOT NULL
                        OR cardinality(v_queues) <> 1;
        IF p_ripe THEN
            SELECT r.ripe_in_s, r.parked INTO v_ripe_in, v_parked
            FROM queen.group_ripe(v_queues, p_group) r;
            v_ripe_read := true;
            EXIT walks WHEN v_parked IS NULL;
            v_n := queen.unpark_listed(v_parked, p_group);
        ELSE
            SELECT u.unparked INTO v_n FROM queen.unpark_cursors(v_queues[1], p_group, 0, NULL) u;
        END IF;
        -- (none unparked: another transaction holds them, claiming or unparking them, and the
        -- ripe read already says they may be claimable now)
        EXIT walks WHEN v_n = 0;
        v_ripe_read := false;
    END LOOP walks;

    IF p_ripe AND v_left = p_batch THEN
        IF v_names IS NOT NULL THEN
            RETURN QUERY
            SELECT NULL::bigint, NULL::text, NULL::text, NULL::bigint, NULL::uuid, NULL::text,
                   NULL::text, NULL::text, NULL::uuid, NULL::integer, NULL::timestamptz,
                   extract(epoch FROM min(k.ripe_at) - now())::double precision
            FROM queen.partitions p
            JOIN queen.cursors cu ON cu.partition_id = p.id
            CROSS JOIN LATERAL (SELECT x.window_buffer_s, x.delayed_processing_s
                                FROM queen.queues x WHERE x.id = p.queue_id OFFSET 0) q
            CROSS JOIN LATERAL queen.cursor_claim(cu.partition_id, p.next_offset,
                                                  cu.next_offset, cu.lease_expires_at,
                                                  cu.not_before, q.window_buffer_s,
                                                  q.delayed_processing_s) k
            WHERE p.id = ANY (v_pids)
              AND cu.partition_id = ANY (v_pids) AND cu.consumer_group = p_group
              AND k.pending;
        ELSE
            IF NOT v_ripe_read THEN
                SELECT r.ripe_in_s INTO v_ripe_in FROM queen.group_ripe(v_queues, p_group) r;
            END IF;
            RETURN QUERY
            SELECT NULL::bigint, NULL::text, NULL::text, NULL::bigint, NULL::uuid, NULL::text,
                   NULL::text, NULL::text, NULL::uuid, NULL::integer, NULL::timestamptz,
                   v_ripe_in;
        END IF;
    END IF;

    -- A look at a named queue as a whole that delivered nothing is recorded, last, in
    -- queen.consumer_watermarks: a row written within the last second is left as it is, and
    -- one that another transaction holds is skipped, so pops never queue on it. (Each
    -- statement names its row's whole key: its plan is the key's index at any table size.)
    IF v_left = p_batch AND p_partition IS NULL AND p_queue IS NOT NULL THEN
        SELECT w.last_empty_scan_at INTO v_wm_at FROM queen.consumer_watermarks w
        WHERE w.queue_name = p_queue AND w.consumer_group = p_group;
        IF NOT FOUND THEN
            INSERT INTO queen.consumer_watermarks (queue_name, consumer_group,
                                                  last_empty_scan_at, updated_at)
            VALUES (p_queue, p_group, now(), now())
            ON CONFLICT DO NOTHING;
        ELSIF v_wm_at < now() - interval '1 second' THEN
            UPDATE queen.consumer_watermarks w
            SET last_empty_scan_at = now(), updated_at = now()
            WHERE w.queue_name = p_queue AND w.consumer_group = p_group
              AND w.ctid = (SELECT x.ctid FROM queen.consumer_watermarks x
                            WHERE x.queue_name = p_queue AND x.consumer_group = p_group
                            FOR UPDATE SKIP LOCKED);
        END IF;
    END IF;
END
$fn$;

-- For the acks of one (partition, group): each ack (in order) with the offset and content
-- of the message it names, the first one among [p_next, p_hi) not yet done; NULLs if none.
-- The segments are read and unnested once, and acks meet their frames by one sort on the
-- transaction id (a window), never through a join: the planner believes unnest yields a
-- handful of rows, and a nested loop re-read every frame for every ack.
CREATE OR REPLACE FUNCTION queen.ack_targets(
    p_pid bigint, p_group text, p_pids bigint[], p_groups text[], p_txids text[],
    p_statuses text[], p_errors text[], p_leases uuid[], p_from bigint, p_hi bigint,
    p_next bigint, p_acked bigint[])
RETURNS TABLE (ord integer, tx text, st text, err text, lease uuid, off bigint, mid uuid,
               pl text, sub text, tr uuid)
LANGUAGE sql STABLE
AS $fn$
    WITH items AS (
        SELECT u.ord::integer AS ord, u.tx, u.st, u.err, u.lease
        FROM unnest(p_pids, p_groups, p_txids, p_statuses, p_errors, p_leases)
             WITH ORDINALITY AS u (pid, grp, tx, st, err, lease, ord)
        WHERE u.pid = p_pid AND u.grp = p_group
    ),
    frames AS MATERIALIZED (   -- read the batch's segments once, unnest [p_next, p_hi) of them
        SELECT b.lo + f.i - 1 AS off, f.tx, f.mid, f.pl, f.sub, f.tr
        FROM queen.segments s
        CROSS JOIN LATERAL queen.segment_range(s.first_offset, array_lower(s.message_ids, 1),
                                               p_next, p_hi) b
        CROSS JOIN LATERAL unnest(s.message_ids[b.a : b.z], s.transaction_ids[b.a : b.z],
                                  s.payloads[b.a : b.z], s.producer_subs[b.a : b.z],
                                  s.trace_ids[b.a : b.z])
             WITH ORDINALITY AS f (mid, tx, pl, sub, tr, i)
        WHERE s.partition_id = p_pid AND s.first_offset >= p_from AND s.first_offset < p_hi
    ),
    side_by_side AS (   -- acks (ord set) and the open frames (off set)
        SELECT i.ord, i.tx, i.st, i.err, i.lease, NULL::bigint AS off, NULL::uuid AS mid,
               NULL::text AS pl, NULL::text AS sub, NULL::uuid AS tr
        FROM items i
        UNION ALL
        SELECT NULL, fr.tx, NULL, NULL, NULL, fr.off, fr.mid, fr.pl, fr.sub, fr.tr
        FROM frames fr
        WHERE fr.off >= p_next AND fr.off < p_hi AND fr.off <> ALL (p_acked)
    ),
    matched AS (   -- per transaction id, its first open frame comes first (NULLs if none)
        SELECT x.ord, x.tx, x.st, x.err, x.lease,
               first_value(x.off) OVER w AS off, first_value(x.mid) OVER w AS mid,
               first_value(x.pl) OVER w AS pl, first_value(x.sub) OVER w AS sub,
               first_value(x.tr) OVER w AS tr
        FROM side_by_side x
        WINDOW w AS (PARTITION BY x.tx ORDER BY x.off NULLS LAST)
    )
    SELECT m.ord, m.tx, m.st, m.err, m.lease, m.off, m.mid, m.pl, m.sub, m.tr
    FROM matched m
    WHERE m.ord IS NOT NULL
    ORDER BY m.ord
$fn$;

-- Acknowledge messages: one element per ack in every array (p_leases[i] NULL = unfenced).
-- Statuses: 'completed', 'failed' (retry until the queue's retry_limit, then the DLQ; either
-- way the lease is released, since the consumer gives up the rest of the batch), 'dlq' (to the
-- DLQ, the lease stays) and 'retry' (release the lease without counting). A lease id that is
-- not the live lease of the message's (partition, group) fails that item: 'Invalid or expired
-- lease'; so does an item without a lease id while a lease is live ('Lease required'): the
-- consumer holding it is the only one that may complete, fail or release its batch.
--
-- Cursor rows are locked in (partition_id, consumer_group) order. A completed ack moves the
-- cursor over every contiguous done offset; when the whole leased batch is done, or on a
-- failure that is retried, the lease is released and the rest of the batch is redelivered.
CREATE OR REPLACE FUNCTION queen.ack(
    p_groups text[], p_pids bigint[], p_txids text[], p_statuses text[], p_errors text[],
    p_leases uuid[])
RETURNS TABLE (idx integer, success boolean, error text, queue_name text,
               partition_name text, lease_released boolean, dlq boolean)
LANGUAGE plpgsql AS $fn$
#variable_conflict use_column
DECLARE
    k          record;
    cu         record;
    it         record;
    v_live     boolean;
    v_cov      bigint;
    v_hi       bigint;
    v_done     bigint[];
    v_release  boolean;
    v_clear    boolean;
    v_retry_at timestamptz;
    v_attempts integer;
    v_next     bigint;
    v_rest     bigint[];
    r_idx      integer[];
    r_ok       boolean[];
    r_err      text[];
    r_dlq      boolean[];
BEGIN
    -- Items that name no partition of this broker.
    RETURN QUERY
    SELECT u.ord::integer, false, 'Message not found'::text, NULL::text, NULL::text, false, false
    FROM unnest(p_pids) WITH ORDINALITY AS u (pid, ord)
    WHERE u.pid IS NULL;

    FOR k IN
        SELECT DISTINCT u.pid, u.grp
        FROM unnest(p_pids, p_groups) AS u (pid, grp)
        WHERE u.pid IS NOT NULL
        ORDER BY u.pid, u.grp
    LOOP
        SELECT c.next_offset, c.acked, c.lease_id, c.lease_end, c.lease_expires_at, c.queue_id,
               p.name AS pname, q.name AS qname, q.retry_limit, q.retry_delay_ms,
               p.next_offset AS high
        INTO cu
        FROM queen.cursors c
        JOIN queen.partitions p ON p.id = c.partition_id
        JOIN queen.queues q ON q.id = p.queue_id
        WHERE c.partition_id = k.pid AND c.consumer_group = k.grp
        FOR UPDATE OF c;
        IF NOT FOUND THEN   -- nothing of this partition was ever delivered to this group
            RETURN QUERY
            SELECT u.ord::integer, false, 'Message not found'::text, q.name, p.name, false, false
            FROM unnest(p_pids, p_groups) WITH ORDINALITY AS u (pid, grp, ord)
            LEFT JOIN queen.partitions p ON p.id = k.pid
            LEFT JOIN queen.queues q ON q.id = p.queue_id
            WHERE u.pid = k.pid AND u.grp = k.grp;
            CONTINUE;
        END IF;

        v_live := cu.lease_id IS NOT NULL AND cu.lease_expires_at > now();
        -- Search the leased batch; without a live lease, what follows the cursor (bounded).
        v_hi := CASE WHEN v_live THEN cu.lease_end ELSE least(cu.high, cu.next_offset + 10000) END;
        SELECT coalesce(max(s.first_offset), cu.next_offset) INTO v_cov
        FROM queen.segments s
        WHERE s.partition_id = k.pid AND s.first_offset <= cu.next_offset;

        v_done := '{}';
        v_release := false;
        v_retry_at := NULL;
        r_idx := '{}'; r_ok := '{}'; r_err := '{}'; r_dlq := '{}';

        FOR it IN
            SELECT * FROM queen.ack_targets(k.pid, k.grp, p_pids, p_groups, p_txids, p_statuses,
                                            p_errors, p_leases, v_cov, v_hi, cu.next_offset,
                                            cu.acked)
        LOOP
            r_idx := r_idx || it.ord;
            r_dlq := r_dlq || false;
            IF it.lease IS NOT NULL AND NOT (v_live AND it.lease = cu.lease_id) THEN
                r_ok := r_ok || false;
                r_err := r_err || 'Invalid or expired lease'::text;
                CONTINUE;
            END IF;
            IF it.lease IS NULL AND v_live THEN   -- leased to a consumer: only it may judge
                r_ok := r_ok || false;
                r_err := r_err || 'Lease required: the partition is leased'::text;
                CONTINUE;
            END IF;
            IF it.off IS NULL THEN
                r_ok := r_ok || false;
                r_err := r_err || 'Message not found'::text;
                CONTINUE;
            END IF;
            r_ok := r_ok || true;
            r_err := r_err || NULL::text;
            CONTINUE WHEN it.off = ANY (v_done);   -- the same message twice in one call

            IF it.st = 'completed' THEN
                v_done := v_done || it.off;
            ELSIF it.st = 'retry' THEN
                v_release := true;
            ELSE   -- 'failed' or 'dlq'
                SELECT f.attempts INTO v_attempts FROM queen.failures f
                WHERE f.partition_id = k.pid AND f.consumer_group = k.grp
                  AND f.msg_offset = it.off;
                v_attempts := coalesce(v_attempts, 0);
                IF it.st = 'failed' AND v_attempts + 1 <= cu.retry_limit THEN
                    INSERT INTO queen.failures AS f (partition_id, consumer_group, msg_offset,
                                                     queue_id, attempts, last_error)
                    VALUES (k.pid, k.grp, it.off, cu.queue_id, v_attempts + 1, it.err)
                    ON CONFLICT (partition_id, consumer_group, msg_offset) DO UPDATE
                    SET attempts = EXCLUDED.attempts, last_error = EXCLUDED.last_error;
                    v_release := true;
                    v_retry_at := now() + make_interval(secs => cu.retry_delay_ms / 1000.0);
                ELSE
                    INSERT INTO queen.dlq (queue_id, partition_id, consumer_group, msg_offset,
                                           message_id, transaction_id, payload, producer_sub,
                                           trace_id, error_message, retry_count)
                    SELECT cu.queue_id, k.pid, k.grp, it.off, it.mid, it.tx, it.pl, it.sub,
                           it.tr, coalesce(it.err, f.last_error), v_attempts
                    FROM (SELECT 1) one
                    LEFT JOIN queen.failures f
                           ON f.partition_id = k.pid AND f.consumer_group = k.grp
                          AND f.msg_offset = it.off;
                    v_done := v_done || it.off;
                    r_dlq[cardinality(r_dlq)] := true;
                    -- a consumer that nacks skips the rest of the partition: release it
                    v_release := v_release OR it.st = 'failed';
                END IF;
            END IF;
        END LOOP;

        SELECT a.next_offset, a.rest INTO v_next, v_rest
        FROM queen.cursor_advance(cu.next_offset, cu.acked || v_done) a;
        v_clear := cu.lease_id IS NOT NULL
                   AND (v_release OR v_next >= cu.lease_end OR NOT v_live);
        UPDATE queen.cursors c SET
            next_offset = v_next,
            acked = v_rest,
            lease_id = CASE WHEN v_clear THEN NULL ELSE c.lease_id END,
            lease_end = CASE WHEN v_clear THEN NULL ELSE c.lease_end END,
            lease_expires_at = CASE WHEN v_clear THEN NULL ELSE c.lease_expires_at END,
            not_before = coalesce(v_retry_at, c.not_before)
        WHERE c.partition_id = k.pid AND c.consumer_group = k.grp;
        IF v_next > cu.next_offset THEN
            DELETE FROM queen.failures f
            WHERE f.partition_id = k.pid AND f.consumer_group = k.grp
              AND f.msg_offset < v_next;
        END IF;
        -- A lease handed back (retry, a failure) with messages behind it: pops waiting in
        -- other broker processes, which knew the partition as leased, are told as of a push
        -- to it (at commit). A batch completed is usually followed by its consumer's next pop;
        -- other processes' waiting pops find what is left at their re-check.
        IF v_release AND v_live AND cu.high > v_next THEN   -- (a live lease: released)
            PERFORM pg_notify('queen_pushed', jsonb_build_array(cu.qname, cu.pname)::text);
        END IF;

        RETURN QUERY
        SELECT r.i, r.ok, r.err, cu.qname, cu.pname, v_clear AND v_live, r.d
        FROM unnest(r_idx, r_ok, r_err, r_dlq) AS r (i, ok, err, d);
    END LOOP;
END
$fn$;

-- The same, with every column sent as one text joined by chr(31) (an empty element is NULL):
-- splitting on the server is far cheaper than adapting Python lists element by element.
CREATE OR REPLACE FUNCTION queen.ack_joined(
    p_groups text, p_pids text, p_txids text, p_statuses text, p_errors text, p_leases text)
RETURNS TABLE (idx integer, success boolean, error text, queue_name text,
               partition_name text, lease_released boolean, dlq boolean)
LANGUAGE sql AS $fn$
    SELECT * FROM queen.ack(string_to_array(p_groups, chr(31)),
                            string_to_array(p_pids, chr(31), '')::bigint[],
                            string_to_array(p_txids, chr(31)),
                            string_to_array(p_statuses, chr(31)),
                            string_to_array(p_errors, chr(31), ''),
                            string_to_array(p_leases, chr(31), '')::uuid[])
$fn$;

-- Extend every live row of a lease (all partitions of a multi-partition pop) to
-- max(current expiry, now + p_seconds); p_seconds NULL means each queue's lease time.
-- state: 'renewed', 'expired' (the lease exists but is no longer live) or 'missing'.
CREATE OR REPLACE FUNCTION queen.extend_lease(
    p_lease uuid, p_seconds integer,
    OUT renewed integer, OUT expires_at timestamptz, OUT state text)
LANGUAGE plpgsql AS $fn$
#variable_conflict use_column
BEGIN
    WITH locked AS (
        SELECT c.partition_id, c.consumer_group, q.lease_time_s
        FROM queen.cursors c
        JOIN queen.partitions p ON p.id = c.partition_id
        JOIN queen.queues q ON q.id = p.queue_id
        WHERE c.lease_id = p_lease AND c.lease_expires_at > now()
        ORDER BY c.partition_id, c.consumer_group
        FOR UPDATE OF c
    ),
    upd AS (
        UPDATE queen.cursors c
        SET lease_expires_at = greatest(
                c.lease_expires_at,
                now() + make_interval(secs => coalesce(p_seconds, l.lease_time_s)))
        FROM locked l
        WHERE c.partition_id = l.partition_id AND c.consumer_group = l.consumer_group
          AND c.lease_id = p_lease
        RETURNING c.lease_expires_at
    )
    SELECT count(*)::integer, max(upd.lease_expires_at) INTO renewed, expires_at FROM upd;
    IF renewed > 0 THEN
        state := 'renewed';
    ELSIF EXISTS (SELECT 1 FROM queen.cursors c WHERE c.lease_id = p_lease) THEN
        state := 'expired';
    ELSE
        state := 'missing';
    END IF;
END
$fn$;

-- Acks and pushes applied atomically (POST /api/v1/transaction). The acks run first (cursor
-- rows, in key order), then the pushes through queen.push_frames (partition rows, in id
-- order). If a required lease is not live, an ack fails, or a pushed partition vanished, the
-- block is rolled back and ok is false; the ack results still say which item failed.
-- Push frames name their partition by (queue, partition) name; partitions are created here,
-- inside the transaction, so a failed transaction leaves nothing behind.
CREATE OR REPLACE FUNCTION queen.transact(
    p_required uuid[],
    p_groups text[], p_pids bigint[], p_txids text[], p_statuses text[], p_errors text[],
    p_leases uuid[],
    p_queues text[], p_parts text[], p_mids uuid[], p_ptxids text[], p_payloads text[],
    p_subs text[], p_traces uuid[], p_leaders integer[],
    OUT ok boolean, OUT reason text, OUT acks jsonb, OUT pids bigint[], OUT statuses text,
    OUT originals text)
LANGUAGE plpgsql AS $fn$
#variable_conflict use_column
DECLARE
    v_missing uuid;
    v_leases  uuid[];
    v_wpids   bigint[];
    v_wcounts integer[];
BEGIN
    ok := true;
    acks := '[]';
    BEGIN
        -- Judged before the acks, which may release the very leases they name.
        SELECT l INTO v_missing FROM unnest(p_required) AS l
        WHERE NOT EXISTS (SELECT 1 FROM queen.cursors c
                          WHERE c.lease_id = l AND c.lease_expires_at > now())
        LIMIT 1;

        -- An ack without a lease id of its own acts under the required lease that holds its
        -- (partition, group), if one does.
        SELECT coalesce(array_agg(coalesce(u.lease, (
                   SELECT c.lease_id FROM queen.cursors c
                   WHERE c.partition_id = u.pid AND c.consumer_group = u.grp
                     AND c.lease_id = ANY (p_required) AND c.lease_expires_at > now()))
                   ORDER BY u.ord), '{}')
        INTO v_leases
        FROM unnest(p_pids, p_groups, p_leases) WITH ORDINALITY AS u (pid, grp, lease, ord);

        SELECT coalesce(jsonb_agg(to_jsonb(a) ORDER BY a.idx), '[]') INTO acks
        FROM queen.ack(p_groups, p_pids, p_txids, p_statuses, p_errors, v_leases) a;
        IF EXISTS (SELECT 1 FROM jsonb_array_elements(acks) e
                   WHERE NOT (e->>'success')::boolean) THEN
            reason := 'ack';
            RAISE EXCEPTION USING ERRCODE = 'QN001';
        END IF;
        IF v_missing IS NOT NULL THEN
            reason := 'Required lease ' || v_missing || ' is not live';
            RAISE EXCEPTION USING ERRCODE = 'QN001';
        END IF;

        IF cardinality(p_mids) > 0 THEN
            WITH names AS (
                SELECT DISTINCT u.q, u.p FROM unnest(p_queues, p_parts) AS u (q, p)
                ORDER BY u.q, u.p
            ),
            ids AS (
                SELECT n.q, n.p, queen.ensure_partition(n.q, n.p) AS id FROM names n
            )
            SELECT array_agg(ids.id ORDER BY u.ord) INTO pids
            FROM unnest(p_queues, p_parts) WITH ORDINALITY AS u (q, p, ord)
            JOIN ids ON ids.q = u.q AND ids.p = u.p;

            -- the frames of one partition are consecutive: one write per partition
            SELECT array_agg(w.pid ORDER BY w.first), array_agg(w.cnt ORDER BY w.first)
            INTO v_wpids, v_wcounts
            FROM (SELECT u.pid, min(u.ord) AS first, count(*)::integer AS cnt
                  FROM unnest(pids) WITH ORDINALITY AS u (pid, ord)
                  GROUP BY u.pid) w;

            SELECT f.statuses, f.originals INTO statuses, originals
            FROM queen.push_frames(v_wpids, v_wcounts, p_mids, p_ptxids, p_payloads, p_subs,
                                   p_traces, p_leaders) f;
            IF strpos(statuses, '2') > 0 THEN
                reason := 'a pushed partition was deleted during the transaction';
                RAISE EXCEPTION USING ERRCODE = 'QN001';
            END IF;
        END IF;
    EXCEPTION WHEN SQLSTATE 'QN001' THEN
        ok := false;
    END;
END
$fn$;

-- The DLQ of a queue (or of every queue), newest failure first, with the total count.
CREATE OR REPLACE FUNCTION queen.dlq_page(
    p_queue text, p_group text, p_partition text, p_from timestamptz, p_to timestamptz,
    p_limit integer, p_offset integer)
RETURNS TABLE (total bigint, message_id uuid, transaction_id text, partition_id bigint,
               queue_name text, partition_name text, consumer_group text, error_message text,
               retry_count integer, payload text, producer_sub text, trace_id uuid,
               failed_at timestamptz, msg_offset bigint)
LANGUAGE sql STABLE AS $fn$
    WITH hits AS (
        SELECT d.*, q.name AS qname, p.name AS pname
        FROM queen.dlq d
        JOIN queen.queues q ON q.id = d.queue_id
        JOIN queen.partitions p ON p.id = d.partition_id
        WHERE (p_queue IS NULL OR q.name = p_queue)
          AND (p_group IS NULL OR d.consumer_group = p_group)
          AND (p_partition IS NULL OR p.name = p_partition)
          AND (p_from IS NULL OR d.failed_at >= p_from)
          AND (p_to IS NULL OR d.failed_at <= p_to)
    ),
    n AS (SELECT count(*) AS total FROM hits)
    SELECT n.total, h.message_id, h.transaction_id, h.partition_id, h.qname, h.pname,
           h.consumer_group, h.error_message, h.retry_count, h.payload, h.producer_sub,
           h.trace_id, h.failed_at, h.msg_offset
    FROM n LEFT JOIN LATERAL (
        SELECT * FROM hits ORDER BY hits.failed_at DESC, hits.id DESC
        LIMIT p_limit OFFSET p_offset
    ) h ON true
$fn$;

-- Forget a consumer group on every queue: cursors (and so leases) and pending failures;
-- with p_metadata also where it subscribed. Returns the number of cursors removed.
CREATE OR REPLACE FUNCTION queen.delete_consumer_group(p_group text, p_metadata boolean)
RETURNS integer
LANGUAGE plpgsql AS $fn$
DECLARE
    v_n integer;
BEGIN
    PERFORM 1 FROM queen.cursors WHERE consumer_group = p_group
    ORDER BY partition_id, consumer_group FOR UPDATE;
    PERFORM queen.notify_queues(ARRAY(SELECT DISTINCT c.queue_id FROM queen.cursors c
                                      WHERE c.consumer_group = p_group));
    DELETE FROM queen.cursors WHERE consumer_group = p_group;
    GET DIAGNOSTICS v_n = ROW_COUNT;
    DELETE FROM queen.cursor_marks WHERE consumer_group = p_group;
    DELETE FROM queen.failures WHERE consumer_group = p_group;
    IF p_metadata THEN
        DELETE FROM queen.consumer_groups WHERE consumer_group = p_group;
    END IF;
    DELETE FROM queen.consumer_watermarks WHERE consumer_group = p_group;
    RETURN v_n;
END
$fn$;

-- Move a named group's start to p_at on every queue it is subscribed to, and put each of its
-- cursors at the first message stored at or after p_at (live leases are dropped).
-- Returns the number of subscriptions changed.
CREATE OR REPLACE FUNCTION queen.set_subscription(p_group text, p_at timestamptz)
RETURNS integer
LANGUAGE plpgsql AS $fn$
DECLARE
    v_n integer;
BEGIN
    UPDATE queen.consumer_groups
    SET subscription_mode = 'at', subscribed_at = p_at
    WHERE consumer_group = p_group;
    GET DIAGNOSTICS v_n = ROW_COUNT;

    PERFORM 1 FROM queen.cursors WHERE consumer_group = p_group
    ORDER BY partition_id, consumer_group FOR UPDATE;
    PERFORM queen.notify_queues(ARRAY(SELECT g.queue_id FROM queen.consumer_groups g
                                      WHERE g.consumer_group = p_group));
    UPDATE queen.cursors c
    SET next_offset = coalesce((SELECT s.first_offset FROM queen.segments s
                                WHERE s.partition_id = c.partition_id AND s.created_at >= p_at
                                ORDER BY s.first_offset LIMIT 1),
                               (SELECT p.next_offset FROM queen.partitions p
                                WHERE p.id = c.partition_id)),
        acked = '{}', lease_id = NULL, lease_end = NULL, lease_expires_at = NULL,
        not_before = NULL, parked = false
    WHERE c.consumer_group = p_group;
    DELETE FROM queen.failures WHERE consumer_group = p_group;
    DELETE FROM queen.consumer_watermarks WHERE consumer_group = p_group;
    RETURN v_n;
END
$fn$;

-- Forget a consumer group on one queue only: its cursors there (and so its leases), its
-- pending failures there and, with p_metadata, where it subscribed to that queue.
-- queue_found is false (and nothing changes) when the queue does not exist.
CREATE OR REPLACE FUNCTION queen.delete_consumer_group_on_queue(
    p_group text, p_queue text, p_metadata boolean,
    OUT queue_found boolean, OUT cursors_deleted integer, OUT metadata_deleted boolean)
LANGUAGE plpgsql AS $fn$
DECLARE
    v_qid bigint;
BEGIN
    SELECT q.id INTO v_qid FROM queen.queues q WHERE q.name = p_queue;
    queue_found := FOUND;
    cursors_deleted := 0;
    metadata_deleted := false;
    IF NOT queue_found THEN
        RETURN;
    END IF;
    PERFORM 1 FROM queen.cursors c WHERE c.queue_id = v_qid AND c.consumer_group = p_group
    ORDER BY c.partition_id, c.consumer_group FOR UPDATE;
    DELETE FROM queen.cursors c WHERE c.queue_id = v_qid AND c.consumer_group = p_group;
    GET DIAGNOSTICS cursors_deleted = ROW_COUNT;
    PERFORM queen.notify_queues(ARRAY[v_qid]);
    DELETE FROM queen.cursor_marks m WHERE m.queue_id = v_qid AND m.consumer_group = p_group;
    DELETE FROM queen.failures f WHERE f.queue_id = v_qid AND f.consumer_group = p_group;
    IF p_metadata THEN
        DELETE FROM queen.consumer_groups g
        WHERE g.queue_id = v_qid AND g.consumer_group = p_group;
        metadata_deleted := FOUND;
    END IF;
    DELETE FROM queen.consumer_watermarks w
    WHERE w.queue_name = p_queue AND w.consumer_group = p_group;
END
$fn$;

-- Move a consumer group's cursors on a queue (or on one partition of it): to the end
-- (p_to_end: everything stored so far is skipped) or to the first message stored at or after
-- p_at (the group reads again from there; the end if none). Partitions holding messages where
-- the group has no cursor yet get one, so the move covers every message stored so far.
-- Leases and retry delays of the group there are released and its pending failures dropped.
-- Cursor rows are inserted in key order, then locked FOR UPDATE in (partition, group) order,
-- like an ack. queue_found/partition_found say whether the names exist (nothing changes if
-- not); moved_to is the stored time the cursors now start after (to the end) or p_at.
CREATE OR REPLACE FUNCTION queen.seek(
    p_group text, p_queue text, p_partition text, p_to_end boolean, p_at timestamptz,
    OUT queue_found boolean, OUT partition_found boolean, OUT updated integer,
    OUT moved_to timestamptz)
LANGUAGE plpgsql AS $fn$
DECLARE
    v_qid bigint;
BEGIN
    updated := 0;
    SELECT q.id INTO v_qid FROM queen.queues q WHERE q.name = p_queue;
    queue_found := FOUND;
    partition_found := queue_found AND (p_partition IS NULL OR EXISTS (
        SELECT 1 FROM queen.partitions p WHERE p.queue_id = v_qid AND p.name = p_partition));
    IF NOT partition_found THEN
        RETURN;
    END IF;

    INSERT INTO queen.cursors (partition_id, consumer_group, queue_id, next_offset)
    SELECT p.id, p_group, p.queue_id, 0
    FROM queen.partitions p
    WHERE p.queue_id = v_qid AND (p_partition IS NULL OR p.name = p_partition)
      AND p.next_offset > 0
      AND NOT EXISTS (SELECT 1 FROM queen.cursors x
                      WHERE x.partition_id = p.id AND x.consumer_group = p_group)
    ORDER BY p.id
    ON CONFLICT DO NOTHING;

    PERFORM 1 FROM queen.cursors c
    JOIN queen.partitions p ON p.id = c.partition_id
    WHERE c.queue_id = v_qid AND c.consumer_group = p_group
      AND (p_partition IS NULL OR p.name = p_partition)
    ORDER BY c.partition_id, c.consumer_group
    FOR UPDATE OF c;

    UPDATE queen.cursors c
    SET next_offset = CASE
            WHEN p_to_end THEN p.next_offset
            ELSE coalesce((SELECT s.first_offset FROM queen.segments s
                           WHERE s.partition_id = c.partition_id AND s.created_at >= p_at
                           ORDER BY s.first_offset LIMIT 1),
                          p.next_offset)
        END,
        acked = '{}', lease_id = NULL, lease_end = NULL, lease_expires_at = NULL,
        not_before = NULL, parked = false
    FROM queen.partitions p
    WHERE p.id = c.partition_id AND c.queue_id = v_qid AND c.consumer_group = p_group
      AND (p_partition IS NULL OR p.name = p_partition);
    GET DIAGNOSTICS updated = ROW_COUNT;
    PERFORM queen.notify_queues(ARRAY[v_qid]);

    DELETE FROM queen.failures f
    USING queen.partitions p
    WHERE p.id = f.partition_id AND f.queue_id = v_qid AND f.consumer_group = p_group
      AND (p_partition IS NULL OR p.name = p_partition);
    DELETE FROM queen.consumer_watermarks w
    WHERE w.queue_name = p_queue AND w.consumer_group = p_group;

    IF p_to_end THEN
        SELECT max(s.created_at) INTO moved_to
        FROM queen.partitions p
        CROSS JOIN LATERAL (SELECT x.created_at FROM queen.segments x
                            WHERE x.partition_id = p.id
                            ORDER BY x.first_offset DESC LIMIT 1) s
        WHERE p.queue_id = v_qid AND (p_partition IS NULL OR p.name = p_partition);
    ELSE
        moved_to := p_at;
    END IF;
END
$fn$;

-- Processing traces: what consumers recorded about a message (POST /api/v1/traces), named by
-- its (partition, transactionId). No foreign key (see above); rows of a deleted queue go with
-- it (queues_forget_traces), and the retention pass removes a trace once its partition holds
-- no segment stored before it, so a trace never outlives its message by more than the
-- partition's older messages do.
CREATE TABLE IF NOT EXISTS queen.traces (
    id             bigserial PRIMARY KEY,
    queue_id       bigint NOT NULL,
    partition_id   bigint NOT NULL,
    transaction_id text NOT NULL,
    consumer_group text NOT NULL,
    event_type     text NOT NULL,
    data           text NOT NULL,   -- JSON text, as a payload is stored
    names          text[] NOT NULL DEFAULT '{}',
    worker_id      text,
    created_at     timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE INDEX IF NOT EXISTS traces_by_message ON queen.traces (partition_id, transaction_id);
CREATE INDEX IF NOT EXISTS traces_by_age ON queen.traces (partition_id, created_at);
CREATE INDEX IF NOT EXISTS traces_by_name ON queen.traces USING gin (names);

CREATE OR REPLACE FUNCTION queen.forget_queue_traces() RETURNS trigger
LANGUAGE plpgsql AS $fn$
BEGIN
    DELETE FROM queen.traces WHERE queue_id IN (SELECT g.id FROM gone g);
    RETURN NULL;
END
$fn$;
CREATE OR REPLACE TRIGGER queues_forget_traces AFTER DELETE ON queen.queues
    REFERENCING OLD TABLE AS gone FOR EACH STATEMENT EXECUTE FUNCTION queen.forget_queue_traces();

-- Record one trace; returns its id, or NULL when no partition has id p_partition.
CREATE OR REPLACE FUNCTION queen.record_trace(
    p_partition bigint, p_txid text, p_group text, p_event text, p_data text, p_names text[],
    p_worker text)
RETURNS bigint
LANGUAGE sql AS $fn$
    INSERT INTO queen.traces (queue_id, partition_id, transaction_id, consumer_group,
                              event_type, data, names, worker_id)
    SELECT p.queue_id, p.id, p_txid, p_group, p_event, p_data,
           ARRAY(SELECT DISTINCT n FROM unnest(p_names) AS n ORDER BY n), p_worker
    FROM queen.partitions p WHERE p.id = p_partition
    RETURNING id
$fn$;

-- The traces of one message, oldest first.
CREATE OR REPLACE FUNCTION queen.message_traces(p_partition bigint, p_txid text)
RETURNS TABLE (id bigint, event_type text, data text, consumer_group text, worker_id text,
               created_at timestamptz, names text[])
LANGUAGE sql STABLE AS $fn$
    SELECT t.id, t.event_type, t.data, t.consumer_group, t.worker_id, t.created_at, t.names
    FROM queen.traces t
    WHERE t.partition_id = p_partition AND t.transaction_id = p_txid
    ORDER BY t.created_at, t.id
$fn$;

-- One page of the traces carrying a name, oldest first, with their total and where they are.
CREATE OR REPLACE FUNCTION queen.traces_by_name(p_name text, p_limit integer, p_offset integer)
RETURNS TABLE (total bigint, id bigint, transaction_id text, partition_id bigint,
               event_type text, data text, consumer_group text, worker_id text,
               created_at timestamptz, names text[], queue_name text, partition_name text)
LANGUAGE sql STABLE AS $fn$
    WITH hits AS (SELECT * FROM queen.traces t WHERE t.names @> ARRAY[p_name]),
         n AS (SELECT count(*) AS total FROM hits)
    SELECT n.total, h.id, h.transaction_id, h.partition_id, h.event_type, h.data,
           h.consumer_group, h.worker_id, h.created_at, h.names, q.name, p.name
    FROM n
    LEFT JOIN LATERAL (SELECT * FROM hits ORDER BY hits.created_at, hits.id
                       LIMIT p_limit OFFSET p_offset) h ON true
    LEFT JOIN queen.partitions p ON p.id = h.partition_id
    LEFT JOIN queen.queues q ON q.id = p.queue_id
    ORDER BY h.created_at, h.id
$fn$;

-- One page of the trace names in use, most recently seen first, with their counts.
CREATE OR REPLACE FUNCTION queen.trace_names(p_limit integer, p_offset integer)
RETURNS TABLE (total bigint, name text, trace_count bigint, message_count bigint,
               last_seen timestamptz)
LANGUAGE sql STABLE AS $fn$
    WITH named AS (
        SELECT u.name, count(*) AS trace_count,
               count(DISTINCT (t.partition_id, t.transaction_id)) AS message_count,
               max(t.created_at) AS last_seen
        FROM queen.traces t CROSS JOIN LATERAL unnest(t.names) AS u (name)
        GROUP BY u.name
    ),
    n AS (SELECT count(*) AS total FROM named)
    SELECT n.total, x.name, x.trace_count, x.message_count, x.last_seen
    FROM n
    LEFT JOIN LATERAL (SELECT * FROM named ORDER BY named.last_seen DESC, named.name
                       LIMIT p_limit OFFSET p_offset) x ON true
    ORDER BY x.last_seen DESC, x.name
$fn$;
