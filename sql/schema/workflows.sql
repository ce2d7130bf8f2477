-- pgqueue schema, as it stands now: workflows (named steps with dependencies,
-- each enqueued exactly once).
--
-- The exactly-once argument, in one place:
--   * Every enqueued step is a barrier (one member for a message step, N for
--     a fan-out step, under its failure policy). The barrier fires exactly
--     once (barriers.sql); for a step's barrier the firing resolves the step
--     (_step_done) instead of sending a callback.
--   * A resolution locks the workflow's row first, so the resolutions of one
--     workflow run one at a time: each takes its dependents' deps_left down
--     by one under that lock, and only the one that takes it to 0 enqueues
--     (or cancels) the dependent, moving it out of 'waiting' in the same
--     transaction. However many dependencies end at once, on however many
--     connections, a step is enqueued at most once, and exactly once when its
--     dependencies all end (the with_items incident).
--   * Lock order: message rows, member rows, barrier rows, then the workflow
--     row, as every completion already takes them; a resolution creates new
--     barriers and members but locks no existing one.
--   * The workflow ends when its last step has an outcome (and it is sealed):
--     the same transaction writes its state and its one final callback.

CREATE TABLE pgqueue.workflow (
    workflow_id text PRIMARY KEY,
    state text NOT NULL DEFAULT 'running'
        CHECK (state IN ('running', 'succeeded', 'failed', 'cancelled')),
    -- false while steps may still be grafted on (add_steps); it ends only sealed
    sealed boolean NOT NULL DEFAULT true,
    steps integer NOT NULL DEFAULT 0,
    steps_left integer NOT NULL DEFAULT 0 CHECK (steps_left >= 0),
    callback_queue_id integer,
    callback_message jsonb,
    headers jsonb,
    fingerprint bytea,
    -- cancel_workflow was called: it ends as cancelled
    cancel_requested boolean NOT NULL DEFAULT false,
    -- the start call's token: a retry of that call finds its run, even finished
    start_token uuid,
    created_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    finished_at timestamptz,
    callback_msg_id bigint,
    CHECK ((state = 'running') = (finished_at IS NULL))
);
CREATE INDEX workflow_running_idx ON pgqueue.workflow (created_at) WHERE state = 'running';
CREATE INDEX workflow_created_idx ON pgqueue.workflow (created_at);
-- drop_queue's check that no running workflow calls back into the queue
CREATE INDEX workflow_callback_queue_idx ON pgqueue.workflow (callback_queue_id)
    WHERE state = 'running';

CREATE TABLE pgqueue.workflow_step (
    workflow_id text NOT NULL REFERENCES pgqueue.workflow ON DELETE CASCADE,
    step text NOT NULL,
    queue_id integer NOT NULL,
    -- what it sends once its dependencies end: one message, or a fan-out's members
    messages jsonb[],
    fan_out boolean NOT NULL,
    headers jsonb,
    policy text,
    max_failures integer,
    max_failure_ratio double precision,
    -- cancel: a failed (or cancelled) dependency cancels it; run: it runs anyway
    on_dependency_failure text NOT NULL DEFAULT 'cancel'
        CHECK (on_dependency_failure IN ('cancel', 'run')),
    deps integer NOT NULL,
    deps_left integer NOT NULL CHECK (deps_left >= 0),
    deps_failed integer NOT NULL DEFAULT 0,
    state text NOT NULL DEFAULT 'waiting'
        CHECK (state IN ('waiting', 'enqueued', 'succeeded', 'failed', 'cancelled')),
    barrier_id text,
    added_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    enqueued_at timestamptz,
    finished_at timestamptz,
    PRIMARY KEY (workflow_id, step)
);
CREATE UNIQUE INDEX workflow_step_barrier_idx ON pgqueue.workflow_step (barrier_id);

-- step depends on depends_on; looked up by the step that ended
CREATE TABLE pgqueue.workflow_dep (
    workflow_id text NOT NULL,
    depends_on text NOT NULL,
    step text NOT NULL,
    PRIMARY KEY (workflow_id, depends_on, step),
    FOREIGN KEY (workflow_id, step) REFERENCES pgqueue.workflow_step ON DELETE CASCADE
);

CREATE TYPE pgqueue.workflow_status AS (
    workflow_id text,
    state text,
    sealed boolean,
    steps integer,
    steps_left integer,
    waiting integer,
    enqueued integer,
    succeeded integer,
    failed integer,
    cancelled integer,
    callback_queue text,
    callback_msg_id bigint,
    created_at timestamptz,
    finished_at timestamptz
);

