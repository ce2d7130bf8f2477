-- pgqueue 0016: trace context that travels with a message, and a fan-in a
-- trace viewer can follow.
--
-- A message's W3C trace context rides in the reserved headers
-- _pg_traceparent / _pg_tracestate. Only these functions write them, from
-- their new traceparent/tracestate arguments, after the caller's own headers
-- were checked (a caller's headers still cannot hold a _pg_ key). fan_out
-- keeps its context on the barrier row: the members carry it, and the firing
-- writes it into the callback, so the callback's run continues the trace of
-- the request that fanned out. A traced run that completes a member leaves
-- its own context on the member's row (complete_members' traceparents, one
-- column on the UPDATE that already counts it: no extra row or statement);
-- barrier_links() reads them back, at most qty, for the callback's span links.
-- A producer cannot forge those: complete_members is the consumer's.
--
-- The new trailing parameters have defaults, so an older client's calls
-- resolve as before; the functions are dropped and created (CREATE OR REPLACE
-- cannot add parameters, and an overload would make those calls ambiguous).

ALTER TABLE pgqueue.barrier ADD COLUMN traceparent text, ADD COLUMN tracestate text;
ALTER TABLE pgqueue.barrier_member ADD COLUMN traceparent text;

DROP FUNCTION pgqueue.send_keyed(text, jsonb, text, jsonb, integer, uuid);
DROP FUNCTION pgqueue.send(text, jsonb, jsonb, integer, text, uuid);
DROP FUNCTION pgqueue.send_batch(text, jsonb[], jsonb[], integer);
DROP FUNCTION pgqueue.fan_out(text, jsonb[], text, jsonb, text, jsonb, integer);
DROP FUNCTION pgqueue.complete_members(text, bigint[], text[], jsonb[], integer[]);
DROP FUNCTION pgqueue._complete(integer[], bigint[], text[], jsonb[]);
DELETE FROM pgqueue.role_grant WHERE function_signature IN (
    'pgqueue.send(text,jsonb,jsonb,integer,text,uuid)',
    'pgqueue.send_keyed(text,jsonb,text,jsonb,integer,uuid)',
    'pgqueue.send_batch(text,jsonb[],jsonb[],integer)',
    'pgqueue.fan_out(text,jsonb[],text,jsonb,text,jsonb,integer)',
    'pgqueue.complete_members(text,bigint[],text[],jsonb[],integer[])');

-- A W3C traceparent of version 00 with non-zero ids, else 22023 naming `what`.
CREATE FUNCTION pgqueue._require_traceparent(what text, traceparent text) RETURNS void
LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    IF traceparent !~ '^00-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$'
       OR substr(traceparent, 4, 32) = repeat('0', 32) OR substr(traceparent, 37, 16) = repeat('0', 16) THEN
        RAISE EXCEPTION '% is not a W3C traceparent: %', what, quote_literal(left(traceparent, 80))
            USING ERRCODE = '22023',
                  HINT = 'Expected 00-<32 hex trace id>-<16 hex span id>-<2 hex flags>, ids not all zero.';
    END IF;
END
$$;

-- The reserved headers that carry a message's trace context (W3C Trace
-- Context): {"_pg_traceparent": ..., "_pg_tracestate": ...}, the latter only
-- when non-empty; NULL for no traceparent. Only pgqueue's functions write
-- these keys, from their traceparent/tracestate arguments; a caller's headers
-- cannot hold them (_require_headers).
CREATE FUNCTION pgqueue._trace_headers(traceparent text, tracestate text) RETURNS jsonb
LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    IF traceparent IS NULL THEN
        RETURN NULL;
    END IF;
    PERFORM pgqueue._require_traceparent('traceparent', traceparent);
    IF length(tracestate) > 512 OR tracestate ~ '[^\x20-\x7e]' THEN
        RAISE EXCEPTION 'tracestate must be at most 512 printable ASCII characters'
            USING ERRCODE = '22023', HINT = 'Pass the W3C tracestate header as the propagator wrote it.';
    END IF;
    RETURN jsonb_build_object('_pg_traceparent', traceparent)
           || CASE WHEN tracestate <> '' THEN jsonb_build_object('_pg_tracestate', tracestate)
                   ELSE '{}'::jsonb END;
END
$$;

