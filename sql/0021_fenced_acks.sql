-- pgqueue 0021: acks fenced by enqueued_at, so that an ack retried across a
-- failover to an asynchronous standby never removes another message.
--
-- A sequence's advance is WAL-logged ahead of the sends that use its values.
-- A standby promoted before it received some sends therefore hands their
-- msg_ids out again, and a worker that read one of those messages from the
-- old primary and acks it on the new one (the acker retries across the
-- failover) would have removed the new message with that id. delete and
-- archive gain overloads taking each message's enqueued_at, which no write
-- changes; complete_members gains enqueued_ats (its signature changes: it is
-- dropped and created again, and grant_roles below grants it again). The
-- worker acks with them; the overloads without keep their meaning.

-- Raises unless msg_ids and enqueued_ats are both given and pair up.
CREATE FUNCTION pgqueue._require_pairs(msg_ids bigint[], enqueued_ats timestamptz[]) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    IF msg_ids IS NULL OR enqueued_ats IS NULL THEN
        RAISE EXCEPTION 'msg_ids and enqueued_ats must not be NULL' USING ERRCODE = '22004';
    END IF;
    IF cardinality(msg_ids) <> cardinality(enqueued_ats) THEN
        RAISE EXCEPTION 'msg_ids and enqueued_ats must have the same length (% and %)',
            cardinality(msg_ids), cardinality(enqueued_ats)
            USING ERRCODE = '22023';
    END IF;
END
$$;

-- Acks many messages, each only while it is the message its reader was given:
-- the same msg_id and the same enqueued_at (which no write changes). An id
-- handed out again cannot be acked by a reader of the first message with that
-- id: a sequence's advance is WAL-logged ahead of the sends that use it, so
-- after an asynchronous standby is promoted, the ids of the sends it never
-- received are handed out again, and an unfenced ack retried across that
-- failover would remove the new message. Locked and removed as delete does.
-- The worker acks this way (docs/deploy.md, "HA and failover").
CREATE FUNCTION pgqueue.delete(queue_name text, msg_ids bigint[], enqueued_ats timestamptz[])
RETURNS SETOF bigint
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
SECURITY DEFINER SET search_path = pg_catalog, pgqueue, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    q pgqueue.queue := pgqueue._queue(delete.queue_name);
    v_tids tid[];
BEGIN
    PERFORM pgqueue._require_pairs(delete.msg_ids, delete.enqueued_ats);
    v_tids := ARRAY(
        SELECT (SELECT m.ctid FROM pgqueue.message m
                 WHERE m.queue_id = q.queue_id AND m.msg_id = u.id AND m.enqueued_at = u.at
                   FOR UPDATE)
          FROM (SELECT DISTINCT i, e FROM unnest(delete.msg_ids, delete.enqueued_ats) AS x (i, e)
                 ORDER BY i) AS u (id, at));
    RETURN QUERY
    DELETE FROM pgqueue.message m WHERE m.ctid = ANY (v_tids) RETURNING m.msg_id;
END
$$;

-- Acks many messages by archiving them, fenced by enqueued_at as the
-- delete above.
CREATE FUNCTION pgqueue.archive(queue_name text, msg_ids bigint[], enqueued_ats timestamptz[])
RETURNS SETOF bigint
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
SECURITY DEFINER SET search_path = pg_catalog, pgqueue, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    q pgqueue.queue := pgqueue._queue(archive.queue_name);
    v_tids tid[];
BEGIN
    PERFORM pgqueue._require_pairs(archive.msg_ids, archive.enqueued_ats);
    v_tids := ARRAY(
        SELECT (SELECT m.ctid FROM pgqueue.message m
                 WHERE m.queue_id = q.queue_id AND m.msg_id = u.id AND m.enqueued_at = u.at
                   FOR UPDATE)
          FROM (SELECT DISTINCT i, e FROM unnest(archive.msg_ids, archive.enqueued_ats) AS x (i, e)
                 ORDER BY i) AS u (id, at));
    RETURN QUERY
    WITH gone AS (
        DELETE FROM pgqueue.message m WHERE m.ctid = ANY (v_tids)
        RETURNING m.*
    ), kept AS (
        INSERT INTO pgqueue.archive (queue_id, msg_id, read_ct, enqueued_at, vt, message, headers)
        SELECT g.queue_id, g.msg_id, g.read_ct, g.enqueued_at, g.vt, g.message, g.headers FROM gone g
        RETURNING msg_id
    )
    SELECT k.msg_id FROM kept k;
