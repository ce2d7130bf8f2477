-- pgqueue schema, as it stands now: barriers (fan-out and fan-in with exactly
-- one callback).
--
-- The exactly-once argument, in one place:
--   * A barrier counts distinct members. Each member has a row in
--     pgqueue.barrier_member whose outcome moves from NULL to a value exactly
--     once, by `UPDATE ... WHERE outcome IS NULL`: a member completed twice (a
--     redelivery, a retried ack, a poison drop racing a completion) counts once.
--   * Only the transaction that counted a member decrements `remaining`, in the
--     same transaction, on the barrier row (row-locked), guarded by
--     `state = 'open'`. `remaining` therefore reaches 0 in exactly one
--     transaction, and that transaction enqueues the callback and marks the
--     barrier fired before it commits. Nothing is decided in Python.
--   * Every path by which a member message leaves the live table counts it:
--     an explicit completion, a plain delete/archive/pop (succeeded), a poison
--     drop (poisoned, failed), a purge (purged, failed). Paths that mean
--     another outcome than 'succeeded' count their members themselves before
--     the trigger message_members_gone counts the rest; no session setting is
--     read. So no barrier waits for a message that no longer exists; the
--     deadline sweep covers members that never finish.
--   * Only the firing writes a callback (it inserts it itself; every entry
--     refuses the _pg_ header keys, and the callback's record is under them:
--     the header rule, queue.sql), so a callback cannot be forged.
--   * Lock order is always message rows, then member rows, then barrier rows
--     (in barrier_id order within a batch), so completions, poison drops and
--     sweeps do not deadlock in the common cases; the rare remaining ones abort
--     a transaction that changed nothing, and the client retries it.

CREATE TABLE pgqueue.barrier (
    barrier_id text PRIMARY KEY,
    queue_id integer NOT NULL,
    callback_queue_id integer NOT NULL,
    callback_message jsonb NOT NULL,
    headers jsonb,
    total integer NOT NULL CHECK (total >= 0),
    remaining integer NOT NULL CHECK (remaining >= 0),
    succeeded integer NOT NULL DEFAULT 0,
    failed integer NOT NULL DEFAULT 0,
    state text NOT NULL DEFAULT 'open' CHECK (state IN ('open', 'fired', 'expired')),
    deadline timestamptz,
    created_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    fired_at timestamptz,
    callback_msg_id bigint,
    -- sha256 of the fan_out request that armed it: a retry matches, another does not
    fingerprint bytea,
    -- the trace context fan_out was called in (W3C), for the callback's headers
    traceparent text,
    tracestate text,
    -- The failure policy: wait_all fires when every member has an outcome;
    -- fail_fast and max_failures fire as soon as more members failed than
    -- tolerated (_tolerated), cancelling the members not under a live lease.
    policy text NOT NULL DEFAULT 'wait_all' CHECK (policy IN ('wait_all', 'fail_fast', 'max_failures')),
    max_failures integer CHECK (max_failures >= 0),
    max_failure_ratio double precision CHECK (max_failure_ratio >= 0 AND max_failure_ratio < 1),
    cancelled integer NOT NULL DEFAULT 0,
    -- false for an open barrier (open_barrier) until seal(): it never fires
    -- before, except by its deadline
    sealed boolean NOT NULL DEFAULT true,
    -- how it ended: succeeded, failed (more failures than its policy
    -- tolerates) or timed_out (its deadline); NULL while open
    outcome text CHECK (outcome IN ('succeeded', 'failed', 'timed_out')),
    -- a workflow step's barrier: its firing resolves the step, and sends no callback
    workflow_id text,
    step text,
    CHECK ((state = 'open') = (fired_at IS NULL))
) WITH (fillfactor = 70);
CREATE INDEX barrier_deadline_idx ON pgqueue.barrier (deadline) WHERE state = 'open';
CREATE INDEX barrier_created_idx ON pgqueue.barrier (created_at, barrier_id);
CREATE INDEX barrier_callback_queue_idx ON pgqueue.barrier (callback_queue_id) WHERE state = 'open';

