-- pgqueue 0008: what an outside review broke, fixed at the root.
--
--   1. Lease changes are fenced. A read hands out a lease identified by the
--      read_ct it returns; extending, nacking, releasing or poisoning a
--      message can now name that read_ct, and then changes nothing (0 rows,
--      false, NULL) unless it is still the current lease. A reader that stalled
--      past its vt (a GC pause, SIGSTOP, a frozen container) can no longer move
--      the lease of the reader that took the message over.
--        * read_ct alone identifies a lease because it only ever grows while a
--          message lives under one msg_id, and a message lives under one
--          msg_id once: poison_requeue now gives the requeued message a new
--          msg_id (it reset read_ct to 0 under the old id, so a holder stalled
--          through a poison and a requeue could match again).
--        * Acks (delete, archive, pop, complete with 'succeeded') stay
--          unfenced, on purpose: an ack says the work was done, and it was,
--          by whichever run acks first. The later run's ack finds nothing
--          and says so (false, no row); a barrier member is counted once,
--          with the first result. Fencing the stale run's ack would throw a
--          finished run away and count on the newer one, which may still fail.
--          A failure verdict is fenced like poison (complete_members with
--          read_cts): it speaks for one attempt, and a newer attempt may
--          succeed.
--        * hold_leases() locks the messages still leased to a read, for
--          callers that commit their own writes with the ack (the worker's
--          transactional handlers): the stale one then rolls back, so the
--          writes commit once.
--        * nack() is the fenced nack that also ends the last attempt: when the
--          read_ct is the queue's max_attempts it poisons the message now, with
--          its error, instead of leaving it to the next read.
--   2. Callbacks cannot be forged. Header keys starting with _pg_ are
--      pgqueue's: send, send_batch and fan_out refuse them, and only a
--      barrier's firing writes _pg_transport (it inserts its callback itself,
--      no longer through send). A fan-out's member_index no longer leaks into
--      its callback's headers.
--   3. No session setting changes how a member is counted. The trigger that
--      counts members leaving the live table read a custom setting any
--      session could SET; now every path that means another outcome than
--      'succeeded' counts its members before the trigger sees them
--      (complete_members, the purges in the same statement as their DELETE),
--      and the trigger counts the rest: 'poisoned' if they went to the
--      poison table, else 'succeeded'.
--   4. A barrier id reused for another fan-out is refused. fan_out keeps a
--      fingerprint of the whole request (queue, members, callback, headers,
--      deadline); a retry of the same call matches it and sends nothing,
--      anything else raises PGQ03.
--   5. Committed messages below a safe floor. _oldest_writer() read the
--      prepared transactions before the sessions, so a transaction that
--      PREPAREd between the two reads was seen by neither, and a sweep could
--      raise the safe floor above its rows. It reads the sessions first now
--      (argument below), and a read that finds the clock went back resets the
--      lane floors (see _claim).
--   6. A keyed send retried after its own message was consumed returns its own
--      msg_id (its receipt), never the id of another sender's message that
--      holds the key now.
--   7. A read that poison-drops a message raises a NOTICE (SQLSTATE PGQ10)
--      naming it, so a client can log every drop.

-- ---------------------------------------------------------------------------
-- 7. the reason and the notice of a poison drop, in one place

-- The poison reason of a message whose attempts ran out.
CREATE FUNCTION pgqueue._exhausted_reason(read_ct integer, last_error text) RETURNS text
LANGUAGE sql STABLE AS $$
    SELECT format('max_attempts exceeded (read %s times)', read_ct)
           || coalesce('; last error: ' || last_error, '');
$$;

-- Tells the caller of a read that it poison-dropped a message: the message is
-- human-readable, the DETAIL is JSON for clients (pgqueue's logs
-- `message.poisoned` from it). Sent like any notice, so a session with
-- client_min_messages above NOTICE does not get it; the drop happens all the same.
CREATE FUNCTION pgqueue._notice_poisoned(queue_name text, msg_id bigint, read_ct integer, reason text)
RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    RAISE NOTICE USING
        ERRCODE = 'PGQ10',
        MESSAGE = format('pgqueue: message %s of queue %s poisoned: %s', msg_id, queue_name, reason),
        DETAIL = json_build_object('queue', queue_name, 'msg_id', msg_id, 'read_ct', read_ct,
                                   'reason', reason)::text;
END
$$;

-- ---------------------------------------------------------------------------
-- 1. fenced lease changes

-- Raised when a fenced call gets no read_ct: without it, it would fence nothing.
CREATE FUNCTION pgqueue._require_read_ct(read_ct integer) RETURNS void
LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    IF read_ct IS NULL THEN
        RAISE EXCEPTION 'read_ct must not be NULL' USING ERRCODE = '22004',
            HINT = 'Pass the read_ct your read returned with the message; it identifies your lease.';
    END IF;
END
$$;

-- set_vt for the holder of the lease that read_ct names: extend it, or nack
-- (vt > 0) or release (vt = 0) it. No row when that lease is not the current
-- one (another reader took the message over, or it is gone).
CREATE FUNCTION pgqueue.set_vt(queue_name text, msg_id bigint, vt integer, last_error text, read_ct integer)
RETURNS SETOF pgqueue.message_record
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    q pgqueue.queue;
BEGIN
    PERFORM pgqueue._require_nonnegative('vt', set_vt.vt);
    PERFORM pgqueue._require_read_ct(set_vt.read_ct);
    q := pgqueue._queue(set_vt.queue_name);
    RETURN QUERY
    UPDATE pgqueue.message
       SET vt = clock_timestamp() + make_interval(secs => set_vt.vt),
           last_error = coalesce(pgqueue._clip_error(set_vt.last_error), last_error)
     WHERE queue_id = q.queue_id AND msg_id = set_vt.msg_id AND read_ct = set_vt.read_ct
    RETURNING msg_id, read_ct, enqueued_at, vt, message, headers;
END
$$;

