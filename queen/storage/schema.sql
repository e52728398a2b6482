-- Queen on Trio storage, schema "queen". Idempotent. Applied by a broker that starts on a
-- database whose recorded schema digest is not its own, under an advisory lock and with every
-- table locked first (queen/storage/postgres.py, migrate_once_sync); a start on a current
-- schema applies nothing.

CREATE SCHEMA IF NOT EXISTS queen;

-- One row per queue. Deleting a queue cascades to its partitions, segments and sidecar rows,
-- so "DELETE FROM queen.queues WHERE name LIKE ..." cleans up everything of those queues.
CREATE TABLE IF NOT EXISTS queen.queues (
    id                   bigserial PRIMARY KEY,
    name                 text NOT NULL UNIQUE,
    namespace            text NOT NULL DEFAULT '',
    task                 text NOT NULL DEFAULT '',
    dedup_window_seconds integer NOT NULL DEFAULT 3600 CHECK (dedup_window_seconds >= 0),
    created_at           timestamptz NOT NULL DEFAULT now()
);

-- One row per (queue, partition). The row is the partition's write lock (SELECT ... FOR UPDATE,
-- always in id order) and holds the next offset to allocate.
CREATE TABLE IF NOT EXISTS queen.partitions (
    id          bigserial PRIMARY KEY,
    queue_id    bigint NOT NULL REFERENCES queen.queues (id) ON DELETE CASCADE,
    name        text NOT NULL,
    next_offset bigint NOT NULL DEFAULT 0,
    created_at  timestamptz NOT NULL DEFAULT now(),
    UNIQUE (queue_id, name)
) WITH (fillfactor = 70);

-- One row per write of one partition: the frames stored at offsets first_offset..last_offset.
-- The arrays are parallel, one element per frame, in offset order.
CREATE TABLE IF NOT EXISTS queen.segments (
    partition_id    bigint NOT NULL REFERENCES queen.partitions (id) ON DELETE CASCADE,
    first_offset    bigint NOT NULL,
    last_offset     bigint NOT NULL,
    created_at      timestamptz NOT NULL DEFAULT now(),
    message_ids     uuid[] NOT NULL,
    transaction_ids text[] NOT NULL,
    payloads        text[] NOT NULL,
    producer_subs   text[],
    trace_ids       uuid[],
    PRIMARY KEY (partition_id, first_offset),
    CHECK (last_offset >= first_offset)
);
-- No query filters or joins on the frame arrays: their statistics would only make every
-- ANALYZE detoast and hash a sample of every message.
ALTER TABLE queen.segments
    ALTER COLUMN message_ids SET STATISTICS 0,
    ALTER COLUMN transaction_ids SET STATISTICS 0,
    ALTER COLUMN payloads SET STATISTICS 0,
    ALTER COLUMN producer_subs SET STATISTICS 0,
    ALTER COLUMN trace_ids SET STATISTICS 0;