CREATE FUNCTION pgqueue.send_batch(
    queue_name text,
    messages jsonb[],
    headers jsonb[] DEFAULT NULL,
    delay integer DEFAULT 0,
    traceparent text DEFAULT NULL,
    tracestate text DEFAULT NULL
) RETURNS SETOF bigint
LANGUAGE plpgsql
SECURITY DEFINER SET search_path = pg_catalog, pgqueue, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    q pgqueue.queue;
    v_now timestamptz := clock_timestamp();
    v_trace jsonb := pgqueue._trace_headers(send_batch.traceparent, send_batch.tracestate);
BEGIN
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
    PERFORM pgqueue._require_nonnegative('delay', send_batch.delay);
    PERFORM pgqueue._require_headers(h) FROM unnest(send_batch.headers) h;
    q := pgqueue._queue(send_batch.queue_name);

    RETURN QUERY
    INSERT INTO pgqueue.message (queue_id, msg_id, enqueued_at, vt, message, headers)
    SELECT q.queue_id, nextval(q.msg_seq), v_now, v_now + make_interval(secs => send_batch.delay),
           b.message, CASE WHEN v_trace IS NULL THEN b.headers ELSE coalesce(b.headers, '{}') || v_trace END
      FROM unnest(send_batch.messages, send_batch.headers) WITH ORDINALITY AS b (message, headers, ord)
     ORDER BY b.ord
    RETURNING msg_id;

    IF send_batch.delay = 0 AND cardinality(send_batch.messages) > 0 THEN
        PERFORM pgqueue._notify(q);
    END IF;
END
$$;

-- Enqueues one message; its msg_id. The argument checks run as one inline
-- condition on the fast path (a header key starting with _pg_ always shows as
-- "_pg_ in the headers' text; a value that merely contains it costs only the
-- full check). With a dedupe_key: single flight, decided by the unique index;
-- a retry that carries its send_token returns its own message, live or
-- consumed (its receipt), before it considers another sender's.
CREATE FUNCTION pgqueue.send(
    queue_name text,
    message jsonb,
    headers jsonb DEFAULT NULL,
    delay integer DEFAULT 0,
    dedupe_key text DEFAULT NULL,
    send_token uuid DEFAULT NULL,
    traceparent text DEFAULT NULL,
    tracestate text DEFAULT NULL
) RETURNS bigint
LANGUAGE plpgsql
SECURITY DEFINER SET search_path = pg_catalog, pgqueue, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    q pgqueue.queue;
    v_now timestamptz := clock_timestamp();
    v_id bigint;
    v_token uuid;
    v_own bigint;
    v_headers jsonb := send.headers;
BEGIN
    IF send.message IS NULL OR send.delay IS NULL OR send.delay < 0
       OR jsonb_typeof(send.headers) <> 'object' OR strpos(send.headers::text, '"_pg_') > 0
       OR length(send.dedupe_key) > 1000 THEN
        IF send.message IS NULL THEN
            RAISE EXCEPTION 'message must not be NULL' USING ERRCODE = '22004',
                HINT = 'Send a JSON value; use ''null''::jsonb for a JSON null.';
        END IF;
        PERFORM pgqueue._require_nonnegative('delay', send.delay);
        PERFORM pgqueue._require_headers(send.headers);
        IF length(send.dedupe_key) > 1000 THEN
            RAISE EXCEPTION 'dedupe_key is % characters; at most 1000', length(send.dedupe_key)
                USING ERRCODE = '22023', HINT = 'Use a short key, e.g. a hash of the long one.';
        END IF;
    END IF;
    IF send.traceparent IS NOT NULL THEN
        -- after the caller's headers were checked: only this writes _pg_ keys
        v_headers := coalesce(v_headers, '{}') || pgqueue._trace_headers(send.traceparent, send.tracestate);
    END IF;
    SELECT * INTO q FROM pgqueue.queue AS t WHERE t.queue_name = send.queue_name;
    IF NOT FOUND THEN
        q := pgqueue._queue(send.queue_name);  -- raises "queue ... does not exist"
    END IF;

    IF send.dedupe_key IS NULL THEN
        INSERT INTO pgqueue.message (queue_id, msg_id, enqueued_at, vt, message, headers, send_token)
        VALUES (q.queue_id, nextval(q.msg_seq), v_now, v_now + make_interval(secs => send.delay),
                send.message, v_headers, send.send_token)
        RETURNING msg_id INTO v_id;
    ELSE
        -- Single flight. The unique index decides; the loop only covers the
        -- window where the holder of the key is acked between our INSERT
        -- conflicting and our SELECT looking (each statement sees a new snapshot).
        FOR attempt IN 1..100 LOOP
            SELECT m.msg_id, m.send_token INTO v_id, v_token FROM pgqueue.message m
             WHERE m.queue_id = q.queue_id AND m.dedupe_key = send.dedupe_key;
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
                 WHERE r.send_token = send.send_token AND r.queue_id = q.queue_id;
                IF FOUND THEN
                    RETURN v_own;  -- a retry of a send that did commit and was consumed since
                END IF;
                IF v_id IS NOT NULL THEN
                    RETURN v_id;  -- our earlier attempt never committed: single flight
                END IF;
            END IF;
            INSERT INTO pgqueue.message (queue_id, msg_id, enqueued_at, vt, message, headers, dedupe_key, send_token)
            VALUES (q.queue_id, nextval(q.msg_seq), v_now, v_now + make_interval(secs => send.delay),
                    send.message, v_headers, send.dedupe_key, send.send_token)
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
    IF send.delay = 0 AND EXISTS (SELECT 1 FROM pgqueue.waiter w WHERE w.queue_id = q.queue_id) THEN
        PERFORM pg_notify(pgqueue._channel(q.queue_name), '');
    END IF;
    RETURN v_id;
