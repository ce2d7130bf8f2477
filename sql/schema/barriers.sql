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
--   * Only the firing writes a callback (it inserts it itself; send refuses
--     the _pg_ header keys), so a callback cannot be forged.
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
    CHECK ((state = 'open') = (fired_at IS NULL))
) WITH (fillfactor = 70);
CREATE INDEX barrier_deadline_idx ON pgqueue.barrier (deadline) WHERE state = 'open';
CREATE INDEX barrier_created_idx ON pgqueue.barrier (created_at);
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
    deadline timestamptz
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
           b.remaining, b.state, b.created_at, b.fired_at, b.callback_msg_id, b.deadline
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
    v_remaining integer;
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
        UPDATE pgqueue.barrier
           SET remaining = remaining - v_counted[i],
               succeeded = succeeded + v_ok[i],
               failed = failed + (v_counted[i] - v_ok[i])
         WHERE barrier_id = v_ids[i] AND state = 'open'
        RETURNING remaining INTO v_remaining;
        IF FOUND AND v_remaining = 0 THEN
            PERFORM pgqueue._fire(v_ids[i], 'fired');
        END IF;
    END LOOP;
END
$$;

-- A callback must have somewhere to go: a queue that open barriers call back
-- into cannot be dropped (checked before drop_queue touches anything).
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

-- The one callback, inserted here rather than through send(), which refuses
-- the marker. The fan-out's headers come first, without a member_index (a
-- handler that passed its member's headers on to a nested fan_out would
-- otherwise make that fan-out's callback look like a member), then the keys
-- only a firing writes.
CREATE FUNCTION pgqueue._fire(p_barrier_id text, p_state text) RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    b pgqueue.barrier;
    q pgqueue.queue;
    v_now timestamptz := clock_timestamp();
    v_msg_id bigint;
BEGIN
    SELECT * INTO b FROM pgqueue.barrier WHERE barrier_id = p_barrier_id;
    SELECT * INTO q FROM pgqueue.queue WHERE queue_id = b.callback_queue_id;
    INSERT INTO pgqueue.message (queue_id, msg_id, enqueued_at, vt, message, headers)
    VALUES (q.queue_id, nextval(q.msg_seq), v_now, v_now, b.callback_message,
            (coalesce(b.headers, '{}'::jsonb) - 'member_index') || jsonb_build_object(
                '_pg_transport', true,
                'barrier_id', b.barrier_id,
                'total', b.total,
                'succeeded', b.succeeded,
                'failed', b.failed,
                'state', p_state)
             || coalesce(pgqueue._trace_headers(b.traceparent, b.tracestate), '{}'))
    RETURNING msg_id INTO v_msg_id;
    PERFORM pgqueue._notify(q);
    UPDATE pgqueue.barrier
       SET state = p_state, fired_at = clock_timestamp(), callback_msg_id = v_msg_id
     WHERE barrier_id = p_barrier_id;
    RETURN v_msg_id;
END
$$;

-- Sends the members and arms their barrier in one transaction; the barrier
-- id. The barrier keeps a fingerprint of the request: a retry of the same
-- request (the client sends the very same parameters again) matches it and
-- returns the id, sending nothing; any other request for that id raises
-- PGQ03. The deadline is fingerprinted as the seconds given, so a retry
-- later still matches.
CREATE FUNCTION pgqueue.fan_out(
    queue_name text,
    messages jsonb[],
    callback_queue text,
    callback_message jsonb,
    barrier_id text DEFAULT NULL,
    headers jsonb DEFAULT NULL,
    deadline_seconds integer DEFAULT NULL,
    traceparent text DEFAULT NULL,
    tracestate text DEFAULT NULL
) RETURNS text
LANGUAGE plpgsql
SECURITY DEFINER SET search_path = pg_catalog, pgqueue, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    q pgqueue.queue;
    cq pgqueue.queue;
    v_id text := coalesce(fan_out.barrier_id, gen_random_uuid()::text);
    v_n integer := cardinality(fan_out.messages);
    v_now timestamptz := clock_timestamp();
    v_print bytea;
    v_trace jsonb := pgqueue._trace_headers(fan_out.traceparent, fan_out.tracestate);
    old pgqueue.barrier;
