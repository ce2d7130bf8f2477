-- pgqueue 0002: barriers (fan-out / fan-in with exactly one callback) and
-- single-flight claims.
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
--   * Every path by which a member message leaves the live table counts it: an
--     explicit completion, a plain delete/archive/pop (succeeded), a poison drop
--     (poisoned, failed) and a purge (purged, failed), through one trigger. So
--     no barrier waits for a message that no longer exists; the deadline sweep
--     covers members that never finish.
--   * Lock order is always message rows, then member rows, then barrier rows
--     (in barrier_id order within a batch), so completions, poison drops and
--     sweeps do not deadlock in the common cases; the rare remaining ones abort
--     a transaction that changed nothing, and the client retries it.
--
-- Error codes: PGQ02 unknown barrier, PGQ03 barrier id reused with other members.

ALTER TABLE pgqueue.message ADD COLUMN member_of text;

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

-- ---------------------------------------------------------------------------
-- internals

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

-- Enqueue the one callback. The caller holds the barrier row lock and has just
-- taken `remaining` to 0 (or is the sweep that expired it).
CREATE FUNCTION pgqueue._fire(p_barrier_id text, p_state text) RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    b pgqueue.barrier;
    v_queue text;
    v_msg_id bigint;
BEGIN
    SELECT * INTO b FROM pgqueue.barrier WHERE barrier_id = p_barrier_id;
    SELECT queue_name INTO v_queue FROM pgqueue.queue WHERE queue_id = b.callback_queue_id;
    -- The transport marker tells the callback's handler it came through this
    -- at-least-once transport, so it can guard its side effects.
    v_msg_id := pgqueue.send(
        v_queue,
        b.callback_message,
        coalesce(b.headers, '{}'::jsonb) || jsonb_build_object(
            '_pg_transport', true,
            'barrier_id', b.barrier_id,
            'total', b.total,
            'succeeded', b.succeeded,
            'failed', b.failed,
            'state', p_state));
    UPDATE pgqueue.barrier
       SET state = p_state, fired_at = clock_timestamp(), callback_msg_id = v_msg_id
     WHERE barrier_id = p_barrier_id;
    RETURN v_msg_id;
END
$$;

-- Count completions of members (the single place that does), then fire the
-- barriers whose last member this was. Members already counted are skipped;
-- barrier rows are locked in barrier_id order, the order every path uses.
CREATE FUNCTION pgqueue._complete(p_queue_ids integer[], p_msg_ids bigint[], p_outcomes text[],
                                  p_results jsonb[])
RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    v_ids text[];
    v_counted integer[];
    v_ok integer[];
    v_remaining integer;