CREATE TABLE pgqueue.barrier_member (
    barrier_id text NOT NULL,
    member_index integer NOT NULL,
    queue_id integer NOT NULL,
    msg_id bigint NOT NULL,
    -- NULL while pending; then succeeded | failed | poisoned | purged | timed_out
    outcome text,
    result jsonb,
    completed_at timestamptz,
    -- the trace context of the run that completed it, when traced: the
    -- callback's span links to it (barrier_links)
    traceparent text,
    PRIMARY KEY (barrier_id, member_index)
);
CREATE UNIQUE INDEX barrier_member_msg_idx ON pgqueue.barrier_member (queue_id, msg_id);

-- One row per add_members call made with an add_key: a retry finds its first
-- member index here and returns the members it added.
CREATE TABLE pgqueue.barrier_addition (
    barrier_id text NOT NULL,
    add_key uuid NOT NULL,
    first_index integer NOT NULL,
    PRIMARY KEY (barrier_id, add_key)
);

CREATE TYPE pgqueue.barrier_status AS (
    barrier_id text,
    queue_name text,
    callback_queue text,
    total integer,
    succeeded integer,
    failed integer,
    remaining integer,
    state text,
    created_at timestamptz,
    fired_at timestamptz,
    callback_msg_id bigint,
    deadline timestamptz,
    policy text,
    max_failures integer,
    max_failure_ratio double precision,
    cancelled integer,
    sealed boolean,
    outcome text
);

CREATE TYPE pgqueue.member_result AS (
    member_index integer,
    msg_id bigint,
    outcome text,
    result jsonb,
    completed_at timestamptz
);

CREATE TYPE pgqueue.member_failure AS (
    member_index integer,
    msg_id bigint,
    outcome text,
    reason text,
    result jsonb,
    completed_at timestamptz
);

CREATE FUNCTION pgqueue._barrier_status(p_barrier_id text) RETURNS pgqueue.barrier_status
LANGUAGE sql STABLE AS $$
    SELECT b.barrier_id, mq.queue_name, cq.queue_name, b.total, b.succeeded, b.failed,
           b.remaining, b.state, b.created_at, b.fired_at, b.callback_msg_id, b.deadline,
           b.policy, b.max_failures, b.max_failure_ratio, b.cancelled, b.sealed, b.outcome
      FROM pgqueue.barrier b
      LEFT JOIN pgqueue.queue mq ON mq.queue_id = b.queue_id
      LEFT JOIN pgqueue.queue cq ON cq.queue_id = b.callback_queue_id
     WHERE b.barrier_id = p_barrier_id;
$$;

CREATE FUNCTION pgqueue._barrier_or_raise(p_barrier_id text) RETURNS pgqueue.barrier_status
LANGUAGE plpgsql STABLE AS $$
DECLARE
    s pgqueue.barrier_status := pgqueue._barrier_status(p_barrier_id);
BEGIN
    IF s.barrier_id IS NULL THEN
        RAISE EXCEPTION 'barrier "%" does not exist', p_barrier_id
            USING ERRCODE = 'PGQ02', HINT = 'List barriers with pgqueue.list_barriers().';
    END IF;
    RETURN s;
END
$$;