-- Poison for the holder of the lease that read_ct names; false when that lease
-- is not the current one (nothing changes then).
CREATE FUNCTION pgqueue.poison(queue_name text, msg_id bigint, reason text, read_ct integer) RETURNS boolean
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    q pgqueue.queue := pgqueue._queue(poison.queue_name);
BEGIN
    PERFORM pgqueue._require_read_ct(poison.read_ct);
    IF poison.reason IS NULL OR poison.reason = '' THEN
        RAISE EXCEPTION 'reason must not be empty' USING ERRCODE = '22023',
            HINT = 'Say why the message is poisoned: operators read it in pgqueue.poison_list().';
    END IF;
    WITH gone AS (
        DELETE FROM pgqueue.message
         WHERE queue_id = q.queue_id AND msg_id = poison.msg_id AND read_ct = poison.read_ct
        RETURNING *
    )
    INSERT INTO pgqueue.poison (queue_id, msg_id, read_ct, enqueued_at, reason, message, headers, dedupe_key)
    SELECT g.queue_id, g.msg_id, g.read_ct, g.enqueued_at, poison.reason, g.message, g.headers, g.dedupe_key
      FROM gone g;
    RETURN FOUND;
END
$$;

-- The nack of a consumer whose handler failed, for the holder of the lease
-- that read_ct names: 'retry' when the message is visible again after `delay`
-- seconds; 'poisoned' when that was its last attempt (read_ct has reached the
-- queue's max_attempts), so it went to the poison table now, with the error,
-- rather than at the next read; NULL when that lease is not the current one
-- (nothing changed).
CREATE FUNCTION pgqueue.nack(queue_name text, msg_id bigint, read_ct integer, delay integer,
                             last_error text DEFAULT NULL)
RETURNS text
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    q pgqueue.queue;
    v_error text := pgqueue._clip_error(nack.last_error);
BEGIN
    PERFORM pgqueue._require_nonnegative('delay', nack.delay);
    PERFORM pgqueue._require_read_ct(nack.read_ct);
    q := pgqueue._queue(nack.queue_name);
    IF nack.read_ct >= q.max_attempts THEN
        WITH gone AS (
            DELETE FROM pgqueue.message
             WHERE queue_id = q.queue_id AND msg_id = nack.msg_id AND read_ct = nack.read_ct
            RETURNING *
        )
        INSERT INTO pgqueue.poison (queue_id, msg_id, read_ct, enqueued_at, reason, message, headers,
                                    dedupe_key)
        SELECT g.queue_id, g.msg_id, g.read_ct, g.enqueued_at,
               pgqueue._exhausted_reason(g.read_ct, coalesce(v_error, g.last_error)),
               g.message, g.headers, g.dedupe_key
          FROM gone g;
        RETURN CASE WHEN FOUND THEN 'poisoned' END;
    END IF;
    UPDATE pgqueue.message
       SET vt = clock_timestamp() + make_interval(secs => nack.delay),
           last_error = coalesce(v_error, last_error)
     WHERE queue_id = q.queue_id AND msg_id = nack.msg_id AND read_ct = nack.read_ct;
    RETURN CASE WHEN FOUND THEN 'retry' END;
END
$$;

-- Locks, until the caller's transaction ends, the messages whose current
-- lease is the one each read_ct names; their ids. A caller that commits its
-- own writes with the ack calls it first in that transaction and rolls back
-- when a message is missing: its lease was taken over (or the message acked),
-- so the writes are another run's to commit. Locked rows cannot be read,
-- changed or acked by anyone else until then.
CREATE FUNCTION pgqueue.hold_leases(queue_name text, msg_ids bigint[], read_cts integer[])
RETURNS SETOF bigint
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    q pgqueue.queue := pgqueue._queue(hold_leases.queue_name);
BEGIN
    IF hold_leases.msg_ids IS NULL OR hold_leases.read_cts IS NULL
       OR cardinality(hold_leases.msg_ids) <> cardinality(hold_leases.read_cts) THEN
        RAISE EXCEPTION 'msg_ids and read_cts must be given, with the same length' USING ERRCODE = '22023';
    END IF;
    RETURN QUERY
    SELECT m.msg_id FROM pgqueue.message m
      JOIN unnest(hold_leases.msg_ids, hold_leases.read_cts) AS l (msg_id, read_ct)
        ON m.msg_id = l.msg_id AND m.read_ct = l.read_ct
     WHERE m.queue_id = q.queue_id
     ORDER BY m.msg_id
       FOR UPDATE OF m;
END
$$;

-- A requeued message gets a new msg_id (see 1. above): its lease history
-- starts over, and no holder of an old lease can name it. The poison row is
-- gone either way; the returned ids are the new ones, in the order of the old.
CREATE OR REPLACE FUNCTION pgqueue.poison_requeue(queue_name text, msg_ids bigint[]) RETURNS SETOF bigint
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    q pgqueue.queue := pgqueue._queue_locked(poison_requeue.queue_name);
    v_now timestamptz := clock_timestamp();
    v_rows pgqueue.poison[];
    v_new bigint[];
    v_keyed bigint[];
BEGIN
    -- Rows go back with their single-flight key where it is free; where a live
    -- message (or an earlier row of this batch) holds the key, they go back
    -- without one. Nothing is lost: every row taken from the poison table is
    -- inserted by one of the two statements below, in this transaction.
    WITH back AS (
        DELETE FROM pgqueue.poison WHERE queue_id = q.queue_id AND msg_id = ANY (poison_requeue.msg_ids)
        RETURNING *
    )
    SELECT array_agg(b ORDER BY b.msg_id) INTO v_rows FROM back b;
    IF v_rows IS NULL THEN
        RETURN;
    END IF;
    SELECT array_agg(nextval(q.msg_seq) ORDER BY r.ord) INTO v_new
      FROM unnest(v_rows) WITH ORDINALITY AS r (queue_id, msg_id, read_ct, enqueued_at, poisoned_at,
                                                reason, message, headers, dedupe_key, ord);

    WITH ins AS (
        INSERT INTO pgqueue.message (queue_id, msg_id, read_ct, enqueued_at, vt, message, headers, dedupe_key)
        SELECT r.queue_id, v_new[r.ord], 0, r.enqueued_at, v_now, r.message, r.headers, r.dedupe_key
          FROM unnest(v_rows) WITH ORDINALITY AS r (queue_id, msg_id, read_ct, enqueued_at, poisoned_at,
                                                    reason, message, headers, dedupe_key, ord)
         WHERE r.dedupe_key IS NOT NULL
         ORDER BY r.ord
        ON CONFLICT (queue_id, dedupe_key) WHERE dedupe_key IS NOT NULL DO NOTHING
        RETURNING msg_id
    )
    SELECT coalesce(array_agg(i.msg_id), '{}') INTO v_keyed FROM ins i;

    INSERT INTO pgqueue.message (queue_id, msg_id, read_ct, enqueued_at, vt, message, headers)
    SELECT r.queue_id, v_new[r.ord], 0, r.enqueued_at, v_now, r.message, r.headers
      FROM unnest(v_rows) WITH ORDINALITY AS r (queue_id, msg_id, read_ct, enqueued_at, poisoned_at,
                                                reason, message, headers, dedupe_key, ord)
     WHERE v_new[r.ord] <> ALL (v_keyed)
     ORDER BY r.ord;

    PERFORM pgqueue._notify(q);
    RETURN QUERY SELECT u.id FROM unnest(v_new) WITH ORDINALITY AS u (id, ord) ORDER BY u.ord;
END
$$;

-- ---------------------------------------------------------------------------
-- 2. the _pg_ header namespace is pgqueue's

-- Headers must be a JSON object (or NULL) whose keys do not start with _pg_.
CREATE OR REPLACE FUNCTION pgqueue._require_headers(headers jsonb) RETURNS void
LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    v_key text;
BEGIN
    IF headers IS NOT NULL AND jsonb_typeof(headers) <> 'object' THEN
        RAISE EXCEPTION 'headers must be a JSON object, got a JSON %', jsonb_typeof(headers)
            USING ERRCODE = '22023', HINT = 'Pass headers as {"key": value, ...}, or NULL.';
    END IF;
    SELECT k INTO v_key FROM jsonb_object_keys(headers) AS k WHERE left(k, 4) = '_pg_' ORDER BY k LIMIT 1;
    IF FOUND THEN
        RAISE EXCEPTION 'header % is reserved: keys starting with _pg_ are written by pgqueue only',
            to_json(v_key)::text
            USING ERRCODE = '22023',
                  HINT = 'Rename it. A callback''s _pg_transport marker is written by its barrier when it fires,'
                         ' never by a send; when passing on the headers of a message you got, leave out'
                         ' the keys that start with _pg_.';
    END IF;
END
$$;

-- 0006's send, with the namespace check on its fast path (a key starting with
-- _pg_ always shows as "_pg_ in the text of the headers; a value that
-- contains it only costs the full check), and with 6. above: a retry that
-- carries its token returns its own message, live or consumed, before it
-- considers another sender's.
CREATE OR REPLACE FUNCTION pgqueue.send(
    queue_name text,
    message jsonb,
    headers jsonb DEFAULT NULL,
    delay integer DEFAULT 0,
    dedupe_key text DEFAULT NULL,
    send_token uuid DEFAULT NULL
) RETURNS bigint
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    q pgqueue.queue;
    v_now timestamptz := clock_timestamp();
    v_id bigint;
    v_token uuid;
    v_own bigint;
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
    SELECT * INTO q FROM pgqueue.queue AS t WHERE t.queue_name = send.queue_name;
    IF NOT FOUND THEN
        q := pgqueue._queue(send.queue_name);  -- raises "queue ... does not exist"
    END IF;

    IF send.dedupe_key IS NULL THEN
        INSERT INTO pgqueue.message (queue_id, msg_id, enqueued_at, vt, message, headers, send_token)
        VALUES (q.queue_id, nextval(q.msg_seq), v_now, v_now + make_interval(secs => send.delay),
                send.message, send.headers, send.send_token)
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
                    send.message, send.headers, send.dedupe_key, send.send_token)
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

