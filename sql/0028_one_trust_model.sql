-- pgqueue 0028: one rule for the headers of every message pgqueue makes, no
-- document that its readers cannot decode, and three races closed.
--
-- An adversarial review found that a producer could forge a callback of the
-- other kind: a workflow's final callback was its caller's headers merged
-- with pgqueue's keys (barrier_id, total, state, ...), and a barrier's the
-- same way, so a workflow with no steps, started with the headers of a
-- victim's barrier callback, sent a message that passed for it. The keys
-- pgqueue wrote and the keys a caller wrote shared one namespace; that is
-- the root, and it is closed here rather than patched per kind:
--
-- * The one header rule (docs/security.md, "What a handler may trust"). A
--   caller's header keys never start with _pg_: every entry that takes
--   headers checks them (_require_headers). Every key pgqueue writes starts
--   with _pg_, and is written by one of the functions below and by nothing
--   else: _member_headers (a barrier member: _pg_member, and on a workflow
--   step's message _pg_step), _callback_headers (a callback: _pg_transport
--   and _pg_callback, whose "kind" says barrier or workflow) and
--   _trace_headers (_pg_traceparent, _pg_tracestate). A caller's headers
--   travel on members and callbacks as they are, beside pgqueue's keys: the
--   two sets cannot meet. tests/sql/test_header_rule.py lists every function
--   whose source names a _pg_ key and fails on one it does not know.
-- * Messages made before this migration are rewritten where pgqueue's own
--   rows say what they are: members (member_of), barrier callbacks and
--   workflow callbacks (their callback_msg_id), live and in the poison table
--   (a requeue brings those back). Their old plain keys go; a caller's keys stay.
--
-- Documents Python cannot decode. Postgres stores JSON nested 3,000 deep and
-- numbers of 5,000 digits; Python's json raises on both (RecursionError past
-- about 1,000 levels, ValueError past 4,300 digits), and one such message
-- took down every worker of its queue. Every entry that takes a message, a
-- member, a callback message or headers now refuses a document nested more
-- than 255 levels deep (_undecodable, _require_decodable; 22023), which no
-- decoder can be relied on to read; the check walks only a document larger
-- than 2 kB, which every one that deep is. A long number is no decoder's
-- limit but Python's default: pgqueue's Python readers read it exactly. And
-- they survive a document that got in some other way (an older version, an
-- import, a direct write): docs/reliability.md.
--
-- Races and smaller fixes:
-- * cancel_workflow listed the barriers to cancel in its first statement,
--   before it locked the workflow's row: a step enqueued by a completion (or
--   add_steps) that committed while it waited for that row had a barrier it
--   never saw, and that step's message stayed in the queue, marked cancelled.
--   It now lists them again under the workflow's lock and locks any new one
--   without waiting, starting over (its locks given back) if one is busy.
-- * drop_queue refuses a queue that a running workflow calls back into (55006,
--   as for open barriers); before, the final callback was silently lost.
-- * poison_page builds a payload's preview only when the payload is small: a
--   page of huge payloads no longer reads them whole (it says their size).
--
-- Every statement can run again over its own result.

------------------------------------------------------------------------------
-- Documents every reader can decode
------------------------------------------------------------------------------

-- True when a JSON document is nested more than 255 levels deep (a value
-- lies inside 256 arrays or objects), which readers cannot decode: Python's
-- json stops near 1,000 levels, less deep in a deep stack, other decoders
-- sooner. Such a document takes more than 2 kB (8 bytes a level at least),
-- so a smaller one, uncompressed, is never walked. NULL for NULL. Inlined
-- (STABLE, as the size functions are: an IMMUTABLE one would not be).
CREATE OR REPLACE FUNCTION pgqueue._undecodable(doc jsonb) RETURNS boolean
LANGUAGE sql STABLE PARALLEL SAFE
AS $$
    SELECT (pg_column_size(doc) > 2048 OR pg_column_compression(doc) IS NOT NULL)
           AND jsonb_path_exists(doc, 'strict $.**{256}');
$$;

-- Raises 22023 naming `what` when a document is _undecodable.
CREATE OR REPLACE FUNCTION pgqueue._require_decodable(what text, doc jsonb) RETURNS void
LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    IF pgqueue._undecodable(doc) THEN
        RAISE EXCEPTION '% is nested more than 255 levels deep', what
            USING ERRCODE = '22023',
                  HINT = 'Readers cannot decode it (Python''s json stops near 1,000 levels, other decoders'
                         ' sooner). Flatten it, or send the deep part as a string.';
    END IF;
END
$$;

-- The document, when it is not _undecodable; else raises as _require_decodable.
-- For a statement that checks each row as it goes (send_batch).
CREATE OR REPLACE FUNCTION pgqueue._decodable_or_raise(what text, doc jsonb) RETURNS jsonb
LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    PERFORM pgqueue._require_decodable(what, doc);
    RETURN doc;
END
$$;

