-- Queen on Trio's SQL interface: what an application may call in its own PostgreSQL
-- transactions, beside the HTTP routes. Everything here is built on the broker's own
-- functions (queen.ensure_partitions, queen.push_frames, queen.pop, queen.ack), so a message
-- produced or consumed from SQL obeys the same rules as one sent over HTTP: offsets in commit
-- order under the partition's row lock, exact dedup within the queue's window, leases and
-- retries as the queue is configured. The names, arguments and answers are those of the
-- original Queen broker's stored procedures, so SQL written against that broker runs here.
--
-- A push from SQL is part of the caller's transaction (a transactional outbox): its messages
-- exist, and waiting pops are woken, when that transaction commits, and never if it rolls
-- back. Until then it holds the row locks of the partitions it wrote, as any push does while
-- its transaction runs: a transaction that pushes should commit promptly.
--
-- Not here: payload encryption (the key stays with the broker: pushes and pops of an
-- encrypted queue are refused), and the broker's in-process counters (the dashboard's
-- throughput figures count HTTP traffic only).

-- A fresh message id: a UUIDv7, as the broker mints them (48 bits of Unix milliseconds, the
-- version, random bits), which is where a message's createdAt is read from.
CREATE OR REPLACE FUNCTION queen.new_message_id() RETURNS uuid
LANGUAGE sql VOLATILE AS $fn$
    SELECT encode(set_bit(set_bit(
               overlay(uuid_send(gen_random_uuid())
                       PLACING substring(int8send(floor(extract(epoch FROM clock_timestamp())
                                                        * 1000)::bigint) FROM 3)
                       FROM 1 FOR 6),
               52, 1), 53, 1), 'hex')::uuid
$fn$;

-- When a message id was minted (its first 48 bits, Unix milliseconds).
CREATE OR REPLACE FUNCTION queen.message_time(p_id uuid) RETURNS timestamptz
LANGUAGE sql IMMUTABLE AS $fn$
    SELECT to_timestamp(('x' || substr(replace(p_id::text, '-', ''), 1, 12))::bit(48)::bigint
                        / 1000.0)
$fn$;

-- A UUID written out in full (8-4-4-4-12 hex digits), or NULL for any other text.
CREATE OR REPLACE FUNCTION queen.as_uuid(p_text text) RETURNS uuid
LANGUAGE sql IMMUTABLE AS $fn$
    SELECT CASE WHEN p_text ~* '^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$'
                THEN p_text::uuid END
$fn$;

-- Every stored message, one row per message (read-only): its id, partition, offset,
-- transaction id, trace id, payload (jsonb; an encrypted payload is its sealed envelope, a
-- JSON string, and is_encrypted is true), producer identity, when it was stored, and the
-- names of its queue and partition. The joins are LEFT JOINs on primary keys, so a query that
-- reads neither name does not make them, and one filtered by queue_name starts from the queue.
CREATE OR REPLACE VIEW queen.messages AS
SELECT s.message_ids[u.i] AS id,
       s.partition_id,
       s.first_offset + u.i - 1 AS msg_offset,
       s.transaction_ids[u.i] AS transaction_id,
       s.trace_ids[u.i] AS trace_id,
       s.payloads[u.i]::jsonb AS payload,
       starts_with(s.payloads[u.i], '"\/qenc1:') AS is_encrypted,
       s.producer_subs[u.i] AS producer_sub,
       s.created_at,
       q.name AS queue_name,
       p.name AS partition_name
FROM queen.segments s
CROSS JOIN LATERAL generate_subscripts(s.message_ids, 1) AS u (i)
LEFT JOIN queen.partitions p ON p.id = s.partition_id
LEFT JOIN queen.queues q ON q.id = p.queue_id;