CREATE TYPE pgqueue.workflow_step_status AS (
    step text,
    queue_name text,
    state text,
    depends_on text[],
    on_dependency_failure text,
    barrier_id text,
    total integer,
    succeeded integer,
    failed integer,
    cancelled integer,
    remaining integer,
    enqueued_at timestamptz,
    finished_at timestamptz
);

CREATE FUNCTION pgqueue._workflow_or_raise(p_workflow_id text) RETURNS pgqueue.workflow
LANGUAGE plpgsql STABLE AS $$
DECLARE
    w pgqueue.workflow;
BEGIN
    SELECT * INTO w FROM pgqueue.workflow x WHERE x.workflow_id = p_workflow_id;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'workflow "%" does not exist', p_workflow_id
            USING ERRCODE = 'PGQ05', HINT = 'List workflows with pgqueue.list_workflows().';
    END IF;
    RETURN w;
END
$$;

-- Sends a step whose dependencies have all ended: a barrier of its messages
-- (callback-less: its firing resolves the step), the step marked enqueued.
-- False, with the step failed, when its queue was dropped meanwhile: the
-- caller resolves it (a completion must never fail for a step it unblocks).
CREATE FUNCTION pgqueue._enqueue_step(s pgqueue.workflow_step) RETURNS boolean
LANGUAGE plpgsql AS $$
DECLARE
    q pgqueue.queue;
    v_bid text := gen_random_uuid()::text;
BEGIN
    SELECT * INTO q FROM pgqueue.queue x WHERE x.queue_id = s.queue_id FOR KEY SHARE;
    IF NOT FOUND THEN
        UPDATE pgqueue.workflow_step x
           SET state = 'failed', finished_at = clock_timestamp(), messages = NULL
         WHERE x.workflow_id = s.workflow_id AND x.step = s.step;
        RETURN false;
    END IF;
    PERFORM pgqueue._arm(q.queue_name, s.messages, q.queue_name, '{}'::jsonb, v_bid, s.headers,
                         NULL, s.policy, s.max_failures, s.max_failure_ratio, true, NULL, NULL,
                         s.workflow_id, s.step);
    UPDATE pgqueue.workflow_step x
       SET state = 'enqueued', barrier_id = v_bid, enqueued_at = clock_timestamp(), messages = NULL
     WHERE x.workflow_id = s.workflow_id AND x.step = s.step;
    RETURN true;
END
$$;

-- Resolves steps that ended (p_steps, with their states), with the workflow's
-- row locked by the caller: each dependent's deps_left goes down by one; one
-- that reaches 0 is enqueued, or cancelled (a dependency failed and it does
-- not run anyway), which resolves it in turn. A worklist, not recursion: a
-- chain of a thousand cancelled steps is one loop. The workflow ends when its
-- last step has, and it is sealed.
CREATE FUNCTION pgqueue._resolve(w pgqueue.workflow, p_steps text[], p_states text[]) RETURNS void
LANGUAGE plpgsql
SET enable_seqscan = off
AS $$
DECLARE
    v_steps text[] := p_steps;
    v_states text[] := p_states;
    v_i integer := 1;
    d pgqueue.workflow_step;
BEGIN
    WHILE v_i <= coalesce(cardinality(v_steps), 0) LOOP
        FOR d IN
            UPDATE pgqueue.workflow_step x
               SET deps_left = x.deps_left - 1,
                   deps_failed = x.deps_failed + (v_states[v_i] <> 'succeeded')::integer
              FROM pgqueue.workflow_dep e
             WHERE e.workflow_id = w.workflow_id AND e.depends_on = v_steps[v_i]
               AND x.workflow_id = w.workflow_id AND x.step = e.step AND x.state = 'waiting'
            RETURNING x.*
        LOOP
            IF d.deps_left = 0 THEN
                IF d.deps_failed > 0 AND d.on_dependency_failure = 'cancel' THEN
                    UPDATE pgqueue.workflow_step x
                       SET state = 'cancelled', finished_at = clock_timestamp(), messages = NULL
                     WHERE x.workflow_id = d.workflow_id AND x.step = d.step;
                    v_steps := v_steps || d.step;
                    v_states := v_states || 'cancelled'::text;
                ELSIF NOT pgqueue._enqueue_step(d) THEN
                    v_steps := v_steps || d.step;
                    v_states := v_states || 'failed'::text;
                END IF;
            END IF;
        END LOOP;
        v_i := v_i + 1;
    END LOOP;
    UPDATE pgqueue.workflow x SET steps_left = x.steps_left - cardinality(v_steps)
     WHERE x.workflow_id = w.workflow_id
    RETURNING * INTO w;
    PERFORM pgqueue._finish_if_done(w);
