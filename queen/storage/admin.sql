-- Queen on Trio admin reads: what queues hold, where consumers stand, stored messages.
-- Idempotent; applied after consume.sql. Nothing here counts messages by reading them: a
-- partition's depth comes from its next_offset, its lowest stored offset (one probe of the
-- segments primary key) and its cursors, so a figure costs a few index probes per partition
-- whatever the number of messages. Each function turns JIT compilation off for itself: on
-- PostgreSQL 15-17 (jit on by default) the estimated cost of a pass over 10,000 partitions
-- would compile every call, which costs more than the query.

-- Per partition of the given queues: what it holds, and where queue mode stands.
--   held        messages stored (next_offset - lowest stored offset - the gaps above it)
--   undone      of those, not done by queue mode (acked or dead-lettered)
--   processing  of those, inside a live lease
--   start_at    created_at of the segment holding the first undone message (null if none)
--   newest_at   created_at of the newest segment (null if none)
-- Offsets removed above the lowest stored one (queen.gaps: a clear or retention that kept a
-- leased write below them, a deleted message) are no messages: every count leaves them out,
-- and acks recorded ahead of the cursor count only where a message is still stored.
-- Then the consumers that read the partition (queue mode and every group with a cursor there
-- that either popped there or was made by the first look of a group subscribed from a time:
-- the original's partition consumers), each figure taken from the one furthest behind for
-- it:
--   consumers        how many read here (0: every figure below is as if none consumed)
--   most_undone      the most messages one of them has still to do, its lease included
--                    (held when none reads here)
--   most_processing  the most one of them holds inside a live lease
--   most_done        the most one of them has done: held - its undone - the partition's
--                    dead letters (a message any group dead-lettered is not done)
--   most_dead        the partition's dead letters (every group's)
-- When the first stored message at or above offset p_start was stored: the created_at of the
-- segment holding p_start, or, when p_start falls in a gap, of the first segment above it
-- (null when none). The one definition of a consumer's "oldest waiting" time, read by
-- queen.admin_partition_stats, queen.admin_group_positions and queen.admin_group_partitions.
-- A set-returning SQL function of one SELECT, so that the planner inlines it into the
-- caller's query (the same index probes as if written there; see queen.stored_lag).
CREATE OR REPLACE FUNCTION queen.stored_since(p_partition_id bigint, p_start bigint)
RETURNS TABLE (at timestamptz)
LANGUAGE sql STABLE AS $fn$
    SELECT coalesce(
        (SELECT y.created_at
         FROM (SELECT s.created_at, s.last_offset FROM queen.segments s
               WHERE s.partition_id = p_partition_id AND s.first_offset <= p_start
               ORDER BY s.first_offset DESC LIMIT 1) y
         WHERE y.last_offset >= p_start),
        (SELECT s.created_at FROM queen.segments s      -- p_start is in a gap
         WHERE s.partition_id = p_partition_id AND s.first_offset > p_start
         ORDER BY s.first_offset LIMIT 1))
$fn$;

DO $do$
BEGIN   -- earlier answers had no consumers column (and cannot be replaced in place)
    IF EXISTS (SELECT 1 FROM pg_proc
               WHERE pronamespace = 'queen'::regnamespace AND proname = 'admin_partition_stats'
                 AND NOT ('consumers' = ANY (proargnames))) THEN
        DROP FUNCTION queen.admin_partition_stats(bigint[]);
    END IF;
END
$do$;
CREATE OR REPLACE FUNCTION queen.admin_partition_stats(p_queue_ids bigint[])
RETURNS TABLE (queue_id bigint, partition_id bigint, name text, created_at timestamptz,
               next_offset bigint, low_offset bigint, cursor_offset bigint, held bigint,
               undone bigint, processing bigint, failed bigint, lease_expires_at timestamptz,
               start_at timestamptz, newest_at timestamptz, consumers bigint,
               most_undone bigint, most_processing bigint, most_done bigint, most_dead bigint)
LANGUAGE sql STABLE SET jit = off AS $fn$
    SELECT p.queue_id, p.id, p.name, p.created_at, p.next_offset, l.low, st.start,
           p.next_offset - l.low - g.gap[1],
           b.undone,
           CASE WHEN c.lease_expires_at > now()
                THEN least(b.undone,
                           greatest(0, c.lease_end - st.start - g.gap[3] - b.ahead))
                ELSE 0 END,
           (SELECT count(*) FROM queen.failures f
            WHERE f.partition_id = p.id AND f.consumer_group = '__QUEUE_MODE__'),
           CASE WHEN c.lease_expires_at > now() THEN c.lease_expires_at END,
           CASE WHEN b.undone > 0
                THEN (SELECT o.at FROM queen.stored_since(p.id, st.start) o) END,
           (SELECT s.created_at FROM queen.segments s
            WHERE s.partition_id = p.id ORDER BY s.first_offset DESC LIMIT 1),
           w.consumers,
           CASE WHEN w.consumers > 0 THEN w.undone
                ELSE p.next_offset - l.low - g.gap[1] END,
           coalesce(w.processing, 0),
           CASE WHEN w.consumers > 0
                THEN greatest(0, w.done + p.next_offset - l.low - g.gap[1] - dl.dead) ELSE 0 END,
           dl.dead
    FROM queen.partitions p
    LEFT JOIN queen.cursors c
           ON c.partition_id = p.id AND c.consumer_group = '__QUEUE_MODE__'
    CROSS JOIN LATERAL (   -- OFFSET 0: computed once, not once per use
        SELECT coalesce((SELECT s.first_offset FROM queen.segments s
                         WHERE s.partition_id = p.id ORDER BY s.first_offset LIMIT 1),
                        p.next_offset) AS low
        OFFSET 0) l
    CROSS JOIN LATERAL (
        SELECT greatest(l.low, coalesce(c.next_offset, l.low)) AS start) st
    CROSS JOIN LATERAL (   -- offsets removed in [low, next), [start, next), [start, lease_end)
        SELECT CASE WHEN p.id IN (SELECT x.partition_id FROM queen.gaps x)   -- usually not:
               THEN (SELECT ARRAY[                                             -- one hashed look
                        coalesce(sum(x.last_offset + 1 - greatest(x.first_offset, l.low)), 0),
                        coalesce(sum(greatest(0, x.last_offset + 1
                                                 - greatest(x.first_offset, st.start))), 0),
                        coalesce(sum(greatest(0, least(x.last_offset + 1, c.lease_end)
                                                 - greatest(x.first_offset, st.start))), 0)]
                     FROM queen.gaps x
                     WHERE x.partition_id = p.id AND x.last_offset >= l.low)
               ELSE ARRAY[0, 0, 0]::bigint[] END AS gap
        OFFSET 0) g
    CROSS JOIN LATERAL (
        SELECT a.ahead, greatest(0, p.next_offset - st.start - g.gap[2] - a.ahead) AS undone
        FROM (SELECT CASE WHEN cardinality(c.acked) > 0 THEN
                         (SELECT count(*) FROM unnest(c.acked) AS k (off)
                          WHERE k.off >= st.start
                            AND NOT EXISTS (SELECT 1 FROM queen.gaps x
                                            WHERE x.partition_id = p.id
                                              AND x.first_offset <= k.off
                                              AND x.last_offset >= k.off))
                         ELSE 0 END AS ahead) a
        OFFSET 0) b
    CROSS JOIN LATERAL (   -- every consumer that reads here, as queue mode's figures above;
                           -- done is held - undone - the partition's dead letters (held is
                           -- added above): a message dead-lettered by any group is not done
        SELECT count(*) AS consumers, max(y.undone) AS undone,
               max(y.processing) AS processing, max(- y.undone) AS done
        FROM (SELECT x.undone,
                     CASE WHEN k.lease_expires_at > now()
                          THEN least(x.undone, greatest(0, k.lease_end - x.start - x.gap[2]
                                                           - x.ahead))
                          ELSE 0 END AS processing
              FROM queen.cursors k
              CROSS JOIN LATERAL (
                  SELECT z.start, z.gap, z.ahead,
                         greatest(0, p.next_offset - z.start - z.gap[1] - z.ahead) AS undone
                  FROM (SELECT ks.start,
                               CASE WHEN g.gap[1] > 0 THEN   -- the partition has gaps
                                   (SELECT ARRAY[
                                       coalesce(sum(greatest(0, x.last_offset + 1
                                                    - greatest(x.first_offset, ks.start))), 0),
                                       coalesce(sum(greatest(0, least(x.last_offset + 1,
                                                                      k.lease_end)
                                                    - greatest(x.first_offset, ks.start))), 0)]
                                    FROM queen.gaps x
                                    WHERE x.partition_id = p.id AND x.last_offset >= ks.start)
                               ELSE ARRAY[0, 0]::bigint[] END AS gap,
                               CASE WHEN cardinality(k.acked) > 0 THEN
                                   (SELECT count(*) FROM unnest(k.acked) AS a (off)
                                    WHERE a.off >= ks.start
                                      AND NOT EXISTS (SELECT 1 FROM queen.gaps x
                                                      WHERE x.partition_id = p.id
                                                        AND x.first_offset <= a.off
                                                        AND x.last_offset >= a.off))
                                   ELSE 0 END AS ahead
                        FROM (SELECT greatest(l.low, k.next_offset) AS start) ks) z) x
              WHERE k.partition_id = p.id
                AND (k.delivered_at IS NOT NULL
                     OR EXISTS (SELECT 1 FROM queen.consumer_groups cg   -- its subscription's
                                WHERE cg.queue_id = p.queue_id            -- first look made it
                                  AND cg.consumer_group = k.consumer_group
                                  AND cg.subscribed_at IS NOT NULL))) y
        OFFSET 0) w
    CROSS JOIN LATERAL (SELECT count(*) AS dead FROM queen.dlq d WHERE d.partition_id = p.id) dl
    WHERE p.queue_id = ANY (p_queue_ids)