-- Count completions of members (the single place that does), then fire the
-- barriers whose last member this was. Members already counted are skipped;
-- barrier rows are locked in barrier_id order, the order every path uses.
CREATE FUNCTION pgqueue._complete(p_queue_ids integer[], p_msg_ids bigint[], p_outcomes text[],
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

-- A callback must have somewhere to go: a queue that open barriers or
-- running workflows call back into cannot be dropped (checked before
-- drop_queue touches anything).
CREATE FUNCTION pgqueue._before_drop(q pgqueue.queue) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    v_n bigint;
BEGIN
    SELECT count(*) INTO v_n FROM pgqueue.barrier
     WHERE callback_queue_id = q.queue_id AND state = 'open';
    IF v_n > 0 THEN
        RAISE EXCEPTION 'queue "%" receives the callbacks of % open barrier(s)', q.queue_name, v_n
            USING ERRCODE = '55006',
                  HINT = 'Wait for them to fire, or give them a deadline and run pgqueue.expire_barriers().';
    END IF;
    SELECT count(*) INTO v_n FROM pgqueue.workflow
     WHERE callback_queue_id = q.queue_id AND state = 'running';
    IF v_n > 0 THEN
        RAISE EXCEPTION 'queue "%" receives the final callbacks of % running workflow(s)', q.queue_name, v_n
            USING ERRCODE = '55006',
                  HINT = 'Wait for them to finish, or cancel them with pgqueue.cancel_workflow().';
    END IF;
END
$$;

-- Fires the barriers whose deadline passed, their pending members counted as
-- timed_out; how many fired.
CREATE FUNCTION pgqueue.expire_barriers() RETURNS integer
LANGUAGE plpgsql
SET enable_seqscan = off
SET enable_bitmapscan = off
SECURITY DEFINER SET search_path = pg_catalog, pgqueue, pg_temp
AS $$
DECLARE
    v_id text;
    v_tids tid[];
    v_n integer;
    v_remaining integer;
    v_expired integer := 0;
BEGIN
    -- Safe from every consumer at once, and with completions in flight:
    --   * barriers are taken in barrier_id order, the order completions lock
    --     them in, so a sweep and a batch completion never wait on each other
    --     in a cycle;
    --   * members being completed right now are skipped (SKIP LOCKED): their
    --     completion counts them, and the barrier then fires as `fired`, or
    --     stays open for the next sweep if that completion rolls back;
    --   * only the statement that takes remaining to 0 fires.
    FOR v_id IN
        SELECT b.barrier_id FROM pgqueue.barrier b
         WHERE b.state = 'open' AND b.deadline <= clock_timestamp()
         ORDER BY b.barrier_id LIMIT 1000
    LOOP
        -- the barrier's pending members, by its primary key's prefix, locked;
        -- then timed out by ctid
        v_tids := ARRAY(SELECT x.ctid FROM pgqueue.barrier_member x
                         WHERE x.barrier_id = v_id AND x.outcome IS NULL
                           FOR UPDATE SKIP LOCKED);
        UPDATE pgqueue.barrier_member m
           SET outcome = 'timed_out', completed_at = clock_timestamp()
         WHERE m.ctid = ANY (v_tids) AND m.outcome IS NULL;
        GET DIAGNOSTICS v_n = ROW_COUNT;
        UPDATE pgqueue.barrier
           SET remaining = remaining - v_n, failed = failed + v_n
         WHERE barrier_id = v_id AND state = 'open'
        RETURNING remaining INTO v_remaining;
        IF FOUND AND v_remaining = 0 THEN
            PERFORM pgqueue._fire(v_id, 'expired');
            v_expired := v_expired + 1;
        END IF;
    END LOOP;
    RETURN v_expired;
END
$$;

CREATE FUNCTION pgqueue.barrier_status(barrier_id text) RETURNS pgqueue.barrier_status
LANGUAGE sql STABLE
SECURITY DEFINER SET search_path = pg_catalog, pgqueue, pg_temp
AS $$
    SELECT pgqueue._barrier_or_raise(barrier_id);
$$;

CREATE FUNCTION pgqueue.barrier_results(barrier_id text) RETURNS SETOF pgqueue.member_result
LANGUAGE plpgsql STABLE
SECURITY DEFINER SET search_path = pg_catalog, pgqueue, pg_temp
AS $$
#variable_conflict use_column
BEGIN
    PERFORM pgqueue._barrier_or_raise(barrier_results.barrier_id);
    RETURN QUERY
    SELECT m.member_index, m.msg_id, m.outcome, m.result, m.completed_at
      FROM pgqueue.barrier_member m
     WHERE m.barrier_id = barrier_results.barrier_id
     ORDER BY m.member_index;
END
$$;

CREATE FUNCTION pgqueue.list_barriers(state text DEFAULT NULL, qty integer DEFAULT 100)
RETURNS SETOF pgqueue.barrier_status
LANGUAGE plpgsql STABLE
SECURITY DEFINER SET search_path = pg_catalog, pgqueue, pg_temp
AS $$
#variable_conflict use_column
BEGIN
    IF list_barriers.state IS NOT NULL AND list_barriers.state NOT IN ('open', 'fired', 'expired') THEN
        RAISE EXCEPTION 'state must be open, fired or expired, got %', quote_literal(list_barriers.state)
            USING ERRCODE = '22023';
    END IF;
    PERFORM pgqueue._require_nonnegative('qty', list_barriers.qty);
    RETURN QUERY
    SELECT s.*
      FROM (SELECT b.barrier_id FROM pgqueue.barrier b
             WHERE list_barriers.state IS NULL OR b.state = list_barriers.state
             ORDER BY b.created_at DESC, b.barrier_id
             LIMIT list_barriers.qty) ids,
           LATERAL pgqueue._barrier_status(ids.barrier_id) s
     ORDER BY s.created_at DESC, s.barrier_id;
END
$$;

-- Every member that completed other than 'succeeded', by member index, with a
-- one-line reason: the poison reason, the failure's own result, or what the
-- outcome means.
CREATE FUNCTION pgqueue.barrier_failures(barrier_id text, qty integer DEFAULT 100)
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

-- The trace contexts the barrier's members were completed in (by traced
-- runs), by member index: the span links of its callback's run. At most qty,
-- read by the primary key's prefix, whatever the number of members.
CREATE FUNCTION pgqueue.barrier_links(barrier_id text, qty integer DEFAULT 128)
RETURNS TABLE (member_index integer, msg_id bigint, traceparent text)
LANGUAGE plpgsql STABLE
SECURITY DEFINER SET search_path = pg_catalog, pgqueue, pg_temp
AS $$
#variable_conflict use_column
BEGIN
    PERFORM pgqueue._barrier_or_raise(barrier_links.barrier_id);
    PERFORM pgqueue._require_nonnegative('qty', barrier_links.qty);
    RETURN QUERY
    SELECT m.member_index, m.msg_id, m.traceparent
      FROM pgqueue.barrier_member m
     WHERE m.barrier_id = barrier_links.barrier_id AND m.traceparent IS NOT NULL
     ORDER BY m.member_index
     LIMIT barrier_links.qty;
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