END
$$;

DROP FUNCTION pgqueue.complete_members(text, bigint[], text[], jsonb[], integer[], text[]);

-- complete_members with read_cts: an entry with a read_ct acts only while
-- that read still holds the message's lease (else it is left alone: not
-- counted, not acked); an entry without one acts unfenced. Meant for
-- failures ('failed' speaks for one attempt, and the current holder may
-- still succeed); a success may go unfenced. The statuses returned are those
-- of the barriers of the entries that acted.
-- complete_members with enqueued_ats: an entry with one is left alone while
-- a live message holds its msg_id with another enqueued_at (an id handed out
-- again after an asynchronous standby was promoted; see delete(text,
-- bigint[], timestamptz[])). With the message gone, its member was counted
-- when it went, and completing it again changes nothing.
CREATE FUNCTION pgqueue.complete_members(
    queue_name text,
    msg_ids bigint[],
    outcomes text[] DEFAULT NULL,
    results jsonb[] DEFAULT NULL,
    read_cts integer[] DEFAULT NULL,
    traceparents text[] DEFAULT NULL,
    enqueued_ats timestamptz[] DEFAULT NULL
) RETURNS SETOF pgqueue.barrier_status
LANGUAGE plpgsql
SET enable_seqscan = off
SECURITY DEFINER SET search_path = pg_catalog, pgqueue, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    q pgqueue.queue := pgqueue._queue(complete_members.queue_name);
    v_ids bigint[] := complete_members.msg_ids;
    v_n integer := cardinality(complete_members.msg_ids);
    v_outcomes text[];
    v_results jsonb[];
    v_traces text[];
    v_read_cts integer[] := complete_members.read_cts;
    v_tids tid[];
    v_bad text;