-- ---------------------------------------------------------------------------
-- 2. (cont.) only a firing writes a callback; 4. fingerprinted fan-outs

ALTER TABLE pgqueue.barrier ADD COLUMN fingerprint bytea;

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
                'state', p_state))
    RETURNING msg_id INTO v_msg_id;
    PERFORM pgqueue._notify(q);
    UPDATE pgqueue.barrier
       SET state = p_state, fired_at = clock_timestamp(), callback_msg_id = v_msg_id
     WHERE barrier_id = p_barrier_id;
    RETURN v_msg_id;
END
$$;

-- 0002's fan_out, with the fingerprint: a retry of the same request (the
-- client sends the very same parameters again) matches it and returns the id;
-- any other request for that id raises PGQ03. The deadline is fingerprinted
-- as the seconds given, so a retry later still matches.
CREATE OR REPLACE FUNCTION pgqueue.fan_out(
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
    v_print bytea;
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

    INSERT INTO pgqueue.barrier (barrier_id, queue_id, callback_queue_id, callback_message, headers,
                                 total, remaining, deadline, fingerprint)
    VALUES (v_id, q.queue_id, cq.queue_id, fan_out.callback_message, fan_out.headers, v_n, v_n,
            v_now + make_interval(secs => fan_out.deadline_seconds), v_print)
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

-- ---------------------------------------------------------------------------
-- 3. counting members without a session setting

-- Members leaving the live table that nothing counted yet: 'poisoned' when
-- they went to the poison table in the same statement, else 'succeeded' (an
-- ack by delete, archive or pop). Every path that means another outcome
-- (complete_members, the purges) counts its members first, so they are
-- skipped here; nothing a session sets is read.
CREATE OR REPLACE FUNCTION pgqueue._members_gone() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    v_queue_ids integer[];
    v_msg_ids bigint[];
    v_outcomes text[];
    v_results jsonb[];
BEGIN
    SELECT array_agg(g.queue_id), array_agg(g.msg_id),
           array_agg(CASE WHEN p.msg_id IS NOT NULL THEN 'poisoned' ELSE 'succeeded' END),
           array_agg(CASE WHEN p.msg_id IS NOT NULL THEN jsonb_build_object('reason', p.reason) END)
      INTO v_queue_ids, v_msg_ids, v_outcomes, v_results
      FROM gone g
      JOIN pgqueue.barrier_member bm ON bm.queue_id = g.queue_id AND bm.msg_id = g.msg_id
      LEFT JOIN pgqueue.poison p ON p.queue_id = g.queue_id AND p.msg_id = g.msg_id
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

CREATE OR REPLACE FUNCTION pgqueue.purge_queue(queue_name text) RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    q pgqueue.queue := pgqueue._queue(queue_name);
    n bigint;
BEGIN
    -- Members are counted as purged in the statement that deletes them.
    WITH gone AS (
        DELETE FROM pgqueue.message m WHERE m.queue_id = q.queue_id
        RETURNING m.msg_id, m.member_of
    ), agg AS (
        SELECT count(*) AS n, array_agg(g.msg_id) FILTER (WHERE g.member_of IS NOT NULL) AS members
          FROM gone g
    )
    SELECT agg.n INTO n FROM agg, LATERAL pgqueue._count_purged(q.queue_id, agg.members) AS c;
    RETURN n;
END
$$;

CREATE OR REPLACE FUNCTION pgqueue.purge_queue_chunk(queue_name text, up_to_msg_id bigint, qty integer)
RETURNS bigint
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    q pgqueue.queue := pgqueue._queue(purge_queue_chunk.queue_name);
    n bigint;
BEGIN
    PERFORM pgqueue._require_nonnegative('qty', purge_queue_chunk.qty);
    WITH gone AS (
        DELETE FROM pgqueue.message m
         WHERE m.queue_id = q.queue_id
           AND m.msg_id IN (SELECT c.msg_id FROM pgqueue.message c
                             WHERE c.queue_id = q.queue_id AND c.msg_id <= purge_queue_chunk.up_to_msg_id
                             ORDER BY c.msg_id
                             LIMIT purge_queue_chunk.qty
                               FOR UPDATE)
        RETURNING m.msg_id, m.member_of
    ), agg AS (
        SELECT count(*) AS n, array_agg(g.msg_id) FILTER (WHERE g.member_of IS NOT NULL) AS members
          FROM gone g
    )
    SELECT agg.n INTO n FROM agg, LATERAL pgqueue._count_purged(q.queue_id, agg.members) AS c;
    RETURN n;
END
$$;

CREATE OR REPLACE FUNCTION pgqueue.drop_queue(queue_name text) RETURNS boolean
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    q pgqueue.queue;
    n bigint;
BEGIN
    SELECT * INTO q FROM pgqueue.queue WHERE queue_name = drop_queue.queue_name FOR UPDATE;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    PERFORM pgqueue._before_drop(q);
    -- Drop the sequence first: nextval holds a lock on it until the sending
    -- transaction ends, so this waits for in-flight sends to commit (their rows
    -- are then deleted below, not left behind without a queue), and a send that
    -- starts later fails instead of writing an orphan row.
    EXECUTE format('DROP SEQUENCE %s', q.msg_seq);
    -- Members are counted as purged in the statement that deletes them.
    WITH gone AS (
        DELETE FROM pgqueue.message m WHERE m.queue_id = q.queue_id
        RETURNING m.msg_id, m.member_of
    ), agg AS (
        SELECT count(*) AS n, array_agg(g.msg_id) FILTER (WHERE g.member_of IS NOT NULL) AS members
          FROM gone g
    )
    SELECT agg.n INTO n FROM agg, LATERAL pgqueue._count_purged(q.queue_id, agg.members) AS c;
    DELETE FROM pgqueue.archive WHERE queue_id = q.queue_id;
    DELETE FROM pgqueue.poison WHERE queue_id = q.queue_id;
    DELETE FROM pgqueue.send_receipt WHERE queue_id = q.queue_id;
    DELETE FROM pgqueue.waiter WHERE queue_id = q.queue_id;
    DELETE FROM pgqueue.recheck WHERE queue_id = q.queue_id;
    DELETE FROM pgqueue.queue WHERE queue_id = q.queue_id;
    PERFORM pgqueue._lane_seqs(q.queue_id, false);
    RETURN true;
END
$$;

-- ---------------------------------------------------------------------------
-- 1. (cont.) completions: a failure verdict may be fenced

-- 0002's complete_members with read_cts: an entry with a read_ct acts only
-- while that read still holds the message's lease (else it is left alone: not
-- counted, not acked); an entry without one acts unfenced, as before. Meant
-- for failures ('failed' speaks for one attempt, and the current holder may
-- still succeed); a success may go unfenced (see the header). The statuses
-- returned are those of the barriers of the entries that acted.
DROP FUNCTION pgqueue.complete_member(text, bigint, text, jsonb);
DROP FUNCTION pgqueue.complete_members(text, bigint[], text[], jsonb[]);
DELETE FROM pgqueue.role_grant
 WHERE function_signature IN ('pgqueue.complete_member(text,bigint,text,jsonb)',
                              'pgqueue.complete_members(text,bigint[],text[],jsonb[])');