-- Cancels the pending members of a barrier (its row locked by the caller)
-- that are not under a live lease (never read, or visible again): their
-- messages leave the queue and they count as cancelled. Rows another
-- transaction holds right now are skipped rather than waited for (they are
-- being acked, nacked or read, and waiting could close a lock cycle). How
-- many it cancelled.
CREATE FUNCTION pgqueue._cancel_pending(p_barrier_id text) RETURNS integer
LANGUAGE plpgsql
SET enable_seqscan = off
AS $$
DECLARE
    v_now timestamptz := clock_timestamp();
    v_member_tids tid[];
    v_message_tids tid[];
    v_n integer;
BEGIN
    SELECT coalesce(array_agg(c.member_tid), '{}'), coalesce(array_agg(c.message_tid), '{}')
      INTO v_member_tids, v_message_tids
      FROM (SELECT bm.ctid AS member_tid, m.ctid AS message_tid
              FROM pgqueue.barrier_member bm
              JOIN pgqueue.message m ON m.queue_id = bm.queue_id AND m.msg_id = bm.msg_id AND pgqueue._keyed(m.read_ct, m.vt, m.enqueued_at, m.group_key)
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
     WHERE x.barrier_id = p_barrier_id;
    RETURN v_n;
END
$$;

-- The one callback, inserted here rather than through send(), which refuses
-- the marker. Called with the barrier row locked, by the one transaction that
-- found it due. Fired early by its failure policy (members still pending),
-- it first cancels the members not under a live lease (_cancel_pending); a
-- member still running finishes, and its completion is recorded on its own
-- row and changes no counts. Its headers are the fan-out's, then what only a
-- firing writes (_callback_headers): the marker, and under _pg_callback the
-- barrier's id, how it ended (succeeded, failed or timed_out) and the count
-- of every outcome. A workflow step's barrier sends no callback: its firing
-- resolves the step (workflows.sql).
CREATE FUNCTION pgqueue._fire(p_barrier_id text, p_state text) RETURNS bigint
LANGUAGE plpgsql
SET enable_seqscan = off
AS $$
DECLARE
    b pgqueue.barrier;
    q pgqueue.queue;
    v_now timestamptz := clock_timestamp();
    v_msg_id bigint;
    v_outcome text;
    v_counts jsonb;
BEGIN
    SELECT * INTO b FROM pgqueue.barrier WHERE barrier_id = p_barrier_id;
    IF p_state = 'fired' AND b.remaining > 0 THEN
        PERFORM pgqueue._cancel_pending(p_barrier_id);
        SELECT * INTO b FROM pgqueue.barrier WHERE barrier_id = p_barrier_id;
    END IF;
    v_outcome := CASE WHEN p_state = 'expired' THEN 'timed_out'
                      WHEN b.failed > pgqueue._tolerated(b) OR b.cancelled > 0 THEN 'failed'
                      ELSE 'succeeded' END;
    IF b.workflow_id IS NOT NULL THEN
        UPDATE pgqueue.barrier
           SET state = p_state, outcome = v_outcome, fired_at = clock_timestamp()
         WHERE barrier_id = p_barrier_id;
        PERFORM pgqueue._step_done(b.workflow_id, b.step, v_outcome);
        RETURN NULL;
    END IF;
    SELECT jsonb_object_agg(o.outcome, o.n) INTO v_counts
      FROM (SELECT coalesce(m.outcome, 'pending') AS outcome, count(*) AS n
              FROM pgqueue.barrier_member m WHERE m.barrier_id = p_barrier_id
             GROUP BY 1) o;
    SELECT * INTO q FROM pgqueue.queue WHERE queue_id = b.callback_queue_id;
    INSERT INTO pgqueue.message (queue_id, msg_id, enqueued_at, vt, message, headers)
    VALUES (q.queue_id, nextval(q.msg_seq), v_now, v_now, b.callback_message,
            pgqueue._callback_headers(b.headers,
                                      jsonb_build_object('kind', 'barrier',
                                                         'barrier_id', b.barrier_id,
                                                         'state', v_outcome,
                                                         'total', b.total,
                                                         'succeeded', b.succeeded,
                                                         'failed', b.failed,
                                                         'cancelled', b.cancelled,
                                                         'outcomes', coalesce(v_counts, '{}')),
                                      pgqueue._trace_headers(b.traceparent, b.tracestate)))
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
               pgqueue._member_headers(b.headers, b.barrier_id, p_first + m.ord::integer - 1,
                                       b.workflow_id, b.step,
                                       pgqueue._trace_headers(b.traceparent, b.tracestate)),
               b.barrier_id
          FROM unnest(p_messages) WITH ORDINALITY AS m (message, ord)
         ORDER BY m.ord
        RETURNING msg_id, (headers -> '_pg_member' ->> 'index')::integer AS member_index
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
    PERFORM pgqueue._require_all_decodable('messages', messages);
END
$$;

-- A failure policy and its limits that go together, else 22023.
CREATE FUNCTION pgqueue._require_policy(p_policy text, p_max_failures integer,
                                        p_max_failure_ratio double precision) RETURNS void
LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    IF p_policy NOT IN ('wait_all', 'fail_fast', 'max_failures') THEN
        RAISE EXCEPTION 'policy must be wait_all, fail_fast or max_failures, got %', quote_literal(p_policy)
            USING ERRCODE = '22023';
    END IF;
    IF (p_policy = 'max_failures') <> (p_max_failures IS NOT NULL OR p_max_failure_ratio IS NOT NULL) THEN
        RAISE EXCEPTION 'max_failures and max_failure_ratio go with the policy max_failures, and it needs one'
            USING ERRCODE = '22023',
                  HINT = 'Pass max_failures => N or max_failure_ratio => 0.05 (or both: the lower limit wins).';
    END IF;
    IF p_max_failures < 0 OR NOT (p_max_failure_ratio >= 0 AND p_max_failure_ratio < 1) THEN
        RAISE EXCEPTION 'max_failures must be >= 0 and max_failure_ratio from 0 up to, not including, 1'
            USING ERRCODE = '22023';
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
    p_traceparent text, p_tracestate text, p_workflow_id text DEFAULT NULL, p_step text DEFAULT NULL
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
    old pgqueue.barrier;
BEGIN
    PERFORM pgqueue._require_members(p_messages);
    IF p_callback_message IS NULL THEN
        RAISE EXCEPTION 'callback_message must not be NULL' USING ERRCODE = '22004';
    END IF;
    PERFORM pgqueue._require_decodable('callback_message', p_callback_message);
    IF v_id = '' OR length(v_id) > 200 THEN
        RAISE EXCEPTION 'barrier_id must be 1 to 200 characters' USING ERRCODE = '22023';
    END IF;
    IF p_deadline_seconds IS NOT NULL THEN
        PERFORM pgqueue._require_nonnegative('deadline_seconds', p_deadline_seconds);
    END IF;
    PERFORM pgqueue._require_policy(v_policy, p_max_failures, p_max_failure_ratio);
    PERFORM pgqueue._require_headers(p_headers);
    -- checked here; stored as _trace_headers keeps it (an empty tracestate is none)
    PERFORM pgqueue._trace_headers(p_traceparent, p_tracestate);
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
                                 policy, max_failures, max_failure_ratio, sealed, workflow_id, step)
    VALUES (v_id, q.queue_id, cq.queue_id, p_callback_message, p_headers, v_n, v_n,
            v_now + make_interval(secs => p_deadline_seconds), v_print,
            p_traceparent, CASE WHEN p_traceparent IS NOT NULL THEN nullif(p_tracestate, '') END,
            v_policy, p_max_failures, p_max_failure_ratio, p_sealed, p_workflow_id, p_step)
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