$fn$;

-- The queues matching the filters (p_name: that queue only), one page in name order, with their totals and the number
-- of queues matching (full_count). held, undone, processing and failed are queue mode's;
-- dead_letter counts every group; most_* add up, partition by partition, the figures of the
-- consumer furthest behind there (see queen.admin_partition_stats).
DO $do$
BEGIN   -- earlier answers had no most_undone column (and cannot be replaced in place)
    IF EXISTS (SELECT 1 FROM pg_proc
               WHERE pronamespace = 'queen'::regnamespace AND proname = 'admin_queues'
                 AND NOT ('most_undone' = ANY (proargnames))) THEN
        DROP FUNCTION queen.admin_queues(text, text, text, text, integer, integer);
    END IF;
END
$do$;
CREATE OR REPLACE FUNCTION queen.admin_queues(
    p_name text, p_search text, p_namespace text, p_task text, p_limit integer, p_offset integer)
RETURNS TABLE (id bigint, name text, namespace text, task text, priority integer,
               created_at timestamptz, partitions bigint, held bigint, undone bigint,
               processing bigint, failed bigint, dead_letter bigint, oldest_pending_at timestamptz,
               newest_at timestamptz, most_undone bigint, most_processing bigint,
               most_done bigint, most_dead bigint, full_count bigint)
LANGUAGE sql STABLE SET jit = off AS $fn$
    WITH page AS (
        SELECT q.id, q.name, q.namespace, q.task, q.priority, q.created_at,
               count(*) OVER () AS full_count
        FROM queen.queues q
        WHERE (p_name IS NULL OR q.name = p_name)
          AND (p_search IS NULL OR strpos(lower(q.name), lower(p_search)) > 0)
          AND (p_namespace IS NULL OR q.namespace = p_namespace)
          AND (p_task IS NULL OR q.task = p_task)
        ORDER BY q.name
        LIMIT p_limit OFFSET p_offset
    ),
    stats AS (
        SELECT s.queue_id, count(*) AS partitions, sum(s.held)::bigint AS held,
               sum(s.undone)::bigint AS undone, sum(s.processing)::bigint AS processing,
               sum(s.failed)::bigint AS failed, min(s.start_at) AS oldest_pending_at,
               max(s.newest_at) AS newest_at, sum(s.most_undone)::bigint AS most_undone,
               sum(s.most_processing)::bigint AS most_processing,
               sum(s.most_done)::bigint AS most_done, sum(s.most_dead)::bigint AS most_dead
        FROM queen.admin_partition_stats(ARRAY(SELECT page.id FROM page)) s
        GROUP BY s.queue_id
    )
    SELECT page.id, page.name, page.namespace, page.task, page.priority, page.created_at,
           coalesce(stats.partitions, 0), coalesce(stats.held, 0), coalesce(stats.undone, 0),
           coalesce(stats.processing, 0), coalesce(stats.failed, 0),
           (SELECT count(*) FROM queen.dlq d WHERE d.queue_id = page.id),
           stats.oldest_pending_at, stats.newest_at, coalesce(stats.most_undone, 0),
           coalesce(stats.most_processing, 0), coalesce(stats.most_done, 0),
           coalesce(stats.most_dead, 0), page.full_count
    FROM page LEFT JOIN stats ON stats.queue_id = page.id
    ORDER BY page.name
$fn$;

-- Why a group's partition looks stuck, or null: it holds messages for the group (p_lag), no
-- live lease covers them (p_lease), and either a lease ran out there with messages in it and no
-- pop came since (p_expired: 'lease_expired'), or its oldest such message (p_oldest) has waited
-- p_idle_s with no pop there for as long ('idle') or ever ('never_popped'). The one rule the
-- group page, its sort and the overview's count of stuck groups read. Plain SQL, inlined where
-- it is called.
CREATE OR REPLACE FUNCTION queen.admin_stuck(
    p_lag numeric, p_lease timestamptz, p_expired timestamptz, p_oldest timestamptz,
    p_delivered timestamptz, p_idle_s double precision)
RETURNS text LANGUAGE sql STABLE AS $fn$
    SELECT CASE WHEN p_lag <= 0 OR p_lease IS NOT NULL THEN NULL
                WHEN p_expired IS NOT NULL THEN 'lease_expired'
                WHEN p_oldest IS NULL
                  OR p_oldest > now() - make_interval(secs => p_idle_s) THEN NULL
                WHEN p_delivered IS NULL THEN 'never_popped'
                WHEN p_delivered <= now() - make_interval(secs => p_idle_s) THEN 'idle'
           END
$fn$;

-- A group's lag in one partition: the messages stored from p_start on (p_next_offset the
-- partition's next offset) that it has not done, p_acked its offsets acked ahead of its
-- cursor. Offsets removed above p_start (queen.gaps) are no messages, and an ack of one
-- counts for nothing. The one definition of the figure, read by queen.admin_group_positions
-- and queen.admin_group_partitions. A set-returning SQL function of one SELECT, not STRICT,
-- with no SET clause and no SECURITY DEFINER, so that the planner inlines it into the caller's
-- query (CROSS JOIN LATERAL): the look at the partitions with gaps stays one hashed look per
-- query, as if written there, where a function called per row would run its subqueries
-- again for each (tests/test_group_lag.py checks that it is inlined).
CREATE OR REPLACE FUNCTION queen.stored_lag(
    p_partition_id bigint, p_next_offset bigint, p_start bigint, p_acked bigint[])