CREATE FUNCTION pgqueue.complete_members(
    queue_name text,
    msg_ids bigint[],
    outcomes text[] DEFAULT NULL,
    results jsonb[] DEFAULT NULL,
    read_cts integer[] DEFAULT NULL
) RETURNS SETOF pgqueue.barrier_status
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    q pgqueue.queue := pgqueue._queue(complete_members.queue_name);
    v_ids bigint[] := complete_members.msg_ids;
    v_n integer := cardinality(complete_members.msg_ids);
    v_outcomes text[];
    v_results jsonb[];
    v_bad text;
BEGIN
    IF complete_members.msg_ids IS NULL THEN
        RAISE EXCEPTION 'msg_ids must not be NULL' USING ERRCODE = '22004';
    END IF;
    v_outcomes := coalesce(complete_members.outcomes, array_fill('succeeded'::text, ARRAY[v_n]));
    v_results := coalesce(complete_members.results, array_fill(NULL::jsonb, ARRAY[v_n]));
    IF cardinality(v_outcomes) <> v_n OR cardinality(v_results) <> v_n
       OR cardinality(complete_members.read_cts) <> v_n THEN
        RAISE EXCEPTION 'msg_ids, outcomes, results and read_cts must have the same length'
            USING ERRCODE = '22023';
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
      WHERE queue_id = q.queue_id AND msg_id = ANY (v_ids)
      ORDER BY msg_id FOR UPDATE;
    IF complete_members.read_cts IS NOT NULL THEN
        -- The rows are locked: what this sees holds until we commit.
        SELECT coalesce(array_agg(u.msg_id ORDER BY u.ord), '{}'),
               coalesce(array_agg(u.outcome ORDER BY u.ord), '{}'),
               coalesce(array_agg(u.result ORDER BY u.ord), '{}')
          INTO v_ids, v_outcomes, v_results
          FROM unnest(complete_members.msg_ids, v_outcomes, v_results, complete_members.read_cts)
               WITH ORDINALITY AS u (msg_id, outcome, result, read_ct, ord)
         WHERE u.read_ct IS NULL
            OR EXISTS (SELECT 1 FROM pgqueue.message m
                        WHERE m.queue_id = q.queue_id AND m.msg_id = u.msg_id AND m.read_ct = u.read_ct);
        v_n := cardinality(v_ids);
        IF v_n = 0 THEN
            RETURN;
        END IF;
    END IF;
    -- Count the outcomes, then ack: the ack's trigger finds the members
    -- counted and leaves them alone.
    PERFORM pgqueue._complete(array_fill(q.queue_id, ARRAY[v_n]), v_ids, v_outcomes, v_results);
    DELETE FROM pgqueue.message WHERE queue_id = q.queue_id AND msg_id = ANY (v_ids);

    RETURN QUERY
    SELECT s.* FROM (SELECT DISTINCT bm.barrier_id FROM pgqueue.barrier_member bm
                      WHERE bm.queue_id = q.queue_id AND bm.msg_id = ANY (v_ids)) d,
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
LANGUAGE sql AS $$
    -- The barrier's state after the completion; NULL when the message is not a
    -- barrier member (it is acked all the same), or when read_ct is given and
    -- no longer names the current lease (nothing changed).
    SELECT to_jsonb(s)
      FROM pgqueue.complete_members(queue_name, ARRAY[msg_id], ARRAY[outcome], ARRAY[result],
                                    CASE WHEN read_ct IS NOT NULL THEN ARRAY[read_ct] END) s;