-- Members leaving the live table that nothing counted yet: 'poisoned' when
-- they went to the poison table in the same statement, else 'succeeded' (an
-- ack by delete, archive or pop). Every path that means another outcome
-- (complete_members, the purges) counts its members first, so they are
-- skipped here; nothing a session sets is read. Each gone row looks up its
-- member row and its poison row by one primary-key probe each.
CREATE FUNCTION pgqueue._count_gone(p_queue_ids integer[], p_msg_ids bigint[]) RETURNS void
LANGUAGE plpgsql
SET enable_seqscan = off
AS $$
DECLARE
    v_queue_ids integer[];
    v_msg_ids bigint[];
    v_outcomes text[];
    v_results jsonb[];
BEGIN
    SELECT array_agg(g.queue_id), array_agg(g.msg_id),
           array_agg(CASE WHEN p.reason IS NOT NULL THEN 'poisoned' ELSE 'succeeded' END),
           array_agg(CASE WHEN p.reason IS NOT NULL THEN jsonb_build_object('reason', p.reason) END)
      INTO v_queue_ids, v_msg_ids, v_outcomes, v_results
      FROM unnest(p_queue_ids, p_msg_ids) AS g (queue_id, msg_id)
     CROSS JOIN LATERAL (SELECT bm.outcome FROM pgqueue.barrier_member bm
                          WHERE bm.queue_id = g.queue_id AND bm.msg_id = g.msg_id LIMIT 1) bm
      LEFT JOIN LATERAL (SELECT x.reason FROM pgqueue.poison x
                          WHERE x.queue_id = g.queue_id AND x.msg_id = g.msg_id LIMIT 1) p ON true
     WHERE bm.outcome IS NULL;
    IF v_msg_ids IS NOT NULL THEN
        PERFORM pgqueue._complete(v_queue_ids, v_msg_ids, v_outcomes, v_results);
    END IF;
