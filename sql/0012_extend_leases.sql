-- pgqueue 0012: a heartbeat that never waits for a row lock.
--
-- A worker's heartbeat extended its leases one set_vt at a time, and waited
-- for each row's lock. A message whose ack was still running (a slow commit,
-- a trigger, a lock queue) held that lock: the heartbeat waited as long as the
-- ack ran, and the leases of the messages behind it ran out and were handed
-- out again. extend_leases extends every lease of a queue in one statement
-- and skips rows that someone else holds locked.

-- The heartbeat of a worker: extend many leases in one statement, each for
-- the holder of the lease its read_ct names, and never wait for a row lock.
-- A row another transaction has locked (the worker's own ack still running,
-- a reader taking the message over) is skipped: it comes back with extended
-- false, to be tried again; while it is locked nobody else can read it. A
-- lease taken over or gone gives no row. Waiting there instead held a
-- worker's every other heartbeat for as long as one slow ack ran, and the
-- leases behind it ran out.
CREATE FUNCTION pgqueue.extend_leases(queue_name text, msg_ids bigint[], read_cts integer[], vt integer)
RETURNS TABLE (msg_id bigint, extended boolean)
LANGUAGE plpgsql
SET enable_seqscan = off
SECURITY DEFINER SET search_path = pg_catalog, pgqueue, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    q pgqueue.queue;
    v_tids tid[];
    v_done bigint[];
BEGIN
    PERFORM pgqueue._require_nonnegative('vt', extend_leases.vt);
    IF extend_leases.msg_ids IS NULL OR extend_leases.read_cts IS NULL
       OR cardinality(extend_leases.msg_ids) <> cardinality(extend_leases.read_cts) THEN
        RAISE EXCEPTION 'msg_ids and read_cts must be given, with the same length' USING ERRCODE = '22023';
    END IF;
    IF array_position(extend_leases.read_cts, NULL) IS NOT NULL THEN
        PERFORM pgqueue._require_read_ct(NULL);
    END IF;
    q := pgqueue._queue(extend_leases.queue_name);
    v_tids := ARRAY(
        SELECT t.tid FROM (
            SELECT (SELECT m.ctid FROM pgqueue.message m
                     WHERE m.queue_id = q.queue_id AND m.msg_id = l.msg_id AND m.read_ct = l.read_ct
                       FOR UPDATE SKIP LOCKED) AS tid
              FROM (SELECT DISTINCT ON (x.msg_id) x.msg_id, x.read_ct
                      FROM unnest(extend_leases.msg_ids, extend_leases.read_cts) AS x (msg_id, read_ct)
                     ORDER BY x.msg_id) AS l) AS t
         WHERE t.tid IS NOT NULL);
    WITH moved AS (
        UPDATE pgqueue.message m
           SET vt = clock_timestamp() + make_interval(secs => extend_leases.vt)
         WHERE m.ctid = ANY (v_tids)
        RETURNING m.msg_id
    )
    SELECT coalesce(array_agg(moved.msg_id), '{}') INTO v_done FROM moved;
    RETURN QUERY SELECT d.id, true FROM unnest(v_done) AS d (id);
    -- Not locked by us: still the same lease (so locked by another), or gone.
    RETURN QUERY
    SELECT l.msg_id, false
      FROM (SELECT DISTINCT ON (x.msg_id) x.msg_id, x.read_ct
              FROM unnest(extend_leases.msg_ids, extend_leases.read_cts) AS x (msg_id, read_ct)
             ORDER BY x.msg_id) AS l
     WHERE l.msg_id <> ALL (v_done)
       AND EXISTS (SELECT FROM pgqueue.message m
                    WHERE m.queue_id = q.queue_id AND m.msg_id = l.msg_id AND m.read_ct = l.read_ct);
END
$$;

INSERT INTO pgqueue.role_grant (function_signature, roles) VALUES
    ('pgqueue.extend_leases(text,bigint[],integer[],integer)', '{pgqueue_consumer}');

SELECT pgqueue.grant_roles();
