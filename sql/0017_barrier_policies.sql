-- pgqueue 0017: failure policies, and open barriers that grow until sealed.
--
-- A barrier has a failure policy. wait_all (the default, and what every
-- barrier did before) fires when every member has an outcome. fail_fast and
-- max_failures fire as soon as more members failed than they tolerate (none;
-- max_failures, or max_failure_ratio of the members): the firing cancels, in
-- its own transaction, every member not under a live lease (its message
-- leaves the queue, its outcome is 'cancelled', counted), and a member still
-- running finishes with its own outcome recorded, changing no counts.
-- The callback's header `state` now says how the barrier ended: succeeded,
-- failed (more failures than tolerated; for wait_all, any) or timed_out (its
-- deadline). It said 'fired' or 'expired' before; barrier.state still does.
-- The callback also carries `cancelled` and `outcomes` (every outcome's count).
--
-- An open barrier (open_barrier) takes members until seal(): add_members adds
-- them in the caller's transaction, with the barrier row locked, so a seal
-- counts exactly the members added before it; it fires only once sealed, or
-- by its deadline.

ALTER TABLE pgqueue.barrier
    ADD COLUMN policy text NOT NULL DEFAULT 'wait_all' CHECK (policy IN ('wait_all', 'fail_fast', 'max_failures')),
    ADD COLUMN max_failures integer CHECK (max_failures >= 0),
    ADD COLUMN max_failure_ratio double precision CHECK (max_failure_ratio >= 0 AND max_failure_ratio < 1),
    ADD COLUMN cancelled integer NOT NULL DEFAULT 0,
    ADD COLUMN sealed boolean NOT NULL DEFAULT true,
    ADD COLUMN outcome text CHECK (outcome IN ('succeeded', 'failed', 'timed_out'));
-- the barriers that fired before: how they ended, as the callback said then
UPDATE pgqueue.barrier
   SET outcome = CASE WHEN state = 'expired' THEN 'timed_out'
                      WHEN failed > 0 THEN 'failed' ELSE 'succeeded' END
 WHERE state <> 'open';

-- One row per add_members call made with an add_key: a retry finds its first
-- member index here and returns the members it added.
CREATE TABLE pgqueue.barrier_addition (
    barrier_id text NOT NULL,
    add_key uuid NOT NULL,
    first_index integer NOT NULL,
    PRIMARY KEY (barrier_id, add_key)
);

ALTER TYPE pgqueue.barrier_status
    ADD ATTRIBUTE policy text,
    ADD ATTRIBUTE max_failures integer,
    ADD ATTRIBUTE max_failure_ratio double precision,
    ADD ATTRIBUTE cancelled integer,
    ADD ATTRIBUTE sealed boolean,
    ADD ATTRIBUTE outcome text;

DROP FUNCTION pgqueue.fan_out(text, jsonb[], text, jsonb, text, jsonb, integer, text, text);
DELETE FROM pgqueue.role_grant
 WHERE function_signature = 'pgqueue.fan_out(text,jsonb[],text,jsonb,text,jsonb,integer,text,text)';

CREATE OR REPLACE FUNCTION pgqueue._barrier_status(p_barrier_id text) RETURNS pgqueue.barrier_status
LANGUAGE sql STABLE AS $$
    SELECT b.barrier_id, mq.queue_name, cq.queue_name, b.total, b.succeeded, b.failed,
           b.remaining, b.state, b.created_at, b.fired_at, b.callback_msg_id, b.deadline,
           b.policy, b.max_failures, b.max_failure_ratio, b.cancelled, b.sealed, b.outcome
      FROM pgqueue.barrier b
      LEFT JOIN pgqueue.queue mq ON mq.queue_id = b.queue_id
      LEFT JOIN pgqueue.queue cq ON cq.queue_id = b.callback_queue_id
     WHERE b.barrier_id = p_barrier_id;
$$;

-- Count completions of members (the single place that does), then fire the
-- barriers whose last member this was. Members already counted are skipped;
-- barrier rows are locked in barrier_id order, the order every path uses.
CREATE OR REPLACE FUNCTION pgqueue._complete(p_queue_ids integer[], p_msg_ids bigint[], p_outcomes text[],
                                             p_results jsonb[], p_traceparents text[] DEFAULT NULL)
RETURNS void
LANGUAGE plpgsql
SET enable_seqscan = off
AS $$
DECLARE
    v_ids text[];
    v_counted integer[];
    v_ok integer[];
    v_due boolean;
BEGIN
    -- Each member row is found by one probe of (queue_id, msg_id) and counted
    -- by ctid, only while its outcome is NULL: a completion racing this one
    -- for the same member updates the row first, and then its ctid no longer
    -- matches here (nor does its outcome): the member counts once.
    WITH i AS (
        SELECT DISTINCT ON (u.queue_id, u.msg_id) u.queue_id, u.msg_id, u.outcome, u.result, u.tp
          FROM unnest(p_queue_ids, p_msg_ids, p_outcomes, p_results, p_traceparents) WITH ORDINALITY
               AS u (queue_id, msg_id, outcome, result, tp, ord)
         ORDER BY u.queue_id, u.msg_id, u.ord  -- listed twice: the first entry counts
    ), t AS (
        SELECT i.outcome, i.result, i.tp,
               (SELECT bm.ctid FROM pgqueue.barrier_member bm
                 WHERE bm.queue_id = i.queue_id AND bm.msg_id = i.msg_id) AS tid
          FROM i
    ), counted AS (
        UPDATE pgqueue.barrier_member bm
           SET outcome = t.outcome, result = t.result, completed_at = clock_timestamp(),
               traceparent = t.tp
          FROM t
         WHERE bm.ctid = t.tid AND bm.outcome IS NULL
        RETURNING bm.barrier_id, bm.outcome
    )
    SELECT array_agg(g.barrier_id ORDER BY g.barrier_id),
           array_agg(g.n ORDER BY g.barrier_id),
           array_agg(g.ok ORDER BY g.barrier_id)
      INTO v_ids, v_counted, v_ok
      FROM (SELECT c.barrier_id, count(*)::integer AS n,
                   (count(*) FILTER (WHERE c.outcome = 'succeeded'))::integer AS ok
              FROM counted c GROUP BY c.barrier_id) g;

    FOR i IN 1 .. coalesce(cardinality(v_ids), 0) LOOP
        UPDATE pgqueue.barrier b
           SET remaining = remaining - v_counted[i],
               succeeded = succeeded + v_ok[i],
               failed = failed + (v_counted[i] - v_ok[i])
         WHERE barrier_id = v_ids[i] AND state = 'open'
        RETURNING b.sealed AND (b.remaining = 0 OR pgqueue._breached(b)) INTO v_due;
        IF v_due THEN
            PERFORM pgqueue._fire(v_ids[i], 'fired');
        END IF;
    END LOOP;
END
$$;

-- Every member that completed other than 'succeeded', by member index, with a
-- one-line reason: the poison reason, the failure's own result, or what the
-- outcome means.
CREATE OR REPLACE FUNCTION pgqueue.barrier_failures(barrier_id text, qty integer DEFAULT 100)
RETURNS SETOF pgqueue.member_failure
LANGUAGE plpgsql STABLE
SECURITY DEFINER SET search_path = pg_catalog, pgqueue, pg_temp
AS $$
#variable_conflict use_column
BEGIN
    PERFORM pgqueue._barrier_or_raise(barrier_failures.barrier_id);
    PERFORM pgqueue._require_nonnegative('qty', barrier_failures.qty);
    RETURN QUERY
    SELECT m.member_index, m.msg_id, m.outcome,
           CASE m.outcome
               WHEN 'poisoned' THEN coalesce(m.result ->> 'reason', 'poisoned')
               WHEN 'purged' THEN 'purged from the queue before it was processed'
               WHEN 'timed_out' THEN 'still pending when the barrier''s deadline passed'
               WHEN 'cancelled' THEN 'cancelled before it started: its barrier had failed'
               ELSE coalesce(m.result ->> 'error', m.result ->> 'reason', m.result::text,
                             'completed as failed')
           END,
           m.result, m.completed_at
      FROM pgqueue.barrier_member m
     WHERE m.barrier_id = barrier_failures.barrier_id
       AND m.outcome IS NOT NULL AND m.outcome <> 'succeeded'
     ORDER BY m.member_index
     LIMIT barrier_failures.qty;
END
$$;

-- How many failed members a barrier tolerates: 0 for wait_all and fail_fast,
-- else the least of max_failures and max_failure_ratio of its members.
CREATE FUNCTION pgqueue._tolerated(b pgqueue.barrier) RETURNS integer
LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE WHEN b.policy = 'max_failures'
                THEN least(coalesce(b.max_failures, 2147483647),
                           coalesce(floor(b.max_failure_ratio * b.total)::integer, 2147483647))
                ELSE 0 END;
$$;

-- The barrier has failed more members than its policy tolerates, and its
-- policy fires it then (wait_all waits for every member all the same).
CREATE FUNCTION pgqueue._breached(b pgqueue.barrier) RETURNS boolean
LANGUAGE sql IMMUTABLE AS $$
    SELECT b.policy <> 'wait_all' AND b.failed > pgqueue._tolerated(b);
$$;

-- The one callback, inserted here rather than through send(), which refuses
-- the marker. Called with the barrier row locked, by the one transaction that
-- found it due. Fired early by its failure policy (members still pending),
-- it first cancels the members not under a live lease (never read, or
-- visible again): their messages leave the queue and they count as
-- cancelled, in this transaction. Rows another transaction holds right now
-- are skipped rather than waited for (they are being acked, nacked or read,
-- and waiting could close a lock cycle); a member still running finishes, and
-- its completion is recorded on its own row and changes no counts. The
-- fan-out's headers come first, without a member_index (a handler that
-- passed its member's headers on to a nested fan_out would otherwise make
-- that fan-out's callback look like a member), then the keys only a firing
-- writes: state (succeeded, failed or timed_out) and the count of every
-- outcome.
CREATE OR REPLACE FUNCTION pgqueue._fire(p_barrier_id text, p_state text) RETURNS bigint
LANGUAGE plpgsql
SET enable_seqscan = off
AS $$
DECLARE
    b pgqueue.barrier;
    q pgqueue.queue;
    v_now timestamptz := clock_timestamp();
    v_msg_id bigint;
    v_member_tids tid[];
    v_message_tids tid[];
    v_n integer;
    v_outcome text;
    v_counts jsonb;
BEGIN
    SELECT * INTO b FROM pgqueue.barrier WHERE barrier_id = p_barrier_id;
    IF p_state = 'fired' AND b.remaining > 0 THEN
        SELECT coalesce(array_agg(c.member_tid), '{}'), coalesce(array_agg(c.message_tid), '{}')
          INTO v_member_tids, v_message_tids
          FROM (SELECT bm.ctid AS member_tid, m.ctid AS message_tid
                  FROM pgqueue.barrier_member bm
                  JOIN pgqueue.message m ON m.queue_id = bm.queue_id AND m.msg_id = bm.msg_id
                 WHERE bm.barrier_id = p_barrier_id AND bm.outcome IS NULL
                   AND (m.read_ct = 0 OR m.vt <= v_now)
                   FOR UPDATE OF bm, m SKIP LOCKED) c;
        UPDATE pgqueue.barrier_member m
           SET outcome = 'cancelled', completed_at = v_now
         WHERE m.ctid = ANY (v_member_tids) AND m.outcome IS NULL;
        GET DIAGNOSTICS v_n = ROW_COUNT;
        -- counted above: the trigger leaves them alone
        DELETE FROM pgqueue.message m WHERE m.ctid = ANY (v_message_tids);
        UPDATE pgqueue.barrier x
           SET cancelled = x.cancelled + v_n, remaining = x.remaining - v_n
         WHERE x.barrier_id = p_barrier_id
        RETURNING * INTO b;
    END IF;
    v_outcome := CASE WHEN p_state = 'expired' THEN 'timed_out'
                      WHEN b.failed > pgqueue._tolerated(b) THEN 'failed'
                      ELSE 'succeeded' END;
    SELECT jsonb_object_agg(o.outcome, o.n) INTO v_counts
      FROM (SELECT coalesce(m.outcome, 'pending') AS outcome, count(*) AS n
              FROM pgqueue.barrier_member m WHERE m.barrier_id = p_barrier_id
             GROUP BY 1) o;
    SELECT * INTO q FROM pgqueue.queue WHERE queue_id = b.callback_queue_id;
    INSERT INTO pgqueue.message (queue_id, msg_id, enqueued_at, vt, message, headers)
    VALUES (q.queue_id, nextval(q.msg_seq), v_now, v_now, b.callback_message,
            (coalesce(b.headers, '{}'::jsonb) - 'member_index') || jsonb_build_object(
                '_pg_transport', true,
                'barrier_id', b.barrier_id,
                'total', b.total,
                'succeeded', b.succeeded,
                'failed', b.failed,
                'cancelled', b.cancelled,
                'outcomes', coalesce(v_counts, '{}'),
                'state', v_outcome)
             || coalesce(pgqueue._trace_headers(b.traceparent, b.tracestate), '{}'))
    RETURNING msg_id INTO v_msg_id;
    PERFORM pgqueue._notify(q);
    UPDATE pgqueue.barrier
       SET state = p_state, outcome = v_outcome, fired_at = clock_timestamp(),
           callback_msg_id = v_msg_id
     WHERE barrier_id = p_barrier_id;
    RETURN v_msg_id;
END
$$;

-- Inserts members p_first.. of a barrier into queue q, each message carrying
-- the barrier's headers, its id and member index, and its trace context;
-- their msg_ids in order. The caller has counted them on the barrier row.
CREATE FUNCTION pgqueue._insert_members(b pgqueue.barrier, q pgqueue.queue, p_first integer,
                                        p_messages jsonb[], p_now timestamptz)
RETURNS bigint[]
LANGUAGE sql AS $$
    WITH sent AS (
        INSERT INTO pgqueue.message (queue_id, msg_id, enqueued_at, vt, message, headers, member_of)
        SELECT q.queue_id, nextval(q.msg_seq), p_now, p_now, m.message,
               coalesce(b.headers, '{}'::jsonb)
                   || jsonb_build_object('barrier_id', b.barrier_id, 'member_index', p_first + m.ord - 1)
                   || coalesce(pgqueue._trace_headers(b.traceparent, b.tracestate), '{}'),
               b.barrier_id
          FROM unnest(p_messages) WITH ORDINALITY AS m (message, ord)
         ORDER BY m.ord
        RETURNING msg_id, (headers ->> 'member_index')::integer AS member_index
    ), members AS (
        INSERT INTO pgqueue.barrier_member (barrier_id, member_index, queue_id, msg_id)
        SELECT b.barrier_id, s.member_index, q.queue_id, s.msg_id FROM sent s
        RETURNING msg_id, member_index
    )
    SELECT coalesce(array_agg(x.msg_id ORDER BY x.member_index), '{}') FROM members x;
$$;

-- Members must be an array of JSON values, none NULL.
CREATE FUNCTION pgqueue._require_members(messages jsonb[]) RETURNS void
LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    IF messages IS NULL THEN
        RAISE EXCEPTION 'messages must not be NULL' USING ERRCODE = '22004';
    END IF;
    IF array_position(messages, NULL) IS NOT NULL THEN
        RAISE EXCEPTION 'messages[%] is NULL', array_position(messages, NULL)
            USING ERRCODE = '22004', HINT = 'Every member must be a JSON value.';
    END IF;
END
$$;

-- Arms a barrier (sealed: fan_out; not: open_barrier) with its first members,
-- in one transaction; its id. The barrier keeps a fingerprint of the
-- request: a retry of the same request (the client sends the very same
-- parameters again) matches it and returns the id, sending nothing; any other
-- request for that id raises PGQ03. The deadline is fingerprinted as the
-- seconds given, so a retry later still matches; the trace context is left
-- out, so the same request re-sent under another span is still a retry.
CREATE FUNCTION pgqueue._arm(
    p_queue text, p_messages jsonb[], p_callback_queue text, p_callback_message jsonb,
    p_barrier_id text, p_headers jsonb, p_deadline_seconds integer, p_policy text,
    p_max_failures integer, p_max_failure_ratio double precision, p_sealed boolean,
    p_traceparent text, p_tracestate text
) RETURNS text
LANGUAGE plpgsql AS $$
DECLARE
    q pgqueue.queue;
    cq pgqueue.queue;
    b pgqueue.barrier;
    v_id text := coalesce(p_barrier_id, gen_random_uuid()::text);
    v_n integer := cardinality(p_messages);
    v_now timestamptz := clock_timestamp();
    v_policy text := coalesce(p_policy, CASE WHEN p_max_failures IS NOT NULL OR p_max_failure_ratio IS NOT NULL
                                             THEN 'max_failures' ELSE 'wait_all' END);
    v_print bytea;
    v_trace jsonb := pgqueue._trace_headers(p_traceparent, p_tracestate);
    old pgqueue.barrier;
BEGIN
    PERFORM pgqueue._require_members(p_messages);
    IF p_callback_message IS NULL THEN
        RAISE EXCEPTION 'callback_message must not be NULL' USING ERRCODE = '22004';
    END IF;
    IF v_id = '' OR length(v_id) > 200 THEN
        RAISE EXCEPTION 'barrier_id must be 1 to 200 characters' USING ERRCODE = '22023';
    END IF;
    IF p_deadline_seconds IS NOT NULL THEN
        PERFORM pgqueue._require_nonnegative('deadline_seconds', p_deadline_seconds);
    END IF;
    IF v_policy NOT IN ('wait_all', 'fail_fast', 'max_failures') THEN
        RAISE EXCEPTION 'policy must be wait_all, fail_fast or max_failures, got %', quote_literal(v_policy)
            USING ERRCODE = '22023';
    END IF;
    IF (v_policy = 'max_failures') <> (p_max_failures IS NOT NULL OR p_max_failure_ratio IS NOT NULL) THEN
        RAISE EXCEPTION 'max_failures and max_failure_ratio go with the policy max_failures, and it needs one'
            USING ERRCODE = '22023',
                  HINT = 'Pass max_failures => N or max_failure_ratio => 0.05 (or both: the lower limit wins).';
    END IF;
    IF p_max_failures < 0 OR NOT (p_max_failure_ratio >= 0 AND p_max_failure_ratio < 1) THEN
        RAISE EXCEPTION 'max_failures must be >= 0 and max_failure_ratio from 0 up to, not including, 1'
            USING ERRCODE = '22023';
    END IF;
    PERFORM pgqueue._require_headers(p_headers);
    -- Locked so a concurrent drop_queue either sees this barrier or makes us
    -- fail: a barrier never points at a callback queue that is gone.
    q := pgqueue._queue_locked(p_queue);
    cq := pgqueue._queue_locked(p_callback_queue);
    -- A sealed wait_all barrier keeps the fingerprint it had before policies existed.
    v_print := sha256(convert_to((jsonb_build_array(
                   q.queue_name, cq.queue_name, p_callback_message, p_headers,
                   p_deadline_seconds, to_jsonb(p_messages))
                   || CASE WHEN v_policy = 'wait_all' AND p_sealed THEN '[]'::jsonb
                           ELSE jsonb_build_array(v_policy, p_max_failures, p_max_failure_ratio, p_sealed)
                      END)::text, 'UTF8'));

    INSERT INTO pgqueue.barrier (barrier_id, queue_id, callback_queue_id, callback_message, headers,
                                 total, remaining, deadline, fingerprint, traceparent, tracestate,
                                 policy, max_failures, max_failure_ratio, sealed)
    VALUES (v_id, q.queue_id, cq.queue_id, p_callback_message, p_headers, v_n, v_n,
            v_now + make_interval(secs => p_deadline_seconds), v_print,
            p_traceparent, v_trace ->> '_pg_tracestate',
            v_policy, p_max_failures, p_max_failure_ratio, p_sealed)
    ON CONFLICT (barrier_id) DO NOTHING
    RETURNING * INTO b;
    IF NOT FOUND THEN
        -- The id exists: the same request again (a retry) returns it and
        -- sends nothing; any other is an error. Barriers armed before 0008
        -- have no fingerprint and are compared by shape.
        SELECT * INTO old FROM pgqueue.barrier x WHERE x.barrier_id = v_id;
        IF old.fingerprint = v_print
           OR (old.fingerprint IS NULL AND old.total = v_n AND old.queue_id = q.queue_id
               AND old.callback_queue_id = cq.queue_id) THEN
            RETURN v_id;
        END IF;
        RAISE EXCEPTION 'barrier "%" already exists for another fan-out', v_id
            USING ERRCODE = 'PGQ03',
                  DETAIL = 'Its members, callback, headers, deadline or policy differ from this request''s.',
                  HINT = 'Use a new barrier_id, or omit it to get a generated one.';
    END IF;

    PERFORM pgqueue._insert_members(b, q, 0, p_messages, v_now);
    IF v_n = 0 AND p_sealed THEN
        PERFORM pgqueue._fire(v_id, 'fired');
    ELSIF v_n > 0 THEN
        PERFORM pgqueue._notify(q);
    END IF;
    RETURN v_id;
END
$$;

-- Sends the members and arms their barrier in one transaction; the barrier
-- id. Its callback follows once every member has an outcome, or as soon as
-- more members failed than its policy tolerates (fail_fast: one;
-- max_failures: more than max_failures, or than max_failure_ratio of them).
-- A retry of the same request returns the id and sends nothing (see _arm).
CREATE FUNCTION pgqueue.fan_out(
    queue_name text,
    messages jsonb[],
    callback_queue text,
    callback_message jsonb,
    barrier_id text DEFAULT NULL,
    headers jsonb DEFAULT NULL,
    deadline_seconds integer DEFAULT NULL,
    traceparent text DEFAULT NULL,
    tracestate text DEFAULT NULL,
    policy text DEFAULT NULL,
    max_failures integer DEFAULT NULL,
    max_failure_ratio double precision DEFAULT NULL
) RETURNS text
LANGUAGE sql
SECURITY DEFINER SET search_path = pg_catalog, pgqueue, pg_temp
AS $$
    SELECT pgqueue._arm(queue_name, messages, callback_queue, callback_message, barrier_id, headers,
                        deadline_seconds, policy, max_failures, max_failure_ratio, true,
                        traceparent, tracestate);
$$;

-- Arms a barrier whose members are known only at run time, with its first
-- members (or none); its id. add_members adds more; it fires only once
-- sealed (seal), or by its deadline. Retries as fan_out's do.
CREATE FUNCTION pgqueue.open_barrier(
    queue_name text,
    callback_queue text,
    callback_message jsonb,
    barrier_id text DEFAULT NULL,
    headers jsonb DEFAULT NULL,
    deadline_seconds integer DEFAULT NULL,
    policy text DEFAULT NULL,
    max_failures integer DEFAULT NULL,
    max_failure_ratio double precision DEFAULT NULL,
    messages jsonb[] DEFAULT '{}',
    traceparent text DEFAULT NULL,
    tracestate text DEFAULT NULL
) RETURNS text
LANGUAGE sql
SECURITY DEFINER SET search_path = pg_catalog, pgqueue, pg_temp
AS $$
    SELECT pgqueue._arm(queue_name, messages, callback_queue, callback_message, barrier_id, headers,
                        deadline_seconds, policy, max_failures, max_failure_ratio, false,
                        traceparent, tracestate);
$$;

-- Adds members to an open barrier that is not sealed, in the caller's
-- transaction; their msg_ids, in order. PGQ03 once the barrier is sealed or
-- has fired; PGQ02 for no such barrier. With an add_key (the client makes one
-- per call), a retry of a call that committed returns the same ids and adds
-- nothing. The barrier row is locked until the caller commits: completions
-- and a seal of this barrier wait for it, so a seal counts exactly the
-- members added before it.
CREATE FUNCTION pgqueue.add_members(barrier_id text, messages jsonb[], add_key uuid DEFAULT NULL)
RETURNS SETOF bigint
LANGUAGE plpgsql
SECURITY DEFINER SET search_path = pg_catalog, pgqueue, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    b pgqueue.barrier;
    q pgqueue.queue;
    v_n integer := cardinality(add_members.messages);
    v_first integer;
BEGIN
    PERFORM pgqueue._require_members(add_members.messages);
    SELECT * INTO b FROM pgqueue.barrier x WHERE x.barrier_id = add_members.barrier_id FOR UPDATE;
    IF NOT FOUND THEN
        PERFORM pgqueue._barrier_or_raise(add_members.barrier_id);
    END IF;
    IF add_members.add_key IS NOT NULL THEN
        SELECT a.first_index INTO v_first FROM pgqueue.barrier_addition a
         WHERE a.barrier_id = add_members.barrier_id AND a.add_key = add_members.add_key;
        IF FOUND THEN  -- this call, retried after it committed
            RETURN QUERY SELECT m.msg_id FROM pgqueue.barrier_member m
                          WHERE m.barrier_id = add_members.barrier_id
                            AND m.member_index >= v_first AND m.member_index < v_first + v_n
                          ORDER BY m.member_index;
            RETURN;
        END IF;
    END IF;
    IF b.state <> 'open' OR b.sealed THEN
        RAISE EXCEPTION 'barrier "%" is %: no more members can be added', b.barrier_id,
            CASE WHEN b.state <> 'open' THEN 'fired' ELSE 'sealed' END
            USING ERRCODE = 'PGQ03',
                  HINT = 'Add members before seal(); a barrier that fired or was sealed takes none.';
    END IF;
    SELECT * INTO q FROM pgqueue.queue x WHERE x.queue_id = b.queue_id FOR KEY SHARE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'the queue of barrier "%" was dropped', b.barrier_id USING ERRCODE = 'PGQ01';
    END IF;
    UPDATE pgqueue.barrier x SET total = x.total + v_n, remaining = x.remaining + v_n
     WHERE x.barrier_id = b.barrier_id
    RETURNING * INTO b;
    v_first := b.total - v_n;
    IF add_members.add_key IS NOT NULL THEN
        INSERT INTO pgqueue.barrier_addition (barrier_id, add_key, first_index)
        VALUES (b.barrier_id, add_members.add_key, v_first);
    END IF;
    RETURN QUERY SELECT unnest(pgqueue._insert_members(b, q, v_first, add_members.messages, clock_timestamp()));
    IF v_n > 0 THEN
        PERFORM pgqueue._notify(q);
    END IF;
END
$$;

-- Says no more members will come: the barrier fires now if every member has
-- an outcome (or its policy is breached), else when the last one has. The
-- barrier's state after. Sealing a sealed or fired barrier changes nothing.
CREATE FUNCTION pgqueue.seal(barrier_id text) RETURNS pgqueue.barrier_status
LANGUAGE plpgsql
SECURITY DEFINER SET search_path = pg_catalog, pgqueue, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_due boolean;
BEGIN
    UPDATE pgqueue.barrier b SET sealed = true
     WHERE b.barrier_id = seal.barrier_id AND b.state = 'open' AND NOT b.sealed
    RETURNING b.remaining = 0 OR pgqueue._breached(b) INTO v_due;
    IF v_due THEN
        PERFORM pgqueue._fire(seal.barrier_id, 'fired');
    END IF;
    RETURN pgqueue._barrier_or_raise(seal.barrier_id);
END
$$;

INSERT INTO pgqueue.role_grant (function_signature, roles) VALUES
    ('pgqueue.fan_out(text,jsonb[],text,jsonb,text,jsonb,integer,text,text,text,integer,double precision)', '{pgqueue_producer,pgqueue_consumer}'),
    ('pgqueue.open_barrier(text,text,jsonb,text,jsonb,integer,text,integer,double precision,jsonb[],text,text)', '{pgqueue_producer,pgqueue_consumer}'),
    ('pgqueue.add_members(text,jsonb[],uuid)', '{pgqueue_producer,pgqueue_consumer}'),
    ('pgqueue.seal(text)', '{pgqueue_producer,pgqueue_consumer}');

SELECT pgqueue.grant_roles();
