-- pgqueue 0006: leaner hot calls. A single send without nested function calls
-- on its fast path, and acks by id array that plan once per session.
--
-- Profiling single sends (pgbench, one SELECT pgqueue.send per transaction)
-- showed that each nested plpgsql call costs a function setup: the argument
-- checks, the queue lookup and the wake-up check were four of them per send.
-- Here the checks run as one inline condition (the helpers raise their usual
-- errors only once it fails), the queue row is read inline (the helper raises
-- the usual "does not exist" error only when it is missing), and the waiter
-- check is inline. Behaviour, errors and hints are those of 0001-0005.

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
BEGIN
    IF send.message IS NULL OR send.delay IS NULL OR send.delay < 0
       OR jsonb_typeof(send.headers) <> 'object' OR length(send.dedupe_key) > 1000 THEN
        IF send.message IS NULL THEN
            RAISE EXCEPTION 'message must not be NULL' USING ERRCODE = '22004',
                HINT = 'Send a JSON value; use ''null''::jsonb for a JSON null.';
        END IF;
        PERFORM pgqueue._require_nonnegative('delay', send.delay);
        PERFORM pgqueue._require_headers(send.headers);
        RAISE EXCEPTION 'dedupe_key is % characters; at most 1000', length(send.dedupe_key)
            USING ERRCODE = '22023', HINT = 'Use a short key, e.g. a hash of the long one.';
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
            SELECT m.msg_id INTO v_id FROM pgqueue.message m
             WHERE m.queue_id = q.queue_id AND m.dedupe_key = send.dedupe_key;
            IF FOUND THEN
                RETURN v_id;
            END IF;
            IF send.send_token IS NOT NULL THEN
                SELECT r.msg_id INTO v_id FROM pgqueue.send_receipt r
                 WHERE r.send_token = send.send_token AND r.queue_id = q.queue_id;
                IF FOUND THEN
                    -- This is a retry of a send that did commit and was consumed since.
                    RETURN v_id;
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

-- Acks by id array: plan once per session. Left to choose, plpgsql planned
-- the DELETE anew on every call (a custom plan for the array each time);
-- measured in a one-message read+delete loop, the ack cost about 150 us of
-- which the DELETE itself ran 40.
ALTER FUNCTION pgqueue.delete(text, bigint[]) SET plan_cache_mode = force_generic_plan;
ALTER FUNCTION pgqueue.archive(text, bigint[]) SET plan_cache_mode = force_generic_plan;