END
$$;

-- Ends a sealed workflow whose steps all have an outcome: its state
-- (succeeded when every step succeeded, else failed; cancelled stays) and
-- its one final callback, with every step's state, in this transaction.
CREATE FUNCTION pgqueue._finish_if_done(w pgqueue.workflow) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    q pgqueue.queue;
    v_steps jsonb;
    v_state text;
    v_msg_id bigint;
    v_now timestamptz := clock_timestamp();
BEGIN
    IF w.steps_left > 0 OR NOT w.sealed OR w.finished_at IS NOT NULL THEN
        RETURN;
    END IF;
    SELECT jsonb_object_agg(s.step, s.state), bool_and(s.state = 'succeeded')
      INTO v_steps, v_state
      FROM pgqueue.workflow_step s WHERE s.workflow_id = w.workflow_id;
    v_state := CASE WHEN w.cancel_requested THEN 'cancelled'
                    WHEN v_state IS NULL OR v_state::boolean THEN 'succeeded'
                    ELSE 'failed' END;
    IF w.callback_queue_id IS NOT NULL THEN
        SELECT * INTO q FROM pgqueue.queue x WHERE x.queue_id = w.callback_queue_id;
        IF FOUND THEN
            INSERT INTO pgqueue.message (queue_id, msg_id, enqueued_at, vt, message, headers)
            VALUES (q.queue_id, nextval(q.msg_seq), v_now, v_now, w.callback_message,
                    pgqueue._callback_headers(w.headers,
                                              jsonb_build_object('kind', 'workflow',
                                                                 'workflow_id', w.workflow_id,
                                                                 'state', v_state,
                                                                 'steps', coalesce(v_steps, '{}'::jsonb)),
                                              NULL))
            RETURNING msg_id INTO v_msg_id;
            PERFORM pgqueue._notify(q);
        END IF;
    END IF;
    UPDATE pgqueue.workflow x
       SET state = v_state, finished_at = v_now, callback_msg_id = v_msg_id
     WHERE x.workflow_id = w.workflow_id;
END
$$;

-- Called by a step barrier's firing: the step ends as its barrier did.
CREATE FUNCTION pgqueue._step_done(p_workflow_id text, p_step text, p_outcome text) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    w pgqueue.workflow;
    v_state text := CASE WHEN p_outcome = 'succeeded' THEN 'succeeded' ELSE 'failed' END;
BEGIN
    SELECT * INTO w FROM pgqueue.workflow x WHERE x.workflow_id = p_workflow_id FOR UPDATE;
    UPDATE pgqueue.workflow_step x SET state = v_state, finished_at = clock_timestamp()
     WHERE x.workflow_id = p_workflow_id AND x.step = p_step AND x.state = 'enqueued';
    IF FOUND THEN
        PERFORM pgqueue._resolve(w, ARRAY[p_step], ARRAY[v_state]);
    END IF;
END
$$;

-- Adds steps to a workflow whose row the caller holds: each is a JSON object
-- {"step", "queue", "message" | "messages" (a fan-out), "depends_on": [...],
-- "headers", "policy", "max_failures", "max_failure_ratio",
-- "on_dependency_failure"}. A dependency names a step already in the workflow
-- or earlier in the list (so there is no cycle). Steps whose dependencies all
-- ended are enqueued (or cancelled) now.
CREATE FUNCTION pgqueue._add_steps(w pgqueue.workflow, p_steps jsonb) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    e jsonb;
    v_name text;
    v_deps text[];
    v_missing text;
    q pgqueue.queue;
    v_messages jsonb[];
    v_left integer;
    v_failed integer;
    v_ready text[] := '{}';
    v_cancel text[] := '{}';
    v_policy text;
    v_failed_now text[];
    v_n integer := 0;