-- Raises 22023 at the first of docs that is _undecodable, naming it what[i]
-- (from 1, as Postgres counts an array's elements).
CREATE OR REPLACE FUNCTION pgqueue._require_all_decodable(what text, docs jsonb[]) RETURNS void
LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    v_bad bigint;
BEGIN
    IF EXISTS (SELECT 1 FROM unnest(docs) AS d (doc) WHERE pgqueue._undecodable(d.doc)) THEN
        SELECT d.ord INTO v_bad FROM unnest(docs) WITH ORDINALITY AS d (doc, ord)
         WHERE pgqueue._undecodable(d.doc) ORDER BY d.ord LIMIT 1;
        PERFORM pgqueue._require_decodable(format('%s[%s]', what, v_bad), docs[v_bad]);
    END IF;
END
$$;

-- Why a caller's headers are refused, or NULL when they are not: not a JSON
-- object, or a key starting with _pg_ (the header rule's first half). The
-- entries raise it (_require_headers); `pgqueue pgmq import` counts by it.
CREATE OR REPLACE FUNCTION pgqueue._headers_problem(headers jsonb) RETURNS text
LANGUAGE sql IMMUTABLE
AS $$
    SELECT CASE WHEN headers IS NULL THEN NULL
                WHEN jsonb_typeof(headers) <> 'object'
                THEN format('headers must be a JSON object, got a JSON %s', jsonb_typeof(headers))
                ELSE (SELECT format('header %s is reserved: keys starting with _pg_ are written by pgqueue only',
                                    to_json(k)::text)
                        FROM jsonb_object_keys(headers) AS k WHERE left(k, 4) = '_pg_' ORDER BY k LIMIT 1)
           END;
$$;

-- Headers must be a JSON object (or NULL) whose keys do not start with _pg_,
-- and a document every reader can decode.
CREATE OR REPLACE FUNCTION pgqueue._require_headers(headers jsonb) RETURNS void
LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    v_problem text := pgqueue._headers_problem(headers);
BEGIN
    IF v_problem LIKE 'headers must be%' THEN
        RAISE EXCEPTION '%', v_problem
            USING ERRCODE = '22023', HINT = 'Pass headers as {"key": value, ...}, or NULL.';
    ELSIF v_problem IS NOT NULL THEN
        RAISE EXCEPTION '%', v_problem
            USING ERRCODE = '22023',
                  HINT = 'Rename it. pgqueue writes the _pg_ keys (a callback''s, a member''s, a trace''s)'
                         ' itself; when passing on the headers of a message you got, leave out the keys'
                         ' that start with _pg_.';
    END IF;
    PERFORM pgqueue._require_decodable('headers', headers);
END
$$;

-- Members must be an array of JSON values, none NULL, each one every reader
-- can decode.
CREATE OR REPLACE FUNCTION pgqueue._require_members(messages jsonb[]) RETURNS void
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

------------------------------------------------------------------------------
-- The one header rule: the keys pgqueue writes
------------------------------------------------------------------------------

-- A barrier member's headers: its fan-out's headers as they are, then
-- {"_pg_member": {"barrier_id", "index"}} and, on a workflow step's message,
-- {"_pg_step": {"workflow_id", "step"}}, then the trace context. Inlined.
CREATE OR REPLACE FUNCTION pgqueue._member_headers(p_headers jsonb, p_barrier_id text, p_index integer,
                                                   p_workflow_id text, p_step text, p_trace jsonb)
RETURNS jsonb
LANGUAGE sql IMMUTABLE
AS $$
    SELECT coalesce(p_headers, '{}'::jsonb)
           || jsonb_build_object('_pg_member', jsonb_build_object('barrier_id', p_barrier_id, 'index', p_index))
           || CASE WHEN p_workflow_id IS NULL THEN '{}'::jsonb
                   ELSE jsonb_build_object('_pg_step', jsonb_build_object('workflow_id', p_workflow_id,
                                                                          'step', p_step)) END
           || coalesce(p_trace, '{}'::jsonb);
$$;

-- A callback's headers: its fan-out's (or workflow's) headers as they are,
-- then the transport marker and {"_pg_callback": p_callback}, the firing's
-- record ({"kind": "barrier" | "workflow", ...}), then the trace context.
CREATE OR REPLACE FUNCTION pgqueue._callback_headers(p_headers jsonb, p_callback jsonb, p_trace jsonb)
RETURNS jsonb
LANGUAGE sql IMMUTABLE
AS $$
    SELECT coalesce(p_headers, '{}'::jsonb)
           || jsonb_build_object('_pg_transport', true, '_pg_callback', p_callback)
           || coalesce(p_trace, '{}'::jsonb);
$$;

CREATE OR REPLACE FUNCTION pgqueue._insert_members(b pgqueue.barrier, q pgqueue.queue, p_first integer,
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

CREATE OR REPLACE FUNCTION pgqueue._fire(p_barrier_id text, p_state text) RETURNS bigint
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

-- _arm learns the workflow step it arms a barrier for, so that its members
-- carry _pg_step from their first insert (a step's headers are the caller's).
DROP FUNCTION IF EXISTS pgqueue._arm(text, jsonb[], text, jsonb, text, jsonb, integer, text, integer,
                                     double precision, boolean, text, text);
CREATE OR REPLACE FUNCTION pgqueue._arm(
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

CREATE OR REPLACE FUNCTION pgqueue._enqueue_step(s pgqueue.workflow_step) RETURNS boolean
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

CREATE OR REPLACE FUNCTION pgqueue._finish_if_done(w pgqueue.workflow) RETURNS void
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

------------------------------------------------------------------------------
-- The entries that take documents: each checks them
------------------------------------------------------------------------------

CREATE OR REPLACE FUNCTION pgqueue.send(
    queue_name text,
    message jsonb,
    headers jsonb DEFAULT NULL,
    delay integer DEFAULT 0,
    dedupe_key text DEFAULT NULL,
    send_token uuid DEFAULT NULL,
    traceparent text DEFAULT NULL,
    tracestate text DEFAULT NULL,
    group_key text DEFAULT NULL
) RETURNS bigint
LANGUAGE plpgsql
SECURITY DEFINER SET search_path = pg_catalog, pgqueue, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    q pgqueue.queue;
    v_queue_id integer;
    v_seq regclass;
    v_queue text;
    v_channel text;
    v_now timestamptz;
    v_id bigint;
    v_token uuid;
    v_own bigint;
    v_headers jsonb := send.headers;
BEGIN
    -- A send without options meets only the first condition: an expression's
    -- parts cost a call each whether they run or not.
    IF send.message IS NULL OR send.delay IS NULL OR send.delay < 0
       OR send.headers IS NOT NULL OR send.dedupe_key IS NOT NULL OR send.group_key IS NOT NULL
       OR pgqueue._undecodable(send.message) THEN
        IF send.message IS NULL OR send.delay IS NULL OR send.delay < 0
           OR jsonb_typeof(send.headers) <> 'object' OR strpos(send.headers::text, '"_pg_') > 0
           OR length(send.dedupe_key) > 1000 OR send.group_key = '' OR length(send.group_key) > 200
           OR pgqueue._undecodable(send.message) OR pgqueue._undecodable(send.headers) THEN
            IF send.message IS NULL THEN
                RAISE EXCEPTION 'message must not be NULL' USING ERRCODE = '22004',
                    HINT = 'Send a JSON value; use ''null''::jsonb for a JSON null.';
            END IF;
            PERFORM pgqueue._require_decodable('message', send.message);
            PERFORM pgqueue._require_nonnegative('delay', send.delay);
            PERFORM pgqueue._require_headers(send.headers);
            IF length(send.dedupe_key) > 1000 THEN
                RAISE EXCEPTION 'dedupe_key is % characters; at most 1000', length(send.dedupe_key)
                    USING ERRCODE = '22023', HINT = 'Use a short key, e.g. a hash of the long one.';
            END IF;
            PERFORM pgqueue._require_group_key(send.group_key);
        END IF;
    END IF;
    IF send.traceparent IS NOT NULL THEN
        -- after the caller's headers were checked: only this writes _pg_ keys
        v_headers := coalesce(v_headers, '{}') || pgqueue._trace_headers(send.traceparent, send.tracestate);
    END IF;
    -- the columns a send needs (the whole row only for a group or a channel)
    SELECT t.queue_id, t.msg_seq, t.queue_name, t.notify_channel INTO v_queue_id, v_seq, v_queue, v_channel
      FROM pgqueue.queue AS t WHERE t.queue_name = send.queue_name;
    IF NOT FOUND THEN
        q := pgqueue._queue(send.queue_name);  -- PGQ01, or the queue a PGMQ name means
        v_queue_id := q.queue_id;
        v_seq := q.msg_seq;
        v_queue := q.queue_name;
        v_channel := q.notify_channel;
    END IF;
    IF send.group_key IS NOT NULL THEN
        PERFORM pgqueue._lock_groups(x, ARRAY[send.group_key]) FROM pgqueue.queue x WHERE x.queue_id = v_queue_id;
    END IF;
    -- after the group's lock: a send that waited for it is stamped when it goes on
    v_now := clock_timestamp();

    IF send.dedupe_key IS NULL THEN
        INSERT INTO pgqueue.message (queue_id, msg_id, enqueued_at, vt, message, headers, send_token, group_key)
        VALUES (v_queue_id, nextval(v_seq), v_now, v_now + make_interval(secs => send.delay),
                send.message, v_headers, send.send_token, send.group_key)
        RETURNING msg_id INTO v_id;
    ELSE
        -- Single flight. The unique index decides; the loop only covers the
        -- window where the holder of the key is acked between our INSERT
        -- conflicting and our SELECT looking (each statement sees a new snapshot).
        FOR attempt IN 1..100 LOOP
            SELECT m.msg_id, m.send_token INTO v_id, v_token FROM pgqueue.message m
             WHERE m.queue_id = v_queue_id AND m.dedupe_key = send.dedupe_key;
            IF FOUND AND (send.send_token IS NULL OR v_token = send.send_token) THEN
                RETURN v_id;  -- the holder of the key (our own earlier attempt, with a token)
            END IF;
            IF send.send_token IS NOT NULL THEN
                -- Our earlier attempt, if it committed, is either the live
                -- holder (above) or consumed, with a receipt: the key cannot
                -- have two live holders, so a holder found above that is not
                -- ours means ours was consumed before that SELECT, and its
                -- receipt (committed with the consumption) is visible here.
                SELECT r.msg_id INTO v_own FROM pgqueue.send_receipt r
                 WHERE r.send_token = send.send_token AND r.queue_id = v_queue_id;
                IF FOUND THEN
                    RETURN v_own;  -- a retry of a send that did commit and was consumed since
                END IF;
                IF v_id IS NOT NULL THEN
                    RETURN v_id;  -- our earlier attempt never committed: single flight
                END IF;
            END IF;
            INSERT INTO pgqueue.message (queue_id, msg_id, enqueued_at, vt, message, headers, dedupe_key, send_token,
                                         group_key)
            VALUES (v_queue_id, nextval(v_seq), v_now, v_now + make_interval(secs => send.delay),
                    send.message, v_headers, send.dedupe_key, send.send_token, send.group_key)
            ON CONFLICT (queue_id, dedupe_key) WHERE dedupe_key IS NOT NULL DO NOTHING
            RETURNING msg_id INTO v_id;
            EXIT WHEN FOUND;
        END LOOP;
        IF v_id IS NULL THEN
            RAISE EXCEPTION 'could not settle dedupe_key % in queue % (it is being sent and acked continuously)',
                send.dedupe_key, send.queue_name USING ERRCODE = '55000';
        END IF;
        -- Receipts only matter for seconds (a client retry); prune old ones now and then.
        IF random() < 0.01 THEN
            DELETE FROM pgqueue.send_receipt WHERE finished_at < v_now - interval '1 day';
        END IF;
    END IF;

    -- Wake waiting consumers (see _notify): only when one is waiting.
    IF send.delay = 0 AND EXISTS (SELECT 1 FROM pgqueue.waiter w WHERE w.queue_id = v_queue_id) THEN
        PERFORM pg_notify(pgqueue._channel(v_queue), '');
    END IF;
    IF v_channel IS NOT NULL THEN
        PERFORM pgqueue._notify_channel(x) FROM pgqueue.queue x WHERE x.queue_id = v_queue_id;
    END IF;
    RETURN v_id;
END
$$;


CREATE OR REPLACE FUNCTION pgqueue.send_batch(
    queue_name text,
    messages jsonb[],
    headers jsonb[] DEFAULT NULL,
    delay integer DEFAULT 0,
    traceparent text DEFAULT NULL,
    tracestate text DEFAULT NULL,
    group_keys text[] DEFAULT NULL
) RETURNS SETOF bigint
LANGUAGE plpgsql
SECURITY DEFINER SET search_path = pg_catalog, pgqueue, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    q pgqueue.queue;
    v_now timestamptz;
    v_vt timestamptz;
    v_trace jsonb;
    v_queue_id integer;
    v_seq regclass;
BEGIN
    IF send_batch.traceparent IS NOT NULL THEN
        v_trace := pgqueue._trace_headers(send_batch.traceparent, send_batch.tracestate);
    END IF;
    IF send_batch.messages IS NULL THEN
        RAISE EXCEPTION 'messages must not be NULL' USING ERRCODE = '22004';
    END IF;
    IF array_position(send_batch.messages, NULL) IS NOT NULL THEN
        RAISE EXCEPTION 'messages[%] is NULL', array_position(send_batch.messages, NULL)
            USING ERRCODE = '22004', HINT = 'Every message must be a JSON value; use ''null''::jsonb for a JSON null.';
    END IF;
    IF send_batch.headers IS NOT NULL
       AND cardinality(send_batch.headers) <> cardinality(send_batch.messages) THEN
        RAISE EXCEPTION 'headers has % elements but messages has %',
            cardinality(send_batch.headers), cardinality(send_batch.messages)
            USING ERRCODE = '22023', HINT = 'Pass one headers value per message, or NULL for none.';
    END IF;
    IF send_batch.group_keys IS NOT NULL
       AND cardinality(send_batch.group_keys) <> cardinality(send_batch.messages) THEN
        RAISE EXCEPTION 'group_keys has % elements but messages has %',
            cardinality(send_batch.group_keys), cardinality(send_batch.messages)
            USING ERRCODE = '22023', HINT = 'Pass one group key per message (NULL for none), or NULL for no groups.';
    END IF;
    IF send_batch.delay IS NULL OR send_batch.delay < 0 THEN
        PERFORM pgqueue._require_nonnegative('delay', send_batch.delay);
    END IF;
    -- each check a statement: only for the arrays that were given
    IF send_batch.headers IS NOT NULL THEN
        PERFORM pgqueue._require_headers(h) FROM unnest(send_batch.headers) h;
    END IF;
    IF send_batch.group_keys IS NOT NULL THEN
        PERFORM pgqueue._require_group_key(k) FROM unnest(send_batch.group_keys) k;
    END IF;
    SELECT * INTO q FROM pgqueue.queue AS t WHERE t.queue_name = send_batch.queue_name;
    IF NOT FOUND THEN
        q := pgqueue._queue(send_batch.queue_name);  -- PGQ01, or the queue a PGMQ name means
    END IF;
    IF send_batch.group_keys IS NOT NULL
       AND EXISTS (SELECT 1 FROM unnest(send_batch.group_keys) k WHERE k IS NOT NULL) THEN
        PERFORM pgqueue._lock_groups(q, send_batch.group_keys);
    END IF;
    v_queue_id := q.queue_id;
    v_seq := q.msg_seq;
    v_now := clock_timestamp();
    v_vt := v_now + make_interval(secs => send_batch.delay);

    RETURN QUERY
    INSERT INTO pgqueue.message (queue_id, msg_id, enqueued_at, vt, message, headers, group_key)
    SELECT v_queue_id, nextval(v_seq), v_now, v_vt,
           -- each message checked as it goes in (a statement of its own cost
           -- a batch of 100 about 7% more): the check raises, naming it
           CASE WHEN pgqueue._undecodable(b.message)
                THEN pgqueue._decodable_or_raise(format('messages[%s]', b.ord), b.message)
                ELSE b.message END,
           CASE WHEN v_trace IS NULL THEN b.headers ELSE coalesce(b.headers, '{}') || v_trace END,
           b.group_key
      FROM unnest(send_batch.messages, send_batch.headers, send_batch.group_keys)
           WITH ORDINALITY AS b (message, headers, group_key, ord)
     ORDER BY b.ord
    RETURNING msg_id;

    IF cardinality(send_batch.messages) > 0 THEN
        IF send_batch.delay = 0 THEN
            PERFORM pgqueue._notify(q);
        END IF;
        IF q.notify_channel IS NOT NULL THEN
            PERFORM pgqueue._notify_channel(q);
        END IF;
    END IF;
END
$$;

CREATE OR REPLACE FUNCTION pgqueue._add_steps(w pgqueue.workflow, p_steps jsonb) RETURNS void
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

CREATE OR REPLACE FUNCTION pgqueue.start_workflow(
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

------------------------------------------------------------------------------
-- cancel_workflow under every interleaving; drop_queue and workflows
------------------------------------------------------------------------------

CREATE OR REPLACE FUNCTION pgqueue.cancel_workflow(workflow_id text) RETURNS pgqueue.workflow_status
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

-- Raises 55006 when queue q receives the callbacks of open barriers or the
-- final callbacks of running workflows: dropping it would lose them.
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
    SELECT count(*) INTO v_n FROM pgqueue.workflow
     WHERE callback_queue_id = q.queue_id AND state = 'running';
    IF v_n > 0 THEN
        RAISE EXCEPTION 'queue "%" receives the final callbacks of % running workflow(s)', q.queue_name, v_n
            USING ERRCODE = '55006',
                  HINT = 'Wait for them to finish, or cancel them with pgqueue.cancel_workflow().';
    END IF;
END
$$;

CREATE INDEX IF NOT EXISTS workflow_callback_queue_idx ON pgqueue.workflow (callback_queue_id)
    WHERE state = 'running';

------------------------------------------------------------------------------
-- poison_page: no preview read of a huge payload
------------------------------------------------------------------------------

-- Its result gains message_bytes (the payload's stored size); message and
-- message_chars are NULL for a payload stored in more than 16 kB, and
-- headers NULL for headers as large.
DROP FUNCTION IF EXISTS pgqueue.poison_page(text, integer, timestamptz, timestamptz, text, timestamptz,
                                            integer, bigint, integer, integer);
CREATE OR REPLACE FUNCTION pgqueue.poison_page(
    queue_name text,
    qty integer,
    poisoned_after timestamptz DEFAULT NULL,
    poisoned_before timestamptz DEFAULT NULL,
    reason_contains text DEFAULT NULL,
    cursor_poisoned_at timestamptz DEFAULT NULL,
    cursor_queue_id integer DEFAULT NULL,
    cursor_msg_id bigint DEFAULT NULL,
    scan_limit integer DEFAULT 100000,
    preview_chars integer DEFAULT 300
) RETURNS TABLE (
    queue text,
    queue_id integer,
    msg_id bigint,
    read_ct integer,
    enqueued_at timestamptz,
    poisoned_at timestamptz,
    reason text,
    message text,
    message_chars integer,
    headers jsonb,
    capped boolean,
    message_bytes integer
)
LANGUAGE plpgsql STABLE
SECURITY DEFINER SET search_path = pg_catalog, pgqueue, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_queue_id integer := pgqueue._queue_id_or_null(poison_page.queue_name);
    v_at timestamptz := coalesce(poison_page.cursor_poisoned_at, 'infinity');
    v_qid integer := coalesce(poison_page.cursor_queue_id, 2147483647);
    v_mid bigint := coalesce(poison_page.cursor_msg_id, 9223372036854775807);
    v_needle text := lower(nullif(poison_page.reason_contains, ''));
    v_scanned integer := 0;
    v_found integer := 0;
    p record;
    c refcursor;
    v_names text[];  -- queue names by queue_id, looked up once each
    v_text text;
    -- a payload or headers stored in more bytes than this are not read
    -- (nor detoasted) for a preview: a page of them costs what its rows'
    -- other columns cost, not their size
    c_preview_bytes constant integer := 16384;
BEGIN
    PERFORM pgqueue._require_nonnegative('qty', poison_page.qty);
    PERFORM pgqueue._require_nonnegative('scan_limit', poison_page.scan_limit);
    PERFORM pgqueue._require_nonnegative('preview_chars', poison_page.preview_chars);
    IF (poison_page.cursor_poisoned_at IS NULL) <> (poison_page.cursor_msg_id IS NULL) THEN
        RAISE EXCEPTION 'cursor_poisoned_at and cursor_msg_id go together' USING ERRCODE = '22023',
            HINT = 'Pass both from the last row of the previous page, or neither for the first page.';
    END IF;
    IF poison_page.qty = 0 THEN
        RETURN;
    END IF;
    IF v_queue_id IS NULL THEN
        OPEN c FOR
        SELECT x.ctid AS tid, x.queue_id, x.msg_id, x.read_ct, x.enqueued_at, x.poisoned_at, x.reason,
               pg_column_size(x.message) AS bytes, pg_column_size(x.headers) AS header_bytes
          FROM pgqueue.poison x
         WHERE (x.poisoned_at, x.queue_id, x.msg_id) < (v_at, v_qid, v_mid)
           AND (poison_page.poisoned_after IS NULL OR x.poisoned_at >= poison_page.poisoned_after)
           AND (poison_page.poisoned_before IS NULL OR x.poisoned_at < poison_page.poisoned_before)
         ORDER BY x.poisoned_at DESC, x.queue_id DESC, x.msg_id DESC;
    ELSE
        OPEN c FOR
        SELECT x.ctid AS tid, x.queue_id, x.msg_id, x.read_ct, x.enqueued_at, x.poisoned_at, x.reason,
               pg_column_size(x.message) AS bytes, pg_column_size(x.headers) AS header_bytes
          FROM pgqueue.poison x
         WHERE x.queue_id = v_queue_id
           AND (x.poisoned_at, x.msg_id) < (v_at, v_mid)
           AND (poison_page.poisoned_after IS NULL OR x.poisoned_at >= poison_page.poisoned_after)
           AND (poison_page.poisoned_before IS NULL OR x.poisoned_at < poison_page.poisoned_before)
         ORDER BY x.poisoned_at DESC, x.msg_id DESC;
    END IF;
    LOOP
        FETCH c INTO p;
        EXIT WHEN NOT FOUND;
        v_scanned := v_scanned + 1;
        IF v_needle IS NULL OR strpos(lower(p.reason), v_needle) > 0 THEN
            v_found := v_found + 1;
            queue := v_names[p.queue_id];
            IF queue IS NULL THEN
                SELECT q.queue_name INTO queue FROM pgqueue.queue q WHERE q.queue_id = p.queue_id;
                v_names[p.queue_id] := queue;
            END IF;
            queue_id := p.queue_id;
            msg_id := p.msg_id;
            read_ct := p.read_ct;
            enqueued_at := p.enqueued_at;
            poisoned_at := p.poisoned_at;
            reason := p.reason;
            -- the payload read only for the rows shown, and only when small
            -- (by ctid: poison rows are never updated, and one gone since is NULL)
            SELECT CASE WHEN p.bytes <= c_preview_bytes THEN x.message::text END,
                   CASE WHEN p.header_bytes <= c_preview_bytes THEN x.headers END
              INTO v_text, headers
              FROM pgqueue.poison x WHERE x.ctid = p.tid;
            message := left(v_text, poison_page.preview_chars);
            message_chars := length(v_text);
            message_bytes := p.bytes;
            capped := false;
            RETURN NEXT;
            EXIT WHEN v_found >= poison_page.qty;
        ELSIF v_scanned >= poison_page.scan_limit THEN
            SELECT q.queue_name INTO queue FROM pgqueue.queue q WHERE q.queue_id = p.queue_id;
            queue_id := p.queue_id;
            msg_id := p.msg_id;
            poisoned_at := p.poisoned_at;
            read_ct := NULL;
            enqueued_at := NULL;
            reason := NULL;
            message := NULL;
            message_chars := NULL;
            headers := NULL;
            message_bytes := NULL;
            capped := true;
            RETURN NEXT;
            EXIT;
        END IF;
    END LOOP;
    CLOSE c;
END
$$;

------------------------------------------------------------------------------
-- Messages made before this migration: pgqueue's keys under their new names
------------------------------------------------------------------------------

-- Members, live and poisoned (a poison row of a member names it by queue and
-- msg_id in barrier_member). Their old plain keys were written after the
-- fan-out's headers, so they were pgqueue's: they go.
UPDATE pgqueue.message m
   SET headers = pgqueue._member_headers(m.headers - ARRAY['barrier_id', 'member_index']
                                             - CASE WHEN b.workflow_id IS NULL THEN '{}'::text[]
                                                    ELSE ARRAY['workflow_id', 'step'] END,
                                         b.barrier_id, bm.member_index, b.workflow_id, b.step, NULL)
  FROM pgqueue.barrier_member bm
  JOIN pgqueue.barrier b ON b.barrier_id = bm.barrier_id
 WHERE m.member_of = bm.barrier_id AND m.queue_id = bm.queue_id AND m.msg_id = bm.msg_id
   AND NOT m.headers ? '_pg_member';
UPDATE pgqueue.poison p
   SET headers = pgqueue._member_headers(p.headers - ARRAY['barrier_id', 'member_index']
                                             - CASE WHEN b.workflow_id IS NULL THEN '{}'::text[]
                                                    ELSE ARRAY['workflow_id', 'step'] END,
                                         b.barrier_id, bm.member_index, b.workflow_id, b.step, NULL)
  FROM pgqueue.barrier_member bm
  JOIN pgqueue.barrier b ON b.barrier_id = bm.barrier_id
 WHERE p.queue_id = bm.queue_id AND p.msg_id = bm.msg_id
   AND p.headers ->> 'barrier_id' = bm.barrier_id AND NOT p.headers ? '_pg_member';

-- Callbacks, found by the callback_msg_id their barrier or workflow keeps:
-- the firing's record moves under _pg_callback. (A callback requeued from
-- the poison table before this migration has a new msg_id and keeps its
-- old keys: docs/security.md.)
UPDATE pgqueue.message m
   SET headers = pgqueue._callback_headers(
           m.headers - ARRAY['_pg_transport', 'barrier_id', 'member_index', 'total', 'succeeded', 'failed',
                             'cancelled', 'outcomes', 'state'],
           jsonb_build_object('kind', 'barrier', 'barrier_id', b.barrier_id,
                              'state', coalesce(m.headers -> 'state', to_jsonb(b.outcome)),
                              'total', b.total, 'succeeded', b.succeeded, 'failed', b.failed,
                              'cancelled', b.cancelled, 'outcomes', coalesce(m.headers -> 'outcomes', '{}')),
           NULL)
  FROM pgqueue.barrier b
 WHERE m.queue_id = b.callback_queue_id AND m.msg_id = b.callback_msg_id
   AND m.headers -> '_pg_transport' = 'true' AND NOT m.headers ? '_pg_callback';
UPDATE pgqueue.poison m
   SET headers = pgqueue._callback_headers(
           m.headers - ARRAY['_pg_transport', 'barrier_id', 'member_index', 'total', 'succeeded', 'failed',
                             'cancelled', 'outcomes', 'state'],
           jsonb_build_object('kind', 'barrier', 'barrier_id', b.barrier_id,
                              'state', coalesce(m.headers -> 'state', to_jsonb(b.outcome)),
                              'total', b.total, 'succeeded', b.succeeded, 'failed', b.failed,
                              'cancelled', b.cancelled, 'outcomes', coalesce(m.headers -> 'outcomes', '{}')),
           NULL)
  FROM pgqueue.barrier b
 WHERE m.queue_id = b.callback_queue_id AND m.msg_id = b.callback_msg_id
   AND m.headers -> '_pg_transport' = 'true' AND NOT m.headers ? '_pg_callback';
UPDATE pgqueue.message m
   SET headers = pgqueue._callback_headers(
           m.headers - ARRAY['_pg_transport', 'workflow_id', 'state', 'steps'],
           jsonb_build_object('kind', 'workflow', 'workflow_id', w.workflow_id, 'state', w.state,
                              'steps', coalesce(m.headers -> 'steps', '{}')),
           NULL)
  FROM pgqueue.workflow w
 WHERE m.queue_id = w.callback_queue_id AND m.msg_id = w.callback_msg_id
   AND m.headers -> '_pg_transport' = 'true' AND NOT m.headers ? '_pg_callback';
UPDATE pgqueue.poison m
   SET headers = pgqueue._callback_headers(
           m.headers - ARRAY['_pg_transport', 'workflow_id', 'state', 'steps'],
           jsonb_build_object('kind', 'workflow', 'workflow_id', w.workflow_id, 'state', w.state,
                              'steps', coalesce(m.headers -> 'steps', '{}')),
           NULL)
  FROM pgqueue.workflow w
 WHERE m.queue_id = w.callback_queue_id AND m.msg_id = w.callback_msg_id
   AND m.headers -> '_pg_transport' = 'true' AND NOT m.headers ? '_pg_callback';

------------------------------------------------------------------------------
-- The one role model: pgqueue.role_grant says it for both schemas
------------------------------------------------------------------------------

-- Who may call or read what, in schema pgqueue and in the pgmq facade's
-- schema alike, one row per object (docs/security.md, "The one role model").
-- A function's row names it by signature (as regprocedure spells it), or by
-- schema and name for every overload of that name (the facade's); a
-- relation's by schema and name, `*` standing for any characters (the
-- facade's per-queue views). A function whose name starts with `_` is
-- internal and granted to no one; every other function of either schema has
-- a row, roles '{}' for one granted to no one (tests/sql/test_roles.py fails
-- on one without). A relation without a row is granted to no one.
DO $rename$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_attribute WHERE attrelid = 'pgqueue.role_grant'::regclass
                                            AND attname = 'function_signature') THEN
        ALTER TABLE pgqueue.role_grant RENAME COLUMN function_signature TO object;
    END IF;
END
$rename$;
ALTER TABLE pgqueue.role_grant
    ADD COLUMN IF NOT EXISTS kind text NOT NULL DEFAULT 'function' CHECK (kind IN ('function', 'relation'));
INSERT INTO pgqueue.role_grant (object, roles, kind) VALUES
    ('pgqueue.grant_roles()', '{}', 'function'),
    ('pgqueue.schema_version', '{pgqueue_producer,pgqueue_consumer,pgqueue_operator}', 'relation')
ON CONFLICT (object) DO NOTHING;

-- Grants SELECT on one relation of either schema to the roles its row names
-- (where they exist). Run by grant_roles for every relation, and by the
-- facade for each view it makes.
CREATE OR REPLACE FUNCTION pgqueue._grant_relation(p_rel regclass) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    v_name text;
    r text;
BEGIN
    SELECT n.nspname || '.' || c.relname INTO v_name
      FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
     WHERE c.oid = p_rel;
    FOR r IN SELECT DISTINCT x FROM pgqueue.role_grant g, unnest(g.roles) x
              WHERE g.kind = 'relation'
                AND v_name LIKE replace(replace(g.object, '_', '\_'), '*', '%')
                AND EXISTS (SELECT 1 FROM pg_catalog.pg_roles o WHERE o.rolname = x)
              ORDER BY 1
    LOOP
        EXECUTE format('GRANT SELECT ON %s TO %I', p_rel, r);
    END LOOP;
END
$$;

-- Applies pgqueue.role_grant to both schemas: creates the roles where
-- missing (if this role may), makes every pgqueue API function SECURITY
-- DEFINER with the fixed search_path (the facade's declare their own), takes
-- every right on the schemas' functions, tables and sequences from PUBLIC
-- and from the three roles, and grants each role exactly its rows.
-- Idempotent; run by the owner (or a superuser). Returns the roles that hold
-- their grants now.
CREATE OR REPLACE FUNCTION pgqueue.grant_roles() RETURNS text[]
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    c_config constant text := 'search_path=pg_catalog, pgqueue, pg_temp';
    v_ready text[] := '{}';
    v_missing text[] := '{}';
    v_owner regrole;
    r text;
    s text;
    f record;
BEGIN
    FOR r IN SELECT DISTINCT x FROM pgqueue.role_grant g, unnest(g.roles) x ORDER BY x LOOP
        IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = r) THEN
            BEGIN
                EXECUTE format('CREATE ROLE %I NOLOGIN', r);
            EXCEPTION
                WHEN duplicate_object OR unique_violation THEN
                    NULL;  -- created meanwhile by a migration of another database
                WHEN insufficient_privilege THEN
                    v_missing := v_missing || r;
                    CONTINUE;
            END;
        END IF;
        v_ready := v_ready || r;
    END LOOP;

    FOR f IN SELECT p.oid::regprocedure AS fn, p.prosecdef, p.proconfig
               FROM pgqueue.role_grant g
               JOIN pg_proc p ON p.oid = CASE WHEN strpos(g.object, '(') > 0 THEN to_regprocedure(g.object) END
              WHERE g.kind = 'function' AND cardinality(g.roles) > 0
                AND p.pronamespace = 'pgqueue'::regnamespace
    LOOP
        IF NOT f.prosecdef OR NOT coalesce(f.proconfig @> ARRAY[c_config], false) THEN
            EXECUTE format('ALTER FUNCTION %s SECURITY DEFINER SET search_path = pg_catalog, pgqueue, pg_temp',
                           f.fn);
        END IF;
    END LOOP;

    FOR s IN SELECT n.nspname FROM pg_namespace n WHERE n.nspname IN ('pgqueue', 'pgmq') ORDER BY 1 LOOP
        EXECUTE format('REVOKE ALL ON ALL FUNCTIONS IN SCHEMA %I FROM PUBLIC', s);
        EXECUTE format('REVOKE ALL ON ALL TABLES IN SCHEMA %I FROM PUBLIC', s);
        EXECUTE format('REVOKE ALL ON ALL SEQUENCES IN SCHEMA %I FROM PUBLIC', s);
        FOREACH r IN ARRAY v_ready LOOP
            -- exactly the listed objects, also after a row changed its roles
            EXECUTE format('REVOKE ALL ON ALL FUNCTIONS IN SCHEMA %I FROM %I', s, r);
            EXECUTE format('REVOKE ALL ON ALL TABLES IN SCHEMA %I FROM %I', s, r);
            EXECUTE format('GRANT USAGE ON SCHEMA %I TO %I', s, r);
        END LOOP;
    END LOOP;

    FOR f IN WITH fns AS MATERIALIZED (
                 SELECT g.object, g.roles,
                        CASE WHEN strpos(g.object, '(') > 0 THEN to_regprocedure(g.object) END AS fn
                   FROM pgqueue.role_grant g WHERE g.kind = 'function'
             )
             SELECT DISTINCT p.oid::regprocedure AS fn, x AS role
               FROM fns, unnest(fns.roles) x, pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
              WHERE n.nspname IN ('pgqueue', 'pgmq') AND x = ANY (v_ready)
                AND (p.oid = fns.fn OR (fns.fn IS NULL AND strpos(fns.object, '(') = 0
                                        AND n.nspname || '.' || p.proname = fns.object))
              ORDER BY 1, 2
    LOOP
        EXECUTE format('GRANT EXECUTE ON FUNCTION %s TO %I', f.fn, f.role);
    END LOOP;
    PERFORM pgqueue._grant_relation(c.oid::regclass)
       FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
      WHERE n.nspname IN ('pgqueue', 'pgmq') AND c.relkind IN ('r', 'p', 'v', 'm', 'f', 'S');

    -- The late sweep of the read lanes (0005) reads pg_stat_activity as the
    -- owner: sessions of roles whose details the owner may not see count as
    -- infinitely old, and then no sweep raises the safe floors.
    SELECT n.nspowner::regrole INTO v_owner FROM pg_namespace n WHERE n.nspname = 'pgqueue';
    IF NOT pg_has_role(v_owner, 'pg_read_all_stats', 'USAGE') THEN
        RAISE NOTICE 'pgqueue: role %, the owner of schema pgqueue, cannot see other roles'' sessions in pg_stat_activity',
            v_owner
            USING HINT = format('Have an administrator run GRANT pg_read_all_stats TO %s; without it, reads'
                                ' cannot raise the read lanes'' safe floors while sessions of other roles'
                                ' are connected (see docs/security.md).', v_owner);
    END IF;

    IF cardinality(v_missing) > 0 THEN
        RAISE NOTICE 'pgqueue: role % may not create roles, so % do not exist and nobody may call pgqueue''s functions but the owner',
            current_user, array_to_string(v_missing, ', ')
            USING HINT = format('Have an administrator run %s then run SELECT pgqueue.grant_roles(); as %s (see docs/security.md).',
                                (SELECT string_agg(format('CREATE ROLE %I NOLOGIN;', m), ' ') FROM unnest(v_missing) m),
                                current_user);
    END IF;
    RETURN v_ready;
END
$$;

SELECT pgqueue.grant_roles();