-- Why one pushed item (jsonb) cannot be stored, as a phrase to follow "items[i]", or NULL.
-- The rules of the HTTP route: queue required, partition "Default" when absent or null, payload
-- required (null is a payload), transactionId a string of at most 1,024 characters (the
-- message id when absent or empty), traceId a UUID, names of at most 255 characters without
-- control characters. producerSub is stored as given (empty is NULL): SQL callers are trusted.
CREATE OR REPLACE FUNCTION queen.push_item_problem(p_item jsonb) RETURNS text
LANGUAGE sql IMMUTABLE AS $fn$
    SELECT CASE
        WHEN jsonb_typeof(p_item) IS DISTINCT FROM 'object' THEN ' must be an object'
        WHEN coalesce(jsonb_typeof(p_item -> 'queue'), 'null') = 'null'
            THEN '.queue is required'
        WHEN jsonb_typeof(p_item -> 'queue') <> 'string' THEN '.queue must be a string'
        WHEN p_item ->> 'queue' = '' THEN '.queue must not be empty'
        WHEN length(p_item ->> 'queue') > 255 THEN '.queue is longer than 255 characters'
        WHEN p_item ->> 'queue' ~ '[\x01-\x1f\x7f]'
            THEN '.queue must not contain control characters'
        WHEN coalesce(jsonb_typeof(p_item -> 'partition'), 'null') NOT IN ('null', 'string')
            THEN '.partition must be a string'
        WHEN p_item ->> 'partition' = '' THEN '.partition must not be empty'
        WHEN length(p_item ->> 'partition') > 255
            THEN '.partition is longer than 255 characters'
        WHEN p_item ->> 'partition' ~ '[\x01-\x1f\x7f]'
            THEN '.partition must not contain control characters'
        WHEN NOT p_item ? 'payload' THEN '.payload is required'
        WHEN coalesce(jsonb_typeof(p_item -> 'transactionId'), 'null') NOT IN ('null', 'string')
            THEN '.transactionId must be a string'
        WHEN length(p_item ->> 'transactionId') > 1024
            THEN '.transactionId is longer than 1024 characters'
        WHEN p_item ->> 'transactionId' ~ '[\x01-\x1f\x7f]'
            THEN '.transactionId must not contain control characters'
        WHEN coalesce(jsonb_typeof(p_item -> 'traceId'), 'null') NOT IN ('null', 'string')
            THEN '.traceId must be a string'
        WHEN coalesce(p_item ->> 'traceId', '') <> ''
             AND p_item ->> 'traceId' !~* '^[0-9a-f]{8}-?[0-9a-f]{4}-?[0-9a-f]{4}-?[0-9a-f]{4}-?[0-9a-f]{12}$'
            THEN '.traceId must be a UUID'
        WHEN coalesce(jsonb_typeof(p_item -> 'producerSub'), 'null') NOT IN ('null', 'string')
            THEN '.producerSub must be a string'
    END
$fn$;

