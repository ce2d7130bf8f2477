-- pgqueue schema, as it stands now: reads and leases.
--
-- A read hands out a lease: it locks up to qty visible messages (FOR UPDATE
-- SKIP LOCKED, so two readers never get the same message), hides them for vt
-- seconds and counts the read in read_ct; a message whose attempts ran out is
-- moved to the poison table by the read that would have delivered it again
-- (with a NOTICE, SQLSTATE PGQ10, per message). A lease is named by the
-- read_ct the read returned: extending, nacking, releasing and poisoning take
-- it and change nothing once another reader has taken the message over. Acks
-- (delete, archive) are not fenced: an ack says the work was done, and the
-- first wins (docs/sql.md, "Leases: fenced, and acks not").
--
-- The read lanes, a read that survives MVCC pressure (docs/design/
-- read-lanes.md; the argument in full is the header of sql/0005_claim_lanes.sql,
-- with 0008's corrections in the header of _oldest_writer below and 0026's
-- id floors in the header of sql/0026_fresh_lane_by_id.sql):
--   1. Two lanes. A message version is FRESH (never read, sent without delay:
--      read_ct = 0 AND vt <= enqueued_at) or TIMED (everything else). The
--      fresh lane is a partial unique index on (queue_id, msg_id), read in
--      msg_id order, and half of the key (queue.sql); the timed lane a partial
--      index on (queue_id, vt, msg_id), read in vt order.
--   2. Floors per lane, kept in sequences (setval leaves no dead tuples): a
--      fast floor where every read starts, and a safe floor below which no
--      deliverable row can exist, raised by the late sweep. The fresh lane's
--      floors are msg_ids and move by watermarks (_mark): a pair (T, W) such
--      that every msg_id below W was drawn before time T.
--   3. Backdated writes (a vt moved into the past by hand) are listed in
--      pgqueue.recheck by a trigger, and every read takes the due ones.
--   4. The late sweep, about once a second per queue, reads each lane from its
--      safe floor and raises the safe floors below the oldest possible writer.