$$;

-- ---------------------------------------------------------------------------
-- 5. the late sweep's view of writers, read in an order that misses none

-- 0007's _oldest_writer(), reading the sessions before the prepared
-- transactions. The argument of 0005 needs: every transaction W that has
-- written a row the sweep's later snapshot cannot see is counted. W is
-- uncommitted from before the first read here until after that snapshot, and
-- while uncommitted it is, at every instant, a session with a transaction id
-- (backend_xid), or a valid prepared transaction, or both: PREPARE marks the
-- prepared transaction valid before it clears the session's transaction id,
-- and a prepared transaction stays until COMMIT/ROLLBACK PREPARED. Reading
-- the sessions at t1 and the prepared transactions at t2 > t1: if W was
-- still a session at t1 it is seen there; if it had prepared by t1, it is
-- still prepared at t2 and seen there. In the old order (prepared first) a
-- PREPARE between the two reads was seen by neither, and the sweep raised the
-- safe floor above W's rows: after COMMIT PREPARED no read found them
-- (test_a_message_prepared_during_a_sweep_is_read_after_commit_prepared).
--
-- Other late writers, checked against the same argument:
--   * transactions of other databases cannot write these tables; prepared
--     transactions are filtered by database, sessions by datname;
--   * subtransactions write under their top transaction, which takes its id
--     first, so the session shows backend_xid;
--   * logical replication workers and other background workers are sessions
--     here (only autovacuum is left out, which never writes message rows);
--   * parallel workers do not write; their leader holds the transaction id;
--   * a session hidden from the owner counts as infinitely old (0007);
--   * a session with track_activities off shows no times (counted as
--     infinitely old) or stale ones (older, so the floor only stays lower);
--   * after a crash or a failover, prepared transactions come back from the
--     WAL as prepared transactions, and sessions start anew;
--   * a clock that steps back is not a late commit but breaks "vt >= the time
--     of the statement that wrote it" as seen by an earlier sweep: _claim
--     resets the floors when a read starts below one of them. Rows sent during
--     a step back of over a second with no read of their queue until the
--     clock caught up again stay below the safe floor (docs/design/claim-lanes.md).
CREATE OR REPLACE FUNCTION pgqueue._oldest_writer() RETURNS timestamptz
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_oldest timestamptz;
BEGIN
    PERFORM pg_stat_clear_snapshot();
    SELECT min(CASE WHEN a.backend_xid IS NOT NULL
                    THEN coalesce(a.xact_start, '-infinity')
                    ELSE coalesce(a.query_start, a.xact_start, '-infinity') END)
      INTO v_oldest
      FROM pg_stat_activity a
     WHERE a.datname = current_database()
       AND a.pid <> pg_backend_pid()
       -- every process that can write rows here (client backends, background
       -- and logical replication workers); vacuum never writes message rows;
       -- a hidden session (NULL type) may be any of them
       AND (a.backend_type IS NULL OR a.backend_type NOT IN ('autovacuum worker', 'autovacuum launcher'))
       -- state and times of another role's session are NULL without
       -- pg_read_all_stats: counted as -infinity
       AND (a.backend_xid IS NOT NULL OR a.state IS NULL
            OR a.state NOT IN ('idle', 'idle in transaction', 'idle in transaction (aborted)'));
    -- After the sessions, never before (see above).
    IF EXISTS (SELECT 1 FROM pg_prepared_xacts p WHERE p.database = current_database()) THEN
        -- a prepared transaction may hold rows stamped at any earlier time
        RETURN '-infinity';
    END IF;
    RETURN coalesce(v_oldest, 'infinity');