BEGIN
    IF jsonb_typeof(p_steps) IS DISTINCT FROM 'array' THEN
        RAISE EXCEPTION 'steps must be a JSON array of step objects' USING ERRCODE = '22023';
    END IF;
    FOR e IN SELECT x FROM jsonb_array_elements(p_steps) AS x LOOP
        v_name := e ->> 'step';
        IF jsonb_typeof(e) <> 'object' OR v_name IS NULL OR v_name = '' OR length(v_name) > 200 THEN
            RAISE EXCEPTION 'each step needs a "step" name of 1 to 200 characters, got %', left(e::text, 200)
                USING ERRCODE = '22023';
        END IF;
        IF e ? 'message' = e ? 'messages' THEN
            RAISE EXCEPTION 'step "%" needs either "message" or "messages" (a fan-out), not both', v_name
                USING ERRCODE = '22023';
        END IF;
        IF e ? 'messages' AND (jsonb_typeof(e -> 'messages') <> 'array'
                               OR jsonb_array_length(e -> 'messages') = 0) THEN
            RAISE EXCEPTION 'step "%": "messages" must be a non-empty array', v_name
                USING ERRCODE = '22023';
        END IF;
        IF e ? 'depends_on' AND jsonb_typeof(e -> 'depends_on') <> 'array' THEN
            RAISE EXCEPTION 'step "%": "depends_on" must be an array of step names', v_name
                USING ERRCODE = '22023';
        END IF;
        PERFORM pgqueue._require_headers(e -> 'headers');
        v_deps := ARRAY(SELECT DISTINCT d FROM jsonb_array_elements_text(coalesce(e -> 'depends_on', '[]')) d);
        SELECT d INTO v_missing FROM unnest(v_deps) d
         WHERE NOT EXISTS (SELECT FROM pgqueue.workflow_step s
                            WHERE s.workflow_id = w.workflow_id AND s.step = d)
         LIMIT 1;
        IF FOUND THEN
            RAISE EXCEPTION 'step "%" depends on "%", which is not in workflow "%" (yet)', v_name, v_missing,
                w.workflow_id USING ERRCODE = '22023',
                HINT = 'Add a step after the steps it depends on.';
        END IF;
        q := pgqueue._queue_locked(e ->> 'queue');
        v_messages := CASE WHEN e ? 'messages'
                           THEN ARRAY(SELECT x FROM jsonb_array_elements(e -> 'messages') AS x)
                           ELSE ARRAY[e -> 'message'] END;
        PERFORM pgqueue._require_all_decodable(format('step "%s" messages', v_name), v_messages);
        v_policy := coalesce(e ->> 'policy',
                             CASE WHEN e ? 'max_failures' OR e ? 'max_failure_ratio'
                                  THEN 'max_failures' ELSE 'wait_all' END);
        PERFORM pgqueue._require_policy(v_policy, (e ->> 'max_failures')::integer,
                                        (e ->> 'max_failure_ratio')::double precision);
        IF coalesce(e ->> 'on_dependency_failure', 'cancel') NOT IN ('cancel', 'run') THEN
            RAISE EXCEPTION 'step "%": on_dependency_failure must be cancel or run', v_name
                USING ERRCODE = '22023';
        END IF;
        SELECT count(*) FILTER (WHERE s.state IN ('waiting', 'enqueued')),
               count(*) FILTER (WHERE s.state IN ('failed', 'cancelled'))
          INTO v_left, v_failed
          FROM pgqueue.workflow_step s
         WHERE s.workflow_id = w.workflow_id AND s.step = ANY (v_deps);
        BEGIN
            INSERT INTO pgqueue.workflow_step (workflow_id, step, queue_id, messages, fan_out, headers,
                                               policy, max_failures, max_failure_ratio,
                                               on_dependency_failure, deps, deps_left, deps_failed)
            VALUES (w.workflow_id, v_name, q.queue_id, v_messages, e ? 'messages', e -> 'headers',
                    v_policy, (e ->> 'max_failures')::integer, (e ->> 'max_failure_ratio')::double precision,
                    coalesce(e ->> 'on_dependency_failure', 'cancel'), cardinality(v_deps), v_left, v_failed);
        EXCEPTION WHEN unique_violation THEN
            RAISE EXCEPTION 'workflow "%" already has a step "%"', w.workflow_id, v_name
                USING ERRCODE = 'PGQ04';
        END;
        INSERT INTO pgqueue.workflow_dep (workflow_id, depends_on, step)
        SELECT w.workflow_id, d, v_name FROM unnest(v_deps) d;
        v_n := v_n + 1;
        IF v_left = 0 THEN
            IF v_failed > 0 AND coalesce(e ->> 'on_dependency_failure', 'cancel') = 'cancel' THEN
                v_cancel := v_cancel || v_name;
            ELSE
                v_ready := v_ready || v_name;
            END IF;
        END IF;
    END LOOP;
    UPDATE pgqueue.workflow x SET steps = x.steps + v_n, steps_left = x.steps_left + v_n
     WHERE x.workflow_id = w.workflow_id;
    UPDATE pgqueue.workflow_step x SET state = 'cancelled', finished_at = clock_timestamp(),
                                       messages = NULL
     WHERE x.workflow_id = w.workflow_id AND x.step = ANY (v_cancel);
    v_failed_now := ARRAY(SELECT s.step FROM pgqueue.workflow_step s
                           WHERE s.workflow_id = w.workflow_id AND s.step = ANY (v_ready)
                             AND NOT pgqueue._enqueue_step(s));
    IF cardinality(v_cancel) + cardinality(v_failed_now) > 0 THEN
        SELECT * INTO w FROM pgqueue.workflow x WHERE x.workflow_id = w.workflow_id;
        PERFORM pgqueue._resolve(w, v_cancel || v_failed_now,
                                 array_fill('cancelled'::text, ARRAY[cardinality(v_cancel)])
                                 || array_fill('failed'::text, ARRAY[cardinality(v_failed_now)]));
    END IF;