END
$$;

-- send under a dedupe_key, saying whether this call sent: (msg_id, sent).
-- sent is true when this call (or an earlier attempt of it, with the same
-- send_token, whose commit reply was lost) inserted the message, live or
-- consumed since; false when an unfinished message sent by someone else holds
-- the key (msg_id is then that message's, and nothing was inserted). Without a
-- send_token the call makes one, so a single call still knows what it did.
CREATE FUNCTION pgqueue.send_keyed(
    queue_name text,
    message jsonb,
    dedupe_key text,
    headers jsonb DEFAULT NULL,
    delay integer DEFAULT 0,
    send_token uuid DEFAULT NULL,
    traceparent text DEFAULT NULL,
    tracestate text DEFAULT NULL
) RETURNS TABLE (msg_id bigint, sent boolean)
LANGUAGE plpgsql
SECURITY DEFINER SET search_path = pg_catalog, pgqueue, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_token uuid := coalesce(send_keyed.send_token, gen_random_uuid());
    v_id bigint;
BEGIN
    IF send_keyed.dedupe_key IS NULL THEN
        RAISE EXCEPTION 'dedupe_key must not be NULL' USING ERRCODE = '22004',
            HINT = 'Use send() for a message without a key.';
    END IF;
    v_id := pgqueue.send(send_keyed.queue_name, send_keyed.message, send_keyed.headers,
                         send_keyed.delay, send_keyed.dedupe_key, v_token,
                         send_keyed.traceparent, send_keyed.tracestate);
    RETURN QUERY
    SELECT v_id,
           EXISTS (SELECT FROM pgqueue.message m JOIN pgqueue.queue q ON q.queue_id = m.queue_id
                    WHERE q.queue_name = send_keyed.queue_name AND m.msg_id = v_id
                      AND m.send_token = v_token)
           OR EXISTS (SELECT FROM pgqueue.send_receipt r
                       WHERE r.send_token = v_token AND r.msg_id = v_id);
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

-- The one callback, inserted here rather than through send(), which refuses
-- the marker. The fan-out's headers come first, without a member_index (a
-- handler that passed its member's headers on to a nested fan_out would
-- otherwise make that fan-out's callback look like a member), then the keys
-- only a firing writes.
CREATE OR REPLACE FUNCTION pgqueue._fire(p_barrier_id text, p_state text) RETURNS bigint
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

INSERT INTO pgqueue.role_grant (function_signature, roles) VALUES
    ('pgqueue.send(text,jsonb,jsonb,integer,text,uuid,text,text)', '{pgqueue_producer,pgqueue_consumer,pgqueue_operator}'),
    ('pgqueue.send_keyed(text,jsonb,text,jsonb,integer,uuid,text,text)', '{pgqueue_producer,pgqueue_consumer,pgqueue_operator}'),
    ('pgqueue.send_batch(text,jsonb[],jsonb[],integer,text,text)', '{pgqueue_producer,pgqueue_consumer,pgqueue_operator}'),
    ('pgqueue.fan_out(text,jsonb[],text,jsonb,text,jsonb,integer,text,text)', '{pgqueue_producer,pgqueue_consumer}'),
    ('pgqueue.complete_members(text,bigint[],text[],jsonb[],integer[],text[])', '{pgqueue_consumer}'),
    ('pgqueue.barrier_links(text,integer)', '{pgqueue_consumer}');

SELECT pgqueue.grant_roles();