END
$$;

-- The trigger of every delete from the live table, fired for each row that
-- was a barrier member: the first such row of a statement whose member is
-- not counted yet counts every member the statement removed, in one
-- _count_gone (one lock order for the batch); the later ones find theirs
-- counted, by one probe each. A delete that takes no member (nearly all of
-- them) fires nothing: the WHEN clause is the whole cost.
CREATE FUNCTION pgqueue._members_gone() RETURNS trigger
LANGUAGE plpgsql
AS $$
DECLARE
    v_queue_ids integer[];
    v_msg_ids bigint[];
BEGIN
    IF EXISTS (SELECT 1 FROM pgqueue.barrier_member bm
                WHERE bm.queue_id = OLD.queue_id AND bm.msg_id = OLD.msg_id AND bm.outcome IS NULL) THEN
        SELECT array_agg(g.queue_id), array_agg(g.msg_id)
          INTO v_queue_ids, v_msg_ids
          FROM gone g
         WHERE g.member_of IS NOT NULL;
        PERFORM pgqueue._count_gone(v_queue_ids, v_msg_ids);
    END IF;
    RETURN NULL;
END
$$;

-- Counts the given members of a queue as purged; called by the purges in the
-- statement that deletes them, so the trigger above finds them counted.
CREATE FUNCTION pgqueue._count_purged(p_queue_id integer, p_msg_ids bigint[]) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    v_n integer := coalesce(cardinality(p_msg_ids), 0);
BEGIN
    IF v_n > 0 THEN
        PERFORM pgqueue._complete(array_fill(p_queue_id, ARRAY[v_n]), p_msg_ids,
                                  array_fill('purged'::text, ARRAY[v_n]), array_fill(NULL::jsonb, ARRAY[v_n]));
    END IF;