BEGIN
    WITH counted AS (
        UPDATE pgqueue.barrier_member bm
           SET outcome = i.outcome, result = i.result, completed_at = clock_timestamp()
          FROM (SELECT DISTINCT ON (u.queue_id, u.msg_id) u.queue_id, u.msg_id, u.outcome, u.result
                  FROM unnest(p_queue_ids, p_msg_ids, p_outcomes, p_results) WITH ORDINALITY
                       AS u (queue_id, msg_id, outcome, result, ord)
                 ORDER BY u.queue_id, u.msg_id, u.ord) AS i  -- listed twice: the first entry counts
         WHERE bm.queue_id = i.queue_id AND bm.msg_id = i.msg_id AND bm.outcome IS NULL
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

-- Any member message leaving the live table without an explicit completion is
-- counted here, with the outcome its way out implies. One call per statement,
-- so a multi-row delete counts all its members in one sorted pass (a per-row
-- trigger locked barriers in row order and deadlocked with batch completions).
CREATE FUNCTION pgqueue._members_gone() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    v_why text := current_setting('pgqueue.removal_reason', true);
    v_queue_ids integer[];
    v_msg_ids bigint[];
    v_outcomes text[];
    v_results jsonb[];
BEGIN
    IF v_why = 'completed' THEN
        RETURN NULL;  -- complete_members counted these itself
    END IF;
    SELECT array_agg(g.queue_id), array_agg(g.msg_id),
           array_agg(CASE WHEN p.msg_id IS NOT NULL THEN 'poisoned'
                          WHEN v_why = 'purged' THEN 'purged'
                          ELSE 'succeeded' END),  -- acked by delete, archive or pop
           array_agg(CASE WHEN p.msg_id IS NOT NULL THEN jsonb_build_object('reason', p.reason) END)
      INTO v_queue_ids, v_msg_ids, v_outcomes, v_results
      FROM gone g
      LEFT JOIN pgqueue.poison p ON p.queue_id = g.queue_id AND p.msg_id = g.msg_id
     WHERE g.member_of IS NOT NULL;
    IF v_msg_ids IS NOT NULL THEN
        PERFORM pgqueue._complete(v_queue_ids, v_msg_ids, v_outcomes, v_results);
    END IF;
    RETURN NULL;
END
$$;

CREATE TRIGGER message_members_gone
    AFTER DELETE ON pgqueue.message
    REFERENCING OLD TABLE AS gone
    FOR EACH STATEMENT EXECUTE FUNCTION pgqueue._members_gone();

-- A callback must have somewhere to go: a queue that open barriers call back
-- into cannot be dropped (checked before drop_queue touches anything).
CREATE OR REPLACE FUNCTION pgqueue._before_drop(q pgqueue.queue) RETURNS void
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

-- ---------------------------------------------------------------------------
-- fan-out and completion

CREATE FUNCTION pgqueue.fan_out(
    queue_name text,
    messages jsonb[],
    callback_queue text,
    callback_message jsonb,
    barrier_id text DEFAULT NULL,
    headers jsonb DEFAULT NULL,
    deadline_seconds integer DEFAULT NULL
) RETURNS text
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    q pgqueue.queue;
    cq pgqueue.queue;
    v_id text := coalesce(fan_out.barrier_id, gen_random_uuid()::text);
    v_n integer := cardinality(fan_out.messages);
    v_now timestamptz := clock_timestamp();
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

    INSERT INTO pgqueue.barrier (barrier_id, queue_id, callback_queue_id, callback_message, headers,
                                 total, remaining, deadline)
    VALUES (v_id, q.queue_id, cq.queue_id, fan_out.callback_message, fan_out.headers, v_n, v_n,
            v_now + make_interval(secs => fan_out.deadline_seconds))
    ON CONFLICT (barrier_id) DO NOTHING;
    IF NOT FOUND THEN
        -- The id exists: a retried fan_out (same shape) returns it and sends
        -- nothing; reusing an id for another fan-out is an error.
        SELECT * INTO old FROM pgqueue.barrier b WHERE b.barrier_id = v_id;
        IF old.total = v_n AND old.queue_id = q.queue_id AND old.callback_queue_id = cq.queue_id THEN
            RETURN v_id;
        END IF;
        RAISE EXCEPTION 'barrier "%" already exists with other members', v_id
            USING ERRCODE = 'PGQ03', HINT = 'Use a new barrier_id, or omit it to get a generated one.';
    END IF;

    WITH sent AS (
        INSERT INTO pgqueue.message (queue_id, msg_id, enqueued_at, vt, message, headers, member_of)
        SELECT q.queue_id, nextval(q.msg_seq), v_now, v_now, m.message,
               coalesce(fan_out.headers, '{}'::jsonb)
                   || jsonb_build_object('barrier_id', v_id, 'member_index', m.ord - 1),
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

CREATE FUNCTION pgqueue.complete_members(
    queue_name text,
    msg_ids bigint[],
    outcomes text[] DEFAULT NULL,
    results jsonb[] DEFAULT NULL
) RETURNS SETOF pgqueue.barrier_status
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    q pgqueue.queue := pgqueue._queue(complete_members.queue_name);
    v_outcomes text[];
    v_bad text;
BEGIN
    IF complete_members.msg_ids IS NULL THEN
        RAISE EXCEPTION 'msg_ids must not be NULL' USING ERRCODE = '22004';
    END IF;
    v_outcomes := coalesce(complete_members.outcomes,
                           array_fill('succeeded'::text, ARRAY[cardinality(complete_members.msg_ids)]));
    IF cardinality(v_outcomes) <> cardinality(complete_members.msg_ids)
       OR cardinality(complete_members.results) <> cardinality(complete_members.msg_ids) THEN
        RAISE EXCEPTION 'msg_ids, outcomes and results must have the same length' USING ERRCODE = '22023';
    END IF;
    SELECT o INTO v_bad FROM unnest(v_outcomes) o WHERE o IS NULL OR o NOT IN ('succeeded', 'failed') LIMIT 1;
    IF FOUND THEN
        RAISE EXCEPTION 'outcome must be ''succeeded'' or ''failed'', got %', quote_nullable(v_bad)
            USING ERRCODE = '22023';
    END IF;

    -- Lock order everywhere is message rows, then member rows, then barrier
    -- rows (a reader that poison-drops a member holds its message row when its
    -- trigger reaches the barrier), so take the message rows first.
    PERFORM 1 FROM pgqueue.message
      WHERE queue_id = q.queue_id AND msg_id = ANY (complete_members.msg_ids)
      ORDER BY msg_id FOR UPDATE;
    -- Record the outcomes, then ack: the ack's trigger then finds the members
    -- already counted and leaves them alone.
    PERFORM pgqueue._complete(array_fill(q.queue_id, ARRAY[cardinality(complete_members.msg_ids)]),
                              complete_members.msg_ids, v_outcomes,
                              coalesce(complete_members.results,
                                       array_fill(NULL::jsonb, ARRAY[cardinality(complete_members.msg_ids)])));
    PERFORM set_config('pgqueue.removal_reason', 'completed', true);
    DELETE FROM pgqueue.message WHERE queue_id = q.queue_id AND msg_id = ANY (complete_members.msg_ids);
    PERFORM set_config('pgqueue.removal_reason', '', true);

    RETURN QUERY
    SELECT s.* FROM (SELECT DISTINCT bm.barrier_id FROM pgqueue.barrier_member bm
                      WHERE bm.queue_id = q.queue_id AND bm.msg_id = ANY (complete_members.msg_ids)) d,
           LATERAL pgqueue._barrier_status(d.barrier_id) s
     ORDER BY s.barrier_id;
END
$$;

CREATE FUNCTION pgqueue.complete_member(
    queue_name text,
    msg_id bigint,
    outcome text DEFAULT 'succeeded',
    result jsonb DEFAULT NULL
) RETURNS jsonb
LANGUAGE sql AS $$
    -- The barrier's state after the completion, or NULL when the message is not
    -- a barrier member (it is acked all the same).
    SELECT to_jsonb(s)
      FROM pgqueue.complete_members(queue_name, ARRAY[msg_id], ARRAY[outcome], ARRAY[result]) s;
$$;

CREATE FUNCTION pgqueue.expire_barriers() RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    v_id text;
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
        WITH timed_out AS (
            UPDATE pgqueue.barrier_member m
               SET outcome = 'timed_out', completed_at = clock_timestamp()
             WHERE (m.barrier_id, m.member_index) IN (
                   SELECT x.barrier_id, x.member_index FROM pgqueue.barrier_member x
                    WHERE x.barrier_id = v_id AND x.outcome IS NULL
                      FOR UPDATE SKIP LOCKED)
               AND m.outcome IS NULL
            RETURNING 1
        )
        SELECT count(*) INTO v_n FROM timed_out;
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

-- ---------------------------------------------------------------------------
-- inspection

CREATE FUNCTION pgqueue.barrier_status(barrier_id text) RETURNS pgqueue.barrier_status
LANGUAGE sql STABLE AS $$
    SELECT pgqueue._barrier_or_raise(barrier_id);
$$;

CREATE FUNCTION pgqueue.barrier_results(barrier_id text) RETURNS SETOF pgqueue.member_result
LANGUAGE plpgsql STABLE AS $$
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
LANGUAGE plpgsql STABLE AS $$
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

-- ---------------------------------------------------------------------------
-- single-flight claims: one holder per key, leases for crash recovery,
-- tombstones so a late duplicate cannot re-run finished work

CREATE TABLE pgqueue.claim (
    key text PRIMARY KEY,
    owner text NOT NULL,
    state text NOT NULL CHECK (state IN ('held', 'finished')),
    lease_until timestamptz,
    claimed_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    finished_at timestamptz
);

CREATE TYPE pgqueue.claim_record AS (
    key text,
    owner text,
    state text,
    lease_until timestamptz,
    claimed_at timestamptz,
    finished_at timestamptz
);

CREATE FUNCTION pgqueue._check_claim_args(key text, owner text, lease_seconds integer) RETURNS void
LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    IF key IS NULL OR key = '' OR owner IS NULL OR owner = '' THEN
        RAISE EXCEPTION 'key and owner must be non-empty' USING ERRCODE = '22023';
    END IF;
    IF length(key) > 1000 OR length(owner) > 200 THEN
        RAISE EXCEPTION 'key (at most 1000 characters) or owner (at most 200) is too long'
            USING ERRCODE = '22023';
    END IF;
    IF lease_seconds IS NOT NULL AND lease_seconds < 1 THEN
        RAISE EXCEPTION 'lease_seconds must be >= 1, got %', lease_seconds USING ERRCODE = '22023';
    END IF;
END
$$;

CREATE FUNCTION pgqueue.claim(key text, owner text, lease_seconds integer) RETURNS boolean
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_now timestamptz := clock_timestamp();
BEGIN
    PERFORM pgqueue._check_claim_args(claim.key, claim.owner, coalesce(claim.lease_seconds, 0));
    -- One statement decides: a new key is taken; a held key is taken over only
    -- when its lease ran out (or we already hold it); a finished key never.
    INSERT INTO pgqueue.claim AS c (key, owner, state, lease_until, claimed_at)
    VALUES (claim.key, claim.owner, 'held', v_now + make_interval(secs => claim.lease_seconds), v_now)
    ON CONFLICT (key) DO UPDATE
       SET owner = EXCLUDED.owner, lease_until = EXCLUDED.lease_until, claimed_at = EXCLUDED.claimed_at
     WHERE c.state = 'held' AND (c.lease_until < v_now OR c.owner = EXCLUDED.owner);
    RETURN FOUND;
END
$$;

CREATE FUNCTION pgqueue.renew(key text, owner text, lease_seconds integer) RETURNS boolean
LANGUAGE plpgsql AS $$
#variable_conflict use_column
BEGIN
    PERFORM pgqueue._check_claim_args(renew.key, renew.owner, coalesce(renew.lease_seconds, 0));
    UPDATE pgqueue.claim
       SET lease_until = clock_timestamp() + make_interval(secs => renew.lease_seconds)
     WHERE key = renew.key AND owner = renew.owner AND state = 'held';
    RETURN FOUND;
END
$$;

CREATE FUNCTION pgqueue.release(key text, owner text) RETURNS boolean
LANGUAGE plpgsql AS $$
#variable_conflict use_column
BEGIN
    DELETE FROM pgqueue.claim WHERE key = release.key AND owner = release.owner AND state = 'held';
    RETURN FOUND;
END
$$;

CREATE FUNCTION pgqueue.finish_claim(key text, owner text) RETURNS boolean
LANGUAGE plpgsql AS $$
#variable_conflict use_column
BEGIN
    UPDATE pgqueue.claim
       SET state = 'finished', finished_at = clock_timestamp(), lease_until = NULL
     WHERE key = finish_claim.key AND owner = finish_claim.owner AND state = 'held';
    IF FOUND THEN
        RETURN true;
    END IF;
    -- Already finished by us: a retry after a lost reply still says so.
    RETURN EXISTS (SELECT 1 FROM pgqueue.claim
                    WHERE key = finish_claim.key AND owner = finish_claim.owner AND state = 'finished');
END
$$;

CREATE FUNCTION pgqueue.list_claims(qty integer DEFAULT 100) RETURNS SETOF pgqueue.claim_record
LANGUAGE sql STABLE AS $$
    SELECT c.key, c.owner, c.state, c.lease_until, c.claimed_at, c.finished_at
      FROM pgqueue.claim c ORDER BY c.claimed_at DESC LIMIT qty;
$$;

CREATE FUNCTION pgqueue.purge_claims(older_than_seconds integer) RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    n bigint;
BEGIN
    PERFORM pgqueue._require_nonnegative('older_than_seconds', older_than_seconds);
    DELETE FROM pgqueue.claim
     WHERE state = 'finished' AND finished_at < clock_timestamp() - make_interval(secs => older_than_seconds);
    GET DIAGNOSTICS n = ROW_COUNT;
    RETURN n;
END
$$;