END
$$;

-- Starts a workflow: its steps (see _add_steps), its optional final callback,
-- all in one transaction; its id. The id is unique while the workflow runs
-- (single flight: "is a run of A pending?" is one lookup). The same request
-- again returns the id while it runs; any other for a running id raises
-- PGQ04. A call with a start_token (the client makes one per call) that
-- finds its own run returns the id, even once that run finished: a retry
-- after a lost reply never starts a second run. Otherwise a finished
-- workflow's id may start again, its old rows gone. With sealed => false,
-- steps may be grafted on with add_steps until seal_workflow.
CREATE FUNCTION pgqueue.start_workflow(
    workflow_id text,
    steps jsonb,
    callback_queue text DEFAULT NULL,
    callback_message jsonb DEFAULT '{}',
    headers jsonb DEFAULT NULL,
    sealed boolean DEFAULT true,
    start_token uuid DEFAULT NULL
) RETURNS text
LANGUAGE plpgsql
SECURITY DEFINER SET search_path = pg_catalog, pgqueue, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    w pgqueue.workflow;
    cq pgqueue.queue;
    v_print bytea;
BEGIN
    IF start_workflow.workflow_id IS NULL OR start_workflow.workflow_id = ''
       OR length(start_workflow.workflow_id) > 200 THEN
        RAISE EXCEPTION 'workflow_id must be 1 to 200 characters' USING ERRCODE = '22023';
    END IF;
    PERFORM pgqueue._require_headers(start_workflow.headers);
    PERFORM pgqueue._require_decodable('callback_message', start_workflow.callback_message);
    IF start_workflow.callback_queue IS NOT NULL THEN
        cq := pgqueue._queue_locked(start_workflow.callback_queue);
    END IF;
    v_print := sha256(convert_to(jsonb_build_array(start_workflow.steps, start_workflow.callback_queue,
                                                   start_workflow.callback_message, start_workflow.headers,
                                                   start_workflow.sealed)::text, 'UTF8'));
    FOR attempt IN 1..3 LOOP
        INSERT INTO pgqueue.workflow (workflow_id, sealed, callback_queue_id, callback_message, headers,
                                      fingerprint, start_token)
        VALUES (start_workflow.workflow_id, start_workflow.sealed, cq.queue_id,
                coalesce(start_workflow.callback_message, '{}'), start_workflow.headers, v_print,
                start_workflow.start_token)
        ON CONFLICT (workflow_id) DO NOTHING
        RETURNING * INTO w;
        EXIT WHEN FOUND;
        SELECT * INTO w FROM pgqueue.workflow x WHERE x.workflow_id = start_workflow.workflow_id FOR UPDATE;
        CONTINUE WHEN NOT FOUND;  -- finished and restarted by another session meanwhile: look again
        IF w.start_token = start_workflow.start_token THEN
            RETURN w.workflow_id;  -- this very call, retried: its run, running or not
        END IF;
        IF w.state = 'running' THEN
            IF w.fingerprint = v_print THEN
                RETURN w.workflow_id;  -- this very request, retried
            END IF;
            RAISE EXCEPTION 'workflow "%" is running', start_workflow.workflow_id
                USING ERRCODE = 'PGQ04',
                      HINT = 'One run per workflow id at a time: wait for it to finish, or cancel it.';
        END IF;
        DELETE FROM pgqueue.workflow x WHERE x.workflow_id = w.workflow_id;  -- a finished run: replaced
    END LOOP;
    IF w.workflow_id IS NULL THEN
        RAISE EXCEPTION 'workflow "%" is being started by another session', start_workflow.workflow_id
            USING ERRCODE = 'PGQ04';
    END IF;
    PERFORM pgqueue._add_steps(w, start_workflow.steps);
    SELECT * INTO w FROM pgqueue.workflow x WHERE x.workflow_id = w.workflow_id;
    PERFORM pgqueue._finish_if_done(w);
    RETURN w.workflow_id;