END
$$;

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
              WHERE m.queue_id = q.queue_id AND m.msg_id = u.id AND pgqueue._keyed(m.read_ct, m.vt, m.enqueued_at, m.group_key) FOR UPDATE)
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
            OR (SELECT 1 FROM pgqueue.message m
                 WHERE m.queue_id = q.queue_id AND m.msg_id = u.msg_id AND pgqueue._keyed(m.read_ct, m.vt, m.enqueued_at, m.group_key)
                   AND m.enqueued_at <> u.enqueued_at
                 LIMIT 1) IS NULL;
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
                 WHERE m.queue_id = q.queue_id AND m.msg_id = u.msg_id AND pgqueue._keyed(m.read_ct, m.vt, m.enqueued_at, m.group_key)) = u.read_ct;
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
                             WHERE m.queue_id = q.queue_id AND m.msg_id = u.id AND pgqueue._keyed(m.read_ct, m.vt, m.enqueued_at, m.group_key))
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

CREATE FUNCTION pgqueue.complete_member(
    queue_name text,
    msg_id bigint,
    outcome text DEFAULT 'succeeded',
    result jsonb DEFAULT NULL,
    read_ct integer DEFAULT NULL
) RETURNS jsonb
LANGUAGE sql
SECURITY DEFINER SET search_path = pg_catalog, pgqueue, pg_temp
AS $$
    -- The barrier's state after the completion; NULL when the message is not a
    -- barrier member (it is acked all the same), or when read_ct is given and
    -- no longer names the current lease (nothing changed).
    SELECT to_jsonb(s)
      FROM pgqueue.complete_members(queue_name, ARRAY[msg_id], ARRAY[outcome], ARRAY[result],
                                    CASE WHEN read_ct IS NOT NULL THEN ARRAY[read_ct] END) s;
$$;

CREATE TRIGGER message_members_gone
    AFTER DELETE ON pgqueue.message
    REFERENCING OLD TABLE AS gone
    FOR EACH ROW WHEN (OLD.member_of IS NOT NULL)
    EXECUTE FUNCTION pgqueue._members_gone();

-- A barrier's members counted by outcome, 'pending' for those without one: a
-- progress bar's segments. One scan of its primary key's prefix.
CREATE FUNCTION pgqueue.barrier_outcomes(barrier_id text)
RETURNS TABLE (outcome text, members bigint)
LANGUAGE plpgsql STABLE
SECURITY DEFINER SET search_path = pg_catalog, pgqueue, pg_temp
AS $$
#variable_conflict use_column
BEGIN
    PERFORM pgqueue._barrier_or_raise(barrier_outcomes.barrier_id);
    RETURN QUERY
    SELECT coalesce(m.outcome, 'pending'), count(*)
      FROM pgqueue.barrier_member m
     WHERE m.barrier_id = barrier_outcomes.barrier_id
     GROUP BY 1
     ORDER BY 1;