BEGIN
    IF fan_out.messages IS NULL OR fan_out.callback_message IS NULL THEN
        RAISE EXCEPTION 'messages and callback_message must not be NULL' USING ERRCODE = '22004';
    END IF;
    IF array_position(fan_out.messages, NULL) IS NOT NULL THEN
        RAISE EXCEPTION 'messages[%] is NULL', array_position(fan_out.messages, NULL)
            USING ERRCODE = '22004', HINT = 'Every member must be a JSON value.';
    END IF;
    IF v_id = '' OR length(v_id) > 200 THEN
        RAISE EXCEPTION 'barrier_id must be 1 to 200 characters' USING ERRCODE = '22023';
    END IF;
    IF fan_out.deadline_seconds IS NOT NULL THEN
        PERFORM pgqueue._require_nonnegative('deadline_seconds', fan_out.deadline_seconds);
    END IF;
    PERFORM pgqueue._require_headers(fan_out.headers);
    -- Locked so a concurrent drop_queue either sees this barrier or makes us
    -- fail: a barrier never points at a callback queue that is gone.
    q := pgqueue._queue_locked(fan_out.queue_name);
    cq := pgqueue._queue_locked(fan_out.callback_queue);
    v_print := sha256(convert_to(jsonb_build_array(
                   q.queue_name, cq.queue_name, fan_out.callback_message, fan_out.headers,
                   fan_out.deadline_seconds, to_jsonb(fan_out.messages))::text, 'UTF8'));

    -- The trace context is not part of the fingerprint: the same request
    -- re-sent under another span is still a retry.
    INSERT INTO pgqueue.barrier (barrier_id, queue_id, callback_queue_id, callback_message, headers,
                                 total, remaining, deadline, fingerprint, traceparent, tracestate)
    VALUES (v_id, q.queue_id, cq.queue_id, fan_out.callback_message, fan_out.headers, v_n, v_n,
            v_now + make_interval(secs => fan_out.deadline_seconds), v_print,
            fan_out.traceparent, v_trace ->> '_pg_tracestate')
    ON CONFLICT (barrier_id) DO NOTHING;
    IF NOT FOUND THEN
        -- The id exists: the same request again (a retry) returns it and
        -- sends nothing; any other is an error. Barriers armed before this
        -- migration have no fingerprint and are compared by shape, as before.
        SELECT * INTO old FROM pgqueue.barrier b WHERE b.barrier_id = v_id;
        IF old.fingerprint = v_print
           OR (old.fingerprint IS NULL AND old.total = v_n AND old.queue_id = q.queue_id
               AND old.callback_queue_id = cq.queue_id) THEN
            RETURN v_id;
        END IF;
        RAISE EXCEPTION 'barrier "%" already exists for another fan-out', v_id
            USING ERRCODE = 'PGQ03',
                  DETAIL = 'Its members, callback, headers or deadline differ from this request''s.',
                  HINT = 'Use a new barrier_id, or omit it to get a generated one.';
    END IF;

    WITH sent AS (
        INSERT INTO pgqueue.message (queue_id, msg_id, enqueued_at, vt, message, headers, member_of)
        SELECT q.queue_id, nextval(q.msg_seq), v_now, v_now, m.message,
               coalesce(fan_out.headers, '{}'::jsonb)
                   || jsonb_build_object('barrier_id', v_id, 'member_index', m.ord - 1)
                   || coalesce(v_trace, '{}'),
               v_id
          FROM unnest(fan_out.messages) WITH ORDINALITY AS m (message, ord)
         ORDER BY m.ord
        RETURNING msg_id, (headers ->> 'member_index')::integer AS member_index
    )
    INSERT INTO pgqueue.barrier_member (barrier_id, member_index, queue_id, msg_id)
    SELECT v_id, s.member_index, q.queue_id, s.msg_id FROM sent s;

    IF v_n = 0 THEN
        PERFORM pgqueue._fire(v_id, 'fired');
    ELSE
        PERFORM pgqueue._notify(q);
    END IF;
    RETURN v_id;
END
$$;

-- Members leaving the live table that nothing counted yet: 'poisoned' when
-- they went to the poison table in the same statement, else 'succeeded' (an
-- ack by delete, archive or pop). Every path that means another outcome
-- (complete_members, the purges) counts its members first, so they are
-- skipped here; nothing a session sets is read. Each gone row looks up its
-- member row and its poison row by one primary-key probe each.
CREATE FUNCTION pgqueue._members_gone() RETURNS trigger
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
      FROM gone g
     CROSS JOIN LATERAL (SELECT bm.outcome FROM pgqueue.barrier_member bm
                          WHERE bm.queue_id = g.queue_id AND bm.msg_id = g.msg_id LIMIT 1) bm
      LEFT JOIN LATERAL (SELECT x.reason FROM pgqueue.poison x
                          WHERE x.queue_id = g.queue_id AND x.msg_id = g.msg_id LIMIT 1) p ON true
     WHERE g.member_of IS NOT NULL AND bm.outcome IS NULL;
    IF v_msg_ids IS NOT NULL THEN
        PERFORM pgqueue._complete(v_queue_ids, v_msg_ids, v_outcomes, v_results);
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
CREATE FUNCTION pgqueue.complete_members(
    queue_name text,
    msg_ids bigint[],
    outcomes text[] DEFAULT NULL,
    results jsonb[] DEFAULT NULL,
    read_cts integer[] DEFAULT NULL,
    traceparents text[] DEFAULT NULL
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
       OR cardinality(complete_members.read_cts) <> v_n OR cardinality(v_traces) <> v_n THEN
        RAISE EXCEPTION 'msg_ids, outcomes, results, read_cts and traceparents must have the same length'
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
    IF complete_members.read_cts IS NOT NULL THEN
        -- The rows are locked: what this sees holds until we commit.
        SELECT coalesce(array_agg(u.msg_id ORDER BY u.ord), '{}'),
               coalesce(array_agg(u.outcome ORDER BY u.ord), '{}'),
               coalesce(array_agg(u.result ORDER BY u.ord), '{}'),
               coalesce(array_agg(u.tp ORDER BY u.ord), '{}')
          INTO v_ids, v_outcomes, v_results, v_traces
          FROM unnest(complete_members.msg_ids, v_outcomes, v_results, complete_members.read_cts, v_traces)
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
    FOR EACH STATEMENT EXECUTE FUNCTION pgqueue._members_gone();