END
$$;

-- Grafts steps onto a running workflow that is not sealed, in the caller's
-- transaction (a step's handler may add the steps it found). A dependency
-- that already ended counts as ended. PGQ04 once sealed or finished.
CREATE FUNCTION pgqueue.add_steps(workflow_id text, steps jsonb) RETURNS void
LANGUAGE plpgsql
SECURITY DEFINER SET search_path = pg_catalog, pgqueue, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    w pgqueue.workflow := pgqueue._workflow_or_raise(add_steps.workflow_id);
BEGIN
    SELECT * INTO w FROM pgqueue.workflow x WHERE x.workflow_id = add_steps.workflow_id FOR UPDATE;
    IF w.state <> 'running' OR w.sealed THEN
        RAISE EXCEPTION 'workflow "%" is %: no more steps can be added', w.workflow_id,
            CASE WHEN w.state <> 'running' THEN w.state ELSE 'sealed' END
            USING ERRCODE = 'PGQ04', HINT = 'Add steps before seal_workflow().';
    END IF;
    PERFORM pgqueue._add_steps(w, add_steps.steps);
END
$$;

-- No more steps will be added: the workflow ends when its last step has an
-- outcome (now, if all have). Its status after.
CREATE FUNCTION pgqueue.seal_workflow(workflow_id text) RETURNS pgqueue.workflow_status
LANGUAGE plpgsql
SECURITY DEFINER SET search_path = pg_catalog, pgqueue, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    w pgqueue.workflow := pgqueue._workflow_or_raise(seal_workflow.workflow_id);
BEGIN
    UPDATE pgqueue.workflow x SET sealed = true
     WHERE x.workflow_id = seal_workflow.workflow_id AND x.state = 'running' AND NOT x.sealed
    RETURNING * INTO w;
    IF FOUND THEN
        PERFORM pgqueue._finish_if_done(w);
    END IF;
    RETURN pgqueue._workflow_status(seal_workflow.workflow_id);
END
$$;

-- Cancels a running workflow: its waiting steps are cancelled now, and so are
-- its enqueued steps, whose members that have not started (no live lease)
-- are cancelled as a failing barrier cancels them; members running finish,
-- recorded on their rows. The workflow ends as cancelled now, with its final
-- callback. Barrier rows are locked before the workflow's, the order
-- completions take them in; a step enqueued by a transaction that commits
-- while this waits for the workflow's row is found again under that lock,
-- its barrier locked without waiting (or the attempt starts over, its locks
-- given back). Its status after; a finished one is left alone.
CREATE FUNCTION pgqueue.cancel_workflow(workflow_id text) RETURNS pgqueue.workflow_status
LANGUAGE plpgsql
SET enable_seqscan = off
SECURITY DEFINER SET search_path = pg_catalog, pgqueue, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    w pgqueue.workflow := pgqueue._workflow_or_raise(cancel_workflow.workflow_id);
    v_bids text[];
    v_new text[];
    v_bid text;
    v_steps text[];
BEGIN
    FOR attempt IN 1..100 LOOP
        BEGIN  -- an attempt: a subtransaction, whose locks go when it starts over
            v_bids := ARRAY(SELECT b.barrier_id FROM pgqueue.barrier b
                             WHERE b.barrier_id IN (SELECT s.barrier_id FROM pgqueue.workflow_step s
                                                     WHERE s.workflow_id = cancel_workflow.workflow_id
                                                       AND s.state = 'enqueued')
                               AND b.state = 'open'
                             ORDER BY b.barrier_id FOR UPDATE);
            SELECT * INTO w FROM pgqueue.workflow x WHERE x.workflow_id = cancel_workflow.workflow_id FOR UPDATE;
            IF w.state <> 'running' THEN
                RETURN pgqueue._workflow_status(w.workflow_id);
            END IF;
            -- With the workflow's row ours, no step can be enqueued any more;
            -- but one enqueued by a transaction that committed while we waited
            -- for the row has a barrier the first statement did not see. Lock
            -- it now without waiting (we hold the workflow's row, which a
            -- completion holding that barrier may be waiting for), or start over.
            v_new := ARRAY(SELECT b.barrier_id FROM pgqueue.barrier b
                            WHERE b.barrier_id IN (SELECT s.barrier_id FROM pgqueue.workflow_step s
                                                    WHERE s.workflow_id = w.workflow_id
                                                      AND s.state = 'enqueued')
                              AND b.state = 'open' AND b.barrier_id <> ALL (v_bids)
                            ORDER BY b.barrier_id FOR UPDATE NOWAIT);
            v_bids := v_bids || v_new;
            UPDATE pgqueue.workflow x SET cancel_requested = true, sealed = true
             WHERE x.workflow_id = w.workflow_id;
            v_steps := ARRAY(SELECT s.step FROM pgqueue.workflow_step s
                              WHERE s.workflow_id = w.workflow_id AND s.state IN ('waiting', 'enqueued')
                              ORDER BY s.step);
            UPDATE pgqueue.workflow_step x SET state = 'cancelled', finished_at = clock_timestamp(), messages = NULL
             WHERE x.workflow_id = w.workflow_id AND x.step = ANY (v_steps);
            -- the barriers of the steps that were enqueued: what has not started
            -- leaves; one with nothing left running fires now (its step is resolved
            -- already, so the firing changes nothing more)
            FOREACH v_bid IN ARRAY v_bids LOOP
                PERFORM pgqueue._cancel_pending(v_bid);
                IF (SELECT b.remaining = 0 FROM pgqueue.barrier b WHERE b.barrier_id = v_bid) THEN
                    PERFORM pgqueue._fire(v_bid, 'fired');
                END IF;
            END LOOP;
            SELECT * INTO w FROM pgqueue.workflow x WHERE x.workflow_id = w.workflow_id;
            PERFORM pgqueue._resolve(w, v_steps, array_fill('cancelled'::text, ARRAY[cardinality(v_steps)]));
            RETURN pgqueue._workflow_status(w.workflow_id);
        EXCEPTION WHEN lock_not_available THEN
            -- a new step's barrier is busy: give our locks back and start over
            PERFORM pg_sleep(0.001 * least(attempt, 50));
        END;
    END LOOP;
    RAISE EXCEPTION 'could not cancel workflow "%": its steps kept being completed', cancel_workflow.workflow_id
        USING ERRCODE = '55000', HINT = 'Call cancel_workflow again.';
END
$$;

CREATE FUNCTION pgqueue._workflow_status(p_workflow_id text) RETURNS pgqueue.workflow_status
LANGUAGE sql STABLE AS $$
    SELECT w.workflow_id, w.state, w.sealed, w.steps, w.steps_left,
           count(*) FILTER (WHERE s.state = 'waiting')::integer,
           count(*) FILTER (WHERE s.state = 'enqueued')::integer,
           count(*) FILTER (WHERE s.state = 'succeeded')::integer,
           count(*) FILTER (WHERE s.state = 'failed')::integer,
           count(*) FILTER (WHERE s.state = 'cancelled')::integer,
           cq.queue_name, w.callback_msg_id, w.created_at, w.finished_at
      FROM pgqueue._workflow_or_raise(p_workflow_id) w
      LEFT JOIN pgqueue.workflow_step s ON s.workflow_id = w.workflow_id
      LEFT JOIN pgqueue.queue cq ON cq.queue_id = w.callback_queue_id
     GROUP BY w.workflow_id, w.state, w.sealed, w.steps, w.steps_left, cq.queue_name,
              w.callback_msg_id, w.created_at, w.finished_at;
$$;

-- A workflow's progress: its state and how many steps are in each state.
CREATE FUNCTION pgqueue.workflow_status(workflow_id text) RETURNS pgqueue.workflow_status
LANGUAGE sql STABLE
SECURITY DEFINER SET search_path = pg_catalog, pgqueue, pg_temp
AS $$
    SELECT pgqueue._workflow_status(workflow_id);
$$;

-- Every step of a workflow, by name: its state, dependencies and its barrier's counts.
CREATE FUNCTION pgqueue.workflow_steps(workflow_id text) RETURNS SETOF pgqueue.workflow_step_status
LANGUAGE plpgsql STABLE
SECURITY DEFINER SET search_path = pg_catalog, pgqueue, pg_temp
AS $$
#variable_conflict use_column
BEGIN
    PERFORM pgqueue._workflow_or_raise(workflow_steps.workflow_id);
    RETURN QUERY
    SELECT s.step, q.queue_name, s.state,
           ARRAY(SELECT e.depends_on FROM pgqueue.workflow_dep e
                  WHERE e.workflow_id = s.workflow_id AND e.step = s.step ORDER BY e.depends_on),
           s.on_dependency_failure, s.barrier_id,
           coalesce(b.total, cardinality(s.messages)), b.succeeded, b.failed, b.cancelled, b.remaining,
           s.enqueued_at, s.finished_at
      FROM pgqueue.workflow_step s
      LEFT JOIN pgqueue.queue q ON q.queue_id = s.queue_id
      LEFT JOIN pgqueue.barrier b ON b.barrier_id = s.barrier_id
     WHERE s.workflow_id = workflow_steps.workflow_id
     ORDER BY s.added_at, s.step;
END
$$;

-- The workflow step each of these barriers is (a step sends its messages as
-- the members of a barrier with a generated id), for the ones that are a
-- step; the others are left out. One probe of the steps' barrier index each.
CREATE FUNCTION pgqueue.barrier_steps(barrier_ids text[])
RETURNS TABLE (barrier_id text, workflow_id text, step text)
LANGUAGE sql STABLE
SECURITY DEFINER SET search_path = pg_catalog, pgqueue, pg_temp
AS $$
    SELECT s.barrier_id, s.workflow_id, s.step
      FROM pgqueue.workflow_step s
     WHERE s.barrier_id = ANY (barrier_steps.barrier_ids)
     ORDER BY s.barrier_id;
$$;

-- The results of one step's members, by member index: how a step reads what
-- its dependencies returned, by reference (never copied into payloads).
CREATE FUNCTION pgqueue.step_results(workflow_id text, step text) RETURNS SETOF pgqueue.member_result
LANGUAGE plpgsql STABLE
SECURITY DEFINER SET search_path = pg_catalog, pgqueue, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_bid text;
BEGIN
    PERFORM pgqueue._workflow_or_raise(step_results.workflow_id);
    SELECT s.barrier_id INTO v_bid FROM pgqueue.workflow_step s
     WHERE s.workflow_id = step_results.workflow_id AND s.step = step_results.step;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'workflow "%" has no step "%"', step_results.workflow_id, step_results.step
            USING ERRCODE = 'PGQ05';
    END IF;
    RETURN QUERY
    SELECT m.member_index, m.msg_id, m.outcome, m.result, m.completed_at
      FROM pgqueue.barrier_member m WHERE m.barrier_id = v_bid ORDER BY m.member_index;
END
$$;

-- The newest workflows, optionally only those in one state.
CREATE FUNCTION pgqueue.list_workflows(state text DEFAULT NULL, qty integer DEFAULT 100)
RETURNS SETOF pgqueue.workflow_status
LANGUAGE plpgsql STABLE
SECURITY DEFINER SET search_path = pg_catalog, pgqueue, pg_temp
AS $$
#variable_conflict use_column
BEGIN
    IF list_workflows.state IS NOT NULL
       AND list_workflows.state NOT IN ('running', 'succeeded', 'failed', 'cancelled') THEN
        RAISE EXCEPTION 'state must be running, succeeded, failed or cancelled, got %',
            quote_literal(list_workflows.state) USING ERRCODE = '22023';
    END IF;
    PERFORM pgqueue._require_nonnegative('qty', list_workflows.qty);
    RETURN QUERY
    SELECT s.*
      FROM (SELECT w.workflow_id FROM pgqueue.workflow w
             WHERE list_workflows.state IS NULL OR w.state = list_workflows.state
             ORDER BY w.created_at DESC, w.workflow_id
             LIMIT list_workflows.qty) ids,
           LATERAL pgqueue._workflow_status(ids.workflow_id) s
     ORDER BY s.created_at DESC, s.workflow_id;
END
$$;