END
$$;

-- ---------------------------------------------------------------------------
-- the read, with 5. (a clock that went back) and 7. (a notice per poison drop)

-- 0005's _claim, but for the two changes named above.
CREATE OR REPLACE FUNCTION pgqueue._claim(q pgqueue.queue, vt_seconds integer, qty integer, remove boolean)
RETURNS SETOF pgqueue.message_record
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan
AS $$
#variable_conflict use_column
DECLARE
    -- How far behind now a fast floor stays when the first row a read locked
    -- in its lane is younger than that (or it locked none): writes that commit
    -- within this long after their statement began are found by every read;
    -- later ones by the late sweep.
    c_margin_f constant interval := interval '50 milliseconds';
    c_margin_t constant interval := interval '10 milliseconds';
    s_fast_f regclass;
    s_fast_f_id regclass;
    s_fast_t regclass;
    s_safe_f regclass;
    s_safe_t regclass;
    s_sweep regclass;
    v_new_f bigint;
    v_new_t bigint;
    v_set_f_id boolean := false;
    v_set_f boolean := false;
    v_set_t boolean := false;
    v_start timestamptz := clock_timestamp();
    v_now timestamptz;
    v_left integer := qty;
    v_ok bigint[];
    v_exhausted bigint[];
    v_handed bigint[] := '{}';
    v_fast_f bigint;
    v_fast_f_id bigint;
    v_fast_t bigint;
    v_safe_f bigint;
    v_safe_t bigint;
    v_next_sweep bigint;
    v_lo_f timestamptz;
    v_lo_f_id bigint;
    v_lo_t timestamptz;
    v_sweep boolean;
    v_raise boolean := false;
    v_first_f timestamptz;
    v_first_t timestamptz;
    v_locked_f timestamptz;
    v_locked_f_id bigint;
    v_locked_t timestamptz;
    v_round_f timestamptz;
    v_round_f_id bigint;
    v_round_t timestamptz;
    v_listed boolean := false;
    v_round_listed boolean;
    v_writer timestamptz;
    v_new bigint;
    v_dropped record;