RETURNS TABLE (lag bigint)
LANGUAGE sql STABLE AS $fn$
    SELECT greatest(0, p_next_offset - p_start
                       - CASE WHEN p_partition_id IN (SELECT g.partition_id FROM queen.gaps g)
                         THEN (SELECT coalesce(sum(g.last_offset + 1
                                                   - greatest(g.first_offset, p_start)), 0)
                               FROM queen.gaps g
                               WHERE g.partition_id = p_partition_id
                                 AND g.last_offset >= p_start)
                         ELSE 0 END
                       - CASE WHEN cardinality(p_acked) > 0 THEN
                             (SELECT count(*) FROM unnest(p_acked) AS a (off)
                              WHERE a.off >= p_start
                                AND NOT EXISTS (SELECT 1 FROM queen.gaps g
                                                WHERE g.partition_id = p_partition_id
                                                  AND g.first_offset <= a.off
                                                  AND g.last_offset >= a.off))
                         ELSE 0 END)::bigint
$fn$;

-- Where groups stand on queues, per partition holding messages, cursor or not. start = the
-- first offset the group will still receive: its cursor (or the lowest stored offset, when
-- what was ahead of the cursor was removed); without one, where its first pop
-- would start: the first segment stored at or after its subscription time (two probes of
-- segments_by_age: the first such time, then the lowest offset stored then; queen.pop orders
-- by offset, and a partition's segments are stored in offset order, so both find the same
-- segment), else the lowest stored offset. lag = messages stored from start on that it has
-- not done (offsets removed above start, queen.gaps, are no messages). So a partition a group
-- never popped counts whole from its subscription's start, and a group that stopped
-- consuming shows the lag of every partition created since.
-- Cost: a partition with a cursor costs a probe of the segments and a hashed look at the
-- partitions with gaps (the gaps' own probe only for those). The partitions without one are
-- looked for among those created since the group's cursor mark (see queen.pop: every
-- partition created before it holding messages got a cursor at the group's look), through
-- partitions_by_queue_created, and cost one probe of the cursors' key and one of the
-- segments each; a group without a mark (it only ever popped single partitions) looks at
-- them all.
DO $do$
BEGIN   -- earlier answers had no lease_expired_at column (and cannot be replaced in place)
    IF EXISTS (SELECT 1 FROM pg_proc
               WHERE pronamespace = 'queen'::regnamespace AND proname = 'admin_group_positions'
                 AND NOT ('lease_expired_at' = ANY (proargnames))) THEN
        DROP FUNCTION queen.admin_group_positions(text[], bigint[], timestamptz[]);
    END IF;
END
$do$;
CREATE OR REPLACE FUNCTION queen.admin_group_positions(
    p_groups text[], p_queue_ids bigint[], p_subscribed_at timestamptz[])
RETURNS TABLE (consumer_group text, queue_id bigint, partition_id bigint, partition_name text,
               next_offset bigint, start_offset bigint, has_cursor boolean, lag bigint,
               oldest_at timestamptz, lease_expires_at timestamptz, delivered_at timestamptz,
               has_done boolean, lease_expired_at timestamptz)
LANGUAGE sql STABLE SET jit = off AS $fn$
    WITH k AS MATERIALIZED (
        SELECT k.grp, k.qid, k.sub_at,
               coalesce((SELECT m.covered FROM queen.cursor_marks m
                         WHERE m.queue_id = k.qid AND m.consumer_group = k.grp),
                        '0'::xid8) AS covered
        FROM unnest(p_groups, p_queue_ids, p_subscribed_at) AS k (grp, qid, sub_at)
    ),
    had AS (   -- partitions the group has popped: from its cursor
        SELECT k.grp, k.qid, p.id, p.name, p.next_offset, greatest(c.next_offset, l.low) AS start,
               true AS cur, c.acked,
               CASE WHEN c.lease_expires_at > now() THEN c.lease_expires_at END AS lease,
               c.delivered_at,
               -- it has done something here (an ack or a dead letter): its cursor moved
               -- past where the pop that made it put it, or it acked ahead of it
               -- past where the pop that made it put it, or it acked ahead of it; a group
               -- subscribed from a time starts done there (the original's subscription
               -- records a consumption)
               k.sub_at IS NOT NULL OR cardinality(c.acked) > 0 OR c.next_offset > 0 AS done,
               -- a lease that ran out with messages still in it, and no pop since
               CASE WHEN c.lease_expires_at <= now() AND c.lease_end > c.next_offset
                    THEN c.lease_expires_at END AS expired
        FROM k
        JOIN queen.cursors c ON c.queue_id = k.qid AND c.consumer_group = k.grp
        JOIN queen.partitions p ON p.id = c.partition_id
        CROSS JOIN LATERAL (   -- OFFSET 0: computed once, not once per use
            SELECT coalesce((SELECT s.first_offset FROM queen.segments s
                             WHERE s.partition_id = p.id
                             ORDER BY s.first_offset LIMIT 1), p.next_offset) AS low
            OFFSET 0) l
    ),
    fresh AS (   -- partitions it has never popped: from where its subscription starts
        SELECT k.grp, k.qid, p.id, p.name, p.next_offset, st.start, false, '{}'::bigint[],
               NULL::timestamptz, NULL::timestamptz, false, NULL::timestamptz
        FROM k
        JOIN queen.partitions p
          ON p.queue_id = k.qid AND p.created_xid >= k.covered AND p.next_offset > 0
        CROSS JOIN LATERAL (   -- OFFSET 0: computed once, not once per use
            SELECT CASE WHEN k.sub_at IS NULL THEN
                    coalesce((SELECT s.first_offset FROM queen.segments s
                              WHERE s.partition_id = p.id
                              ORDER BY s.first_offset LIMIT 1), p.next_offset)
                ELSE
                    coalesce((SELECT min(s.first_offset) FROM queen.segments s
                              WHERE s.partition_id = p.id
                                AND s.created_at = (SELECT f.created_at FROM queen.segments f
                                                    WHERE f.partition_id = p.id
                                                      AND f.created_at >= k.sub_at
                                                    ORDER BY f.created_at LIMIT 1)),
                             p.next_offset)
           END AS start
            OFFSET 0) st
        WHERE NOT EXISTS (SELECT 1 FROM queen.cursors c
                          WHERE c.partition_id = p.id AND c.consumer_group = k.grp)
    ),
    pos AS MATERIALIZED (   -- lag is read twice below: computed once
        SELECT x.*, n.lag
        FROM (SELECT * FROM had UNION ALL SELECT * FROM fresh) x
        CROSS JOIN LATERAL queen.stored_lag(x.id, x.next_offset, x.start, x.acked) n
    )
    SELECT x.grp, x.qid, x.id, x.name, x.next_offset, x.start, x.cur, x.lag,
           CASE WHEN x.lag > 0
                THEN (SELECT o.at FROM queen.stored_since(x.id, x.start) o) END,
           x.lease, x.delivered_at, x.done, CASE WHEN x.lag > 0 THEN x.expired END
    FROM pos x
$fn$;

-- Every consumer group's standing on every queue it reads (queue mode included, once it has
-- popped there), one page in (group, queue) order. lag = messages the group will still
-- receive, over every partition holding messages (see queen.admin_group_positions);
-- partitions = those it has a cursor on; popped = those it reads as the original counts its
-- partition consumers (a cursor with a delivery, or any cursor of a group subscribed from a
-- time: its first look made them); lagging = partitions where it has messages
-- to receive; oldest_at = created_at of the oldest message it will still receive;
-- popped_lag and popped_lagging = lag and lagging over those alone (the original's meaning);
-- done = those where it has acknowledged (or dead-lettered) something; stuck = those that look
-- stuck (queen.admin_stuck, with p_stuck_idle_s). p_group / p_queue narrow the list; a null
-- p_limit lists every pair.
DROP FUNCTION IF EXISTS queen.admin_groups(text, text, integer, integer);   -- no stuck column
CREATE OR REPLACE FUNCTION queen.admin_groups(
    p_group text, p_queue text, p_limit integer, p_offset integer,
    p_stuck_idle_s double precision)
RETURNS TABLE (consumer_group text, queue_id bigint, queue_name text, partitions bigint,
               popped bigint, lag bigint, lagging bigint, leased bigint, oldest_at timestamptz,
               last_delivered_at timestamptz, popped_lag bigint, popped_lagging bigint,
               done bigint, stuck bigint,
               subscription_mode text, subscribed_at timestamptz, subscription_created_at timestamptz,
               full_count bigint)
LANGUAGE sql STABLE SET jit = off AS $fn$
    WITH keys AS (
        SELECT DISTINCT c.consumer_group, c.queue_id
        FROM queen.cursors c
        WHERE (p_group IS NULL OR c.consumer_group = p_group)
          AND (p_queue IS NULL
               OR c.queue_id = (SELECT q.id FROM queen.queues q WHERE q.name = p_queue))
        UNION
        SELECT g.consumer_group, g.queue_id
        FROM queen.consumer_groups g
        WHERE (p_group IS NULL OR g.consumer_group = p_group)
          AND (p_queue IS NULL
               OR g.queue_id = (SELECT q.id FROM queen.queues q WHERE q.name = p_queue))
    ),
    page AS MATERIALIZED (
        SELECT k.consumer_group, k.queue_id, q.name AS queue_name, g.subscription_mode,
               g.subscribed_at, g.created_at AS subscription_created_at,
               count(*) OVER () AS full_count
        FROM keys k JOIN queen.queues q ON q.id = k.queue_id
        LEFT JOIN queen.consumer_groups g
               ON g.queue_id = k.queue_id AND g.consumer_group = k.consumer_group
        ORDER BY k.consumer_group, q.name
        LIMIT p_limit OFFSET p_offset
    ),
    agg AS (
        SELECT x.consumer_group, x.queue_id, count(*) FILTER (WHERE x.has_cursor) AS partitions,
               count(*) FILTER (WHERE x.delivered_at IS NOT NULL
                                   OR (x.has_cursor AND page.subscribed_at IS NOT NULL))
                   AS popped,
               sum(x.lag)::bigint AS lag, count(*) FILTER (WHERE x.lag > 0) AS lagging,
               count(*) FILTER (WHERE x.lease_expires_at IS NOT NULL) AS leased,
               min(x.oldest_at) AS oldest_at, max(x.delivered_at) AS last_delivered_at,
               coalesce(sum(x.lag) FILTER (WHERE x.delivered_at IS NOT NULL
                                           OR (x.has_cursor AND page.subscribed_at IS NOT NULL)),
                        0)::bigint AS popped_lag,
               count(*) FILTER (WHERE (x.delivered_at IS NOT NULL
                                       OR (x.has_cursor AND page.subscribed_at IS NOT NULL))
                                  AND x.lag > 0) AS popped_lagging,
               count(*) FILTER (WHERE (x.delivered_at IS NOT NULL
                                       OR (x.has_cursor AND page.subscribed_at IS NOT NULL))
                                  AND x.has_done) AS done,
               count(*) FILTER (WHERE queen.admin_stuck(x.lag, x.lease_expires_at,
                                                        x.lease_expired_at, x.oldest_at,
                                                        x.delivered_at, p_stuck_idle_s)
                                      IS NOT NULL) AS stuck
        FROM queen.admin_group_positions(
            ARRAY(SELECT page.consumer_group FROM page),
            ARRAY(SELECT page.queue_id FROM page),
            ARRAY(SELECT page.subscribed_at FROM page)) x
        JOIN page ON page.consumer_group = x.consumer_group AND page.queue_id = x.queue_id
        GROUP BY x.consumer_group, x.queue_id
    )
    SELECT page.consumer_group, page.queue_id, page.queue_name,
           coalesce(agg.partitions, 0), coalesce(agg.popped, 0), coalesce(agg.lag, 0),
           coalesce(agg.lagging, 0),
           coalesce(agg.leased, 0),
           agg.oldest_at, agg.last_delivered_at, coalesce(agg.popped_lag, 0),
           coalesce(agg.popped_lagging, 0), coalesce(agg.done, 0), coalesce(agg.stuck, 0),
           page.subscription_mode, page.subscribed_at, page.subscription_created_at,
           page.full_count
    FROM page
    LEFT JOIN agg ON agg.consumer_group = page.consumer_group AND agg.queue_id = page.queue_id
    ORDER BY page.consumer_group, page.queue_name
$fn$;

-- One group on one queue, partition by partition, one page: every partition holding messages,
-- with where the group stands there (cursor_offset is its start, as in
-- queen.admin_group_positions, where it has no cursor yet) and why it looks stuck
-- (queen.admin_stuck, with p_stuck_idle_s). p_order: 'name' (partition name order: the page is
-- chosen first, and only its partitions are looked at), 'lag' (most messages behind first) or
-- 'stuck' (the stuck partitions first, then as 'lag'); ties by name. Those two look at every
-- partition of the queue holding messages, then keep the page.
DROP FUNCTION IF EXISTS queen.admin_group_partitions(text, bigint, integer, integer);   -- no order
CREATE OR REPLACE FUNCTION queen.admin_group_partitions(
    p_group text, p_queue_id bigint, p_limit integer, p_offset integer, p_order text,
    p_stuck_idle_s double precision)
RETURNS TABLE (partition_id bigint, partition_name text, next_offset bigint,
               cursor_offset bigint, has_cursor boolean, lag bigint, oldest_at timestamptz,
               lease_expires_at timestamptz, delivered_at timestamptz,
               lease_expired_at timestamptz, stuck text)
LANGUAGE sql STABLE SET jit = off AS $fn$
    WITH page AS (
        SELECT p.id, p.name, p.next_offset
        FROM queen.partitions p
        WHERE p.queue_id = p_queue_id AND p.next_offset > 0
        ORDER BY p.name
        LIMIT CASE WHEN p_order = 'name' THEN p_limit END
        OFFSET CASE WHEN p_order = 'name' THEN p_offset ELSE 0 END
    ),
    pos AS MATERIALIZED (   -- start is read several times below: computed once
        SELECT page.id, page.name, page.next_offset, c.partition_id IS NOT NULL AS cur,
               CASE WHEN c.partition_id IS NOT NULL THEN
                   greatest(c.next_offset,   -- what was ahead of the cursor may be removed
                            coalesce((SELECT s.first_offset FROM queen.segments s
                                      WHERE s.partition_id = page.id
                                      ORDER BY s.first_offset LIMIT 1), page.next_offset))
               WHEN sub.at IS NULL THEN
                   coalesce((SELECT s.first_offset FROM queen.segments s
                             WHERE s.partition_id = page.id
                             ORDER BY s.first_offset LIMIT 1), page.next_offset)
               ELSE
                   coalesce((SELECT min(s.first_offset) FROM queen.segments s
                             WHERE s.partition_id = page.id
                               AND s.created_at = (SELECT f.created_at
                                                   FROM queen.segments f
                                                   WHERE f.partition_id = page.id
                                                     AND f.created_at >= sub.at
                                                   ORDER BY f.created_at LIMIT 1)),
                            page.next_offset)
               END AS start,
               coalesce(c.acked, '{}') AS acked,
               CASE WHEN c.lease_expires_at > now() THEN c.lease_expires_at END AS lease,
               c.delivered_at,
               -- a lease that ran out with messages still in it, and no pop since
               CASE WHEN c.lease_expires_at <= now() AND c.lease_end > c.next_offset
                    THEN c.lease_expires_at END AS expired
        FROM page
        CROSS JOIN (SELECT (SELECT g.subscribed_at FROM queen.consumer_groups g
                            WHERE g.queue_id = p_queue_id AND g.consumer_group = p_group) AS at
                   ) sub
        LEFT JOIN queen.cursors c ON c.partition_id = page.id AND c.consumer_group = p_group
    ),
    counted AS MATERIALIZED (   -- lag is read several times below: computed once
        SELECT pos.*, n.lag
        FROM pos
        CROSS JOIN LATERAL queen.stored_lag(pos.id, pos.next_offset, pos.start, pos.acked) n
    )
    SELECT w.* FROM (
        SELECT z.*, queen.admin_stuck(z.lag, z.lease, z.expired, z.oldest_at, z.delivered_at,
                                      p_stuck_idle_s) AS stuck
        FROM (SELECT x.id, x.name, x.next_offset, x.start, x.cur, x.lag,
                     CASE WHEN x.lag > 0
                          THEN (SELECT o.at FROM queen.stored_since(x.id, x.start) o)
                     END AS oldest_at,
                     x.lease, x.delivered_at, CASE WHEN x.lag > 0 THEN x.expired END AS expired
              FROM counted x OFFSET 0) z   -- OFFSET 0: oldest_at computed once per row
    ) w
    ORDER BY CASE WHEN p_order = 'stuck' THEN w.stuck IS NULL END,
             CASE WHEN p_order IN ('lag', 'stuck') THEN w.lag END DESC,
             w.name
    LIMIT CASE WHEN p_order = 'name' THEN NULL ELSE p_limit END
    OFFSET CASE WHEN p_order = 'name' THEN 0 ELSE p_offset END
$fn$;

-- Stored messages, newest first: of the partitions matching the filters, the newest segments
-- created in [p_from, p_to) that can hold a matching message (by offset: before or after queue
-- mode's cursor, inside its lease, or holding a dead-lettered offset), at most p_limit +
-- p_offset of them per partition, then overall the newest ones until they can hold p_limit +
-- p_offset messages; only then their frames are read and judged one by one.
-- Status is queue mode's: completed, processing (inside a live lease), pending; dead_letter
-- when a copy of the message is in the DLQ of any group.
-- consumed_by, total_groups: of the named groups with a cursor on the message's partition,
-- how many have it behind their cursor.
DO $do$
BEGIN   -- the earlier answer had no consumed_by column (and cannot be replaced in place)
    IF EXISTS (SELECT 1 FROM pg_proc
               WHERE pronamespace = 'queen'::regnamespace AND proname = 'admin_messages'
                 AND NOT ('consumed_by' = ANY (proargnames))) THEN
        DROP FUNCTION queen.admin_messages(text, text, text, text, text, timestamptz,
                                           timestamptz, integer, integer);
    END IF;
END
$do$;
CREATE OR REPLACE FUNCTION queen.admin_messages(
    p_queue text, p_partition text, p_namespace text, p_task text, p_status text,
    p_from timestamptz, p_to timestamptz, p_limit integer, p_offset integer)
RETURNS TABLE (partition_id bigint, queue_name text, partition_name text, namespace text,
               task text, msg_offset bigint, message_id uuid, transaction_id text,
               producer_sub text, trace_id uuid, created_at timestamptz, status text,
               lease_expires_at timestamptz, consumed_by integer, total_groups integer)
LANGUAGE sql STABLE SET jit = off AS $fn$
    WITH parts AS (
        SELECT p.id, q.id AS queue_id, q.name AS queue_name, p.name AS partition_name,
               q.namespace, q.task,
               coalesce(c.next_offset, 0) AS cursor_offset, coalesce(c.acked, '{}') AS acked,
               CASE WHEN c.lease_expires_at > now() THEN c.lease_end END AS lease_end,
               CASE WHEN c.lease_expires_at > now() THEN c.lease_expires_at END AS lease_expires_at
        FROM queen.queues q
        JOIN queen.partitions p ON p.queue_id = q.id
        LEFT JOIN queen.cursors c
               ON c.partition_id = p.id AND c.consumer_group = '__QUEUE_MODE__'
        WHERE (p_queue IS NULL OR q.name = p_queue)
          AND (p_partition IS NULL OR p.name = p_partition)
          AND (p_namespace IS NULL OR q.namespace = p_namespace)
          AND (p_task IS NULL OR q.task = p_task)
    ),
    dead AS (   -- the dead-lettered offsets of those partitions (a status filter of its own)
        SELECT DISTINCT d.partition_id, d.msg_offset
        FROM queen.dlq d
        WHERE p_status = 'dead_letter'
          AND d.queue_id IN (SELECT DISTINCT parts.queue_id FROM parts)
          AND d.partition_id IN (SELECT parts.id FROM parts)
    ),
    -- Without a status filter only the partitions whose newest segment is among the
    -- p_limit + p_offset newest of all can hold a segment of the page (any other partition has
    -- that many newer segments elsewhere): one probe per partition picks them.
    recent AS (
        SELECT parts.id
        FROM parts
        CROSS JOIN LATERAL (
            SELECT s.created_at FROM queen.segments s
            WHERE s.partition_id = parts.id
              AND s.created_at >= p_from AND s.created_at < p_to
            ORDER BY s.created_at DESC LIMIT 1) x
        WHERE p_status IS NULL
        ORDER BY x.created_at DESC
        LIMIT p_limit + p_offset
    ),
    cand AS (   -- per partition, its newest segments that can hold a matching message, and
                -- how many they can hold at most (n)
        SELECT x.partition_id, x.first_offset, x.created_at, x.n
        FROM parts
        CROSS JOIN LATERAL (
            SELECT s.partition_id, s.first_offset, s.created_at,
                   CASE p_status
                       WHEN 'completed'
                           THEN least(s.last_offset, parts.cursor_offset - 1) - s.first_offset + 1
                       WHEN 'pending'
                           THEN s.last_offset - greatest(s.first_offset, parts.cursor_offset,
                                                         coalesce(parts.lease_end, 0)) + 1
                       WHEN 'processing'
                           THEN least(s.last_offset, parts.lease_end - 1)
                                - greatest(s.first_offset, parts.cursor_offset) + 1
                       WHEN 'dead_letter'
                           THEN (SELECT count(*) FROM dead
                                 WHERE dead.partition_id = s.partition_id
                                   AND dead.msg_offset BETWEEN s.first_offset AND s.last_offset)
                       ELSE s.last_offset - s.first_offset + 1
                   END AS n
            FROM queen.segments s
            WHERE s.partition_id = parts.id
              AND s.created_at >= p_from AND s.created_at < p_to
              AND (p_status IS NULL
                   OR (p_status = 'dead_letter'
                       AND EXISTS (SELECT 1 FROM dead WHERE dead.partition_id = parts.id))
                   OR (p_status = 'completed' AND s.first_offset < parts.cursor_offset)
                   OR (p_status = 'processing' AND parts.lease_end IS NOT NULL
                       AND s.last_offset >= parts.cursor_offset
                       AND s.first_offset < parts.lease_end)
                   OR (p_status = 'pending' AND s.last_offset >= parts.cursor_offset))
            ORDER BY s.created_at DESC
            LIMIT p_limit + p_offset) x
        WHERE x.n > 0
          AND (p_status IS NOT NULL OR parts.id IN (SELECT recent.id FROM recent))
    ),
    segs AS (   -- the newest candidates overall, until they can fill the page
        SELECT c.partition_id, c.first_offset, c.created_at
        FROM (SELECT c.*,
                     sum(c.n) OVER (ORDER BY c.created_at DESC, c.partition_id,
                                             c.first_offset DESC) - c.n AS before
              FROM cand c) c
        WHERE c.before < p_limit + p_offset
    ),
    frames AS (
        SELECT parts.id AS partition_id, parts.queue_id, parts.queue_name,
               parts.partition_name, parts.namespace, parts.task,
               s.first_offset + f.i - 1 AS msg_offset, f.mid, f.txid, s.producer_subs[f.i] AS sub,
               s.trace_ids[f.i] AS trace, s.created_at,
               CASE WHEN s.first_offset + f.i - 1 < parts.cursor_offset
                         OR s.first_offset + f.i - 1 = ANY (parts.acked) THEN 'completed'
                    WHEN s.first_offset + f.i - 1 < parts.lease_end THEN 'processing'
                    ELSE 'pending' END AS queue_status,
               parts.lease_expires_at
        FROM segs
        JOIN parts ON parts.id = segs.partition_id
        JOIN queen.segments s
          ON s.partition_id = segs.partition_id AND s.first_offset = segs.first_offset
        CROSS JOIN LATERAL unnest(s.message_ids, s.transaction_ids)
             WITH ORDINALITY AS f (mid, txid, i)
    ),
    judged AS (
        SELECT fr.*,
               CASE WHEN EXISTS (SELECT 1 FROM queen.dlq d
                                 WHERE d.queue_id = fr.queue_id
                                   AND d.partition_id = fr.partition_id
                                   AND d.msg_offset = fr.msg_offset)
                    THEN 'dead_letter' ELSE fr.queue_status END AS status
        FROM frames fr
    ),
    page AS (
        SELECT j.partition_id, j.queue_name, j.partition_name, j.namespace, j.task,
               j.msg_offset, j.mid, j.txid, j.sub, j.trace, j.created_at, j.status,
               CASE WHEN j.status = 'processing' THEN j.lease_expires_at END AS lease_expires_at
        FROM judged j
        WHERE p_status IS NULL OR j.status = p_status
        ORDER BY j.created_at DESC, j.partition_id, j.msg_offset DESC
        LIMIT p_limit OFFSET p_offset
    )
    SELECT page.*, g.consumed_by, g.total_groups
    FROM page
    CROSS JOIN LATERAL (
        SELECT (count(*) FILTER (WHERE page.msg_offset < c.next_offset
                                    OR page.msg_offset = ANY (c.acked)))::integer AS consumed_by,
               count(*)::integer AS total_groups
        FROM queen.cursors c
        WHERE c.partition_id = page.partition_id AND c.consumer_group <> '__QUEUE_MODE__') g
    ORDER BY page.created_at DESC, page.partition_id, page.msg_offset DESC
$fn$;

-- The offset of a message in a partition, by transaction id: the dedup sidecar first (one
-- probe of its hash index), else the partition's segments.
CREATE OR REPLACE FUNCTION queen.admin_find_offset(p_partition_id bigint, p_txid text)
RETURNS bigint
LANGUAGE sql STABLE SET jit = off AS $fn$
    SELECT coalesce(
        (SELECT max(d.msg_offset) FROM queen.dedup d
         WHERE d.key_hash = hashtextextended(p_txid, p_partition_id)
           AND d.partition_id = p_partition_id AND d.transaction_id = p_txid
           AND EXISTS (SELECT 1 FROM queen.segments s
                       WHERE s.partition_id = p_partition_id
                         AND d.msg_offset BETWEEN s.first_offset AND s.last_offset)),
        (SELECT max(s.first_offset + f.i - 1)
         FROM queen.segments s
         CROSS JOIN LATERAL unnest(s.transaction_ids) WITH ORDINALITY AS f (txid, i)
         WHERE s.partition_id = p_partition_id AND f.txid = p_txid))
$fn$;

-- The partitions of queue p_queue holding a message with transaction id p_txid (first p_limit
-- by name): the dedup sidecar's probe per partition, then, past the dedup window, a look
-- through the partition's stored transaction ids.
CREATE OR REPLACE FUNCTION queen.admin_find_partitions(p_queue text, p_txid text, p_limit integer)
RETURNS TABLE (partition_id bigint)
LANGUAGE sql STABLE SET jit = off AS $fn$
    SELECT p.id
    FROM queen.partitions p JOIN queen.queues q ON q.id = p.queue_id
    WHERE q.name = p_queue AND queen.admin_find_offset(p.id, p_txid) IS NOT NULL
    ORDER BY p.name
    LIMIT p_limit
$fn$;

-- One message, by partition id and transaction id, with its queue and every group's view of it.
CREATE OR REPLACE FUNCTION queen.admin_message(p_partition_id bigint, p_txid text)
RETURNS TABLE (partition_id bigint, queue_name text, partition_name text, namespace text,
               task text, msg_offset bigint, message_id uuid, transaction_id text,
               payload text, producer_sub text, trace_id uuid, created_at timestamptz,
               lease_time_s integer, retry_limit integer, retry_delay_ms integer, ttl_s integer,
               priority integer, groups jsonb, dlq jsonb)
LANGUAGE sql STABLE SET jit = off AS $fn$
    SELECT p.id, q.name, p.name, q.namespace, q.task, o.off,
           s.message_ids[o.off - s.first_offset + 1], s.transaction_ids[o.off - s.first_offset + 1],
           s.payloads[o.off - s.first_offset + 1], s.producer_subs[o.off - s.first_offset + 1],
           s.trace_ids[o.off - s.first_offset + 1], s.created_at,
           q.lease_time_s, q.retry_limit, q.retry_delay_ms, q.ttl_s, q.priority,
           (SELECT coalesce(jsonb_agg(jsonb_build_object(
                       'name', c.consumer_group,
                       'consumed', o.off < c.next_offset OR o.off = ANY (c.acked),
                       'leased', c.lease_expires_at > now() AND o.off >= c.next_offset
                                 AND o.off < c.lease_end,
                       'lease_expires_at', CASE WHEN c.lease_expires_at > now()
                                              THEN c.lease_expires_at END)
                   ORDER BY c.consumer_group), '[]')
            FROM queen.cursors c WHERE c.partition_id = p.id),
           (SELECT jsonb_agg(jsonb_build_object(
                       'consumer_group', d.consumer_group, 'error_message', d.error_message,
                       'retry_count', d.retry_count, 'failed_at', d.failed_at)
                   ORDER BY d.failed_at DESC)
            FROM queen.dlq d
            WHERE d.queue_id = q.id AND d.partition_id = p.id AND d.msg_offset = o.off)
    FROM queen.partitions p
    JOIN queen.queues q ON q.id = p.queue_id
    CROSS JOIN LATERAL (SELECT queen.admin_find_offset(p.id, p_txid) AS off) o
    JOIN queen.segments s
      ON s.partition_id = p.id AND s.first_offset <= o.off AND s.last_offset >= o.off
    WHERE p.id = p_partition_id
$fn$;

-- Remove one stored message: its segment is cut around it (offsets are kept; the pop steps
-- over the gap as it does over what retention removed, and the figures leave it out:
-- queen.gaps). The partition's cursors are locked FOR SHARE first, in the consume side's
-- order, and a message inside a live lease is left alone. Its dead letters (every group's)
-- are removed with it, and so are those left of a message retention already removed.
-- Answers 'deleted', 'leased' or 'missing'.
CREATE OR REPLACE FUNCTION queen.admin_delete_message(p_partition_id bigint, p_txid text)
RETURNS text
LANGUAGE plpgsql SET jit = off AS $fn$
DECLARE
    v_off bigint;
    v_seg queen.segments%ROWTYPE;
    v_i   integer;
    v_n   integer;
BEGIN
    PERFORM 1 FROM queen.cursors c WHERE c.partition_id = p_partition_id
    ORDER BY c.partition_id, c.consumer_group FOR SHARE;
    v_off := queen.admin_find_offset(p_partition_id, p_txid);
    IF v_off IS NULL THEN   -- retention may have removed it and left its dead letters
        DELETE FROM queen.dlq d
        WHERE d.partition_id = p_partition_id AND d.transaction_id = p_txid;
        RETURN CASE WHEN FOUND THEN 'deleted' ELSE 'missing' END;
    END IF;
    IF EXISTS (SELECT 1 FROM queen.cursors c
               WHERE c.partition_id = p_partition_id AND c.lease_expires_at > now()
                 AND v_off >= c.next_offset AND v_off < c.lease_end) THEN
        RETURN 'leased';
    END IF;
    DELETE FROM queen.segments s
    WHERE s.partition_id = p_partition_id AND s.first_offset <= v_off AND s.last_offset >= v_off
    RETURNING * INTO v_seg;
    DELETE FROM queen.dlq d   -- its dead letters go with it
    WHERE d.partition_id = p_partition_id AND d.transaction_id = p_txid AND d.msg_offset = v_off;
    IF v_seg.partition_id IS NULL THEN
        RETURN CASE WHEN FOUND THEN 'deleted' ELSE 'missing' END;
    END IF;
    v_i := (v_off - v_seg.first_offset + 1)::integer;
    v_n := cardinality(v_seg.message_ids);
    IF v_i > 1 THEN
        INSERT INTO queen.segments (partition_id, first_offset, last_offset, created_at,
                                    message_ids, transaction_ids, payloads, producer_subs,
                                    trace_ids)
        VALUES (p_partition_id, v_seg.first_offset, v_off - 1, v_seg.created_at,
                v_seg.message_ids[1 : v_i - 1], v_seg.transaction_ids[1 : v_i - 1],
                v_seg.payloads[1 : v_i - 1], v_seg.producer_subs[1 : v_i - 1],
                v_seg.trace_ids[1 : v_i - 1]);
    END IF;
    IF v_i < v_n THEN
        INSERT INTO queen.segments (partition_id, first_offset, last_offset, created_at,
                                    message_ids, transaction_ids, payloads, producer_subs,
                                    trace_ids)
        VALUES (p_partition_id, v_off + 1, v_seg.last_offset, v_seg.created_at,
                v_seg.message_ids[v_i + 1 : v_n], v_seg.transaction_ids[v_i + 1 : v_n],
                v_seg.payloads[v_i + 1 : v_n], v_seg.producer_subs[v_i + 1 : v_n],
                v_seg.trace_ids[v_i + 1 : v_n]);
    END IF;
    PERFORM queen.note_removed(ARRAY[p_partition_id], ARRAY[v_off], ARRAY[v_off]);
    RETURN 'deleted';
END
$fn$;

-- === Actions on dead letters and stored messages (admin role) ================================

-- Finds a message's dead letters (by partition and transaction id) without reading the DLQ.
CREATE INDEX IF NOT EXISTS dlq_by_message ON queen.dlq (partition_id, transaction_id);
-- The dead letters of a time window, of every queue (the status's dead letter summary), without
-- reading the whole DLQ.
CREATE INDEX IF NOT EXISTS dlq_by_failed_at ON queen.dlq (failed_at);

-- The dead letters to retry: of one message (p_partition_id and p_txid), or of a queue's
-- filter (p_queue, optionally a group, a partition and a failure time range), in id order,
-- with ids in (p_after, p_upto], at most p_limit; with the (queue, partition) each belongs to.
CREATE OR REPLACE FUNCTION queen.admin_dead_letter_targets(
    p_partition_id bigint, p_txid text, p_queue text, p_group text, p_partition text,
    p_from timestamptz, p_to timestamptz, p_after bigint, p_upto bigint, p_limit integer)
RETURNS TABLE (id bigint, partition_id bigint, queue_name text, partition_name text)
LANGUAGE sql STABLE SET jit = off AS $fn$
    SELECT d.id, d.partition_id, q.name, p.name
    FROM queen.dlq d
    JOIN queen.partitions p ON p.id = d.partition_id
    JOIN queen.queues q ON q.id = d.queue_id
    WHERE (p_partition_id IS NULL
           OR (d.partition_id = p_partition_id AND d.transaction_id = p_txid))
      AND (p_queue IS NULL OR d.queue_id = (SELECT x.id FROM queen.queues x WHERE x.name = p_queue))
      AND (p_group IS NULL OR d.consumer_group = p_group)
      AND (p_partition IS NULL OR p.name = p_partition)
      AND (p_from IS NULL OR d.failed_at >= p_from)
      AND (p_to IS NULL OR d.failed_at <= p_to)
      AND d.id > p_after AND (p_upto IS NULL OR d.id <= p_upto)
    ORDER BY d.id
    LIMIT p_limit
$fn$;

-- Deliver dead letters again, each to the group that gave up on it. A copy of each (its
-- message id, transaction id, payload, producer and trace, from the DLQ row) is appended to
-- its partition at the next offsets (several of one partition in their original offset
-- order), and its DLQ row goes. Every other cursor of the partition is moved past the copies,
-- so only the group that dead-lettered a message receives it again; that group has no failure
-- recorded at the new offset, so its retry count starts at 0. With a dedup window the copy gets
-- its sidecar row (the dedup probe is not asked: a retry is not a push). Cursor rows are locked
-- first, in (partition, group) order, then partition rows in id order, as everywhere. Ids no
-- longer in the DLQ (retried meanwhile) are skipped. Returns one row per copy.
CREATE OR REPLACE FUNCTION queen.admin_retry_dead_letters(p_ids bigint[])
RETURNS TABLE (partition_id bigint, transaction_id text, consumer_group text, msg_offset bigint)
LANGUAGE plpgsql SET jit = off AS $fn$
#variable_conflict use_column
DECLARE
    v_pids bigint[];
BEGIN
    SELECT array_agg(DISTINCT d.partition_id) INTO v_pids FROM queen.dlq d WHERE d.id = ANY (p_ids);
    IF v_pids IS NULL THEN
        RETURN;
    END IF;
    PERFORM 1 FROM queen.cursors c WHERE c.partition_id = ANY (v_pids)
    ORDER BY c.partition_id, c.consumer_group FOR UPDATE;
    PERFORM 1 FROM queen.partitions p WHERE p.id = ANY (v_pids) ORDER BY p.id FOR UPDATE;

    RETURN QUERY
    WITH gone AS (
        DELETE FROM queen.dlq d
        WHERE d.id = ANY (p_ids) AND d.partition_id = ANY (v_pids)
        RETURNING d.*
    ),
    placed AS MATERIALIZED (
        SELECT g.id, g.partition_id, g.consumer_group, g.message_id, g.transaction_id,
               g.payload, g.producer_sub, g.trace_id,
               p.next_offset + row_number() OVER (PARTITION BY g.partition_id
                                                  ORDER BY g.msg_offset, g.id) - 1 AS off,
               (SELECT q.dedup_window_seconds FROM queen.queues q WHERE q.id = p.queue_id) AS win
        FROM gone g JOIN queen.partitions p ON p.id = g.partition_id
    ),
    seg AS (
        INSERT INTO queen.segments (partition_id, first_offset, last_offset, message_ids,
                                    transaction_ids, payloads, producer_subs, trace_ids)
        SELECT x.partition_id, min(x.off), max(x.off),
               array_agg(x.message_id ORDER BY x.off),
               array_agg(x.transaction_id ORDER BY x.off),
               array_agg(x.payload ORDER BY x.off),
               CASE WHEN bool_or(x.producer_sub IS NOT NULL)
                    THEN array_agg(x.producer_sub ORDER BY x.off) END,
               CASE WHEN bool_or(x.trace_id IS NOT NULL)
                    THEN array_agg(x.trace_id ORDER BY x.off) END
        FROM placed x
        GROUP BY x.partition_id
    ),
    side AS (
        INSERT INTO queen.dedup (key_hash, partition_id, transaction_id, msg_offset)
        SELECT hashtextextended(x.transaction_id, x.partition_id), x.partition_id,
               x.transaction_id, x.off
        FROM placed x
        WHERE x.win > 0
    ),
    bump AS (
        UPDATE queen.partitions p SET next_offset = p.next_offset + c.n
        FROM (SELECT x.partition_id, count(*) AS n FROM placed x GROUP BY x.partition_id) c
        WHERE p.id = c.partition_id
    ),
    passed AS (   -- every other group's cursor steps over the copies that are not its own
        UPDATE queen.cursors c SET next_offset = a.next_offset, acked = a.rest
        FROM (SELECT o.partition_id, o.consumer_group, adv.next_offset, adv.rest
              FROM (SELECT c2.partition_id, c2.consumer_group, c2.next_offset, c2.acked,
                           ARRAY(SELECT x.off FROM placed x
                                 WHERE x.partition_id = c2.partition_id
                                   AND x.consumer_group <> c2.consumer_group
                                 ORDER BY x.off) AS offs
                    FROM queen.cursors c2 WHERE c2.partition_id = ANY (v_pids)) o
              CROSS JOIN LATERAL queen.cursor_advance(o.next_offset, o.acked || o.offs) adv
              WHERE cardinality(o.offs) > 0) a
        WHERE c.partition_id = a.partition_id AND c.consumer_group = a.consumer_group
    )
    SELECT x.partition_id, x.transaction_id, x.consumer_group, x.off FROM placed x
    ORDER BY x.partition_id, x.off;
END
$fn$;

-- Move one stored message to the DLQ of one group by hand (p_group; '__QUEUE_MODE__' for
-- queue mode): a copy goes to the DLQ with p_error, and the group's cursor counts the message
-- done, so the group never receives it (unless retried). A group without a cursor on the
-- partition gets one where its first pop would put it. Answers: 'moved'; 'already' (that
-- group's DLQ already holds it: nothing changed); 'consumed' (the group has already consumed
-- it, or it lies before the group's start: nothing to take away); 'leased' (inside the
-- group's live lease: left to its consumer); 'no_group' (the group never read this queue);
-- 'missing' (no such message).
CREATE OR REPLACE FUNCTION queen.admin_dead_letter_message(
    p_partition_id bigint, p_txid text, p_group text, p_error text)
RETURNS text
LANGUAGE plpgsql SET jit = off AS $fn$
DECLARE
    v_qid  bigint;
    v_off  bigint;
    v_cur  queen.cursors%ROWTYPE;
    v_seg  queen.segments%ROWTYPE;
    v_i    integer;
    v_next bigint;
    v_rest bigint[];
BEGIN
    SELECT p.queue_id INTO v_qid FROM queen.partitions p WHERE p.id = p_partition_id;
    IF NOT FOUND THEN
        RETURN 'missing';
    END IF;
    IF p_group <> '__QUEUE_MODE__'
       AND NOT EXISTS (SELECT 1 FROM queen.consumer_groups g
                       WHERE g.queue_id = v_qid AND g.consumer_group = p_group)
       AND NOT EXISTS (SELECT 1 FROM queen.cursors c
                       WHERE c.queue_id = v_qid AND c.consumer_group = p_group) THEN
        RETURN 'no_group';
    END IF;
    v_off := queen.admin_find_offset(p_partition_id, p_txid);
    IF v_off IS NULL THEN
        RETURN 'missing';
    END IF;
    INSERT INTO queen.cursors (partition_id, consumer_group, queue_id, next_offset)
    SELECT p.id, p_group, p.queue_id,
           CASE WHEN g.subscribed_at IS NULL THEN 0
                ELSE coalesce((SELECT sg.first_offset FROM queen.segments sg
                               WHERE sg.partition_id = p.id AND sg.created_at >= g.subscribed_at
                               ORDER BY sg.first_offset LIMIT 1),
                              p.next_offset) END
    FROM queen.partitions p
    LEFT JOIN queen.consumer_groups g ON g.queue_id = p.queue_id AND g.consumer_group = p_group
    WHERE p.id = p_partition_id AND p.next_offset > 0
    ON CONFLICT DO NOTHING;
    SELECT * INTO v_cur FROM queen.cursors c
    WHERE c.partition_id = p_partition_id AND c.consumer_group = p_group FOR UPDATE;
    IF NOT FOUND THEN
        RETURN 'missing';
    END IF;
    IF EXISTS (SELECT 1 FROM queen.dlq d
               WHERE d.partition_id = p_partition_id AND d.transaction_id = p_txid
                 AND d.consumer_group = p_group AND d.msg_offset = v_off) THEN
        RETURN 'already';
    END IF;
    IF v_off < v_cur.next_offset OR v_off = ANY (v_cur.acked) THEN
        RETURN 'consumed';
    END IF;
    IF v_cur.lease_expires_at > now() AND v_off < v_cur.lease_end THEN
        RETURN 'leased';
    END IF;
    SELECT * INTO v_seg FROM queen.segments s
    WHERE s.partition_id = p_partition_id AND s.first_offset <= v_off AND s.last_offset >= v_off;
    IF NOT FOUND THEN
        RETURN 'missing';
    END IF;
    v_i := (v_off - v_seg.first_offset + 1)::integer;
    INSERT INTO queen.dlq (queue_id, partition_id, consumer_group, msg_offset, message_id,
                           transaction_id, payload, producer_sub, trace_id, error_message,
                           retry_count)
    VALUES (v_qid, p_partition_id, p_group, v_off, v_seg.message_ids[v_i],
            v_seg.transaction_ids[v_i], v_seg.payloads[v_i], v_seg.producer_subs[v_i],
            v_seg.trace_ids[v_i], p_error,
            coalesce((SELECT f.attempts FROM queen.failures f
                      WHERE f.partition_id = p_partition_id AND f.consumer_group = p_group
                        AND f.msg_offset = v_off), 0));
    SELECT a.next_offset, a.rest INTO v_next, v_rest
    FROM queen.cursor_advance(v_cur.next_offset, v_cur.acked || v_off) a;
    UPDATE queen.cursors c SET next_offset = v_next, acked = v_rest
    WHERE c.partition_id = p_partition_id AND c.consumer_group = p_group;
    DELETE FROM queen.failures f
    WHERE f.partition_id = p_partition_id AND f.consumer_group = p_group
      AND (f.msg_offset = v_off OR f.msg_offset < v_next);
    RETURN 'moved';
END
$fn$;

-- Empty a queue (or one partition of it): every stored message goes, whatever the groups'
-- cursors, except the writes (segments) holding a message inside a live lease, which are kept
-- whole for their consumer (kept). Offsets are not reused: the next push continues after them,
-- the pop steps over the gap, and the figures leave it out (queen.gaps). Dead letters and
-- cursors stay. known is false for an unknown queue or partition.
CREATE OR REPLACE FUNCTION queen.admin_clear(
    p_queue text, p_partition text, OUT known boolean, OUT cleared bigint, OUT kept bigint)
LANGUAGE plpgsql SET jit = off AS $fn$
DECLARE
    v_pids   bigint[];
    v_firsts bigint[];
    v_parts  bigint[];
BEGIN
    SELECT array_agg(p.id ORDER BY p.id) INTO v_parts
    FROM queen.partitions p
    WHERE p.queue_id = (SELECT q.id FROM queen.queues q WHERE q.name = p_queue)
      AND (p_partition IS NULL OR p.name = p_partition);
    known := v_parts IS NOT NULL;
    cleared := 0;
    kept := 0;
    IF NOT known THEN
        RETURN;
    END IF;
    SELECT array_agg(s.partition_id), array_agg(s.first_offset) INTO v_pids, v_firsts
    FROM queen.segments s WHERE s.partition_id = ANY (v_parts);
    IF v_pids IS NOT NULL THEN
        SELECT r.messages INTO cleared
        FROM queen.remove_unleased_segments(v_pids, v_firsts, 'cleared_segments',
                                            'cleared_messages') r;
    END IF;
    SELECT coalesce(sum(s.last_offset - s.first_offset + 1), 0) INTO kept
    FROM queen.segments s WHERE s.partition_id = ANY (v_parts);
END
$fn$;