-- The dedup hash sidecar: one row per stored frame of a queue with a dedup window.
-- key_hash = hashtextextended(transaction_id, partition_id): one probe of one index finds a
-- key in one partition, and the probe compares partition_id and the full text, so a hash
-- collision can never make a false duplicate. There is no foreign key (that would cost a check
-- per frame): partition ids are never reused, so rows of a deleted partition can never match a
-- probe again, and the pruning loop removes them with the rest of the expired history.
CREATE TABLE IF NOT EXISTS queen.dedup (
    key_hash       bigint NOT NULL,
    partition_id   bigint NOT NULL,
    transaction_id text NOT NULL,
    msg_offset     bigint NOT NULL,
    created_at     timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX IF NOT EXISTS dedup_probe ON queen.dedup (key_hash);

-- Analyse every table of schema queen (or those of p_tables) whose size has at least doubled
-- since the planner last recorded it (8 pages at least), and return how many were analysed.
-- Sessions keep the plans of the broker's functions, made with the sizes seen then; a table
-- analysed while nearly empty and then grown fast (thousands of partitions created within
-- seconds, before autovacuum's next round) would keep them reading the whole table. Analysing
-- invalidates every session's plans on that table, so they are made again for its present
-- size, with present statistics; a table growing from empty to N pages is analysed about
-- log2(N) times. A table the current user does not own is left to autovacuum, and one another
-- session is analysing (or vacuuming) is skipped rather than waited for.
CREATE OR REPLACE FUNCTION queen.refresh_statistics(p_tables regclass[] DEFAULT NULL)
RETURNS integer
LANGUAGE plpgsql AS $fn$
DECLARE
    v_table regclass;
    v_count integer := 0;
BEGIN
    FOR v_table IN
        SELECT c.oid::regclass
        FROM pg_class c
        WHERE c.relnamespace = 'queen'::regnamespace AND c.relkind = 'r'
          AND (p_tables IS NULL OR c.oid = ANY (p_tables))
          AND pg_has_role(c.relowner, 'USAGE')
          AND pg_relation_size(c.oid) / current_setting('block_size')::bigint
              >= greatest(8, 2 * c.relpages)
        ORDER BY c.oid
    LOOP
        EXECUTE format('ANALYZE (SKIP_LOCKED) %s', v_table);
        v_count := v_count + 1;
    END LOOP;
    RETURN v_count;
END
$fn$;

-- Return the id of (queue, partition), creating the queue and the partition on first use.
CREATE OR REPLACE FUNCTION queen.ensure_partition(p_queue text, p_partition text)
RETURNS bigint
LANGUAGE plpgsql AS $fn$
DECLARE
    v_queue bigint;
    v_id    bigint;
BEGIN
    SELECT p.id INTO v_id   -- both by key: the queue by name, then its partition by name
    FROM queen.partitions p
    WHERE p.queue_id = (SELECT q.id FROM queen.queues q WHERE q.name = p_queue)
      AND p.name = p_partition;
    IF FOUND THEN
        RETURN v_id;
    END IF;

    SELECT id INTO v_queue FROM queen.queues WHERE name = p_queue;
    IF NOT FOUND THEN
        INSERT INTO queen.queues (name) VALUES (p_queue)
        ON CONFLICT (name) DO NOTHING RETURNING id INTO v_queue;
        IF v_queue IS NULL THEN
            SELECT id INTO STRICT v_queue FROM queen.queues WHERE name = p_queue;
        END IF;
    END IF;

    INSERT INTO queen.partitions (queue_id, name) VALUES (v_queue, p_partition)
    ON CONFLICT (queue_id, name) DO NOTHING RETURNING id INTO v_id;
    IF v_id IS NULL THEN
        SELECT id INTO STRICT v_id FROM queen.partitions
        WHERE queue_id = v_queue AND name = p_partition;
    ELSE
        PERFORM queen.refresh_statistics('{queen.queues,queen.partitions}');
    END IF;
    RETURN v_id;
END
$fn$;

-- Return the ids of many (queue, partition) pairs at once (in input order), creating what is
-- missing. Queues and partitions are inserted in name order, so two of these calls running
-- at once (even in two broker processes) wait for each other in one order and never
-- deadlock; this call takes no lock a push transaction holds (those lock existing rows).
-- Every partition is looked up alone, through both columns of its (queue_id, name) index. A
-- join left the planner free to read every partition of the queue for every name; and plans
-- made while the table was nearly empty read all of it for every name once it had grown
-- (15-30 ms per call while 10,000 partitions were created in 10 s, instead of about one):
-- so when this call has added partitions, it analyses the tables that outgrew their
-- statistics (queen.refresh_statistics), and every session plans them again.
CREATE OR REPLACE FUNCTION queen.ensure_partitions(p_queues text[], p_partitions text[])
RETURNS bigint[]
LANGUAGE plpgsql
AS $fn$
DECLARE
    v_ids   bigint[];
    v_added bigint;
BEGIN
    INSERT INTO queen.queues (name)
    SELECT DISTINCT u.q FROM unnest(p_queues) AS u (q)
    WHERE NOT EXISTS (SELECT 1 FROM queen.queues q WHERE q.name = u.q)
    ORDER BY u.q
    ON CONFLICT (name) DO NOTHING;

    INSERT INTO queen.partitions (queue_id, name)
    SELECT DISTINCT k.qid, k.p
    FROM (
        SELECT u.p, (SELECT q.id FROM queen.queues q WHERE q.name = u.q) AS qid
        FROM unnest(p_queues, p_partitions) AS u (q, p)
    ) k
    WHERE k.qid IS NOT NULL
      AND (SELECT x.id FROM queen.partitions x
           WHERE x.queue_id = k.qid AND x.name = k.p LIMIT 1) IS NULL
    ORDER BY k.qid, k.p
    ON CONFLICT (queue_id, name) DO NOTHING;
    GET DIAGNOSTICS v_added = ROW_COUNT;
    IF v_added > 0 THEN
        PERFORM queen.refresh_statistics('{queen.queues,queen.partitions}');
    END IF;

    SELECT array_agg(
               (SELECT x.id FROM queen.partitions x
                WHERE x.queue_id = (SELECT q.id FROM queen.queues q WHERE q.name = u.q)
                  AND x.name = u.p)
               ORDER BY u.ord)
    INTO v_ids
    FROM unnest(p_queues, p_partitions) WITH ORDINALITY AS u (q, p, ord);
    IF cardinality(v_ids) IS DISTINCT FROM cardinality(p_queues)
       OR array_position(v_ids, NULL) IS NOT NULL THEN
        RAISE EXCEPTION 'a queue was deleted while its partitions were being created'
            USING ERRCODE = '40001';
    END IF;
    RETURN v_ids;
END
$fn$;

-- Earlier signatures of the push functions.
DROP FUNCTION IF EXISTS queen.push_segments(text, text, text, text, text, text, text);
DROP FUNCTION IF EXISTS queen.push_frames(bigint[], uuid[], text[], text[], text[], uuid[],
                                          integer[]);

-- The general store step, for batches with duplicates (see queen.push_frames, which calls it
-- with the partitions locked and what it read of them: p_ids, their next_offset p_next and
-- their queue's dedup window p_win).
--
-- The arrays are parallel, one element per frame; the frames of one partition are consecutive
-- and in body order. p_leaders holds, for every frame, the position (1-based) of the first
-- frame of the same write with the same transactionId: first wins inside a write, and the
-- writer computed it. Returns one status character per frame, in input order: '0' stored,
-- '1' duplicate, '2' partition row missing; and, comma-joined in the same order, the message id
-- each duplicate names.
--
-- No step joins two sets whose size depends on the batch: a cached plan cannot see how many
-- frames arrive, and a nested loop between frames and probe hits turns quadratic (100 ms
-- instead of 10 for 1,000 duplicates in 100 partitions). A frame finds its partition's values
-- by position in p_ids; frames and the sidecar rows found are put side by side and matched
-- by window functions over (partition, transaction id); a duplicate takes its leader's answer
-- through a window over the leader's position. Sorts, whatever the plan.
DROP FUNCTION IF EXISTS queen.store_frames_general(bigint[], uuid[], text[], text[], text[],
                                                   uuid[], integer[]);
CREATE OR REPLACE FUNCTION queen.store_frames_general(
    p_pids bigint[], p_mids uuid[], p_txids text[], p_payloads text[], p_subs text[],
    p_traces uuid[], p_leaders integer[], p_ids bigint[], p_next bigint[], p_win integer[],
    OUT statuses text, OUT originals text)
LANGUAGE plpgsql AS $fn$
BEGIN
    -- The caller holds the partition locks; this statement's snapshot is newer than them, so
    -- the probe sees every write committed before. Probe, allocate offsets, store.
    WITH item AS (
        SELECT u.pid, u.mid, u.txid, u.payload, u.sub, u.trace, u.lead, u.ord,
               hashtextextended(u.txid, u.pid) AS h, array_position(p_ids, u.pid) AS k
        FROM unnest(p_pids, p_mids, p_txids, p_payloads, p_subs, p_traces, p_leaders)
             WITH ORDINALITY AS u (pid, mid, txid, payload, sub, trace, lead, ord)
    ),
    ranked AS MATERIALIZED (   -- with dedup off (window 0) every frame leads itself
        SELECT i.pid, i.mid, i.txid, i.payload, i.sub, i.trace, i.ord, i.h,
               i.k IS NULL AS missing, p_next[i.k] AS next_offset, p_win[i.k] AS win,
               now() - make_interval(secs => p_win[i.k]) AS since,
               CASE WHEN p_win[i.k] > 0 THEN i.lead ELSE i.ord END AS leader
        FROM item i
    ),
    -- One pass of the dedup_probe index over the sorted leader hashes. The age test stays
    -- outside the scan (OFFSET 0 keeps it out): given it, PostgreSQL 18 may choose a skip scan
    -- of dedup_by_partition on created_at, which reads the whole window's rows (16 ms per batch
    -- with 30,000 rows, measured, when statistics were taken on an empty sidecar).
    hits AS (
        SELECT h.partition_id, h.transaction_id, h.msg_offset, h.created_at
        FROM (SELECT d.partition_id, d.transaction_id, d.msg_offset, d.created_at
              FROM queen.dedup d
              WHERE d.key_hash = ANY (ARRAY(SELECT r.h FROM ranked r
                                            WHERE r.win > 0 AND r.leader = r.ord ORDER BY r.h))
              OFFSET 0) h
        WHERE h.created_at > (SELECT min(r.since) FROM ranked r WHERE r.win > 0)
    ),
    side_by_side AS (   -- frames (ord set) and sidecar rows found (hit_* set)
        SELECT r.ord, r.pid, r.txid, r.mid, r.payload, r.sub, r.trace, r.h, r.missing,
               r.next_offset, r.win, r.since, r.leader,
               NULL::bigint AS hit_offset, NULL::timestamptz AS hit_at
        FROM ranked r
        UNION ALL
        SELECT NULL, h.partition_id, h.transaction_id, NULL, NULL, NULL, NULL, NULL, NULL,
               NULL, NULL, NULL, NULL, h.msg_offset, h.created_at
        FROM hits h
    ),
    keyed AS (   -- every row learns its key's window (from the frames of that key)
        SELECT x.*, max(x.since) OVER (PARTITION BY x.pid, x.txid) AS key_since
        FROM side_by_side x
    ),
    probed AS (   -- every frame, with the newest stored offset of its key inside the window
        SELECT y.*
        FROM (SELECT k.*,
                     max(k.hit_offset) FILTER (WHERE k.hit_at > k.key_since)
                         OVER (PARTITION BY k.pid, k.txid) AS orig_offset
              FROM keyed k) y
        WHERE y.ord IS NOT NULL
    ),
    fresh AS (    -- what gets stored, at consecutive offsets in input order
        SELECT p.pid, p.mid, p.txid, p.payload, p.sub, p.trace, p.ord, p.win, p.h,
               p.next_offset + row_number() OVER (PARTITION BY p.pid ORDER BY p.ord) - 1 AS off
        FROM probed p
        WHERE NOT p.missing AND p.leader = p.ord AND (p.win = 0 OR p.orig_offset IS NULL)
    ),
    seg AS (
        INSERT INTO queen.segments (partition_id, first_offset, last_offset, message_ids,
                                    transaction_ids, payloads, producer_subs, trace_ids)
        SELECT f.pid, min(f.off), max(f.off),
               array_agg(f.mid ORDER BY f.off),
               array_agg(f.txid ORDER BY f.off),
               array_agg(f.payload ORDER BY f.off),
               CASE WHEN bool_or(f.sub IS NOT NULL) THEN array_agg(f.sub ORDER BY f.off) END,
               CASE WHEN bool_or(f.trace IS NOT NULL) THEN array_agg(f.trace ORDER BY f.off) END
        FROM fresh f
        GROUP BY f.pid
    ),
    side AS (
        INSERT INTO queen.dedup (key_hash, partition_id, transaction_id, msg_offset)
        SELECT f.h, f.pid, f.txid, f.off
        FROM fresh f
        WHERE f.win > 0
    ),
    bump AS (
        UPDATE queen.partitions p SET next_offset = p.next_offset + c.n
        FROM (SELECT f.pid, count(*) AS n FROM fresh f GROUP BY f.pid) c
        WHERE p.id = c.pid AND p.id = ANY (p_pids)
    ),
    answered AS (   -- a leader's answer; a duplicate reads the id from the covering segment
        SELECT p.ord, p.leader, p.missing,
               p.leader = p.ord AND p.win > 0 AND p.orig_offset IS NOT NULL AS dup,
               CASE WHEN p.leader <> p.ord THEN NULL
                    WHEN p.win = 0 OR p.orig_offset IS NULL THEN p.mid
                    ELSE coalesce(
                        (SELECT CASE WHEN s.last_offset >= p.orig_offset
                                     THEN s.message_ids[p.orig_offset - s.first_offset + 1] END
                         FROM queen.segments s
                         WHERE s.partition_id = p.pid AND s.first_offset <= p.orig_offset
                         ORDER BY s.first_offset DESC LIMIT 1),
                        '00000000-0000-0000-0000-000000000000'::uuid)
               END AS res_mid
        FROM probed p
    ),
    outcome AS (   -- a leader comes first among its followers (it is the first of them)
        SELECT a.ord,
               CASE WHEN a.missing THEN '2'
                    WHEN a.ord = a.leader AND NOT a.dup THEN '0' ELSE '1' END AS st,
               CASE WHEN a.missing OR (a.ord = a.leader AND NOT a.dup) THEN NULL
                    ELSE first_value(a.res_mid) OVER (PARTITION BY a.leader ORDER BY a.ord)
               END AS orig
        FROM answered a
    )
    SELECT string_agg(o.st, '' ORDER BY o.ord),
           string_agg(o.orig::text, ',' ORDER BY o.ord)
    INTO statuses, originals
    FROM outcome o;
END
$fn$;

-- Store one batch of segment writes (several partitions, one write each) in the caller's
-- transaction. A write is a run of consecutive frames: p_wpids/p_wcounts give each write's
-- partition and frame count, in order; the frame arrays are parallel, frames of one write in
-- body order. p_leaders is NULL when no write holds the same transactionId twice, else the
-- first-wins positions (see queen.store_frames_general).
--
-- 1. Lock the partitions in id order, reading once what the rest needs of them: next_offset
--    (read under the lock, so the newest) and their queue's dedup window. A fixed order rules
--    out deadlocks between concurrent batches of one broker and between broker processes.
-- 2. Probe the sidecar (a new statement, so a snapshot newer than the locks) for every frame of
--    the partitions with a dedup window.
-- 3. Nothing found and no repeated transactionId (the common case): store every write as one
--    segment made of slices of the input arrays, at offsets next_offset.., with its sidecar
--    rows. Measured here: 5 us of server CPU per frame instead of 9 for the general step.
--    Otherwise: the general step, which sorts out duplicates frame by frame.
--
-- Generic plans only: left to choose, PostgreSQL plans step 1 afresh on every call (a custom
-- plan looks cheaper for the exact array of ids), 45-85 us of a one-partition call's 330-390 us
-- of backend CPU, for the same index scan; the other statements used their generic plan
-- already. An ANALYZE (see refresh_statistics) still replaces the cached plans.
CREATE OR REPLACE FUNCTION queen.push_frames(
    p_wpids bigint[], p_wcounts integer[], p_mids uuid[], p_txids text[], p_payloads text[],
    p_subs text[], p_traces uuid[], p_leaders integer[], OUT statuses text, OUT originals text)
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan
AS $fn$
DECLARE
    v_candidates boolean;
    v_ids        bigint[];   -- the batch's partitions that exist, locked,
    v_next       bigint[];   -- their next_offset
    v_win        integer[];  -- and their queue's dedup window
BEGIN
    -- Pushes grow the sidecar and segments; plans of the probe made while the sidecar was
    -- tiny read all of it (50-500 ms per batch while it grew to 100,000 rows). Before taking
    -- any lock: when either outgrew its statistics, analyse it (see refresh_statistics;
    -- about log2(size) times in a table's life). The check costs 25-35 us, a tenth of a small
    -- transaction, so a batch of fewer than 64 items makes it one time in 16 at random: the
    -- tables grow by about 16 small batches between checks, and never by a large one unseen.
    IF cardinality(p_mids) >= 64 OR random() < 0.0625 THEN
        IF (SELECT bool_or(pg_relation_size(c.oid)
                           >= greatest(8, 2 * c.relpages) * current_setting('block_size')::bigint)
            FROM pg_class c WHERE c.oid IN ('queen.dedup'::regclass, 'queen.segments'::regclass)
              AND pg_has_role(c.relowner, 'USAGE'))
        THEN
            PERFORM queen.refresh_statistics('{queen.dedup,queen.segments}');
        END IF;
    END IF;

    SELECT array_agg(l.id), array_agg(l.next_offset), array_agg(l.win)
    INTO v_ids, v_next, v_win
    FROM (SELECT p.id, p.next_offset,
                 (SELECT q.dedup_window_seconds FROM queen.queues q WHERE q.id = p.queue_id)
          FROM queen.partitions p WHERE p.id = ANY (p_wpids)
          ORDER BY p.id FOR UPDATE OF p) AS l (id, next_offset, win);

    IF p_leaders IS NULL THEN
        WITH w AS (
            SELECT u.pid, u.cnt, (sum(u.cnt) OVER (ORDER BY u.o) - u.cnt)::integer AS lo
            FROM unnest(p_wpids, p_wcounts) WITH ORDINALITY AS u (pid, cnt, o)
        ),
        part AS (SELECT * FROM unnest(v_ids, v_win) AS k (id, win)),
        d AS (
            SELECT w.*, now() - make_interval(secs => part.win) AS since
            FROM w JOIN part ON part.id = w.pid
            WHERE part.win > 0
        )
        SELECT EXISTS (
            SELECT 1
            FROM (SELECT x.created_at FROM queen.dedup x   -- see hits in store_frames_general
                  WHERE x.key_hash = ANY (ARRAY(
                          SELECT hashtextextended(t.tx, d.pid)
                          FROM d CROSS JOIN LATERAL unnest(p_txids[d.lo + 1 : d.lo + d.cnt])
                                 AS t (tx)
                          ORDER BY 1))
                  OFFSET 0) x
            WHERE x.created_at > (SELECT min(d.since) FROM d))
        INTO v_candidates;

        IF NOT v_candidates THEN
            WITH w AS (
                SELECT u.pid, u.cnt, u.o, (sum(u.cnt) OVER (ORDER BY u.o) - u.cnt)::integer AS lo
                FROM unnest(p_wpids, p_wcounts) WITH ORDINALITY AS u (pid, cnt, o)
            ),
            part AS (SELECT * FROM unnest(v_ids, v_next, v_win) AS k (id, next_offset, win)),
            p AS (
                SELECT w.*, part.next_offset, part.win
                FROM w JOIN part ON part.id = w.pid
            ),
            seg AS (
                INSERT INTO queen.segments (partition_id, first_offset, last_offset, message_ids,
                                            transaction_ids, payloads, producer_subs, trace_ids)
                SELECT p.pid, p.next_offset, p.next_offset + p.cnt - 1,
                       p_mids[p.lo + 1 : p.lo + p.cnt],
                       p_txids[p.lo + 1 : p.lo + p.cnt],
                       p_payloads[p.lo + 1 : p.lo + p.cnt],
                       p_subs[p.lo + 1 : p.lo + p.cnt],
                       p_traces[p.lo + 1 : p.lo + p.cnt]
                FROM p
            ),
            side AS (
                INSERT INTO queen.dedup (key_hash, partition_id, transaction_id, msg_offset)
                SELECT hashtextextended(t.tx, p.pid), p.pid, t.tx, p.next_offset + t.i - 1
                FROM p CROSS JOIN LATERAL unnest(p_txids[p.lo + 1 : p.lo + p.cnt])
                     WITH ORDINALITY AS t (tx, i)
                WHERE p.win > 0
            )
            UPDATE queen.partitions part SET next_offset = part.next_offset + p.cnt
            FROM p WHERE part.id = p.pid AND part.id = ANY (p_wpids);

            SELECT string_agg(repeat(CASE WHEN u.pid = ANY (v_ids) THEN '0' ELSE '2' END, u.cnt),
                              '' ORDER BY u.o)
            INTO statuses
            FROM unnest(p_wpids, p_wcounts) WITH ORDINALITY AS u (pid, cnt, o);
            originals := NULL;
            RETURN;
        END IF;
    END IF;

    SELECT g.statuses, g.originals INTO statuses, originals
    FROM queen.store_frames_general(
        ARRAY(SELECT u.pid FROM unnest(p_wpids, p_wcounts) WITH ORDINALITY AS u (pid, cnt, o)
              CROSS JOIN LATERAL generate_series(1, u.cnt) ORDER BY u.o),
        p_mids, p_txids, p_payloads, p_subs, p_traces,
        coalesce(p_leaders, ARRAY(SELECT generate_series(1, cardinality(p_mids)))),
        v_ids, v_next, v_win) g;
END
$fn$;

-- The same, with every column sent as one text joined by chr(31) (an empty element of p_subs
-- or p_traces is NULL). Splitting on the server is far cheaper than adapting Python lists.
CREATE OR REPLACE FUNCTION queen.push_segments(
    p_wpids text, p_wcounts text, p_mids text, p_txids text, p_payloads text, p_subs text,
    p_traces text, p_leaders text, OUT statuses text, OUT originals text)
LANGUAGE sql AS $fn$
    SELECT f.statuses, f.originals
    FROM queen.push_frames(string_to_array(p_wpids, chr(31))::bigint[],
                           string_to_array(p_wcounts, chr(31))::integer[],
                           string_to_array(p_mids, chr(31))::uuid[],
                           string_to_array(p_txids, chr(31)),
                           string_to_array(p_payloads, chr(31)),
                           string_to_array(p_subs, chr(31), ''),
                           string_to_array(p_traces, chr(31), '')::uuid[],
                           string_to_array(p_leaders, chr(31))::integer[]) f
$fn$;