BEGIN
    IF qty <= 0 THEN
        RETURN;
    END IF;
    -- vt before id: a writer sets id before vt, so a read racing it sees a
    -- pair no higher than the one written (see the fast floor update below)
    -- one statement: the sequences are found by name, and read in this order
    SELECT x.ff, x.ffi, x.ft, x.sf, x.st, x.sw,
           coalesce(pg_sequence_last_value(x.ff), 1), coalesce(pg_sequence_last_value(x.ffi), 1),
           coalesce(pg_sequence_last_value(x.ft), 1), coalesce(pg_sequence_last_value(x.sf), 1),
           coalesce(pg_sequence_last_value(x.st), 1), coalesce(pg_sequence_last_value(x.sw), 1)
      INTO s_fast_f, s_fast_f_id, s_fast_t, s_safe_f, s_safe_t, s_sweep,
           v_fast_f, v_fast_f_id, v_fast_t, v_safe_f, v_safe_t, v_next_sweep
      FROM (SELECT (y.p || 'fast_f')::regclass AS ff, (y.p || 'fast_f_id')::regclass AS ffi,
                   (y.p || 'fast_t')::regclass AS ft, (y.p || 'safe_f')::regclass AS sf,
                   (y.p || 'safe_t')::regclass AS st, (y.p || 'sweep')::regclass AS sw
              FROM (SELECT 'pgqueue.lane_' || q.queue_id || '_' AS p) y) x;

    -- A clock that went back (an NTP step, a failover to a server whose clock
    -- is behind): every floor was set at or below the time of the read that
    -- set it, so a floor above our start means rows written from now on may
    -- lie below it. Start the lanes over from the bottom and sweep now; this
    -- read's sweep then sets the safe floors from the clock as it is.
    IF pgqueue._ts_us(v_start) < greatest(v_fast_f, v_fast_t, v_safe_f, v_safe_t) THEN
        RAISE LOG 'pgqueue: the clock of the server went back (read at %, lane floors up to %); queue % reads its lanes from the bottom',
            v_start, pgqueue._us_ts(greatest(v_fast_f, v_fast_t, v_safe_f, v_safe_t)), q.queue_name;
        PERFORM setval(s_fast_f_id, 1), setval(s_fast_f, 1), setval(s_fast_t, 1),
                setval(s_safe_f, 1), setval(s_safe_t, 1);
        v_fast_f := 1;
        v_fast_f_id := 1;
        v_fast_t := 1;
        v_safe_f := 1;
        v_safe_t := 1;
        v_next_sweep := 1;
    END IF;

    v_sweep := pgqueue._ts_us(v_start) >= v_next_sweep;
    IF v_sweep THEN
        -- Only a read with a fresh snapshot that cannot see uncommitted writes
        -- of its own may raise the safe floors (checked before our setval,
        -- which takes a transaction id).
        v_raise := pg_current_xact_id_if_assigned() IS NULL
                   AND current_setting('transaction_isolation') = 'read committed';
        PERFORM setval(s_sweep, pgqueue._ts_us(v_start + interval '1 second'));
        v_lo_f := pgqueue._us_ts(v_safe_f);
        v_lo_f_id := 0;
        v_lo_t := pgqueue._us_ts(v_safe_t);
        IF v_raise THEN
            v_writer := pgqueue._oldest_writer();
            -- Plain reads: a row being claimed by a transaction still in
            -- progress shows its old version here, and holds the floor.
            SELECT m.vt INTO v_first_f FROM pgqueue.message m
             WHERE m.queue_id = q.queue_id AND m.read_ct = 0 AND m.vt <= m.enqueued_at
               AND m.vt >= v_lo_f AND m.vt <= v_start
             ORDER BY m.vt, m.msg_id LIMIT 1;
            SELECT m.vt INTO v_first_t FROM pgqueue.message m
             WHERE m.queue_id = q.queue_id AND (m.read_ct <> 0 OR m.vt > m.enqueued_at)
               AND m.vt >= v_lo_t AND m.vt <= v_start
             ORDER BY m.vt, m.msg_id LIMIT 1;
            -- nothing visible lies below those rows: the claim starts there
            -- (a row committed since is above the safe floors raised below)
            v_lo_f := coalesce(v_first_f, v_start);
            v_lo_t := coalesce(v_first_t, v_start);
        END IF;
    ELSE
        v_lo_f := pgqueue._us_ts(v_fast_f);
        v_lo_f_id := v_fast_f_id;
        v_lo_t := pgqueue._us_ts(v_fast_t);
    END IF;

    -- Rows are locked by the claim (SKIP LOCKED), so two readers never get the
    -- same message; rows past max_attempts go to the poison table in the
    -- transaction that would have delivered them again; the batch is refilled
    -- for the places they left; no message is handed out twice in one call.
    -- Each lane gives its first rows in (vt, msg_id) order, the listed rows
    -- theirs, and the batch is the first of them all in that order.
    LOOP
        v_now := clock_timestamp();
        WITH f AS (
            SELECT m.msg_id, m.vt, m.read_ct FROM pgqueue.message m
             WHERE m.queue_id = q.queue_id AND m.read_ct = 0 AND m.vt <= m.enqueued_at
               AND (m.vt, m.msg_id) >= (v_lo_f, v_lo_f_id) AND m.vt <= v_now
               AND m.msg_id <> ALL (v_handed)
             ORDER BY m.vt, m.msg_id
             LIMIT v_left
               FOR UPDATE SKIP LOCKED
        ), t AS (
            SELECT m.msg_id, m.vt, m.read_ct FROM pgqueue.message m
             WHERE m.queue_id = q.queue_id AND (m.read_ct <> 0 OR m.vt > m.enqueued_at)
               AND m.vt >= v_lo_t AND m.vt <= v_now
               AND m.msg_id <> ALL (v_handed)
             ORDER BY m.vt, m.msg_id
             LIMIT v_left
               FOR UPDATE SKIP LOCKED
        ), listed AS (
            SELECT r.msg_id FROM pgqueue.recheck r WHERE r.queue_id = q.queue_id
        ), l AS (
            SELECT m.msg_id, m.vt, m.read_ct FROM pgqueue.message m
             WHERE m.queue_id = q.queue_id AND m.msg_id IN (SELECT x.msg_id FROM listed x)
               AND m.vt <= v_now
               AND m.msg_id <> ALL (v_handed)
             ORDER BY m.vt, m.msg_id
             LIMIT v_left
               FOR UPDATE SKIP LOCKED
        ), c AS (
            SELECT DISTINCT ON (u.msg_id) u.msg_id, u.vt, u.read_ct
              FROM (SELECT * FROM f UNION ALL SELECT * FROM t UNION ALL SELECT * FROM l) u
        ), b AS (
            SELECT * FROM c ORDER BY c.vt, c.msg_id LIMIT v_left
        ), f1 AS (
            SELECT f.vt, f.msg_id FROM f ORDER BY f.vt, f.msg_id LIMIT 1
        )
        SELECT (SELECT f1.vt FROM f1), (SELECT f1.msg_id FROM f1), (SELECT min(t.vt) FROM t),
               EXISTS (SELECT 1 FROM listed),
               coalesce((SELECT array_agg(b.msg_id) FROM b WHERE b.read_ct < q.max_attempts), '{}'),
               coalesce((SELECT array_agg(b.msg_id) FROM b WHERE b.read_ct >= q.max_attempts), '{}')
          INTO v_round_f, v_round_f_id, v_round_t, v_round_listed, v_ok, v_exhausted;
        -- the first row locked in each lane over all rounds
        IF v_round_f IS NOT NULL AND (v_locked_f IS NULL OR (v_round_f, v_round_f_id) < (v_locked_f, v_locked_f_id)) THEN
            v_locked_f := v_round_f;
            v_locked_f_id := v_round_f_id;
        END IF;
        v_locked_t := least(v_locked_t, v_round_t);
        v_listed := v_listed OR v_round_listed;

        IF cardinality(v_exhausted) > 0 THEN
            -- One notice per message dropped, so the caller can log it: the
            -- rows a read returns are only the ones it delivered.
            FOR v_dropped IN
                WITH gone AS (
                    DELETE FROM pgqueue.message
                     WHERE queue_id = q.queue_id AND msg_id = ANY (v_exhausted)
                    RETURNING *
                )
                INSERT INTO pgqueue.poison (queue_id, msg_id, read_ct, enqueued_at, poisoned_at,
                                            reason, message, headers, dedupe_key)
                SELECT g.queue_id, g.msg_id, g.read_ct, g.enqueued_at, v_now,
                       pgqueue._exhausted_reason(g.read_ct, g.last_error),
                       g.message, g.headers, g.dedupe_key
                  FROM gone g
                RETURNING msg_id, read_ct, reason
            LOOP
                PERFORM pgqueue._notice_poisoned(q.queue_name, v_dropped.msg_id, v_dropped.read_ct,
                                                 v_dropped.reason);
            END LOOP;
            PERFORM set_config('pgqueue.claim_poisoned', 'on', true);
        END IF;

        IF cardinality(v_ok) > 0 THEN
            IF remove THEN
                RETURN QUERY
                WITH taken AS (
                    DELETE FROM pgqueue.message
                     WHERE queue_id = q.queue_id AND msg_id = ANY (v_ok)
                    RETURNING msg_id, read_ct + 1 AS read_ct, enqueued_at, vt, message, headers
                )
                SELECT * FROM taken t ORDER BY t.msg_id;
            ELSE
                RETURN QUERY
                WITH leased AS (
                    UPDATE pgqueue.message
                       SET vt = v_now + make_interval(secs => vt_seconds), read_ct = read_ct + 1
                     WHERE queue_id = q.queue_id AND msg_id = ANY (v_ok)
                    RETURNING msg_id, read_ct, enqueued_at, vt, message, headers
                )
                SELECT * FROM leased l ORDER BY l.msg_id;
            END IF;
            v_left := v_left - cardinality(v_ok);
            v_handed := v_handed || v_ok;
        END IF;
        EXIT WHEN cardinality(v_exhausted) = 0 OR v_left <= 0;
    END LOOP;

    -- Listed rows that are gone, claimed or not due need no listing any more
    -- (rows we claimed: if this transaction rolls back, so does this delete).
    IF v_listed THEN
        DELETE FROM pgqueue.recheck r
         WHERE r.queue_id = q.queue_id
           AND r.msg_id IN (
               SELECT x.msg_id FROM pgqueue.recheck x
                WHERE x.queue_id = q.queue_id
                  AND NOT EXISTS (SELECT 1 FROM pgqueue.message m
                                   WHERE m.queue_id = x.queue_id AND m.msg_id = x.msg_id
                                     AND m.vt <= v_now AND m.msg_id <> ALL (v_handed))
                  FOR UPDATE SKIP LOCKED);
    END IF;

    -- Fast floors, a matter of speed only (the late sweep finds what they
    -- pass over): the first row this read locked in the lane, as long as it is
    -- older than the margin; else the margin. Only raised here (a sweep lowers
    -- them to rows it finds below them, see the end); an empty read
    -- moves them only by whole seconds (setval takes a transaction id, and its
    -- commit then a WAL flush). The fresh lane also keeps the msg_id of its
    -- first locked row, so a batch of rows sharing one vt is not walked again;
    -- written before the vt, read after it (above), so a read racing this
    -- sees a pair that excludes no more than the pair written.
    IF v_locked_f IS NOT NULL AND v_locked_f < v_start - c_margin_f THEN
        v_new_f := pgqueue._ts_us(v_locked_f);
        v_set_f := v_new_f > v_fast_f OR (v_new_f = v_fast_f AND v_locked_f_id > v_fast_f_id);
        v_set_f_id := v_set_f;
    ELSE
        v_new_f := pgqueue._ts_us(least(v_locked_f, v_start - c_margin_f)) - 1;
        v_set_f := v_new_f > v_fast_f AND (v_locked_f IS NOT NULL OR cardinality(v_handed) > 0
                                           OR v_new_f > v_fast_f + 1000000);
    END IF;
    v_new_t := pgqueue._ts_us(least(v_locked_t, v_start - c_margin_t)) - 1;
    v_set_t := v_new_t > v_fast_t AND (v_locked_t IS NOT NULL OR cardinality(v_handed) > 0
                                       OR v_new_t > v_fast_t + 1000000);
    IF v_set_f OR v_set_t THEN
        -- one statement, evaluated in this order: the id before the vt
        PERFORM CASE WHEN v_set_f_id THEN setval(s_fast_f_id, v_locked_f_id) END,
                CASE WHEN v_set_f THEN setval(s_fast_f, v_new_f) END,
                CASE WHEN v_set_t THEN setval(s_fast_t, v_new_t) END;
    END IF;

    IF v_sweep THEN
        -- Rows the sweep found below a fast floor (a transaction that committed
        -- many rows late, a bulk load): bring the fast floor down to them, so
        -- that every read takes them, not one sweep a second.
        v_new_f := pgqueue._ts_us(least(v_first_f, v_locked_f)) - 1;
        IF v_new_f < v_fast_f THEN
            PERFORM setval(s_fast_f_id, 1), setval(s_fast_f, greatest(v_new_f, 1));
        END IF;
        v_new_t := pgqueue._ts_us(least(v_first_t, v_locked_t)) - 1;
        IF v_new_t < v_fast_t THEN
            PERFORM setval(s_fast_t, greatest(v_new_t, 1));
        END IF;
        IF v_raise THEN
            v_new := pgqueue._ts_us(least(v_start - interval '1 second', v_writer - interval '1 second',
                                          v_first_f)) - 1;
            IF v_new > v_safe_f THEN
                PERFORM setval(s_safe_f, v_new);
            END IF;
            v_new := pgqueue._ts_us(least(v_start - interval '1 second', v_writer - interval '1 second',
                                          v_first_t)) - 1;
            IF v_new > v_safe_t THEN
                PERFORM setval(s_safe_t, v_new);
            END IF;
        END IF;
        -- a slow sweep spaces out the next ones: sweeps take at most ~5% of reads
        PERFORM setval(s_sweep, pgqueue._ts_us(clock_timestamp()
                       + greatest(interval '1 second', 20 * (clock_timestamp() - v_start))));
    END IF;
END
$$;

-- ---------------------------------------------------------------------------
-- who may call the new functions

INSERT INTO pgqueue.role_grant (function_signature, roles) VALUES
    ('pgqueue.set_vt(text,bigint,integer,text,integer)', '{pgqueue_consumer}'),
    ('pgqueue.poison(text,bigint,text,integer)', '{pgqueue_consumer}'),
    ('pgqueue.nack(text,bigint,integer,integer,text)', '{pgqueue_consumer}'),
    ('pgqueue.hold_leases(text,bigint[],integer[])', '{pgqueue_consumer}'),
    ('pgqueue.complete_member(text,bigint,text,jsonb,integer)', '{pgqueue_consumer}'),
    ('pgqueue.complete_members(text,bigint[],text[],jsonb[],integer[])', '{pgqueue_consumer}');

-- CREATE OR REPLACE above reset SECURITY DEFINER and search_path of the API
-- functions it replaced; this sets them again and grants the new ones.
SELECT pgqueue.grant_roles();