-- Messages of a FIFO group are in neither lane (their order is the group's,
-- not vt's): reads take them by the group heads (_take, "Groups").
CREATE UNIQUE INDEX message_fresh_idx ON pgqueue.message (queue_id, msg_id)
    WHERE read_ct = 0 AND vt <= enqueued_at AND group_key IS NULL;
CREATE INDEX message_timed_idx ON pgqueue.message (queue_id, vt, msg_id)
    WHERE (read_ct <> 0 OR vt > enqueued_at) AND group_key IS NULL;

-- Messages whose vt was written into the past (3. above), until a read takes them.
CREATE TABLE pgqueue.recheck (
    queue_id integer NOT NULL,
    msg_id bigint NOT NULL,
    PRIMARY KEY (queue_id, msg_id)
);

-- Removes one message of the named queue (looked up lowercased, as
-- _take_by_name does), into the archive when archived is true: true when it
-- was live, false when it was not, NULL when no queue has that lowercase
-- name. One statement finds the queue and the message by its primary key; the
-- queue's row is looked at again only when no message went.
CREATE FUNCTION pgqueue._remove(queue_name text, msg_id bigint, archived boolean) RETURNS boolean
LANGUAGE plpgsql
AS $$
#variable_conflict use_column
BEGIN
    IF archived THEN
        WITH gone AS (
            DELETE FROM pgqueue.message m
             WHERE m.queue_id = (SELECT q.queue_id FROM pgqueue.queue q
                                  WHERE q.queue_name = lower(_remove.queue_name))
               AND m.msg_id = _remove.msg_id AND pgqueue._keyed(m.read_ct, m.vt, m.enqueued_at, m.group_key)
            RETURNING m.*
        )
        INSERT INTO pgqueue.archive (queue_id, msg_id, read_ct, enqueued_at, vt, message, headers, last_read_at)
        SELECT g.queue_id, g.msg_id, g.read_ct, g.enqueued_at, g.vt, g.message, g.headers, g.last_read_at
          FROM gone g;
    ELSE
        DELETE FROM pgqueue.message m
         WHERE m.queue_id = (SELECT q.queue_id FROM pgqueue.queue q
                              WHERE q.queue_name = lower(_remove.queue_name))
           AND m.msg_id = _remove.msg_id AND pgqueue._keyed(m.read_ct, m.vt, m.enqueued_at, m.group_key);
    END IF;
    IF FOUND THEN
        RETURN true;
    END IF;
    RETURN CASE WHEN EXISTS (SELECT 1 FROM pgqueue.queue q WHERE q.queue_name = lower(_remove.queue_name))
                THEN false END;
END
$$;

CREATE FUNCTION pgqueue.delete(queue_name text, msg_id bigint) RETURNS boolean
LANGUAGE plpgsql
SECURITY DEFINER SET search_path = pg_catalog, pgqueue, pg_temp
AS $$
BEGIN
    -- NULL from _remove: no queue of that lowercase name; _queue raises PGQ01
    -- or finds the one a PGMQ client's name stands for
    RETURN coalesce(pgqueue._remove(queue_name, msg_id, false),
                    pgqueue._remove((pgqueue._queue(queue_name)).queue_name, msg_id, false));
END
$$;

CREATE FUNCTION pgqueue.archive(queue_name text, msg_id bigint) RETURNS boolean
LANGUAGE plpgsql
SECURITY DEFINER SET search_path = pg_catalog, pgqueue, pg_temp
AS $$
BEGIN
    -- as delete does
    RETURN coalesce(pgqueue._remove(queue_name, msg_id, true),
                    pgqueue._remove((pgqueue._queue(queue_name)).queue_name, msg_id, true));
END
$$;

CREATE FUNCTION pgqueue.set_vt(queue_name text, msg_id bigint, vt integer)
RETURNS SETOF pgqueue.message_record
LANGUAGE plpgsql
SECURITY DEFINER SET search_path = pg_catalog, pgqueue, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    q pgqueue.queue;
BEGIN
    PERFORM pgqueue._require_nonnegative('vt', set_vt.vt);
    q := pgqueue._queue(set_vt.queue_name);
    RETURN QUERY
    UPDATE pgqueue.message
       SET vt = clock_timestamp() + make_interval(secs => set_vt.vt)
     WHERE queue_id = q.queue_id AND msg_id = set_vt.msg_id AND pgqueue._keyed(read_ct, vt, enqueued_at, group_key)
    RETURNING msg_id, read_ct, enqueued_at, vt, message, headers;
END
$$;

-- Longest error text kept per message; the rest is cut (with a marker).
CREATE FUNCTION pgqueue._clip_error(error text) RETURNS text
LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE WHEN length(error) > 2000 THEN left(error, 2000) || ' [...]' ELSE error END;
$$;

CREATE FUNCTION pgqueue.set_vt(queue_name text, msg_id bigint, vt integer, last_error text)
RETURNS SETOF pgqueue.message_record
LANGUAGE plpgsql
SECURITY DEFINER SET search_path = pg_catalog, pgqueue, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    q pgqueue.queue;
BEGIN
    PERFORM pgqueue._require_nonnegative('vt', set_vt.vt);
    q := pgqueue._queue(set_vt.queue_name);
    RETURN QUERY
    UPDATE pgqueue.message
       SET vt = clock_timestamp() + make_interval(secs => set_vt.vt),
           last_error = coalesce(pgqueue._clip_error(set_vt.last_error), last_error)
     WHERE queue_id = q.queue_id AND msg_id = set_vt.msg_id AND pgqueue._keyed(read_ct, vt, enqueued_at, group_key)
    RETURNING msg_id, read_ct, enqueued_at, vt, message, headers;
END
$$;

-- Acks many messages; the ids that were still live. Every multi-row remover
-- locks its rows in msg_id order first (in any other order a batch
-- completion and an ack could each hold a row the other wants: a deadlock),
-- one primary-key probe per id, so the plan needs no statistics (see the
-- header of sql/0010_plans.sql), and then removes them by ctid.
CREATE FUNCTION pgqueue.delete(queue_name text, msg_ids bigint[]) RETURNS SETOF bigint
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
SECURITY DEFINER SET search_path = pg_catalog, pgqueue, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    q pgqueue.queue := pgqueue._queue(delete.queue_name);
    v_tids tid[];
BEGIN
    -- Locked in msg_id order, as every multi-row remover locks (a deadlock
    -- with a batch completion otherwise), one primary-key probe per id; then
    -- removed by ctid.
    v_tids := ARRAY(
        SELECT (SELECT m.ctid FROM pgqueue.message m
                 WHERE m.queue_id = q.queue_id AND m.msg_id = u.id AND pgqueue._keyed(m.read_ct, m.vt, m.enqueued_at, m.group_key) FOR UPDATE)
          FROM (SELECT DISTINCT i FROM unnest(delete.msg_ids) AS i ORDER BY i) AS u (id));
    RETURN QUERY
    DELETE FROM pgqueue.message m WHERE m.ctid = ANY (v_tids) RETURNING m.msg_id;
END
$$;

-- Acks many messages by moving them to pgqueue.archive, locked as delete does.
CREATE FUNCTION pgqueue.archive(queue_name text, msg_ids bigint[]) RETURNS SETOF bigint
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
SECURITY DEFINER SET search_path = pg_catalog, pgqueue, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    q pgqueue.queue := pgqueue._queue(archive.queue_name);
    v_tids tid[];
BEGIN
    -- As delete(queue, ids): locked in msg_id order by primary-key probes.
    v_tids := ARRAY(
        SELECT (SELECT m.ctid FROM pgqueue.message m
                 WHERE m.queue_id = q.queue_id AND m.msg_id = u.id AND pgqueue._keyed(m.read_ct, m.vt, m.enqueued_at, m.group_key) FOR UPDATE)
          FROM (SELECT DISTINCT i FROM unnest(archive.msg_ids) AS i ORDER BY i) AS u (id));
    RETURN QUERY
    WITH gone AS (
        DELETE FROM pgqueue.message m WHERE m.ctid = ANY (v_tids)
        RETURNING m.*
    ), kept AS (
        INSERT INTO pgqueue.archive (queue_id, msg_id, read_ct, enqueued_at, vt, message, headers, last_read_at)
        SELECT g.queue_id, g.msg_id, g.read_ct, g.enqueued_at, g.vt, g.message, g.headers, g.last_read_at
          FROM gone g
        RETURNING msg_id
    )
    SELECT k.msg_id FROM kept k;
END
$$;

-- Raises unless msg_ids and enqueued_ats are both given and pair up.
CREATE FUNCTION pgqueue._require_pairs(msg_ids bigint[], enqueued_ats timestamptz[]) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    IF msg_ids IS NULL OR enqueued_ats IS NULL THEN
        RAISE EXCEPTION 'msg_ids and enqueued_ats must not be NULL' USING ERRCODE = '22004';
    END IF;
    IF cardinality(msg_ids) <> cardinality(enqueued_ats) THEN
        RAISE EXCEPTION 'msg_ids and enqueued_ats must have the same length (% and %)',
            cardinality(msg_ids), cardinality(enqueued_ats)
            USING ERRCODE = '22023';
    END IF;
END
$$;

-- Acks many messages, each only while it is the message its reader was given:
-- the same msg_id and the same enqueued_at (which no write changes). An id
-- handed out again cannot be acked by a reader of the first message with that
-- id: a sequence's advance is WAL-logged ahead of the sends that use it, so
-- after an asynchronous standby is promoted, the ids of the sends it never
-- received are handed out again, and an unfenced ack retried across that
-- failover would remove the new message. Locked and removed as delete does.
-- The worker acks this way (docs/deploy.md, "HA and failover").
CREATE FUNCTION pgqueue.delete(queue_name text, msg_ids bigint[], enqueued_ats timestamptz[])
RETURNS SETOF bigint
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
SECURITY DEFINER SET search_path = pg_catalog, pgqueue, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    q pgqueue.queue := pgqueue._queue(delete.queue_name);
    v_tids tid[];
BEGIN
    PERFORM pgqueue._require_pairs(delete.msg_ids, delete.enqueued_ats);
    v_tids := ARRAY(
        SELECT (SELECT m.ctid FROM pgqueue.message m
                 WHERE m.queue_id = q.queue_id AND m.msg_id = u.id AND pgqueue._keyed(m.read_ct, m.vt, m.enqueued_at, m.group_key) AND m.enqueued_at = u.at
                   FOR UPDATE)
          FROM (SELECT DISTINCT i, e FROM unnest(delete.msg_ids, delete.enqueued_ats) AS x (i, e)
                 ORDER BY i) AS u (id, at));
    RETURN QUERY
    DELETE FROM pgqueue.message m WHERE m.ctid = ANY (v_tids) RETURNING m.msg_id;
END
$$;

-- Acks many messages by archiving them, fenced by enqueued_at as the
-- delete above.
CREATE FUNCTION pgqueue.archive(queue_name text, msg_ids bigint[], enqueued_ats timestamptz[])
RETURNS SETOF bigint
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
SECURITY DEFINER SET search_path = pg_catalog, pgqueue, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    q pgqueue.queue := pgqueue._queue(archive.queue_name);
    v_tids tid[];
BEGIN
    PERFORM pgqueue._require_pairs(archive.msg_ids, archive.enqueued_ats);
    v_tids := ARRAY(
        SELECT (SELECT m.ctid FROM pgqueue.message m
                 WHERE m.queue_id = q.queue_id AND m.msg_id = u.id AND pgqueue._keyed(m.read_ct, m.vt, m.enqueued_at, m.group_key) AND m.enqueued_at = u.at
                   FOR UPDATE)
          FROM (SELECT DISTINCT i, e FROM unnest(archive.msg_ids, archive.enqueued_ats) AS x (i, e)
                 ORDER BY i) AS u (id, at));
    RETURN QUERY
    WITH gone AS (
        DELETE FROM pgqueue.message m WHERE m.ctid = ANY (v_tids)
        RETURNING m.*
    ), kept AS (
        INSERT INTO pgqueue.archive (queue_id, msg_id, read_ct, enqueued_at, vt, message, headers, last_read_at)
        SELECT g.queue_id, g.msg_id, g.read_ct, g.enqueued_at, g.vt, g.message, g.headers, g.last_read_at
          FROM gone g
        RETURNING msg_id
    )
    SELECT k.msg_id FROM kept k;
END
$$;

CREATE FUNCTION pgqueue._list_backdated() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO pgqueue.recheck (queue_id, msg_id) VALUES (NEW.queue_id, NEW.msg_id)
    ON CONFLICT DO NOTHING;
    RETURN NULL;
END
$$;

-- Both conversions are plain expressions that the planner inlines into the
-- calling statement: not STRICT (a strict function whose body is a CASE is not
-- inlined) and not IMMUTABLE (their bodies use stable operators, which keeps
-- an IMMUTABLE function from being inlined). Measured: called as functions
-- they cost 16-32 us each, about 130 us of a one-message read.
-- No time is no floor: NULL stays NULL. (greatest() ignores NULLs; without the
-- first branch a missing time became 1, -infinity, and a sweep that found and
-- locked nothing dropped the fresh lane's fast floor to the bottom of the lane.)
CREATE FUNCTION pgqueue._ts_us(ts timestamptz) RETURNS bigint
LANGUAGE sql STABLE AS $$
    SELECT CASE WHEN ts IS NULL THEN NULL
                WHEN ts = '-infinity' THEN 1
                WHEN ts = 'infinity' THEN 9000000000000000000
                ELSE greatest((extract(epoch FROM ts) * 1000000)::bigint, 1) END;
$$;

CREATE FUNCTION pgqueue._us_ts(us bigint) RETURNS timestamptz
LANGUAGE sql STABLE AS $$
    SELECT CASE WHEN us <= 1 THEN '-infinity'::timestamptz
                ELSE 'epoch'::timestamptz + us * interval '1 microsecond' END;
$$;

-- The ten sequences of a queue (pgqueue.lane_<queue_id>_<which>), in this
-- order: the fresh lane's fast floor (a msg_id); the time of its fast
-- watermark; the timed lane's fast floor (a time); the fresh lane's safe
-- floor (a msg_id); the timed lane's safe floor (a time); the earliest time
-- of the next late sweep; the start time of the server whose reads set the
-- floors; the msg_id of the fast watermark; the time and the msg_id of the
-- safe watermark (_mark). Times are microseconds since the epoch, 1 for
-- none. One list of their names.
CREATE FUNCTION pgqueue._lane_names() RETURNS text[]
LANGUAGE sql IMMUTABLE AS $$
    SELECT ARRAY['fast_f_id', 'mark_f', 'fast_t', 'safe_f_id', 'safe_t', 'sweep', 'server',
                 'mark_f_id', 'smark_f', 'smark_f_id'];
$$;

-- A queue's lane sequences, in the order of _lane_names (queue.lane_seqs).
CREATE FUNCTION pgqueue._lane_seq_list(queue_id integer) RETURNS regclass[]
LANGUAGE sql STABLE AS $$
    SELECT ARRAY(SELECT ('pgqueue.lane_' || queue_id || '_' || u.w)::regclass
                   FROM unnest(pgqueue._lane_names()) WITH ORDINALITY AS u (w, i)
                  ORDER BY u.i);
$$;

-- Creates (creating => true) or drops a queue's lane sequences. Once they
-- are created, the queue's row lists them (queue.lane_seqs): a read finds
-- them there, not by name (looking each up by name cost a one-message read
-- about a tenth of its server time).
CREATE FUNCTION pgqueue._lane_seqs(queue_id integer, creating boolean) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    w text;
BEGIN
    FOREACH w IN ARRAY pgqueue._lane_names() LOOP
        EXECUTE format(CASE WHEN creating THEN 'CREATE SEQUENCE IF NOT EXISTS pgqueue.%I AS bigint'
                            ELSE 'DROP SEQUENCE IF EXISTS pgqueue.%I' END,
                       'lane_' || queue_id || '_' || w);
    END LOOP;
    IF creating THEN
        UPDATE pgqueue.queue x SET lane_seqs = pgqueue._lane_seq_list(x.queue_id)
         WHERE x.queue_id = _lane_seqs.queue_id;
    END IF;
END
$$;

-- Records a watermark of a queue's fresh lane in the two sequences given: a
-- time T (s_time) and a msg_id W (s_id) such that every msg_id below W was
-- drawn before T. W is read before T is taken, and written after it; a reader
-- reads W before T. So a reader that sees this W sees this T or a later one,
-- and a pair read is never newer in W than in T. Writers of one queue take
-- turns (an advisory lock, held for the two writes only; its key is
-- _mark_lock_key's): interleaved, two writers could leave one's W beside the
-- other's earlier T. False, and nothing written, when another writer has the
-- turn.
CREATE FUNCTION pgqueue._mark(queue_id integer, msg_seq regclass, s_time regclass, s_id regclass)
RETURNS boolean
LANGUAGE plpgsql AS $$
DECLARE
    v_key bigint := pgqueue._mark_lock_key(queue_id);
    v_w bigint;
BEGIN
    IF NOT pg_try_advisory_lock(v_key) THEN
        RETURN false;
    END IF;
    BEGIN
        v_w := coalesce(pg_sequence_last_value(msg_seq), 0) + 1;
        PERFORM setval(s_time, pgqueue._ts_us(clock_timestamp()));
        PERFORM setval(s_id, v_w);
    EXCEPTION WHEN OTHERS OR query_canceled THEN
        -- a session-level lock: never left behind
        PERFORM pg_advisory_unlock(v_key);
        RAISE;
    END;
    PERFORM pg_advisory_unlock(v_key);
    RETURN true;
END
$$;

-- The advisory lock (its one-bigint form) whose holder writes a queue's
-- watermarks: 'pgqu' in the high 32 bits, the queue's id in the low ones.
CREATE FUNCTION pgqueue._mark_lock_key(queue_id integer) RETURNS bigint
LANGUAGE sql IMMUTABLE AS $$
    SELECT (x'70677175'::bigint << 32) | queue_id::bigint;
$$;

-- The poison reason of a message whose attempts ran out.
CREATE FUNCTION pgqueue._exhausted_reason(read_ct integer, last_error text) RETURNS text
LANGUAGE sql STABLE AS $$
    SELECT format('max_attempts exceeded (read %s %s)', read_ct,
                  CASE WHEN read_ct = 1 THEN 'time' ELSE 'times' END)
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

-- Tells the caller of a read that the queue is paused (queue.sql, "Pausing"),
-- so it got nothing however many messages are visible: the message says how
-- to resume it, the DETAIL is JSON for clients (pgqueue's worker then polls
-- the queue instead of waking on its sends). A consumer polling a paused
-- queue gets one each time: clients log it at DEBUG at most.
CREATE FUNCTION pgqueue._notice_paused(q pgqueue.queue) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    RAISE NOTICE USING
        ERRCODE = 'PGQ11',
        MESSAGE = format('pgqueue: queue %s is paused, so reads return nothing; resume it with'
                         ' `pgqueue queue resume %s` (or SELECT pgqueue.resume_queue(%L))',
                         q.queue_name, q.queue_name, q.queue_name),
        DETAIL = json_build_object('queue', q.queue_name, 'paused_at', q.paused_at,
                                   'paused_by', q.paused_by)::text;
END
$$;

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
LANGUAGE plpgsql
SECURITY DEFINER SET search_path = pg_catalog, pgqueue, pg_temp
AS $$
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
     WHERE queue_id = q.queue_id AND msg_id = set_vt.msg_id AND pgqueue._keyed(read_ct, vt, enqueued_at, group_key) AND read_ct = set_vt.read_ct
    RETURNING msg_id, read_ct, enqueued_at, vt, message, headers;
END
$$;

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
                     WHERE m.queue_id = q.queue_id AND m.msg_id = l.msg_id AND pgqueue._keyed(m.read_ct, m.vt, m.enqueued_at, m.group_key) AND m.read_ct = l.read_ct
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
                     WHERE m.queue_id = q.queue_id AND m.msg_id = l.msg_id AND pgqueue._keyed(m.read_ct, m.vt, m.enqueued_at, m.group_key) AND m.read_ct = l.read_ct
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
       -- a probe by key per id (a scalar subquery with LIMIT is not turned
       -- into a join over the queue's messages)
       AND (SELECT 1 FROM pgqueue.message m
             WHERE m.queue_id = q.queue_id AND m.msg_id = l.msg_id AND pgqueue._keyed(m.read_ct, m.vt, m.enqueued_at, m.group_key) AND m.read_ct = l.read_ct
             LIMIT 1) IS NOT NULL;
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
LANGUAGE plpgsql
SECURITY DEFINER SET search_path = pg_catalog, pgqueue, pg_temp
AS $$
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
             WHERE queue_id = q.queue_id AND msg_id = nack.msg_id AND pgqueue._keyed(read_ct, vt, enqueued_at, group_key) AND read_ct = nack.read_ct
            RETURNING *
        )
        INSERT INTO pgqueue.poison (queue_id, msg_id, read_ct, enqueued_at, reason, message, headers,
                                    dedupe_key, group_key)
        SELECT g.queue_id, g.msg_id, g.read_ct, g.enqueued_at,
               pgqueue._exhausted_reason(g.read_ct, coalesce(v_error, g.last_error)),
               g.message, g.headers, g.dedupe_key, g.group_key
          FROM gone g;
        RETURN CASE WHEN FOUND THEN 'poisoned' END;
    END IF;
    UPDATE pgqueue.message
       SET vt = clock_timestamp() + make_interval(secs => nack.delay),
           last_error = coalesce(v_error, last_error)
     WHERE queue_id = q.queue_id AND msg_id = nack.msg_id AND pgqueue._keyed(read_ct, vt, enqueued_at, group_key) AND read_ct = nack.read_ct;
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
LANGUAGE plpgsql
SET enable_seqscan = off
SECURITY DEFINER SET search_path = pg_catalog, pgqueue, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    q pgqueue.queue := pgqueue._queue(hold_leases.queue_name);
BEGIN
    IF hold_leases.msg_ids IS NULL OR hold_leases.read_cts IS NULL
       OR cardinality(hold_leases.msg_ids) <> cardinality(hold_leases.read_cts) THEN
        RAISE EXCEPTION 'msg_ids and read_cts must be given, with the same length' USING ERRCODE = '22023';
    END IF;
    -- One primary-key probe per lease, in msg_id order; a lease taken over
    -- (read_ct moved on) fails the probe's recheck and is not held.
    RETURN QUERY
    SELECT h.id FROM (
        SELECT (SELECT m.msg_id FROM pgqueue.message m
                 WHERE m.queue_id = q.queue_id AND m.msg_id = l.msg_id AND pgqueue._keyed(m.read_ct, m.vt, m.enqueued_at, m.group_key) AND m.read_ct = l.read_ct
                   FOR UPDATE) AS id
          FROM (SELECT DISTINCT ON (x.msg_id) x.msg_id, x.read_ct
                  FROM unnest(hold_leases.msg_ids, hold_leases.read_cts) AS x (msg_id, read_ct)
                 ORDER BY x.msg_id) AS l) AS h
     WHERE h.id IS NOT NULL;
END
$$;

-- The oldest time a transaction that the current snapshot cannot see yet may
-- have stamped as a vt; -infinity when unknown. Volatile, and clears the
-- activity snapshot first (pg_stat_activity is read once per transaction and
-- then cached). A definer, so a consumer role without pg_read_all_stats still
-- sees other roles' sessions; one hidden even from the owner counts as
-- infinitely old. It reads the sessions before the prepared transactions,
-- never after. The safe-floor argument needs: every transaction W that has
-- written a row the sweep's later snapshot cannot see is counted. W is
-- uncommitted from before the first read here until after that snapshot, and
-- while uncommitted it is, at every instant, a session with a transaction id
-- (backend_xid), or a valid prepared transaction, or both: PREPARE marks the
-- prepared transaction valid before it clears the session's transaction id,
-- and a prepared transaction stays until COMMIT/ROLLBACK PREPARED. Reading
-- the sessions at t1 and the prepared transactions at t2 > t1: if W was
-- still a session at t1 it is seen there; if it had prepared by t1, it is
-- still prepared at t2 and seen there. In the other order (prepared first) a
-- PREPARE between the two reads would be seen by neither: a sweep would raise the
-- safe floor above W's rows, and after COMMIT PREPARED no read would find them
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
--   * a session hidden from the owner counts as infinitely old;
--   * a session with track_activities off shows no times (counted as
--     infinitely old) or stale ones (older, so the floor only stays lower);
--   * after a crash or a failover, prepared transactions come back from the
--     WAL as prepared transactions, and sessions start anew;
--   * a clock that steps back is not a late commit but breaks "vt >= the time
--     of the statement that wrote it" as seen by an earlier sweep: _take
--     resets the floors when a read starts below one of them, and when the
--     floors were set on another server (a failover, possibly to a clock
--     behind) or before a restart. Rows sent during a step back of one
--     server's clock of over a second, with no read of their queue until the
--     clock caught up again, stay below the safe floor
--     (docs/design/read-lanes.md).
CREATE FUNCTION pgqueue._oldest_writer() RETURNS timestamptz
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

-- The poison drop of a read, for every read that hands messages out (_take,
-- and the pgmq facade's grouped reads, sql/pgmq/15_grouped.sql): moves the
-- messages that tids name (rows the caller has locked, whose attempts ran
-- out) to the poison table with their reason, poisoned at dropped_at. One
-- notice per message (_notice_poisoned), so the caller can log it: the rows
-- a read returns are only the ones it delivered. And marks the transaction
-- (pgqueue.read_poisoned), so a polling read returns instead of sleeping on
-- the rows it now holds.
CREATE FUNCTION pgqueue._drop_exhausted(q pgqueue.queue, tids tid[], dropped_at timestamptz) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    v_dropped record;
BEGIN
    FOR v_dropped IN
        WITH gone AS (
            DELETE FROM pgqueue.message WHERE ctid = ANY (tids)
            RETURNING *
        )
        INSERT INTO pgqueue.poison (queue_id, msg_id, read_ct, enqueued_at, poisoned_at,
                                    reason, message, headers, dedupe_key, group_key)
        SELECT g.queue_id, g.msg_id, g.read_ct, g.enqueued_at, _drop_exhausted.dropped_at,
               pgqueue._exhausted_reason(g.read_ct, g.last_error),
               g.message, g.headers, g.dedupe_key, g.group_key
          FROM gone g
        RETURNING msg_id, read_ct, reason
    LOOP
        PERFORM pgqueue._notice_poisoned(q.queue_name, v_dropped.msg_id, v_dropped.read_ct, v_dropped.reason);
    END LOOP;
    PERFORM set_config('pgqueue.read_poisoned', 'on', true);
END
$$;

-- Hands out up to qty messages of queue q: leased for vt_seconds (a read), or
-- deleted (remove, a pop); poison-drops the ones whose attempts ran out, with
-- a notice for each. The read lanes, the floors and the late sweep are the
-- header of sql/schema/reads.sql. The rows a round locks carry their ctids,
-- and the lease (or the pop's delete, or the poison drop) finds them by those.
--
-- Groups. A message with a group_key is in neither lane: only the head of its
-- group (its lowest live msg_id) can be handed out, and only while that head
-- is visible. So _take leases at most one message of a group at a time (a
-- group's later messages wait until its head is acked, popped or poisoned),
-- and a group is delivered in msg_id order, redeliveries and poison drops
-- included; sends of a group draw their msg_ids in commit order (_lock_groups).
-- The heads are found by a skip scan of message_group_idx (one probe per
-- group), only for queues that ever had a group (queue.has_groups), and
-- compete with the lanes' rows by (vt, msg_id). The pgmq facade's grouped
-- reads (PGMQ's read_grouped*, sql/pgmq/15_grouped.sql) lease a run of a
-- group's messages to one reader, always from its head: while that lease
-- runs the head is invisible, and _take hands out nothing of the group.
--
-- conditional (the pgmq facade's filtered read): only messages whose payload
-- contains it (@>). Such a read takes some rows and leaves others, so it
-- starts from the safe floors and neither sweeps nor moves a floor.
--
-- A read in a transaction that wrote before it moves no fast floor: rows its
-- own writes hid from it (deleted, or leased and then given back) come back
-- when it rolls back, and the next read must find them at once, not at the
-- next sweep. Rolled-back leases of other transactions are the sweep's.
CREATE FUNCTION pgqueue._take(q pgqueue.queue, vt_seconds integer, qty integer, remove boolean,
                              conditional jsonb DEFAULT NULL)
RETURNS SETOF pgqueue.taken_record
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
SET enable_bitmapscan = off
AS $$
#variable_conflict use_column
DECLARE
    -- How far behind now a fast floor stays when the first row a read locked
    -- in its lane is younger than that (or it locked none): writes that commit
    -- within this long after their statement began are found by every read;
    -- later ones by the late sweep.
    c_margin_f constant interval := interval '50 milliseconds';
    c_margin_t constant interval := interval '10 milliseconds';
    s_fast_f_id regclass;
    s_mark_f regclass;
    s_mark_f_id regclass;
    s_fast_t regclass;
    s_safe_f_id regclass;
    s_smark_f regclass;
    s_smark_f_id regclass;
    s_safe_t regclass;
    s_sweep regclass;
    s_server regclass;
    v_server bigint;
    v_here bigint := pgqueue._ts_us(pg_postmaster_start_time());
    v_new_f bigint;
    v_new_t bigint;
    v_set_t boolean := false;
    v_mark boolean := false;
    v_start timestamptz := clock_timestamp();
    -- a read in a transaction that has written may not see rows its own
    -- writes hid (a delete it may roll back): it moves no fast floor
    v_wrote boolean := pg_current_xact_id_if_assigned() IS NOT NULL;
    v_now timestamptz;
    v_leased_at timestamptz;
    v_left integer := qty;
    v_ok bigint[];
    v_ok_tids tid[];
    v_exhausted_tids tid[];
    v_handed bigint[] := '{}';
    v_fast_f_id bigint;
    v_mark_f bigint;
    v_mark_f_id bigint;
    v_fast_t bigint;
    v_safe_f_id bigint;
    v_smark_f bigint;
    v_smark_f_id bigint;
    v_safe_t bigint;
    v_next_sweep bigint;
    v_lo_f_id bigint;
    v_lo_t timestamptz;
    v_sweep boolean;
    -- when the sweep's scans were done (the first round's): what follows may
    -- wait on locks (a barrier's row, when a member goes), which is no sweep's cost
    v_swept timestamptz;
    v_raise boolean := false;
    v_first_f_id bigint;
    v_first_t timestamptz;
    v_locked_f timestamptz;
    v_locked_f_id bigint;
    v_locked_t timestamptz;
    v_round_f timestamptz;
    v_round_f_id bigint;
    v_round_t timestamptz;
    v_listed boolean := false;
    v_any_listed boolean;
    v_round_listed boolean;
    v_writer timestamptz;
    v_new bigint;
BEGIN
    IF qty <= 0 THEN
        RETURN;
    END IF;
    -- The lanes' sequences, as the queue's row lists them (by name for a row
    -- without the list).
    IF q.lane_seqs IS NULL THEN
        q.lane_seqs := pgqueue._lane_seq_list(q.queue_id);
    END IF;
    s_fast_f_id := q.lane_seqs[1];
    s_mark_f := q.lane_seqs[2];
    s_fast_t := q.lane_seqs[3];
    s_safe_f_id := q.lane_seqs[4];
    s_safe_t := q.lane_seqs[5];
    s_sweep := q.lane_seqs[6];
    s_server := q.lane_seqs[7];
    s_mark_f_id := q.lane_seqs[8];
    s_smark_f := q.lane_seqs[9];
    s_smark_f_id := q.lane_seqs[10];
    -- One statement, read in this order: the fast watermark's msg_id before
    -- its time (_mark); and whether any row of the queue is listed for a
    -- recheck. (The safe watermark only when a sweep raises the floors.)
    SELECT coalesce(pg_sequence_last_value(s_fast_f_id), 1),
           coalesce(pg_sequence_last_value(s_mark_f_id), 1), coalesce(pg_sequence_last_value(s_mark_f), 1),
           coalesce(pg_sequence_last_value(s_fast_t), 1), coalesce(pg_sequence_last_value(s_safe_f_id), 1),
           coalesce(pg_sequence_last_value(s_safe_t), 1), coalesce(pg_sequence_last_value(s_sweep), 1),
           coalesce(pg_sequence_last_value(s_server), 0),
           EXISTS (SELECT 1 FROM pgqueue.recheck r WHERE r.queue_id = q.queue_id)
      INTO v_fast_f_id, v_mark_f_id, v_mark_f, v_fast_t, v_safe_f_id, v_safe_t,
           v_next_sweep, v_server, v_any_listed;

    -- A clock that went back (an NTP step, a failover to a server whose clock
    -- is behind): every time floor was set at least a margin below the start
    -- of the read that set it, so one above our start means rows written from
    -- now on may lie below it. Not the watermarks: a watermark's time is the
    -- clock's when a read recorded it, so a read that began a moment before
    -- sees it ahead of its own start with no clock gone back. A watermark more
    -- than a second ahead is recorded anew instead (below); until then it is
    -- only not used. Start the lanes over from the bottom and sweep now; this
    -- read's sweep then sets the safe floors from the clock as it is.
    -- The same when the floors were set on another server, or before this one
    -- restarted (its start time differs): after a failover to a clock behind,
    -- sends may have landed below the floors before this first read, with the
    -- clock caught up by now (tests/sql/test_read_lanes.py).
    IF pgqueue._ts_us(v_start) < greatest(v_fast_t, v_safe_t)
       OR v_server <> v_here THEN
        IF pgqueue._ts_us(v_start) < greatest(v_fast_t, v_safe_t) THEN
            RAISE LOG 'pgqueue: the clock of the server went back (read at %, lane floors up to %); queue % reads its lanes from the bottom',
                v_start, pgqueue._us_ts(greatest(v_fast_t, v_safe_t)), q.queue_name;
        END IF;
        PERFORM setval(s_fast_f_id, 1), setval(s_mark_f, 1), setval(s_fast_t, 1), setval(s_safe_f_id, 1),
                setval(s_smark_f, 1), setval(s_safe_t, 1), setval(s_server, v_here);
        v_fast_f_id := 1;
        v_mark_f := 1;
        v_fast_t := 1;
        v_safe_f_id := 1;
        v_safe_t := 1;
        v_next_sweep := 1;
    END IF;

    v_sweep := conditional IS NULL AND pgqueue._ts_us(v_start) >= v_next_sweep;
    IF v_sweep THEN
        -- Only a read with a fresh snapshot that cannot see uncommitted writes
        -- of its own may raise the safe floors (checked before our setval,
        -- which takes a transaction id).
        v_raise := pg_current_xact_id_if_assigned() IS NULL
                   AND current_setting('transaction_isolation') = 'read committed';
        PERFORM setval(s_sweep, pgqueue._ts_us(v_start + interval '1 second'));
        v_lo_f_id := v_safe_f_id;
        v_lo_t := pgqueue._us_ts(v_safe_t);
        IF v_raise THEN
            v_writer := pgqueue._oldest_writer();
            -- Plain reads: a row being leased by a transaction still in
            -- progress shows its old version here, and holds the floor.
            SELECT m.msg_id INTO v_first_f_id FROM pgqueue.message m
             WHERE m.queue_id = q.queue_id AND m.read_ct = 0 AND m.vt <= m.enqueued_at AND m.group_key IS NULL
               AND m.msg_id >= v_lo_f_id
             ORDER BY m.msg_id LIMIT 1;
            SELECT m.vt INTO v_first_t FROM pgqueue.message m
             WHERE m.queue_id = q.queue_id AND (m.read_ct <> 0 OR m.vt > m.enqueued_at) AND m.group_key IS NULL
               AND m.vt >= v_lo_t AND m.vt <= v_start
             ORDER BY m.vt, m.msg_id LIMIT 1;
            -- nothing visible lies below those rows: the read starts there
            -- (a row committed since is above the safe floors raised below;
            -- with no fresh row visible, the fresh lane from its fast floor)
            v_lo_f_id := coalesce(v_first_f_id, greatest(v_fast_f_id, v_safe_f_id));
            v_lo_t := coalesce(v_first_t, v_start);
        END IF;
    ELSIF conditional IS NOT NULL THEN
        v_lo_f_id := v_safe_f_id;
        v_lo_t := pgqueue._us_ts(v_safe_t);
    ELSE
        v_lo_f_id := v_fast_f_id;
        v_lo_t := pgqueue._us_ts(v_fast_t);
    END IF;

    -- Rows are locked by the read (SKIP LOCKED), so two readers never get the
    -- same message; rows past max_attempts go to the poison table in the
    -- transaction that would have delivered them again; the batch is refilled
    -- for the places they left; no message is handed out twice in one call.
    -- The fresh lane gives its first rows in msg_id order, the timed lane and
    -- the listed rows theirs in (vt, msg_id) order, and the batch is the first
    -- of them all in (vt, msg_id) order.
    LOOP
        v_now := clock_timestamp();
        IF NOT q.has_groups AND NOT v_any_listed THEN
            -- The common round: a queue without groups, nothing listed. The
            -- lanes alone, in one statement of few plan nodes (starting the
            -- executor on the full statement below was the largest part of a
            -- one-message read). n ranks the rows of both lanes by (vt,
            -- msg_id), as the batch is chosen; the lanes are disjoint, so no
            -- row comes twice.
            SELECT (array_agg(u.vt ORDER BY u.msg_id) FILTER (WHERE u.fresh))[1],
                   min(u.msg_id) FILTER (WHERE u.fresh),
                   min(u.vt) FILTER (WHERE NOT u.fresh), false,
                   coalesce(array_agg(u.msg_id) FILTER (WHERE u.n <= v_left AND u.read_ct < q.max_attempts), '{}'),
                   coalesce(array_agg(u.tid) FILTER (WHERE u.n <= v_left AND u.read_ct < q.max_attempts), '{}'),
                   coalesce(array_agg(u.tid) FILTER (WHERE u.n <= v_left AND u.read_ct >= q.max_attempts), '{}')
              INTO v_round_f, v_round_f_id, v_round_t, v_round_listed, v_ok, v_ok_tids, v_exhausted_tids
              FROM (SELECT x.*, row_number() OVER (ORDER BY x.vt, x.msg_id) AS n
                      FROM (SELECT * FROM (SELECT m.msg_id, m.vt, m.read_ct, m.ctid AS tid, true AS fresh FROM pgqueue.message m
                              WHERE m.queue_id = q.queue_id AND m.read_ct = 0 AND m.vt <= m.enqueued_at
                                AND m.group_key IS NULL
                                AND m.msg_id >= v_lo_f_id AND m.vt <= v_now
                                AND m.msg_id <> ALL (v_handed)
                                AND (conditional IS NULL OR m.message @> conditional)
                              ORDER BY m.msg_id
                              LIMIT v_left
                                FOR UPDATE SKIP LOCKED) f
                            UNION ALL
                            SELECT * FROM (SELECT m.msg_id, m.vt, m.read_ct, m.ctid AS tid, false AS fresh FROM pgqueue.message m
                              WHERE m.queue_id = q.queue_id AND (m.read_ct <> 0 OR m.vt > m.enqueued_at)
                                AND m.group_key IS NULL
                                AND m.vt >= v_lo_t AND m.vt <= v_now
                                AND m.msg_id <> ALL (v_handed)
                                AND (conditional IS NULL OR m.message @> conditional)
                              ORDER BY m.vt, m.msg_id
                              LIMIT v_left
                                FOR UPDATE SKIP LOCKED) t) x) u;
        ELSE
            WITH RECURSIVE f AS (
                SELECT m.msg_id, m.vt, m.read_ct, m.ctid AS tid FROM pgqueue.message m
                 WHERE m.queue_id = q.queue_id AND m.read_ct = 0 AND m.vt <= m.enqueued_at AND m.group_key IS NULL
                   AND m.msg_id >= v_lo_f_id AND m.vt <= v_now
                   AND m.msg_id <> ALL (v_handed)
                   AND (conditional IS NULL OR m.message @> conditional)
                 ORDER BY m.msg_id
                 LIMIT v_left
                   FOR UPDATE SKIP LOCKED
            ), t AS (
                SELECT m.msg_id, m.vt, m.read_ct, m.ctid AS tid FROM pgqueue.message m
                 WHERE m.queue_id = q.queue_id AND (m.read_ct <> 0 OR m.vt > m.enqueued_at) AND m.group_key IS NULL
                   AND m.vt >= v_lo_t AND m.vt <= v_now
                   AND m.msg_id <> ALL (v_handed)
                   AND (conditional IS NULL OR m.message @> conditional)
                 ORDER BY m.vt, m.msg_id
                 LIMIT v_left
                   FOR UPDATE SKIP LOCKED
            ), gk AS (
                -- the queue's groups, one index probe each (a skip scan)
                (SELECT m.group_key FROM pgqueue.message m
                  WHERE q.has_groups AND m.queue_id = q.queue_id AND m.group_key IS NOT NULL
                  ORDER BY m.group_key LIMIT 1)
                UNION ALL
                SELECT (SELECT m.group_key FROM pgqueue.message m
                         WHERE m.queue_id = q.queue_id AND m.group_key > gk.group_key
                         ORDER BY m.group_key LIMIT 1)
                  FROM gk WHERE gk.group_key IS NOT NULL
            ), heads AS MATERIALIZED (
                -- each group's head, when visible: the candidates, earliest first
                SELECT hd.msg_id, hd.vt FROM gk
                 CROSS JOIN LATERAL (
                       SELECT m.msg_id, m.vt FROM pgqueue.message m
                        WHERE m.queue_id = q.queue_id AND m.group_key = gk.group_key
                        ORDER BY m.group_key, m.msg_id LIMIT 1) hd
                 WHERE gk.group_key IS NOT NULL AND hd.vt <= v_now AND hd.msg_id <> ALL (v_handed)
                 ORDER BY hd.vt, hd.msg_id
            ), g AS (
                -- locked one by one in that order, until enough are (LIMIT stops
                -- the nested loop: no head past those is locked)
                SELECT x.msg_id, x.vt, x.read_ct, x.tid
                  FROM heads h
                 CROSS JOIN LATERAL (
                       SELECT m.msg_id, m.vt, m.read_ct, m.ctid AS tid FROM pgqueue.message m
                        WHERE m.queue_id = q.queue_id AND m.msg_id = h.msg_id AND m.vt <= v_now
                          AND (m.read_ct = 0 AND m.vt <= m.enqueued_at AND m.group_key IS NULL) IS NOT TRUE
                          AND (conditional IS NULL OR m.message @> conditional)
                        LIMIT 1
                          FOR UPDATE SKIP LOCKED) x
                 LIMIT v_left
            ), listed AS (
                SELECT r.msg_id FROM pgqueue.recheck r WHERE r.queue_id = q.queue_id
            ), l AS (
                -- From the listings to the messages, one probe by primary key each
                -- (LATERAL with LIMIT: the planner cannot turn it into a scan of
                -- the queue's messages joined to the listings).
                SELECT x.msg_id, x.vt, x.read_ct, x.tid
                  FROM listed r
                 CROSS JOIN LATERAL (
                       SELECT * FROM (
                           SELECT m.msg_id, m.vt, m.read_ct, m.ctid AS tid FROM pgqueue.message m
                            WHERE m.queue_id = q.queue_id AND m.msg_id = r.msg_id AND m.read_ct = 0 AND m.vt <= m.enqueued_at AND m.group_key IS NULL
                              AND m.vt <= v_now AND m.msg_id <> ALL (v_handed)
                              AND (conditional IS NULL OR m.message @> conditional)
                            LIMIT 1
                              FOR UPDATE SKIP LOCKED) xf
                       UNION ALL
                       SELECT * FROM (
                           SELECT m.msg_id, m.vt, m.read_ct, m.ctid AS tid FROM pgqueue.message m
                            WHERE m.queue_id = q.queue_id AND m.msg_id = r.msg_id AND (m.read_ct = 0 AND m.vt <= m.enqueued_at AND m.group_key IS NULL) IS NOT TRUE
                              AND m.vt <= v_now AND m.msg_id <> ALL (v_handed) AND m.group_key IS NULL
                              AND (conditional IS NULL OR m.message @> conditional)
                            LIMIT 1
                              FOR UPDATE SKIP LOCKED) xr
                       LIMIT 1) x
                 ORDER BY x.vt, x.msg_id
                 LIMIT v_left
            ), c AS (
                SELECT DISTINCT ON (u.msg_id) u.msg_id, u.vt, u.read_ct, u.tid
                  FROM (SELECT * FROM f UNION ALL SELECT * FROM t UNION ALL SELECT * FROM l
                        UNION ALL SELECT * FROM g) u
            ), b AS (
                SELECT * FROM c ORDER BY c.vt, c.msg_id LIMIT v_left
            ), f1 AS (
                SELECT f.vt, f.msg_id FROM f ORDER BY f.msg_id LIMIT 1
            )
            SELECT (SELECT f1.vt FROM f1), (SELECT f1.msg_id FROM f1), (SELECT min(t.vt) FROM t),
                   EXISTS (SELECT 1 FROM listed),
                   coalesce((SELECT array_agg(b.msg_id) FROM b WHERE b.read_ct < q.max_attempts), '{}'),
                   coalesce((SELECT array_agg(b.tid) FROM b WHERE b.read_ct < q.max_attempts), '{}'),
                   coalesce((SELECT array_agg(b.tid) FROM b WHERE b.read_ct >= q.max_attempts), '{}')
              INTO v_round_f, v_round_f_id, v_round_t, v_round_listed, v_ok, v_ok_tids, v_exhausted_tids;
        END IF;
        IF v_sweep AND v_swept IS NULL THEN
            v_swept := clock_timestamp();
        END IF;
        -- the first row locked in each lane over all rounds
        IF v_round_f_id < v_locked_f_id OR (v_locked_f_id IS NULL AND v_round_f_id IS NOT NULL) THEN
            v_locked_f := v_round_f;
            v_locked_f_id := v_round_f_id;
        END IF;
        v_locked_t := least(v_locked_t, v_round_t);
        v_listed := v_listed OR v_round_listed;

        IF cardinality(v_exhausted_tids) > 0 THEN
            PERFORM pgqueue._drop_exhausted(q, v_exhausted_tids, v_now);
        END IF;

        IF cardinality(v_ok) > 0 THEN
            IF remove THEN
                RETURN QUERY
                WITH taken AS (
                    DELETE FROM pgqueue.message WHERE ctid = ANY (v_ok_tids)
                    RETURNING msg_id, read_ct + 1 AS read_ct, enqueued_at, last_read_at, vt, message, headers
                )
                SELECT * FROM taken t ORDER BY t.msg_id;
            ELSE
                -- the lease starts now, when the rows are ours: not at v_now,
                -- before the statement that picked them was planned and ran
                v_leased_at := clock_timestamp();
                RETURN QUERY
                WITH leased AS (
                    UPDATE pgqueue.message
                       SET vt = v_leased_at + make_interval(secs => vt_seconds), read_ct = read_ct + 1,
                           last_read_at = v_leased_at
                     WHERE ctid = ANY (v_ok_tids)
                    RETURNING msg_id, read_ct, enqueued_at, last_read_at, vt, message, headers
                )
                SELECT * FROM leased l ORDER BY l.msg_id;
            END IF;
            v_left := v_left - cardinality(v_ok);
            v_handed := v_handed || v_ok;
        END IF;
        EXIT WHEN cardinality(v_exhausted_tids) = 0 OR v_left <= 0;
    END LOOP;

    -- Listed rows that are gone, taken or not due need no listing any more
    -- (rows we took: if this transaction rolls back, so does this delete).
    IF v_listed THEN
        DELETE FROM pgqueue.recheck r
         WHERE r.queue_id = q.queue_id
           AND r.msg_id IN (
               SELECT x.msg_id FROM pgqueue.recheck x
                WHERE x.queue_id = q.queue_id
                  -- a probe of each half of the key per listing (a scalar
                  -- subquery with LIMIT is not turned into a join over the
                  -- queue's messages); the version this statement sees is in
                  -- one of them
                  AND (SELECT 1 FROM pgqueue.message m
                        WHERE m.queue_id = x.queue_id AND m.msg_id = x.msg_id AND m.read_ct = 0 AND m.vt <= m.enqueued_at AND m.group_key IS NULL
                          AND m.vt <= v_now AND m.msg_id <> ALL (v_handed)
                        LIMIT 1) IS NULL
                  AND (SELECT 1 FROM pgqueue.message m
                        WHERE m.queue_id = x.queue_id AND m.msg_id = x.msg_id AND (m.read_ct = 0 AND m.vt <= m.enqueued_at AND m.group_key IS NULL) IS NOT TRUE
                          AND m.vt <= v_now AND m.msg_id <> ALL (v_handed)
                        LIMIT 1) IS NULL
                  FOR UPDATE SKIP LOCKED);
    END IF;

    -- Fast floors, a matter of speed only (the late sweep finds what they
    -- pass over). Only raised here (a sweep lowers them to rows it finds
    -- below them, see below); an empty read moves them only by whole seconds
    -- (setval takes a transaction id, and its commit then a WAL flush).
    -- The fresh lane's: to the first row this read locked there, when that
    -- row is older than the margin (every lower msg_id was drawn before it);
    -- else up to the fast watermark, once that is older than the margin, but
    -- never past that row; a watermark used (or none) is recorded anew. So a
    -- send that commits within the margin of drawing its msg_id is found by
    -- every read. The timed lane's: the first row locked there, or the margin.
    IF conditional IS NULL AND NOT v_wrote THEN
        IF v_locked_f IS NOT NULL AND v_locked_f < v_start - c_margin_f THEN
            v_new_f := v_locked_f_id;
        ELSIF v_mark_f > 1 AND v_mark_f < pgqueue._ts_us(v_start - c_margin_f)
              AND (v_locked_f IS NOT NULL OR cardinality(v_handed) > 0
                   OR v_mark_f < pgqueue._ts_us(v_start) - 1000000) THEN
            v_new_f := least(v_mark_f_id, v_locked_f_id);
            v_mark := true;
        END IF;
        -- none yet, or one ahead of the clock (the clock went back): anew
        v_mark := v_mark OR v_mark_f <= 1 OR v_mark_f > pgqueue._ts_us(v_start) + 1000000;
        v_new_t := pgqueue._ts_us(least(v_locked_t, v_start - c_margin_t)) - 1;
        v_set_t := v_new_t > v_fast_t AND (v_locked_t IS NOT NULL OR cardinality(v_handed) > 0
                                           OR v_new_t > v_fast_t + 1000000);
        IF v_new_f > v_fast_f_id OR v_set_t THEN
            PERFORM CASE WHEN v_new_f > v_fast_f_id THEN setval(s_fast_f_id, v_new_f) END,
                    CASE WHEN v_set_t THEN setval(s_fast_t, v_new_t) END;
        END IF;
        IF v_mark THEN
            PERFORM pgqueue._mark(q.queue_id, q.msg_seq, s_mark_f, s_mark_f_id);
        END IF;
    END IF;

    IF v_sweep THEN
        -- Rows the sweep found below a fast floor (a transaction that committed
        -- many rows late, a bulk load): bring the fast floor down to them, so
        -- that every read takes them, not one sweep a second.
        v_new_f := least(v_first_f_id, v_locked_f_id);
        IF v_new_f < v_fast_f_id THEN
            PERFORM setval(s_fast_f_id, greatest(v_new_f, 1));
        END IF;
        v_new_t := pgqueue._ts_us(least(v_first_t, v_locked_t)) - 1;
        IF v_new_t < v_fast_t THEN
            PERFORM setval(s_fast_t, greatest(v_new_t, 1));
        END IF;
        IF v_raise THEN
            -- The fresh lane's safe floor: up to the safe watermark, once every
            -- msg_id below it was drawn a second before the oldest writer
            -- began (a writer's msg_ids are drawn after that), never past the
            -- first fresh row visible; then a new watermark.
            -- (its msg_id before its time, _mark; set to none just above when
            -- the lanes started over)
            SELECT coalesce(pg_sequence_last_value(s_smark_f_id), 1), coalesce(pg_sequence_last_value(s_smark_f), 1)
              INTO v_smark_f_id, v_smark_f;
            IF v_smark_f > 1 AND v_smark_f < pgqueue._ts_us(least(v_start, v_writer) - interval '1 second') THEN
                v_new := least(v_smark_f_id, v_first_f_id);
                IF v_new > v_safe_f_id THEN
                    PERFORM setval(s_safe_f_id, v_new);
                END IF;
                PERFORM pgqueue._mark(q.queue_id, q.msg_seq, s_smark_f, s_smark_f_id);
            ELSIF v_smark_f <= 1 OR v_smark_f > pgqueue._ts_us(v_start) + 1000000 THEN
                -- none yet, or one ahead of the clock (the clock went back)
                PERFORM pgqueue._mark(q.queue_id, q.msg_seq, s_smark_f, s_smark_f_id);
            END IF;
            v_new := pgqueue._ts_us(least(v_start - interval '1 second', v_writer - interval '1 second',
                                          v_first_t)) - 1;
            IF v_new > v_safe_t THEN
                PERFORM setval(s_safe_t, v_new);
            END IF;
        END IF;
        -- a slow sweep spaces out the next ones: sweeps take at most ~5% of
        -- reads; what it waited for after its scans does not count
        PERFORM setval(s_sweep, pgqueue._ts_us(clock_timestamp()
                       + greatest(interval '1 second', 20 * (coalesce(v_swept, clock_timestamp()) - v_start))));
    END IF;
END
$$;

-- Hands out up to qty messages of the named queue, as _take does, for every
-- read, read_with_poll and pop: a paused queue gives no rows and one notice
-- (PGQ11), an unknown one raises PGQ01. The name is looked up lowercased: a
-- pgqueue name is its own lowercase, and a name whose lowercase names a queue
-- stands for that queue (_queue_name_for); any other goes through _queue.
--
-- The one-message read. A read of one message (PGMQ's clients read one at a
-- time) runs here in four statements: the queue's row with its lanes' floors,
-- the first row of each lane locked, the lease (or the pop's delete) by ctid,
-- and the fast floors' moves. It runs only when a round of _take would do
-- exactly that: no group in the queue, nothing listed for a recheck, no sweep
-- due, the floors set on this server and not above its clock, no filter, and
-- no write before it in the transaction. Anything else, and a first row whose
-- attempts ran out, goes to _take, which then finds and does the same (the
-- rows locked here stay this transaction's). The message handed out is the
-- one _take's round would hand out: the first of the two lanes' first rows
-- (the fresh lane's by msg_id, the timed lane's by vt) in (vt, msg_id) order.
--
-- Its fast floors move as _take's would, but only once they would move by
-- more than 8 msg_ids (the fresh lane's) or a millisecond (the timed lane's):
-- a floor is a matter of speed, and a read one behind walks at most that many
-- more index entries, where each move costs a sequence write.
CREATE FUNCTION pgqueue._take_by_name(queue_name text, vt_seconds integer, qty integer, remove boolean,
                                      conditional jsonb DEFAULT NULL)
RETURNS SETOF pgqueue.taken_record
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
SET enable_bitmapscan = off
AS $$
#variable_conflict use_column
DECLARE
    q pgqueue.queue;
    v_queue_id integer;
    v_max integer;
    v_seqs regclass[];
    v_msg_seq regclass;
    v_odd boolean;
    v_listed boolean;
    v_start timestamptz;
    v_start_us bigint;
    v_fast_f_id bigint;
    v_mark_f_id bigint;
    v_mark_f bigint;
    v_fast_t bigint;
    v_safe_t bigint;
    v_sweep bigint;
    v_server bigint;
    v_lo_t timestamptz;
    v_new_f bigint;
    v_f_vt timestamptz;
    v_f_id bigint;
    v_f_tid tid;
    v_t_vt timestamptz;
    v_t_id bigint;
    v_t_read_ct integer;
    v_t_tid tid;
    v_tid tid;
    v_new_t bigint;
    v_leased_at timestamptz;
BEGIN
    IF vt_seconds IS NULL THEN
        RAISE EXCEPTION 'vt must not be NULL' USING ERRCODE = '22004';
    END IF;
    -- The queue's row and its lanes' state, read as _take reads it: the fast
    -- watermark's msg_id before its time (_mark). The fresh lane's safe floor
    -- and watermark are the late sweep's, which runs in _take.
    SELECT t.queue_id, t.max_attempts, t.lane_seqs, t.msg_seq, t.paused_at IS NOT NULL OR t.has_groups,
           coalesce(pg_sequence_last_value(t.lane_seqs[1]), 1), coalesce(pg_sequence_last_value(t.lane_seqs[8]), 1),
           coalesce(pg_sequence_last_value(t.lane_seqs[2]), 1), coalesce(pg_sequence_last_value(t.lane_seqs[3]), 1),
           coalesce(pg_sequence_last_value(t.lane_seqs[5]), 1), coalesce(pg_sequence_last_value(t.lane_seqs[6]), 1),
           coalesce(pg_sequence_last_value(t.lane_seqs[7]), 0),
           EXISTS (SELECT 1 FROM pgqueue.recheck r WHERE r.queue_id = t.queue_id),
           clock_timestamp()
      INTO v_queue_id, v_max, v_seqs, v_msg_seq, v_odd, v_fast_f_id, v_mark_f_id, v_mark_f, v_fast_t, v_safe_t,
           v_sweep, v_server, v_listed, v_start
      FROM pgqueue.queue t
     WHERE t.queue_name = lower(_take_by_name.queue_name);
    IF NOT FOUND THEN
        -- raises PGQ01, or names the queue a PGMQ client's name stands for
        q := pgqueue._queue(_take_by_name.queue_name);
        RETURN QUERY SELECT * FROM pgqueue._take_by_name(q.queue_name, vt_seconds, qty, remove, conditional);
        RETURN;
    END IF;
    v_start_us := (extract(epoch FROM v_start) * 1000000)::bigint;
    IF qty IS DISTINCT FROM 1 OR conditional IS NOT NULL OR v_odd OR v_listed OR v_start_us >= v_sweep
       OR v_start_us < greatest(v_fast_t, v_safe_t)
       OR v_server <> (extract(epoch FROM pg_postmaster_start_time()) * 1000000)::bigint
       OR pg_current_xact_id_if_assigned() IS NOT NULL THEN
        SELECT * INTO q FROM pgqueue.queue t WHERE t.queue_id = v_queue_id;
        IF q.paused_at IS NOT NULL THEN
            PERFORM pgqueue._notice_paused(q);
            RETURN;
        END IF;
        RETURN QUERY SELECT * FROM pgqueue._take(q, vt_seconds, qty, remove, conditional);
        RETURN;
    END IF;

    -- The first row of each lane, locked; v_start bounds vt, so no scan of the
    -- timed lane walks the rows it holds beyond it (leases running, delays).
    v_lo_t := pgqueue._us_ts(v_fast_t);
    SELECT f.vt, f.msg_id, f.tid, t.vt, t.msg_id, t.read_ct, t.tid
      INTO v_f_vt, v_f_id, v_f_tid, v_t_vt, v_t_id, v_t_read_ct, v_t_tid
      FROM (SELECT) AS one
      LEFT JOIN LATERAL (
           SELECT m.vt, m.msg_id, m.ctid AS tid FROM pgqueue.message m
            WHERE m.queue_id = v_queue_id AND m.read_ct = 0 AND m.vt <= m.enqueued_at AND m.group_key IS NULL
              AND m.msg_id >= v_fast_f_id AND m.vt <= v_start
            ORDER BY m.msg_id
            LIMIT 1
              FOR UPDATE SKIP LOCKED) f ON true
      LEFT JOIN LATERAL (
           SELECT m.vt, m.msg_id, m.read_ct, m.ctid AS tid FROM pgqueue.message m
            WHERE m.queue_id = v_queue_id AND (m.read_ct <> 0 OR m.vt > m.enqueued_at) AND m.group_key IS NULL
              AND m.vt >= v_lo_t AND m.vt <= v_start
            ORDER BY m.vt, m.msg_id
            LIMIT 1
              FOR UPDATE SKIP LOCKED) t ON true;
    IF v_t_tid IS NULL OR (v_f_vt, v_f_id) < (v_t_vt, v_t_id) THEN
        v_tid := v_f_tid;
    ELSIF v_t_read_ct < v_max THEN
        v_tid := v_t_tid;
    ELSE
        -- its attempts ran out: _take poison-drops it and hands out the next
        SELECT * INTO q FROM pgqueue.queue t WHERE t.queue_id = v_queue_id;
        RETURN QUERY SELECT * FROM pgqueue._take(q, vt_seconds, qty, remove, conditional);
        RETURN;
    END IF;

    IF v_tid IS NOT NULL THEN
        IF remove THEN
            RETURN QUERY
            DELETE FROM pgqueue.message m WHERE m.ctid = v_tid
            RETURNING m.msg_id, m.read_ct + 1, m.enqueued_at, m.last_read_at, m.vt, m.message, m.headers;
        ELSE
            -- the lease starts now, when the row is ours
            v_leased_at := clock_timestamp();
            RETURN QUERY
            UPDATE pgqueue.message m
               SET vt = v_leased_at + make_interval(secs => vt_seconds), read_ct = m.read_ct + 1,
                   last_read_at = v_leased_at
             WHERE m.ctid = v_tid
            RETURNING m.msg_id, m.read_ct, m.enqueued_at, m.last_read_at, m.vt, m.message, m.headers;
        END IF;
    END IF;

    -- The fast floors, as _take moves them, each only once it would move by
    -- more than 8 msg_ids (the fresh lane's) or a millisecond (the timed
    -- lane's): the fresh floor to the first fresh row locked when that is
    -- older than the margin, else up to the fast watermark once that is older
    -- than the margin, never past that row, and a new watermark (the first,
    -- when there is none, and one anew when it is ahead of the clock); the
    -- timed floor behind the first timed row locked and the margin.
    IF v_f_vt < v_start - interval '50 milliseconds' THEN
        IF v_f_id > v_fast_f_id + 8 THEN
            PERFORM setval(v_seqs[1], v_f_id);
        END IF;
    ELSIF v_mark_f > 1 AND v_mark_f < v_start_us - 50000
          AND (v_tid IS NOT NULL OR v_mark_f < v_start_us - 1000000) THEN
        v_new_f := least(v_mark_f_id, v_f_id);
        IF v_new_f > v_fast_f_id + 8 THEN
            PERFORM setval(v_seqs[1], v_new_f);
        END IF;
        PERFORM pgqueue._mark(v_queue_id, v_msg_seq, v_seqs[2], v_seqs[8]);
    ELSIF v_mark_f <= 1 OR v_mark_f > v_start_us + 1000000 THEN
        -- none yet, or one ahead of the clock (the clock went back)
        PERFORM pgqueue._mark(v_queue_id, v_msg_seq, v_seqs[2], v_seqs[8]);
    END IF;
    IF v_t_vt < v_start - interval '10 milliseconds' THEN
        v_new_t := pgqueue._ts_us(v_t_vt) - 1;
        IF v_new_t > v_fast_t + 1000 THEN
            PERFORM setval(v_seqs[3], v_new_t);
        END IF;
    ELSIF v_start_us - 10001 > v_fast_t + 1000
          AND (v_tid IS NOT NULL OR v_start_us - 10001 > v_fast_t + 1000000) THEN
        PERFORM setval(v_seqs[3], v_start_us - 10001);
    END IF;
END
$$;

-- Reads, read_with_poll and pop of a paused queue return no rows, with one
-- NOTICE (_notice_paused): no lane, floor or lock is touched.
CREATE FUNCTION pgqueue.read(queue_name text, vt integer, qty integer)
RETURNS SETOF pgqueue.message_record
LANGUAGE plpgsql
SECURITY DEFINER SET search_path = pg_catalog, pgqueue, pg_temp
AS $$
BEGIN
    IF vt IS NULL OR vt < 0 OR qty IS NULL OR qty < 0 THEN
        PERFORM pgqueue._require_nonnegative('vt', vt);
        PERFORM pgqueue._require_nonnegative('qty', qty);
    END IF;
    RETURN QUERY SELECT t.msg_id, t.read_ct, t.enqueued_at, t.vt, t.message, t.headers
                   FROM pgqueue._take_by_name(queue_name, vt, qty, false) t;
END
$$;

-- Returns as soon as a round hands something out; at once, too, when the
-- caller's transaction had written before it or a round poison-dropped
-- something, rather than sleep on the locks it holds. Each round looks at the
-- queue's row again: a pause ends the wait at the next round (a drop, with
-- PGQ01).
CREATE FUNCTION pgqueue.read_with_poll(
    queue_name text,
    vt integer,
    qty integer,
    max_poll_seconds integer DEFAULT 5,
    poll_interval_ms integer DEFAULT 100
) RETURNS SETOF pgqueue.message_record
LANGUAGE plpgsql
SECURITY DEFINER SET search_path = pg_catalog, pgqueue, pg_temp
AS $$
DECLARE
    q pgqueue.queue;
    v_deadline timestamptz;
    v_had_written boolean := pg_current_xact_id_if_assigned() IS NOT NULL;
BEGIN
    PERFORM pgqueue._require_nonnegative('vt', vt);
    PERFORM pgqueue._require_nonnegative('qty', qty);
    PERFORM pgqueue._require_nonnegative('max_poll_seconds', max_poll_seconds);
    PERFORM pgqueue._require_nonnegative('poll_interval_ms', poll_interval_ms);
    q := pgqueue._queue(queue_name);
    v_deadline := clock_timestamp() + make_interval(secs => max_poll_seconds);
    PERFORM set_config('pgqueue.read_poisoned', 'off', true);
    LOOP
        IF q.paused_at IS NOT NULL THEN
            PERFORM pgqueue._notice_paused(q);
            RETURN;
        END IF;
        RETURN QUERY SELECT t.msg_id, t.read_ct, t.enqueued_at, t.vt, t.message, t.headers
                       FROM pgqueue._take_by_name(q.queue_name, vt, qty, false) t;
        EXIT WHEN FOUND OR clock_timestamp() >= v_deadline OR v_had_written
                  OR current_setting('pgqueue.read_poisoned', true) = 'on';
        PERFORM pg_sleep(greatest(poll_interval_ms, 1) / 1000.0);
        q := pgqueue._queue(queue_name);
    END LOOP;
END
$$;

CREATE FUNCTION pgqueue.pop(queue_name text, qty integer DEFAULT 1)
RETURNS SETOF pgqueue.message_record
LANGUAGE plpgsql
SECURITY DEFINER SET search_path = pg_catalog, pgqueue, pg_temp
AS $$
BEGIN
    IF qty IS NULL OR qty < 0 THEN
        PERFORM pgqueue._require_nonnegative('qty', qty);
    END IF;
    RETURN QUERY SELECT t.msg_id, t.read_ct, t.enqueued_at, t.vt, t.message, t.headers
                   FROM pgqueue._take_by_name(queue_name, 0, qty, true) t;
END
$$;

-- pgqueue's own writes never fire it (their vt is clock_timestamp() + delay).
CREATE TRIGGER message_backdated
    AFTER INSERT OR UPDATE ON pgqueue.message
    FOR EACH ROW WHEN (NEW.vt < statement_timestamp() AND NEW.group_key IS NULL)
    EXECUTE FUNCTION pgqueue._list_backdated();