END
$$;

-- The members a barrier still waits on, by member index after after_index,
-- with the live message each is (NULL columns when the message is gone but
-- its completion is not yet counted): what a stuck fan-out waits for.
CREATE FUNCTION pgqueue.barrier_pending(barrier_id text, qty integer DEFAULT 100,
                                        after_index integer DEFAULT -1)
RETURNS TABLE (
    member_index integer,
    queue_name text,
    msg_id bigint,
    read_ct integer,
    enqueued_at timestamptz,
    vt timestamptz,
    last_error text
)
LANGUAGE plpgsql STABLE
SECURITY DEFINER SET search_path = pg_catalog, pgqueue, pg_temp
AS $$
#variable_conflict use_column
BEGIN
    PERFORM pgqueue._barrier_or_raise(barrier_pending.barrier_id);
    PERFORM pgqueue._require_nonnegative('qty', barrier_pending.qty);
    RETURN QUERY
    SELECT b.member_index, q.queue_name, b.msg_id, m.read_ct, m.enqueued_at, m.vt, m.last_error
      FROM pgqueue.barrier_member b
      JOIN pgqueue.queue q ON q.queue_id = b.queue_id
      LEFT JOIN pgqueue.message m ON m.queue_id = b.queue_id AND m.msg_id = b.msg_id AND pgqueue._keyed(m.read_ct, m.vt, m.enqueued_at, m.group_key)
     WHERE b.barrier_id = barrier_pending.barrier_id
       AND b.member_index > coalesce(barrier_pending.after_index, -1)
       AND b.outcome IS NULL
     ORDER BY b.member_index
     LIMIT barrier_pending.qty;
END
$$;

-- Barriers newest first, by keyset: those created before (before_created_at,
-- before_barrier_id) in (created_at, barrier_id) descending order; NULLs for
-- the first page. Reads barrier_created_idx backwards.
CREATE FUNCTION pgqueue.list_barriers(state text, qty integer, before_created_at timestamptz,
                                      before_barrier_id text)
RETURNS SETOF pgqueue.barrier_status
LANGUAGE plpgsql STABLE
SECURITY DEFINER SET search_path = pg_catalog, pgqueue, pg_temp
AS $$
#variable_conflict use_column
BEGIN
    IF list_barriers.state IS NOT NULL AND list_barriers.state NOT IN ('open', 'fired', 'expired') THEN
        RAISE EXCEPTION 'state must be open, fired or expired, got %', quote_literal(list_barriers.state)
            USING ERRCODE = '22023';
    END IF;
    PERFORM pgqueue._require_nonnegative('qty', list_barriers.qty);
    IF list_barriers.before_created_at IS NULL THEN
        RETURN QUERY
        SELECT s.*
          FROM (SELECT b.barrier_id FROM pgqueue.barrier b
                 WHERE list_barriers.state IS NULL OR b.state = list_barriers.state
                 ORDER BY b.created_at DESC, b.barrier_id DESC
                 LIMIT list_barriers.qty) ids,
               LATERAL pgqueue._barrier_status(ids.barrier_id) s
         ORDER BY s.created_at DESC, s.barrier_id DESC;
    ELSE
        RETURN QUERY
        SELECT s.*
          FROM (SELECT b.barrier_id FROM pgqueue.barrier b
                 WHERE (b.created_at, b.barrier_id)
                       < (list_barriers.before_created_at, coalesce(list_barriers.before_barrier_id, ''))
                   AND (list_barriers.state IS NULL OR b.state = list_barriers.state)
                 ORDER BY b.created_at DESC, b.barrier_id DESC
                 LIMIT list_barriers.qty) ids,
               LATERAL pgqueue._barrier_status(ids.barrier_id) s
         ORDER BY s.created_at DESC, s.barrier_id DESC;
    END IF;
END
$$;
