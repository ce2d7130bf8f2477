-- pgqueue 0011: set_vt of many leases in one call.
--
-- A worker now keeps a prefetch of messages waiting for its handlers sized by
-- their rate (hundreds for fast handlers). When it stops, what waits goes back
-- to the queue at once, fenced by each lease's read_ct; one set_vt per message
-- made that hundreds of round trips inside the shutdown grace. This is the
-- same fenced change for a list of leases, in one statement.

-- set_vt for many leases at once, each for the holder of the lease its
-- read_ct names (msg_ids and read_cts pair up by position): what a worker
-- gives back when it stops with messages prefetched, in one statement instead
-- of one per message. The rows changed; none for a lease taken over or gone.
-- Locked in msg_id order by primary-key probes, then changed by ctid, the
-- plan 0010 fixed for every list of ids.
CREATE FUNCTION pgqueue.set_vt(queue_name text, msg_ids bigint[], vt integer, read_cts integer[])
RETURNS SETOF pgqueue.message_record
LANGUAGE plpgsql
SET enable_seqscan = off
SECURITY DEFINER SET search_path = pg_catalog, pgqueue, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    q pgqueue.queue;
    v_tids tid[];
BEGIN
    PERFORM pgqueue._require_nonnegative('vt', set_vt.vt);
    IF set_vt.msg_ids IS NULL OR set_vt.read_cts IS NULL
       OR cardinality(set_vt.msg_ids) <> cardinality(set_vt.read_cts) THEN
        RAISE EXCEPTION 'msg_ids and read_cts must be given, with the same length' USING ERRCODE = '22023';
    END IF;
    IF array_position(set_vt.read_cts, NULL) IS NOT NULL THEN
        PERFORM pgqueue._require_read_ct(NULL);
    END IF;
    q := pgqueue._queue(set_vt.queue_name);
    v_tids := ARRAY(
        SELECT t.tid FROM (
            SELECT (SELECT m.ctid FROM pgqueue.message m
                     WHERE m.queue_id = q.queue_id AND m.msg_id = l.msg_id AND m.read_ct = l.read_ct
                       FOR UPDATE) AS tid
              FROM (SELECT DISTINCT ON (x.msg_id) x.msg_id, x.read_ct
                      FROM unnest(set_vt.msg_ids, set_vt.read_cts) AS x (msg_id, read_ct)
                     ORDER BY x.msg_id) AS l) AS t
         WHERE t.tid IS NOT NULL);
    RETURN QUERY
    UPDATE pgqueue.message m
       SET vt = clock_timestamp() + make_interval(secs => set_vt.vt)
     WHERE m.ctid = ANY (v_tids)
    RETURNING m.msg_id, m.read_ct, m.enqueued_at, m.vt, m.message, m.headers;
END
$$;

INSERT INTO pgqueue.role_grant (function_signature, roles) VALUES
    ('pgqueue.set_vt(text,bigint[],integer,integer[])', '{pgqueue_consumer}');

SELECT pgqueue.grant_roles();