-- Push items (a JSON array of {queue, partition, transactionId, payload, traceId,
-- producerSub}) in the caller's transaction: one row per item, in item order, with the
-- message id stored, or for a duplicate (same transactionId in the same partition within the
-- queue's dedup window, or earlier in the same call) the id of the message it repeats.
-- Queues and partitions are created on first use. An item that cannot be stored fails the
-- whole call (SQLSTATE 22023, naming the item and the field) and nothing is stored.
CREATE OR REPLACE FUNCTION queen.push_items(p_items jsonb)
RETURNS TABLE (item_index integer, item_queue text, item_partition text,
               item_partition_id bigint, item_transaction_id text, item_message_id uuid,
               item_trace_id uuid, item_duplicate boolean)
LANGUAGE plpgsql AS $fn$
DECLARE
    v_bad      record;
    v_queues   text[];
    v_parts    text[];
    v_pids     bigint[];
    v_order    integer[];   -- the frames, by partition then item: each one's item
    v_fpids    bigint[];
    v_mids     uuid[];
    v_txids    text[];
    v_payloads text[];
    v_subs     text[];
    v_traces   uuid[];
    v_wpids    bigint[];
    v_wcounts  integer[];
    v_leaders  integer[];
    v_status   text;
    v_orig     text;
    v_locked   text;
BEGIN
    IF jsonb_typeof(p_items) IS DISTINCT FROM 'array' THEN
        RAISE EXCEPTION 'the items must be a JSON array, got %',
            coalesce(jsonb_typeof(p_items), 'NULL') USING ERRCODE = '22023';
    END IF;
    IF jsonb_array_length(p_items) = 0 THEN
        RETURN;
    END IF;

    SELECT x.i - 1 AS i, x.problem INTO v_bad
    FROM (SELECT u.i, queen.push_item_problem(u.item) AS problem
          FROM jsonb_array_elements(p_items) WITH ORDINALITY AS u (item, i)) x
    WHERE x.problem IS NOT NULL
    ORDER BY x.i LIMIT 1;
    IF FOUND THEN
        RAISE EXCEPTION 'items[%]%', v_bad.i, v_bad.problem USING ERRCODE = '22023';
    END IF;

    SELECT array_agg(u.item ->> 'queue' ORDER BY u.i),
           array_agg(coalesce(u.item ->> 'partition', 'Default') ORDER BY u.i)
    INTO v_queues, v_parts
    FROM jsonb_array_elements(p_items) WITH ORDINALITY AS u (item, i);

    SELECT q.name INTO v_locked
    FROM queen.queues q WHERE q.name = ANY (v_queues) AND q.encryption_enabled
    ORDER BY q.name LIMIT 1;
    IF FOUND THEN
        RAISE EXCEPTION 'queue "%" is encrypted: its payloads are sealed by the broker, '
                        'push to it over HTTP', v_locked USING ERRCODE = '0A000';
    END IF;

    -- The partitions' ids: read (most calls write partitions that exist), created if missing.
    SELECT array_agg((SELECT x.id FROM queen.partitions x
                      WHERE x.queue_id = (SELECT q.id FROM queen.queues q WHERE q.name = u.q)
                        AND x.name = u.p) ORDER BY u.o)
    INTO v_pids
    FROM unnest(v_queues, v_parts) WITH ORDINALITY AS u (q, p, o);
    IF array_position(v_pids, NULL) IS NOT NULL THEN
        v_pids := queen.ensure_partitions(v_queues, v_parts);
    END IF;

    -- The frames, grouped by partition (one write each), in item order inside each.
    SELECT array_agg(x.i ORDER BY x.pid, x.i), array_agg(x.pid ORDER BY x.pid, x.i),
           array_agg(x.mid ORDER BY x.pid, x.i),
           array_agg(coalesce(x.tx, x.mid::text) ORDER BY x.pid, x.i),
           array_agg(x.payload ORDER BY x.pid, x.i), array_agg(x.sub ORDER BY x.pid, x.i),
           array_agg(x.trace ORDER BY x.pid, x.i)
    INTO v_order, v_fpids, v_mids, v_txids, v_payloads, v_subs, v_traces
    FROM (SELECT u.i::integer AS i, v_pids[u.i] AS pid, queen.new_message_id() AS mid,
                 nullif(u.item ->> 'transactionId', '') AS tx, (u.item -> 'payload')::text AS payload,
                 nullif(u.item ->> 'producerSub', '') AS sub,
                 nullif(u.item ->> 'traceId', '')::uuid AS trace
          FROM jsonb_array_elements(p_items) WITH ORDINALITY AS u (item, i)
          OFFSET 0) x;

    SELECT array_agg(w.pid ORDER BY w.pid), array_agg(w.n ORDER BY w.pid)
    INTO v_wpids, v_wcounts
    FROM (SELECT f.pid, count(*)::integer AS n FROM unnest(v_fpids) AS f (pid) GROUP BY f.pid) w;

    -- First wins inside a call: every frame's leader is the first frame of its partition with
    -- its transactionId (none repeated: no leaders, queen.push_frames' common case).
    SELECT array_agg(l.leader ORDER BY l.o) INTO v_leaders
    FROM (SELECT u.o, min(u.o) OVER (PARTITION BY u.p, u.t)::integer AS leader
          FROM unnest(v_fpids, v_txids) WITH ORDINALITY AS u (p, t, o)) l;
    IF NOT EXISTS (SELECT 1 FROM unnest(v_leaders) WITH ORDINALITY AS u (l, o) WHERE u.l <> u.o)
    THEN
        v_leaders := NULL;
    END IF;

    SELECT f.statuses, f.originals INTO v_status, v_orig
    FROM queen.push_frames(v_wpids, v_wcounts, v_mids, v_txids, v_payloads, v_subs, v_traces,
                           v_leaders) f;
    IF position('2' IN v_status) > 0 THEN
        RAISE EXCEPTION 'a queue was deleted while its partitions were being written'
            USING ERRCODE = '40001';
    END IF;

    RETURN QUERY
    WITH fr AS (
        SELECT u.i, u.p, u.mid, u.tx, u.tr, substr(v_status, u.o::integer, 1) = '1' AS dup,
               count(*) FILTER (WHERE substr(v_status, u.o::integer, 1) = '1')
                   OVER (ORDER BY u.o) AS dup_no
        FROM unnest(v_order, v_fpids, v_mids, v_txids, v_traces)
             WITH ORDINALITY AS u (i, p, mid, tx, tr, o)
    )
    SELECT fr.i - 1, v_queues[fr.i], v_parts[fr.i], fr.p, fr.tx,
           CASE WHEN fr.dup THEN (string_to_array(v_orig, ','))[fr.dup_no]::uuid
                ELSE fr.mid END,
           fr.tr, fr.dup
    FROM fr ORDER BY fr.i;
END
$fn$;

-- One item's answer in the original broker's push procedures: index, transaction_id, status
-- ('queued' or 'duplicate'), message_id (a duplicate's is the message it repeats), and for a
-- stored message its partition_id and trace_id.
CREATE OR REPLACE FUNCTION queen.pushed_item_answer(
    p_index integer, p_transaction_id text, p_message_id uuid, p_partition_id bigint,
    p_trace_id uuid, p_duplicate boolean)
RETURNS jsonb
LANGUAGE sql IMMUTABLE AS $fn$
    SELECT jsonb_build_object('index', p_index, 'transaction_id', p_transaction_id,
                              'status', CASE WHEN p_duplicate THEN 'duplicate' ELSE 'queued' END,
                              'message_id', p_message_id::text)
           || CASE WHEN p_duplicate THEN '{}'::jsonb
                   ELSE jsonb_build_object('partition_id', p_partition_id::text,
                                           'trace_id', p_trace_id::text) END
$fn$;

-- The original broker's push procedures, same arguments and answers. p_check_duplicates and
-- p_check_capacity are accepted and ignored: dedup follows each queue's window, and queues
-- have no capacity check on push. v2 answers an array, one answer per item, in item order.
CREATE OR REPLACE FUNCTION queen.push_messages_v2(
    p_items jsonb, p_check_duplicates boolean DEFAULT true,
    p_check_capacity boolean DEFAULT true)
RETURNS jsonb
LANGUAGE plpgsql AS $fn$
BEGIN
    RETURN (SELECT coalesce(jsonb_agg(
                       queen.pushed_item_answer(r.item_index, r.item_transaction_id,
                                                r.item_message_id, r.item_partition_id,
                                                r.item_trace_id, r.item_duplicate)
                       ORDER BY r.item_index), '[]'::jsonb)
            FROM queen.push_items(p_items) r);
END
$fn$;

-- v3 answers {items, partition_updates}: the items as v2's with each one's queueName, and for
-- every partition written, its queue_name, partition_id, last_message_id and
-- last_message_created_at.
CREATE OR REPLACE FUNCTION queen.push_messages_v3(
    p_items jsonb, p_check_duplicates boolean DEFAULT true,
    p_check_capacity boolean DEFAULT true)
RETURNS jsonb
LANGUAGE plpgsql AS $fn$
BEGIN
    RETURN (
    WITH r AS MATERIALIZED (SELECT * FROM queen.push_items(p_items))
    SELECT jsonb_build_object(
        'items', coalesce((
            SELECT jsonb_agg(
                       queen.pushed_item_answer(r.item_index, r.item_transaction_id,
                                                r.item_message_id, r.item_partition_id,
                                                r.item_trace_id, r.item_duplicate)
                       || jsonb_build_object('queueName', r.item_queue)
                       ORDER BY r.item_index)
            FROM r), '[]'::jsonb),
        'partition_updates', coalesce((
            SELECT jsonb_agg(jsonb_build_object(
                       'queue_name', l.item_queue,
                       'partition_id', l.item_partition_id::text,
                       'last_message_id', l.item_message_id::text,
                       'last_message_created_at', now()) ORDER BY l.item_partition_id)
            FROM (SELECT DISTINCT ON (r.item_partition_id) r.*
                  FROM r WHERE NOT r.item_duplicate
                  ORDER BY r.item_partition_id, r.item_index DESC) l), '[]'::jsonb)));
END
$fn$;

-- Pop named partitions in the caller's transaction: p_requests is a JSON array of {idx,
-- queue_name, partition_name, consumer_group (absent or "__QUEUE_MODE__": the queue's own
-- consumers), batch_size, sub_mode ('all', 'new'; with sub_from a timestamp, from then),
-- worker_id (the lease id when it is a UUID), auto_ack}; lease_seconds is ignored (the
-- queue's lease time applies). One answer per request, in request order: {idx, result:
-- {success, queue, partition, partitionId, leaseId, consumerGroup, leaseExpiresAt, messages:
-- [{id, transactionId, traceId, data, producerSub, createdAt, retryCount}]}}, or {success:
-- false, error, messages: []} for a partition that does not exist, an encrypted queue, or a
-- request that cannot be read. Requests run in (queue, partition) order.
CREATE OR REPLACE FUNCTION queen.pop_specific_batch(p_requests jsonb)
RETURNS jsonb
LANGUAGE plpgsql AS $fn$
DECLARE
    r         record;
    v_out     jsonb := '[]'::jsonb;
    v_pid     bigint;
    v_enc     boolean;
    v_group   text;
    v_batch   integer;
    v_start   text;
    v_at      timestamptz;
    v_lease   uuid;
    v_auto    boolean;
    v_msgs    jsonb;
    v_expires timestamptz;
    v_error   text;
BEGIN
    IF jsonb_typeof(p_requests) IS DISTINCT FROM 'array' THEN
        RAISE EXCEPTION 'the requests must be a JSON array, got %',
            coalesce(jsonb_typeof(p_requests), 'NULL') USING ERRCODE = '22023';
    END IF;
    FOR r IN
        SELECT u.o, coalesce(u.x -> 'idx', to_jsonb(u.o - 1)) AS idx, u.x
        FROM jsonb_array_elements(p_requests) WITH ORDINALITY AS u (x, o)
        ORDER BY u.x ->> 'queue_name', u.x ->> 'partition_name', u.o
    LOOP
        v_error := NULL;
        v_group := coalesce(nullif(r.x ->> 'consumer_group', ''), '__QUEUE_MODE__');
        v_start := CASE WHEN coalesce(r.x ->> 'sub_from', '') NOT IN ('', 'now') THEN 'at'
                        WHEN lower(coalesce(r.x ->> 'sub_mode', '')) IN ('new', 'new-only')
                             OR r.x ->> 'sub_from' = 'now' THEN 'now'
                        ELSE 'all' END;
        BEGIN
            v_batch := coalesce((r.x ->> 'batch_size')::integer, 1);
            v_at := CASE WHEN v_start = 'at' THEN (r.x ->> 'sub_from')::timestamptz END;
            v_auto := coalesce((r.x ->> 'auto_ack')::boolean, false);
        EXCEPTION WHEN invalid_text_representation OR invalid_datetime_format
                       OR datetime_field_overflow OR numeric_value_out_of_range THEN
            v_error := 'invalid_request: ' || SQLERRM;
        END;
        IF v_error IS NULL AND jsonb_typeof(r.x) IS DISTINCT FROM 'object' THEN
            v_error := 'invalid_request: a request must be an object';
        ELSIF v_error IS NULL AND (coalesce(r.x ->> 'queue_name', '') = ''
                                   OR coalesce(r.x ->> 'partition_name', '') = '') THEN
            v_error := 'invalid_request: queue_name and partition_name are required';
        ELSIF v_error IS NULL AND (v_batch < 1 OR v_batch > 10000) THEN
            v_error := 'invalid_request: batch_size must be between 1 and 10000';
        ELSIF v_error IS NULL AND (length(v_group) > 255 OR v_group ~ '[\x01-\x1f\x7f]') THEN
            v_error := 'invalid_request: consumer_group is not a valid name';
        END IF;
        IF v_error IS NULL THEN
            SELECT p.id, q.encryption_enabled INTO v_pid, v_enc
            FROM queen.queues q JOIN queen.partitions p ON p.queue_id = q.id
            WHERE q.name = r.x ->> 'queue_name' AND p.name = r.x ->> 'partition_name';
            IF NOT FOUND THEN
                v_error := 'partition_not_found';
            ELSIF v_enc THEN
                v_error := 'encrypted_queue';
            END IF;
        END IF;
        IF v_error IS NOT NULL THEN
            v_out := v_out || jsonb_build_array(jsonb_build_object('o', r.o, 'answer',
                jsonb_build_object('idx', r.idx, 'result', jsonb_build_object(
                    'success', false, 'error', v_error, 'messages', '[]'::jsonb))));
            CONTINUE;
        END IF;

        v_lease := coalesce(queen.as_uuid(r.x ->> 'worker_id'), gen_random_uuid());
        SELECT coalesce(jsonb_agg(jsonb_build_object(
                   'id', m.message_id::text,
                   'transactionId', m.transaction_id,
                   'traceId', m.trace_id::text,
                   'data', m.payload::jsonb,
                   'producerSub', m.producer_sub,
                   'createdAt', to_char(queen.message_time(m.message_id) AT TIME ZONE 'UTC',
                                        'YYYY-MM-DD"T"HH24:MI:SS.MS"Z"'),
                   'retryCount', m.retry_count) ORDER BY m.msg_offset)
                   FILTER (WHERE m.partition_id IS NOT NULL), '[]'::jsonb),
               max(m.lease_expires_at)
        INTO v_msgs, v_expires
        FROM queen.pop(r.x ->> 'queue_name', r.x ->> 'partition_name', '', '', v_group, v_batch,
                       1, v_auto, v_start, v_at, v_lease, false, NULL, NULL, 1) m;
        v_out := v_out || jsonb_build_array(jsonb_build_object('o', r.o, 'answer',
            jsonb_build_object('idx', r.idx, 'result', jsonb_build_object(
                'success', true,
                'queue', r.x ->> 'queue_name',
                'partition', r.x ->> 'partition_name',
                'partitionId', v_pid::text,
                'leaseId', CASE WHEN v_auto OR v_msgs = '[]'::jsonb THEN NULL
                                ELSE v_lease::text END,
                'leaseExpiresAt', v_expires,
                'consumerGroup', v_group,
                'messages', v_msgs))));
    END LOOP;
    RETURN (SELECT coalesce(jsonb_agg(e -> 'answer' ORDER BY (e ->> 'o')::bigint), '[]'::jsonb)
            FROM jsonb_array_elements(v_out) AS e);
END
$fn$;

-- Acknowledge from SQL: p_acknowledgments is a JSON array of {index, transactionId,
-- partitionId, consumerGroup, leaseId, status ('completed' or 'success', 'failed', 'retry',
-- 'dlq'), error}, as the HTTP batch ack takes them. One answer per acknowledgment, by index:
-- {index, transactionId, success, error, queueName, partitionName, leaseReleased, dlq}.
CREATE OR REPLACE FUNCTION queen.ack_messages_v2(p_acknowledgments jsonb)
RETURNS jsonb
LANGUAGE plpgsql AS $fn$
DECLARE
    v_items jsonb;
BEGIN
    IF jsonb_typeof(p_acknowledgments) IS DISTINCT FROM 'array' THEN
        RAISE EXCEPTION 'the acknowledgments must be a JSON array, got %',
            coalesce(jsonb_typeof(p_acknowledgments), 'NULL') USING ERRCODE = '22023';
    END IF;
    -- Each acknowledgment read, or why it cannot be.
    WITH a AS (
        SELECT u.o, CASE WHEN u.x ->> 'index' ~ '^[0-9]{1,9}$' THEN (u.x ->> 'index')::integer
                         ELSE (u.o - 1)::integer END AS idx,
               u.x ->> 'transactionId' AS txid,
               coalesce(nullif(u.x ->> 'consumerGroup', ''), '__QUEUE_MODE__') AS grp,
               CASE WHEN u.x ->> 'partitionId' ~ '^[0-9]{1,18}$'
                    THEN (u.x ->> 'partitionId')::bigint END AS pid,
               -- (a lease id that is not a UUID never matches a live lease)
               coalesce(queen.as_uuid(u.x ->> 'leaseId'),
                        CASE WHEN coalesce(u.x ->> 'leaseId', '') <> ''
                             THEN '00000000-0000-0000-0000-000000000000'::uuid END) AS lease,
               CASE lower(coalesce(nullif(u.x ->> 'status', ''), 'completed'))
                    WHEN 'completed' THEN 'completed' WHEN 'success' THEN 'completed'
                    WHEN 'failed' THEN 'failed' WHEN 'retry' THEN 'retry'
                    WHEN 'dlq' THEN 'dlq' END AS status,
               u.x ->> 'error' AS err
        FROM jsonb_array_elements(p_acknowledgments) WITH ORDINALITY AS u (x, o)
    ),
    checked AS (
        SELECT a.*, CASE WHEN coalesce(a.txid, '') = '' THEN 'transactionId is required'
                         WHEN a.pid IS NULL THEN 'partitionId must be a partition id'
                         WHEN a.status IS NULL
                             THEN 'status must be one of completed, success, failed, dlq, retry'
                    END AS problem
        FROM a
    ),
    sent AS (
        SELECT c.*, row_number() OVER (ORDER BY c.o) AS k FROM checked c WHERE c.problem IS NULL
    ),
    answers AS (
        SELECT * FROM queen.ack(
            ARRAY(SELECT s.grp FROM sent s ORDER BY s.k),
            ARRAY(SELECT s.pid FROM sent s ORDER BY s.k),
            ARRAY(SELECT s.txid FROM sent s ORDER BY s.k),
            ARRAY(SELECT s.status FROM sent s ORDER BY s.k),
            ARRAY(SELECT s.err FROM sent s ORDER BY s.k),
            ARRAY(SELECT s.lease FROM sent s ORDER BY s.k))
        WHERE EXISTS (SELECT 1 FROM sent)
    )
    SELECT coalesce(jsonb_agg(jsonb_build_object(
               'index', c.idx, 'transactionId', c.txid,
               'success', coalesce(an.success, false),
               'error', coalesce(c.problem, an.error),
               'queueName', an.queue_name, 'partitionName', an.partition_name,
               'leaseReleased', coalesce(an.lease_released, false),
               'dlq', coalesce(an.dlq, false)) ORDER BY c.idx, c.o), '[]'::jsonb)
    INTO v_items
    FROM checked c
    LEFT JOIN sent s ON s.o = c.o
    LEFT JOIN answers an ON an.idx = s.k;
    RETURN v_items;
END
$fn$;

-- Extend leases from SQL: p_items is a JSON array of {index, leaseId, extendSeconds (default
-- 60)}. One answer per item, by index: {index, leaseId, success, error ('Lease not found',
-- 'Lease already expired' or 'invalid leaseId'), expiresAt}. A lease is only ever lengthened.
CREATE OR REPLACE FUNCTION queen.renew_lease_v2(p_items jsonb)
RETURNS jsonb
LANGUAGE plpgsql AS $fn$
DECLARE
    it      record;
    v_out   jsonb := '[]'::jsonb;
    v_ext   record;
    v_error text;
    v_secs  integer;
BEGIN
    IF jsonb_typeof(p_items) IS DISTINCT FROM 'array' THEN
        RAISE EXCEPTION 'the items must be a JSON array, got %',
            coalesce(jsonb_typeof(p_items), 'NULL') USING ERRCODE = '22023';
    END IF;
    FOR it IN   -- in lease order, so two callers renewing the same leases wait in one order
        SELECT u.o, u.x ->> 'leaseId' AS lease,
               CASE WHEN u.x ->> 'index' ~ '^[0-9]{1,9}$' THEN (u.x ->> 'index')::integer
                    ELSE (u.o - 1)::integer END AS idx,
               u.x ->> 'extendSeconds' AS secs
        FROM jsonb_array_elements(p_items) WITH ORDINALITY AS u (x, o)
        ORDER BY u.x ->> 'leaseId', u.o
    LOOP
        v_ext := NULL;
        v_error := NULL;
        IF queen.as_uuid(it.lease) IS NULL THEN
            v_error := 'invalid leaseId';
        ELSIF it.secs IS NOT NULL AND it.secs !~ '^[0-9]{1,7}$' THEN
            v_error := 'extendSeconds must be a whole number of seconds';
        ELSE
            v_secs := coalesce(it.secs::integer, 60);
            SELECT e.renewed, e.expires_at, e.state INTO v_ext
            FROM queen.extend_lease(it.lease::uuid, v_secs) e;
            v_error := CASE v_ext.state WHEN 'renewed' THEN NULL
                                        WHEN 'expired' THEN 'Lease already expired'
                                        ELSE 'Lease not found' END;
        END IF;
        v_out := v_out || jsonb_build_array(jsonb_build_object(
            'o', it.o, 'answer', jsonb_build_object(
                'index', it.idx, 'leaseId', it.lease, 'success', v_error IS NULL,
                'error', v_error,
                'expiresAt', CASE WHEN v_error IS NULL
                                  THEN to_char(v_ext.expires_at AT TIME ZONE 'UTC',
                                               'YYYY-MM-DD"T"HH24:MI:SS.MS"Z"') END)));
    END LOOP;
    RETURN (SELECT coalesce(jsonb_agg(e -> 'answer' ORDER BY (e -> 'answer' ->> 'index')::integer,
                                      (e ->> 'o')::bigint), '[]'::jsonb)
            FROM jsonb_array_elements(v_out) AS e);
END
$fn$;
