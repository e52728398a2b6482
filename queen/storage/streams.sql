-- Queen on Trio streams: registered streaming queries and their per-partition state, in a
-- schema of their own. Idempotent; applied after consume.sql (it calls queen.transact).
--
-- Lock order (see docs/architecture.md): a cycle takes the (query, partition) shard lock first
-- (a transaction-scoped advisory lock), then source cursor rows (the ack's, FOR UPDATE; an
-- idle flush's cycle: those its read held), then its query row (FOR SHARE), then its group
-- row, then state rows, then partition rows (its sink pushes, through queen.transact and
-- queen.push_frames, in id order). A state read takes the shard lock shared, so it waits for
-- the cycle of its shard in progress and reads what that cycle left; an idle flush's read
-- (one asking for ripe windows) then takes the cursor rows of the query's groups on the
-- partition, in group order, as acks do. A registration takes the query row (FOR UPDATE) and
-- then, on reset, state rows. Nothing takes a cursor or partition row after a query or state
-- row, and nothing takes a shard lock after any row, so no cycle of waits can form. The
-- state tables have no foreign key, for the same reason as the consume tables: writing them
-- takes no hidden lock.
--
-- An idle flush and the main loop of one runner both close windows: the flush reads the
-- ripe windows and then sends a cycle without an ack that deletes them and pushes their
-- results; the main loop pops, reads the state, and sends a cycle with the ack. Were the
-- main loop to read between the flush's read and its cycle (or the flush between the main
-- loop's pop and its cycle), both would close the same window and its result would reach
-- the sink twice. So the two take turns on the partition: a flush's read finds nothing ripe
-- while one of the query's groups holds a live lease there, and otherwise, when something is
-- ripe, holds the groups' cursors of the partition with a lease of no message (its id: the
-- query's) until the flush's cycle ends it, or for at most 10 s: a pop cannot claim the
-- partition meanwhile. The flush's cycle ends the hold even when it fails, and wakes the
-- pops waiting for the partition (in every broker process: a notification of it).

CREATE SCHEMA IF NOT EXISTS queen_streams;

-- One row per registered query. name is the caller's query id; config_hash fingerprints the
-- operator chain, so a changed chain is refused unless the caller asks for a reset.
CREATE TABLE IF NOT EXISTS queen_streams.queries (
    id           uuid PRIMARY KEY,
    name         text NOT NULL UNIQUE,
    source_queue text NOT NULL,
    sink_queue   text,
    config_hash  text NOT NULL,
    created_at   timestamptz NOT NULL DEFAULT now(),
    updated_at   timestamptz NOT NULL DEFAULT now()
);

-- A query's state, per source partition (the id pops deliver) and key.
CREATE TABLE IF NOT EXISTS queen_streams.state (
    query_id     uuid NOT NULL,
    partition_id bigint NOT NULL,
    key          text NOT NULL,
    value        jsonb NOT NULL,
    updated_at   timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (query_id, partition_id, key)
);

-- The consumer groups whose acknowledging cycles a query committed: the groups whose pops
-- its idle flush holds off (above).
CREATE TABLE IF NOT EXISTS queen_streams.query_groups (
    query_id       uuid NOT NULL,
    consumer_group text NOT NULL,
    PRIMARY KEY (query_id, consumer_group)
);

-- Register a query, or find it. A known name with another config hash is a conflict unless
-- p_reset, which wipes the query's state and takes the new hash.
CREATE OR REPLACE FUNCTION queen_streams.register_query(
    p_name text, p_source text, p_sink text, p_hash text, p_reset boolean,
    OUT r_id uuid, OUT r_fresh boolean, OUT r_reset boolean, OUT r_conflict boolean)
LANGUAGE plpgsql AS $fn$
DECLARE
    v_hash text;
BEGIN
    r_fresh := false;
    r_reset := false;
    r_conflict := false;
    INSERT INTO queen_streams.queries (id, name, source_queue, sink_queue, config_hash)
    VALUES (gen_random_uuid(), p_name, p_source, p_sink, p_hash)
    ON CONFLICT (name) DO NOTHING
    RETURNING id INTO r_id;
    IF r_id IS NOT NULL THEN
        r_fresh := true;
        RETURN;
    END IF;

    SELECT q.id, q.config_hash INTO r_id, v_hash
    FROM queen_streams.queries q WHERE q.name = p_name
    FOR UPDATE;
    IF v_hash <> p_hash THEN
        IF NOT p_reset THEN
            r_conflict := true;
            RETURN;
        END IF;
        DELETE FROM queen_streams.state s WHERE s.query_id = r_id;
        r_reset := true;
    END IF;
    UPDATE queen_streams.queries q
    SET source_queue = p_source, sink_queue = p_sink, config_hash = p_hash, updated_at = now()
    WHERE q.id = r_id;
END
$fn$;

-- One streaming cycle, all or nothing: the source ack (a prefix of the leased batch, up to
-- and including the message p_ack_tx names, is done; with p_ack_dlq that message is copied
-- to the group's dead letter queue with p_ack_error and the lease is released), the state
-- changes of (query,
-- partition) (p_values[i] NULL deletes p_keys[i]; one entry per key), and the sink pushes
-- (the arrays of queen.transact). If the lease is not live, the message is not there, the
-- query is unknown or a pushed partition vanished, nothing is applied: ok is false and
-- reason says why ('lease', 'message', 'query', or the push failure's text).
CREATE OR REPLACE FUNCTION queen_streams.cycle(
    p_query uuid, p_partition bigint, p_group text,
    p_keys text[], p_values text[],
    p_ack_tx text, p_ack_lease uuid, p_ack_dlq boolean, p_ack_error text, p_release boolean,
    p_queues text[], p_parts text[], p_mids uuid[], p_ptxids text[], p_payloads text[],
    p_subs text[], p_traces uuid[], p_leaders integer[],
    OUT ok boolean, OUT reason text, OUT source_queue text, OUT acked integer,
    OUT lease_released boolean, OUT dlq boolean, OUT pids bigint[], OUT statuses text, OUT originals text)
LANGUAGE plpgsql AS $fn$
DECLARE
    cu        record;
    v_live    boolean;
    v_hi      bigint;
    v_cov     bigint;
    v_off     bigint;
    v_next    bigint;
    v_rest    bigint[];
    v_clear   boolean;
    v_ok      boolean;
    v_reason  text;
    v_unheld  boolean := false;
BEGIN
    ok := true;
    acked := 0;
    lease_released := false;
    dlq := false;
    -- 1. the (query, partition) shard: its cycles take turns, and a state read sent while one
    --    is under way waits for it (queen_streams.state_get)
    PERFORM pg_advisory_xact_lock(hashtextextended(p_query::text || ':' || p_partition, 0));
    SELECT q.name INTO source_queue
    FROM queen.partitions p JOIN queen.queues q ON q.id = p.queue_id
    WHERE p.id = p_partition;
    -- 2a. an idle flush's cycle ends the hold its read put on the partition, whatever follows
    IF p_ack_tx IS NULL THEN
        WITH unheld AS (
            UPDATE queen.cursors c
            SET lease_id = NULL, lease_end = NULL, lease_expires_at = NULL
            WHERE c.partition_id = p_partition AND c.lease_id = p_query
            RETURNING 1
        )
        SELECT count(*) > 0 INTO v_unheld FROM unheld;
        IF v_unheld THEN   -- pops waiting for it, in every broker process (the push listener)
            PERFORM pg_notify('queen_pushed', jsonb_build_array(q.name, p.name)::text)
            FROM queen.partitions p JOIN queen.queues q ON q.id = p.queue_id
            WHERE p.id = p_partition;
        END IF;
    END IF;
    BEGIN
        -- 2. the source ack: the cursor row
        IF p_ack_tx IS NOT NULL THEN
            SELECT c.next_offset, c.acked, c.lease_id, c.lease_end, c.lease_expires_at,
                   p.next_offset AS high
            INTO cu
            FROM queen.cursors c
            JOIN queen.partitions p ON p.id = c.partition_id
            WHERE c.partition_id = p_partition AND c.consumer_group = p_group
            FOR UPDATE OF c;
            IF NOT FOUND THEN
                reason := 'message';
                RAISE EXCEPTION USING ERRCODE = 'QN001';
            END IF;
            v_live := cu.lease_id IS NOT NULL AND cu.lease_expires_at > now();
            IF (p_ack_lease IS NOT NULL AND NOT (v_live AND p_ack_lease = cu.lease_id))
               OR (p_ack_lease IS NULL AND v_live) THEN   -- only the lease holder may judge
                reason := 'lease';
                RAISE EXCEPTION USING ERRCODE = 'QN001';
            END IF;
            -- the leased batch; without a live lease, what follows the cursor (bounded)
            v_hi := CASE WHEN v_live THEN cu.lease_end
                         ELSE least(cu.high, cu.next_offset + 10000) END;
            SELECT coalesce(max(s.first_offset), cu.next_offset) INTO v_cov
            FROM queen.segments s
            WHERE s.partition_id = p_partition AND s.first_offset <= cu.next_offset;
            -- the SDK names the last message of its batch: under a live lease, the last
            -- match in the leased batch; without one, the first after the cursor
            SELECT CASE WHEN v_live THEN max(s.first_offset + f.i - 1)
                        ELSE min(s.first_offset + f.i - 1) END INTO v_off
            FROM queen.segments s
            CROSS JOIN LATERAL unnest(s.transaction_ids) WITH ORDINALITY AS f (tx, i)
            WHERE s.partition_id = p_partition
              AND s.first_offset >= v_cov AND s.first_offset < v_hi
              AND f.tx = p_ack_tx
              AND s.first_offset + f.i - 1 >= cu.next_offset
              AND s.first_offset + f.i - 1 < v_hi;
            IF v_off IS NULL THEN
                reason := 'message';
                RAISE EXCEPTION USING ERRCODE = 'QN001';
            END IF;
            acked := (v_off + 1 - cu.next_offset)::integer
                     - (SELECT count(*) FROM unnest(cu.acked) AS x
                        WHERE x >= cu.next_offset AND x <= v_off)::integer;
            SELECT a.next_offset, a.rest INTO v_next, v_rest
            FROM queen.cursor_advance(v_off + 1, cu.acked) a;
            IF p_ack_dlq THEN
                INSERT INTO queen.dlq (queue_id, partition_id, consumer_group, msg_offset,
                                       message_id, transaction_id, payload, producer_sub,
                                       trace_id, error_message, retry_count)
                SELECT p.queue_id, p_partition, p_group, v_off, f.mid, f.tx, f.pl, f.sub, f.tr,
                       p_ack_error, coalesce(fl.attempts, 0)
                FROM queen.partitions p
                JOIN queen.segments s ON s.partition_id = p.id
                CROSS JOIN LATERAL unnest(s.message_ids, s.transaction_ids, s.payloads,
                                          s.producer_subs, s.trace_ids)
                     WITH ORDINALITY AS f (mid, tx, pl, sub, tr, i)
                LEFT JOIN queen.failures fl
                       ON fl.partition_id = p_partition AND fl.consumer_group = p_group
                      AND fl.msg_offset = v_off
                WHERE p.id = p_partition AND s.first_offset <= v_off AND s.last_offset >= v_off
                  AND s.first_offset + f.i - 1 = v_off;
                dlq := true;
            END IF;
            v_clear := cu.lease_id IS NOT NULL
                       AND (p_release OR p_ack_dlq OR v_next >= cu.lease_end OR NOT v_live);
            UPDATE queen.cursors c SET
                next_offset = v_next,
                acked = v_rest,
                lease_id = CASE WHEN v_clear THEN NULL ELSE c.lease_id END,
                lease_end = CASE WHEN v_clear THEN NULL ELSE c.lease_end END,
                lease_expires_at = CASE WHEN v_clear THEN NULL ELSE c.lease_expires_at END
            WHERE c.partition_id = p_partition AND c.consumer_group = p_group;
            DELETE FROM queen.failures f
            WHERE f.partition_id = p_partition AND f.consumer_group = p_group
              AND f.msg_offset < v_next;
            lease_released := v_clear AND v_live;
        END IF;

        -- 3. the query row, then its group's (the group an idle flush holds off)
        PERFORM 1 FROM queen_streams.queries q WHERE q.id = p_query FOR SHARE;
        IF NOT FOUND THEN
            reason := 'query';
            RAISE EXCEPTION USING ERRCODE = 'QN001';
        END IF;
        IF p_ack_tx IS NOT NULL THEN
            INSERT INTO queen_streams.query_groups (query_id, consumer_group)
            VALUES (p_query, p_group)
            ON CONFLICT DO NOTHING;
        END IF;

        -- 4. state rows, in key order
        IF cardinality(p_keys) > 0 THEN
            DELETE FROM queen_streams.state s
            USING unnest(p_keys, p_values) AS u (k, v)
            WHERE u.v IS NULL AND s.query_id = p_query AND s.partition_id = p_partition
              AND s.key = u.k;
            INSERT INTO queen_streams.state AS s (query_id, partition_id, key, value, updated_at)
            SELECT p_query, p_partition, u.k, u.v::jsonb, now()
            FROM unnest(p_keys, p_values) AS u (k, v)
            WHERE u.v IS NOT NULL
            ORDER BY u.k
            ON CONFLICT (query_id, partition_id, key) DO UPDATE
            SET value = EXCLUDED.value, updated_at = EXCLUDED.updated_at;
        END IF;

        -- 5. the sink pushes: partition rows, through the transaction's push path
        IF cardinality(p_mids) > 0 THEN
            SELECT t.ok, t.reason, t.pids, t.statuses, t.originals
            INTO v_ok, v_reason, pids, statuses, originals
            FROM queen.transact('{}'::uuid[], '{}'::text[], '{}'::bigint[], '{}'::text[],
                                '{}'::text[], '{}'::text[], '{}'::uuid[], p_queues, p_parts,
                                p_mids, p_ptxids, p_payloads, p_subs, p_traces, p_leaders) t;
            IF NOT v_ok THEN
                reason := v_reason;
                RAISE EXCEPTION USING ERRCODE = 'QN001';
            END IF;
        END IF;
    EXCEPTION WHEN SQLSTATE 'QN001' THEN
        ok := false;
        acked := 0;
        lease_released := false;
        dlq := false;
        pids := NULL;
        statuses := NULL;
        originals := NULL;
    END;
    -- (a cycle without an ack reports no release: this tells the broker to wake the source)
    lease_released := lease_released OR v_unheld;
END
$fn$;

-- A query's state for one partition: every row, or those named, or those under a key
-- prefix, or those whose value's windowEnd (epoch ms) is at or before p_ripe. known is false
-- (and no row follows) when the query is not registered. A read with p_ripe is an idle
-- flush's: nothing is ripe while one of the query's groups holds a live lease on the
-- partition, and what is ripe holds the groups' cursors there until the flush's cycle (see
-- the top of this file).
CREATE OR REPLACE FUNCTION queen_streams.state_get(
    p_query uuid, p_partition bigint, p_keys text[], p_prefix text, p_ripe numeric)
RETURNS TABLE (known boolean, key text, value text, updated_at timestamptz)
LANGUAGE plpgsql AS $fn$
DECLARE
    v_groups text[];
    v_rows   bigint;
BEGIN
    -- the shard's cycle under way first: its effect is read, not the state before it (the
    -- statements below take their snapshots once the lock is held)
    PERFORM pg_advisory_xact_lock_shared(hashtextextended(p_query::text || ':' || p_partition, 0));
    IF NOT EXISTS (SELECT 1 FROM queen_streams.queries q WHERE q.id = p_query) THEN
        RETURN;
    END IF;
    IF p_ripe IS NOT NULL THEN   -- an idle flush's read: the groups' cursors, then the state
        v_groups := ARRAY(SELECT g.consumer_group FROM queen_streams.query_groups g
                          WHERE g.query_id = p_query ORDER BY g.consumer_group);
        PERFORM 1 FROM queen.cursors c
        WHERE c.partition_id = p_partition AND c.consumer_group = ANY (v_groups)
        ORDER BY c.consumer_group
        FOR UPDATE;
        IF EXISTS (SELECT 1 FROM queen.cursors c
                   WHERE c.partition_id = p_partition AND c.consumer_group = ANY (v_groups)
                     AND c.lease_id <> p_query AND c.lease_expires_at > now()) THEN
            v_rows := 0;   -- a cycle of the main loop may close these windows: not ripe now
        END IF;
    END IF;
    IF v_rows IS NULL THEN
        RETURN QUERY
        SELECT true, s.key, s.value::text, s.updated_at
        FROM queen_streams.state s
        WHERE s.query_id = p_query AND s.partition_id = p_partition
          AND (cardinality(p_keys) = 0 OR s.key = ANY (p_keys))
          AND (p_prefix IS NULL OR left(s.key, length(p_prefix)) = p_prefix)
          AND (p_ripe IS NULL OR (jsonb_typeof(s.value -> 'windowEnd') = 'number'
                                  AND (s.value -> 'windowEnd')::numeric <= p_ripe))
        ORDER BY s.key;
        GET DIAGNOSTICS v_rows = ROW_COUNT;
    END IF;
    IF v_rows = 0 THEN   -- a known query with no such row: one row saying so
        RETURN QUERY SELECT true, NULL::text, NULL::text, NULL::timestamptz;
    ELSIF p_ripe IS NOT NULL THEN   -- the flush will close these: hold the pops until then
        UPDATE queen.cursors c
        SET lease_id = p_query, lease_end = c.next_offset,
            lease_expires_at = now() + interval '10 seconds'
        WHERE c.partition_id = p_partition AND c.consumer_group = ANY (v_groups);
    END IF;
END
$fn$;