BEGIN
    IF complete_members.msg_ids IS NULL THEN
        RAISE EXCEPTION 'msg_ids must not be NULL' USING ERRCODE = '22004';
    END IF;
    v_outcomes := coalesce(complete_members.outcomes, array_fill('succeeded'::text, ARRAY[v_n]));
    v_results := coalesce(complete_members.results, array_fill(NULL::jsonb, ARRAY[v_n]));
    v_traces := coalesce(complete_members.traceparents, array_fill(NULL::text, ARRAY[v_n]));
    IF cardinality(v_outcomes) <> v_n OR cardinality(v_results) <> v_n
       OR cardinality(complete_members.read_cts) <> v_n OR cardinality(v_traces) <> v_n
       OR cardinality(complete_members.enqueued_ats) <> v_n THEN
        RAISE EXCEPTION 'msg_ids, outcomes, results, read_cts, traceparents and enqueued_ats must have the same length'
            USING ERRCODE = '22023';
    END IF;
    PERFORM pgqueue._require_traceparent('traceparents[' || t.i || ']', t.tp)
       FROM unnest(complete_members.traceparents) WITH ORDINALITY AS t (tp, i) WHERE t.tp IS NOT NULL;
    SELECT o INTO v_bad FROM unnest(v_outcomes) o WHERE o IS NULL OR o NOT IN ('succeeded', 'failed') LIMIT 1;
    IF FOUND THEN
        RAISE EXCEPTION 'outcome must be ''succeeded'' or ''failed'', got %', quote_nullable(v_bad)
            USING ERRCODE = '22023';
    END IF;

    -- Lock order everywhere is message rows, then member rows, then barrier
    -- rows (a reader that poison-drops a member holds its message row when its
    -- trigger reaches the barrier), so take the message rows first, in
    -- msg_id order, one primary-key probe each.
    PERFORM (SELECT 1 FROM pgqueue.message m
              WHERE m.queue_id = q.queue_id AND m.msg_id = u.id FOR UPDATE)
       FROM (SELECT DISTINCT i FROM unnest(v_ids) AS i ORDER BY i) AS u (id);
    IF complete_members.enqueued_ats IS NOT NULL THEN
        -- The rows are locked: what this sees holds until we commit.
        SELECT coalesce(array_agg(u.msg_id ORDER BY u.ord), '{}'),
               coalesce(array_agg(u.outcome ORDER BY u.ord), '{}'),
               coalesce(array_agg(u.result ORDER BY u.ord), '{}'),
               coalesce(array_agg(u.tp ORDER BY u.ord), '{}'),
               CASE WHEN complete_members.read_cts IS NOT NULL
                    THEN coalesce(array_agg(u.read_ct ORDER BY u.ord), '{}') END
          INTO v_ids, v_outcomes, v_results, v_traces, v_read_cts
          FROM unnest(v_ids, v_outcomes, v_results, v_traces, complete_members.enqueued_ats,
                      coalesce(complete_members.read_cts, array_fill(NULL::integer, ARRAY[v_n])))
               WITH ORDINALITY AS u (msg_id, outcome, result, tp, enqueued_at, read_ct, ord)
         WHERE u.enqueued_at IS NULL
            OR NOT EXISTS (SELECT 1 FROM pgqueue.message m
                            WHERE m.queue_id = q.queue_id AND m.msg_id = u.msg_id
                              AND m.enqueued_at <> u.enqueued_at);
        v_n := cardinality(v_ids);
        IF v_n = 0 THEN
            RETURN;
        END IF;
    END IF;
    IF v_read_cts IS NOT NULL THEN
        -- The rows are locked: what this sees holds until we commit.
        SELECT coalesce(array_agg(u.msg_id ORDER BY u.ord), '{}'),
               coalesce(array_agg(u.outcome ORDER BY u.ord), '{}'),
               coalesce(array_agg(u.result ORDER BY u.ord), '{}'),
               coalesce(array_agg(u.tp ORDER BY u.ord), '{}')
          INTO v_ids, v_outcomes, v_results, v_traces
          FROM unnest(v_ids, v_outcomes, v_results, v_read_cts, v_traces)
               WITH ORDINALITY AS u (msg_id, outcome, result, read_ct, tp, ord)
         WHERE u.read_ct IS NULL
            OR (SELECT m.read_ct FROM pgqueue.message m
                 WHERE m.queue_id = q.queue_id AND m.msg_id = u.msg_id) = u.read_ct;
        v_n := cardinality(v_ids);
        IF v_n = 0 THEN
            RETURN;
        END IF;
    END IF;
    -- Count the outcomes, then ack: the ack's trigger finds the members
    -- counted and leaves them alone.
    PERFORM pgqueue._complete(array_fill(q.queue_id, ARRAY[v_n]), v_ids, v_outcomes, v_results,
                              v_traces);
    v_tids := ARRAY(SELECT (SELECT m.ctid FROM pgqueue.message m
                             WHERE m.queue_id = q.queue_id AND m.msg_id = u.id)
                      FROM unnest(v_ids) AS u (id));
    DELETE FROM pgqueue.message m WHERE m.ctid = ANY (v_tids);

    RETURN QUERY
    SELECT s.* FROM (SELECT DISTINCT x.barrier_id
                       FROM unnest(v_ids) AS u (id)
                      CROSS JOIN LATERAL (SELECT bm.barrier_id FROM pgqueue.barrier_member bm
                                           WHERE bm.queue_id = q.queue_id AND bm.msg_id = u.id
                                           LIMIT 1) x) d,
           LATERAL pgqueue._barrier_status(d.barrier_id) s
     ORDER BY s.barrier_id;
END
$$;

DELETE FROM pgqueue.role_grant WHERE function_signature IN (
    'pgqueue.complete_members(text,bigint[],text[],jsonb[],integer[],text[])');
INSERT INTO pgqueue.role_grant (function_signature, roles) VALUES
    ('pgqueue.complete_members(text,bigint[],text[],jsonb[],integer[],text[],timestamp with time zone[])', '{pgqueue_consumer}'),
    ('pgqueue.delete(text,bigint[],timestamp with time zone[])', '{pgqueue_consumer}'),
    ('pgqueue.archive(text,bigint[],timestamp with time zone[])', '{pgqueue_consumer}');

SELECT pgqueue.grant_roles();
