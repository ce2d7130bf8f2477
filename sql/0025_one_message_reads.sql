-- pgqueue 0025: a one-message read in four statements, one-message acks in
-- one, a delete trigger that costs nothing unless a barrier member goes, and
-- queue names as PGMQ's clients give them.
--
-- Measured on a fresh database (benchmarks/pgmq_instructions.py), a
-- one-message read or pop still spent most of its server time starting the
-- executor on _take's statements and evaluating its expressions, and a
-- one-message delete or archive went through two functions and the queue's
-- row twice. Four changes:
--
-- * pgqueue._take_by_name is every read's entry (read, read_with_poll, pop,
--   and the pgmq facade's): the queue's row and its lanes' state in one
--   statement, a paused queue told (PGQ11) and left alone. A read of one
--   message, when a round of _take would do nothing else (its header says
--   when), locks the first row of each lane in one statement of two index
--   scans, leases or pops the first of the two by ctid, and moves the fast
--   floors; anything else runs _take as before. The floors move as _take
--   moves them, but only once they would move by more than a millisecond or,
--   within one vt, 8 msg_ids: a sequence write saved for at most that many
--   index entries walked again (docs/design/read-lanes.md).
-- * delete(queue, msg_id) and archive(queue, msg_id) are one statement each
--   (_remove): the queue's id as a subquery, the message by its primary key.
-- * message_members_gone becomes a row trigger WHEN (OLD.member_of IS NOT
--   NULL) over the same transition table: a delete that takes no barrier
--   member fires no function at all; the first member of a statement counts
--   all of its members, as the statement trigger did.
-- * A name that is not a pgqueue name (capitals, other characters, a digit
--   first, over 48 characters) stands for the queue a PGMQ client means by it
--   (_queue_name_for, the pgmq facade's mapping, docs/pgmq.md), in every
--   function that finds a queue through _queue: such a name could never be a
--   pgqueue queue's, so nothing it meant before changes but PGQ01. The facade
--   passes its clients' names as they are. The functions that looked a name
--   up themselves (pause_queue, resume_queue, send_keyed, drop_queue,
--   worker_heartbeat, queue_rates) now find it the same way.
--
-- And one fix of _take (0005's rule): a slow late sweep spaces out the next
-- ones by its scans' duration, not by locks the read waited for after them.
--
-- Every statement can run again over its own result.

-- The queue a name given by a PGMQ client stands for (docs/pgmq.md, "What
-- is the same, what differs"): the name lowercased when that is a pgqueue
-- name, else one made of it (its characters outside a-z, 0-9 and _
-- replaced, a digit first prefixed, cut, and a hash of the whole name added).
CREATE OR REPLACE FUNCTION pgqueue._queue_name_for(pgmq_name text) RETURNS text
LANGUAGE sql IMMUTABLE
AS $$
    SELECT CASE WHEN lower(pgmq_name) ~ '^[a-z_][a-z0-9_]{0,47}$' THEN lower(pgmq_name)
                ELSE left(regexp_replace(regexp_replace(lower(pgmq_name), '[^a-z0-9_]', '_', 'g'),
                                         '^([0-9])', '_\1'), 39)
                     || '_' || left(md5(lower(pgmq_name)), 8) END;
$$;

-- The queue of that name, or of the name a PGMQ client means by it (a name
-- that is not a pgqueue name stands for _queue_name_for's: docs/pgmq.md,
-- "What is the same, what differs"); PGQ01 when there is none.
CREATE OR REPLACE FUNCTION pgqueue._queue(queue_name text) RETURNS pgqueue.queue
LANGUAGE plpgsql STABLE AS $$
DECLARE
    q pgqueue.queue;
BEGIN
    SELECT * INTO q FROM pgqueue.queue AS t WHERE t.queue_name = _queue.queue_name;
    IF NOT FOUND AND pgqueue._queue_name_for(queue_name) <> queue_name THEN
        SELECT * INTO q FROM pgqueue.queue AS t WHERE t.queue_name = pgqueue._queue_name_for(_queue.queue_name);
    END IF;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'queue "%" does not exist', queue_name
            USING ERRCODE = 'PGQ01',
                  HINT = 'Create it with pgqueue.create_queue(), or check the name with pgqueue.list_queues().';
    END IF;
    RETURN q;
END
$$;

-- The same, holding a KEY SHARE lock on the queue row until commit: writers
-- that must not race drop_queue (which locks the row FOR UPDATE) use this, so
-- either they commit first and the drop sees their rows, or the drop commits
-- first and they find no queue.
CREATE OR REPLACE FUNCTION pgqueue._queue_locked(queue_name text) RETURNS pgqueue.queue
LANGUAGE plpgsql AS $$
DECLARE
    q pgqueue.queue;
BEGIN
    SELECT * INTO q FROM pgqueue.queue AS t WHERE t.queue_name = _queue_locked.queue_name FOR KEY SHARE;
    IF NOT FOUND THEN
        q := pgqueue._queue(queue_name);  -- raises PGQ01, or finds the queue a PGMQ name means
        SELECT * INTO q FROM pgqueue.queue AS t WHERE t.queue_id = q.queue_id FOR KEY SHARE;
        IF NOT FOUND THEN
            RETURN pgqueue._queue(queue_name);  -- dropped meanwhile: raises PGQ01
        END IF;
    END IF;
    RETURN q;
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
-- one _take's round would hand out: the first of the two lanes' first rows in
-- (vt, msg_id) order.
--
-- Its fast floors move as _take's would, but only once they would move by
-- more than a millisecond (or, within one vt, past 8 msg_ids): a floor is a
-- matter of speed, and a read one behind walks at most that many more index
-- entries, where each move costs a sequence write.
CREATE OR REPLACE FUNCTION pgqueue._take_by_name(queue_name text, vt_seconds integer, qty integer, remove boolean,
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
    v_odd boolean;
    v_listed boolean;
    v_start timestamptz;
    v_start_us bigint;
    v_fast_f bigint;
    v_fast_f_id bigint;
    v_fast_t bigint;
    v_safe_f bigint;
    v_safe_t bigint;
    v_sweep bigint;
    v_server bigint;
    v_lo_f timestamptz;
    v_lo_t timestamptz;
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
    -- The queue's row and its lanes' state, read as _take reads it: the vt of
    -- the fresh floor before its msg_id (a writer sets the id first).
    SELECT t.queue_id, t.max_attempts, t.lane_seqs, t.paused_at IS NOT NULL OR t.has_groups,
           coalesce(pg_sequence_last_value(t.lane_seqs[1]), 1), coalesce(pg_sequence_last_value(t.lane_seqs[2]), 1),
           coalesce(pg_sequence_last_value(t.lane_seqs[3]), 1), coalesce(pg_sequence_last_value(t.lane_seqs[4]), 1),
           coalesce(pg_sequence_last_value(t.lane_seqs[5]), 1), coalesce(pg_sequence_last_value(t.lane_seqs[6]), 1),
           coalesce(pg_sequence_last_value(t.lane_seqs[7]), 0),
           EXISTS (SELECT 1 FROM pgqueue.recheck r WHERE r.queue_id = t.queue_id),
           clock_timestamp()
      INTO v_queue_id, v_max, v_seqs, v_odd, v_fast_f, v_fast_f_id, v_fast_t, v_safe_f, v_safe_t, v_sweep,
           v_server, v_listed, v_start
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
       OR v_start_us < greatest(v_fast_f, v_fast_t, v_safe_f, v_safe_t)
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

    -- The first row of each lane, locked; v_start bounds vt, so no scan walks
    -- the rows a lane holds beyond it (leases running, delays).
    v_lo_f := pgqueue._us_ts(v_fast_f);
    v_lo_t := pgqueue._us_ts(v_fast_t);
    SELECT f.vt, f.msg_id, f.tid, t.vt, t.msg_id, t.read_ct, t.tid
      INTO v_f_vt, v_f_id, v_f_tid, v_t_vt, v_t_id, v_t_read_ct, v_t_tid
      FROM (SELECT) AS one
      LEFT JOIN LATERAL (
           SELECT m.vt, m.msg_id, m.ctid AS tid FROM pgqueue.message m
            WHERE m.queue_id = v_queue_id AND m.read_ct = 0 AND m.vt <= m.enqueued_at AND m.group_key IS NULL
              AND (m.vt, m.msg_id) >= (v_lo_f, v_fast_f_id) AND m.vt <= v_start
            ORDER BY m.vt, m.msg_id
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

    -- The fast floors, as _take moves them (its header), each only once it
    -- would move by more than a millisecond or, within one vt, 8 msg_ids: the
    -- fresh floor to the first fresh row locked when that is older than the
    -- margin, else behind the margin; the timed floor behind the first timed
    -- row locked and the margin. The id before the vt.
    IF v_f_vt < v_start - interval '50 milliseconds' THEN
        IF v_f_vt > v_lo_f + interval '1 millisecond' OR (v_f_vt >= v_lo_f AND v_f_id > v_fast_f_id + 8) THEN
            PERFORM setval(v_seqs[2], v_f_id), setval(v_seqs[1], pgqueue._ts_us(v_f_vt));
        END IF;
    ELSIF v_start_us - 50001 > v_fast_f + 1000
          AND (v_tid IS NOT NULL OR v_start_us - 50001 > v_fast_f + 1000000) THEN
        PERFORM setval(v_seqs[1], v_start_us - 50001);
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
CREATE OR REPLACE FUNCTION pgqueue.read(queue_name text, vt integer, qty integer)
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
CREATE OR REPLACE FUNCTION pgqueue.read_with_poll(
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

CREATE OR REPLACE FUNCTION pgqueue.pop(queue_name text, qty integer DEFAULT 1)
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

-- Removes one message of the named queue (looked up lowercased, as
-- _take_by_name does), into the archive when archived is true: true when it
-- was live, false when it was not, NULL when no queue has that lowercase
-- name. One statement finds the queue and the message by its primary key; the
-- queue's row is looked at again only when no message went.
CREATE OR REPLACE FUNCTION pgqueue._remove(queue_name text, msg_id bigint, archived boolean) RETURNS boolean
LANGUAGE plpgsql
AS $$
#variable_conflict use_column
BEGIN
    IF archived THEN
        WITH gone AS (
            DELETE FROM pgqueue.message m
             WHERE m.queue_id = (SELECT q.queue_id FROM pgqueue.queue q
                                  WHERE q.queue_name = lower(_remove.queue_name))
               AND m.msg_id = _remove.msg_id
            RETURNING m.*
        )
        INSERT INTO pgqueue.archive (queue_id, msg_id, read_ct, enqueued_at, vt, message, headers, last_read_at)
        SELECT g.queue_id, g.msg_id, g.read_ct, g.enqueued_at, g.vt, g.message, g.headers, g.last_read_at
          FROM gone g;
    ELSE
        DELETE FROM pgqueue.message m
         WHERE m.queue_id = (SELECT q.queue_id FROM pgqueue.queue q
                              WHERE q.queue_name = lower(_remove.queue_name))
           AND m.msg_id = _remove.msg_id;
    END IF;
    IF FOUND THEN
        RETURN true;
    END IF;
    RETURN CASE WHEN EXISTS (SELECT 1 FROM pgqueue.queue q WHERE q.queue_name = lower(_remove.queue_name))
                THEN false END;
END
$$;

CREATE OR REPLACE FUNCTION pgqueue.delete(queue_name text, msg_id bigint) RETURNS boolean
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

CREATE OR REPLACE FUNCTION pgqueue.archive(queue_name text, msg_id bigint) RETURNS boolean
LANGUAGE plpgsql
SECURITY DEFINER SET search_path = pg_catalog, pgqueue, pg_temp
AS $$
BEGIN
    -- as delete does
    RETURN coalesce(pgqueue._remove(queue_name, msg_id, true),
                    pgqueue._remove((pgqueue._queue(queue_name)).queue_name, msg_id, true));
END
$$;

-- The trigger of every delete from the live table, fired for each row that
-- was a barrier member: the first such row of a statement whose member is
-- not counted yet counts every member the statement removed, in one
-- _count_gone (one lock order for the batch); the later ones find theirs
-- counted, by one probe each. A delete that takes no member (nearly all of
-- them) fires nothing: the WHEN clause is the whole cost.
CREATE OR REPLACE FUNCTION pgqueue._members_gone() RETURNS trigger
LANGUAGE plpgsql
AS $$
DECLARE
    v_queue_ids integer[];
    v_msg_ids bigint[];
BEGIN
    IF EXISTS (SELECT 1 FROM pgqueue.barrier_member bm
                WHERE bm.queue_id = OLD.queue_id AND bm.msg_id = OLD.msg_id AND bm.outcome IS NULL) THEN
        SELECT array_agg(g.queue_id), array_agg(g.msg_id)
          INTO v_queue_ids, v_msg_ids
          FROM gone g
         WHERE g.member_of IS NOT NULL;
        PERFORM pgqueue._count_gone(v_queue_ids, v_msg_ids);
    END IF;
    RETURN NULL;
END
$$;

CREATE OR REPLACE TRIGGER message_members_gone
    AFTER DELETE ON pgqueue.message
    REFERENCING OLD TABLE AS gone
    FOR EACH ROW WHEN (OLD.member_of IS NOT NULL)
    EXECUTE FUNCTION pgqueue._members_gone();

-- send_batch: the checks of headers and group keys run only for the arrays
-- given, the queue is found without a second function, and every row's vt is
-- computed once.
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
           b.message, CASE WHEN v_trace IS NULL THEN b.headers ELSE coalesce(b.headers, '{}') || v_trace END,
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

-- send: a send without options checks its arguments in one short condition;
-- the queue's row is read for the columns a send needs, the whole row only
-- for a group's lock or a notify channel.
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
       OR send.headers IS NOT NULL OR send.dedupe_key IS NOT NULL OR send.group_key IS NOT NULL THEN
        IF send.message IS NULL OR send.delay IS NULL OR send.delay < 0
           OR jsonb_typeof(send.headers) <> 'object' OR strpos(send.headers::text, '"_pg_') > 0
           OR length(send.dedupe_key) > 1000 OR send.group_key = '' OR length(send.group_key) > 200 THEN
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

-- Every function that finds a queue by a name the caller gave finds it as
-- _queue does (a name that is not a pgqueue name stands for the queue a PGMQ
-- client means by it), also those that looked the name up themselves: before,
-- pause_queue('ORDERS') on queue orders said false ("already paused") and
-- paused nothing, resume_queue likewise, send_keyed sent and said it had not,
-- drop_queue said there was no such queue, and a worker's heartbeat neither
-- told it its queues' pauses nor counted its tallies.
CREATE OR REPLACE FUNCTION pgqueue.pause_queue(queue_name text, actor text DEFAULT NULL) RETURNS boolean
LANGUAGE plpgsql
SECURITY DEFINER SET search_path = pg_catalog, pgqueue, pg_temp
AS $$
#variable_conflict use_column
BEGIN
    IF length(pause_queue.actor) > 200 THEN
        RAISE EXCEPTION 'actor is % characters; at most 200', length(pause_queue.actor)
            USING ERRCODE = '22023', HINT = 'Name who pauses the queue: a user name, a host, a ticket.';
    END IF;
    -- the name as _queue finds it (a PGMQ client's name mapped)
    UPDATE pgqueue.queue SET paused_at = clock_timestamp(), paused_by = pause_queue.actor
     WHERE queue_name = pgqueue._queue_name_for(pause_queue.queue_name) AND paused_at IS NULL;
    IF FOUND THEN
        RETURN true;
    END IF;
    PERFORM pgqueue._queue(pause_queue.queue_name);  -- raises PGQ01 when there is no such queue
    RETURN false;
END
$$;

CREATE OR REPLACE FUNCTION pgqueue.resume_queue(queue_name text) RETURNS boolean
LANGUAGE plpgsql
SECURITY DEFINER SET search_path = pg_catalog, pgqueue, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    q pgqueue.queue;
BEGIN
    -- the name as _queue finds it (a PGMQ client's name mapped)
    UPDATE pgqueue.queue SET paused_at = NULL, paused_by = NULL
     WHERE queue_name = pgqueue._queue_name_for(resume_queue.queue_name) AND paused_at IS NOT NULL
    RETURNING * INTO q;
    IF NOT FOUND THEN
        PERFORM pgqueue._queue(resume_queue.queue_name);  -- raises PGQ01 when there is no such queue
        RETURN false;
    END IF;
    IF EXISTS (SELECT 1 FROM pgqueue.waiter w WHERE w.queue_id = q.queue_id) THEN
        PERFORM pg_notify(pgqueue._channel(q.queue_name), 'resumed');
    END IF;
    RETURN true;
END
$$;

CREATE OR REPLACE FUNCTION pgqueue.send_keyed(
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
           EXISTS (SELECT FROM pgqueue.message m
                    WHERE m.queue_id = (pgqueue._queue(send_keyed.queue_name)).queue_id
                      AND m.msg_id = v_id AND m.send_token = v_token)
           OR EXISTS (SELECT FROM pgqueue.send_receipt r
                       WHERE r.send_token = v_token AND r.msg_id = v_id);
END
$$;

CREATE OR REPLACE FUNCTION pgqueue.drop_queue(queue_name text) RETURNS boolean
LANGUAGE plpgsql
SECURITY DEFINER SET search_path = pg_catalog, pgqueue, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    q pgqueue.queue;
    n bigint;
BEGIN
    -- the name as given, or the queue a PGMQ client means by it (as _queue)
    SELECT * INTO q FROM pgqueue.queue
     WHERE queue_name IN (drop_queue.queue_name, pgqueue._queue_name_for(drop_queue.queue_name))
       FOR UPDATE;
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

CREATE OR REPLACE FUNCTION pgqueue.worker_heartbeat(
    worker_id uuid,
    host text,
    pid integer,
    queues text[],
    concurrency integer,
    in_flight integer,
    started_at timestamptz,
    stopping boolean,
    tally_queues text[],
    acked bigint[],
    nacked bigint[],
    poisoned bigint[]
) RETURNS TABLE (queue_name text, paused boolean)
LANGUAGE plpgsql
SECURITY DEFINER SET search_path = pg_catalog, pgqueue, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_now timestamptz := clock_timestamp();
    v_minute timestamptz := date_trunc('minute', v_now);
    v_null text;
BEGIN
    v_null := CASE WHEN worker_heartbeat.worker_id IS NULL THEN 'worker_id'
                   WHEN worker_heartbeat.host IS NULL THEN 'host'
                   WHEN worker_heartbeat.pid IS NULL THEN 'pid'
                   WHEN worker_heartbeat.queues IS NULL THEN 'queues'
                   WHEN worker_heartbeat.concurrency IS NULL THEN 'concurrency'
                   WHEN worker_heartbeat.in_flight IS NULL THEN 'in_flight'
                   WHEN worker_heartbeat.stopping IS NULL THEN 'stopping'
                   WHEN worker_heartbeat.tally_queues IS NULL THEN 'tally_queues'
                   WHEN worker_heartbeat.acked IS NULL THEN 'acked'
                   WHEN worker_heartbeat.nacked IS NULL THEN 'nacked'
                   WHEN worker_heartbeat.poisoned IS NULL THEN 'poisoned' END;
    IF v_null IS NOT NULL THEN
        RAISE EXCEPTION '% must not be NULL', v_null USING ERRCODE = '22004',
            HINT = 'Only started_at may be NULL (the first heartbeat''s time); pass empty arrays for no tallies.';
    END IF;
    IF worker_heartbeat.host = '' OR length(worker_heartbeat.host) > 255 THEN
        RAISE EXCEPTION 'host must be 1 to 255 characters, got %', length(worker_heartbeat.host)
            USING ERRCODE = '22023';
    END IF;
    IF worker_heartbeat.pid < 1 THEN
        RAISE EXCEPTION 'pid must be >= 1, got %', worker_heartbeat.pid USING ERRCODE = '22023';
    END IF;
    IF worker_heartbeat.concurrency < 1 THEN
        RAISE EXCEPTION 'concurrency must be >= 1, got %', worker_heartbeat.concurrency
            USING ERRCODE = '22023';
    END IF;
    PERFORM pgqueue._require_nonnegative('in_flight', worker_heartbeat.in_flight);
    IF array_position(worker_heartbeat.queues, NULL) IS NOT NULL THEN
        RAISE EXCEPTION 'queues[%] is NULL', array_position(worker_heartbeat.queues, NULL)
            USING ERRCODE = '22004';
    END IF;
    IF cardinality(worker_heartbeat.acked) <> cardinality(worker_heartbeat.tally_queues)
       OR cardinality(worker_heartbeat.nacked) <> cardinality(worker_heartbeat.tally_queues)
       OR cardinality(worker_heartbeat.poisoned) <> cardinality(worker_heartbeat.tally_queues) THEN
        RAISE EXCEPTION 'tally_queues, acked, nacked and poisoned have %, %, % and % elements',
            cardinality(worker_heartbeat.tally_queues), cardinality(worker_heartbeat.acked),
            cardinality(worker_heartbeat.nacked), cardinality(worker_heartbeat.poisoned)
            USING ERRCODE = '22023', HINT = 'Pass one count of each kind per queue of tally_queues.';
    END IF;
    IF EXISTS (SELECT 1 FROM unnest(worker_heartbeat.tally_queues, worker_heartbeat.acked,
                                    worker_heartbeat.nacked, worker_heartbeat.poisoned) AS t (name, a, n, p)
                WHERE t.name IS NULL OR t.a IS NULL OR t.n IS NULL OR t.p IS NULL) THEN
        RAISE EXCEPTION 'tally_queues, acked, nacked and poisoned must not hold NULLs' USING ERRCODE = '22004';
    END IF;
    IF EXISTS (SELECT 1 FROM unnest(worker_heartbeat.acked, worker_heartbeat.nacked,
                                    worker_heartbeat.poisoned) AS t (a, n, p)
                WHERE t.a < 0 OR t.n < 0 OR t.p < 0) THEN
        RAISE EXCEPTION 'acked, nacked and poisoned must be >= 0' USING ERRCODE = '22023',
            HINT = 'They count what happened since the last successful heartbeat.';
    END IF;

    DELETE FROM pgqueue.worker w
     WHERE w.worker_id IN (SELECT s.worker_id FROM pgqueue.worker s
                            WHERE s.last_seen_at < v_now - interval '10 minutes'
                              FOR UPDATE SKIP LOCKED);
    INSERT INTO pgqueue.worker AS w
           (worker_id, host, pid, queues, concurrency, in_flight, started_at, last_seen_at, stopping)
    VALUES (worker_heartbeat.worker_id, worker_heartbeat.host, worker_heartbeat.pid,
            worker_heartbeat.queues, worker_heartbeat.concurrency, worker_heartbeat.in_flight,
            coalesce(worker_heartbeat.started_at, v_now), v_now, worker_heartbeat.stopping)
    ON CONFLICT (worker_id) DO UPDATE
       SET host = EXCLUDED.host, pid = EXCLUDED.pid, queues = EXCLUDED.queues,
           concurrency = EXCLUDED.concurrency, in_flight = EXCLUDED.in_flight,
           started_at = coalesce(worker_heartbeat.started_at, w.started_at),
           last_seen_at = EXCLUDED.last_seen_at, stopping = EXCLUDED.stopping;

    -- Sample before adding tallies: both write this minute's rows in
    -- queue_id order, the sample all of them, so the tallies only take rows
    -- this transaction holds already.
    IF pg_sequence_last_value('pgqueue.rates_sampled_minute')
       IS DISTINCT FROM (extract(epoch FROM v_minute) / 60)::bigint THEN
        PERFORM pgqueue._sample_rates(v_minute);
    END IF;
    INSERT INTO pgqueue.queue_minute AS m (queue_id, minute, acked, nacked, poisoned)
    SELECT q.queue_id, v_minute, sum(t.a), sum(t.n), sum(t.p)
      FROM unnest(worker_heartbeat.tally_queues, worker_heartbeat.acked,
                  worker_heartbeat.nacked, worker_heartbeat.poisoned) AS t (name, a, n, p)
      JOIN pgqueue.queue q ON q.queue_name = pgqueue._queue_name_for(t.name)  -- as _queue finds it
     GROUP BY q.queue_id
    HAVING sum(t.a) + sum(t.n) + sum(t.p) > 0
     ORDER BY q.queue_id
    ON CONFLICT (queue_id, minute) DO UPDATE
       SET acked = m.acked + EXCLUDED.acked, nacked = m.nacked + EXCLUDED.nacked,
           poisoned = m.poisoned + EXCLUDED.poisoned;

    -- each queue under the name the worker gave
    RETURN QUERY
    SELECT DISTINCT t.name, q.paused_at IS NOT NULL
      FROM unnest(worker_heartbeat.queues) AS t (name)
      JOIN pgqueue.queue q ON q.queue_name = pgqueue._queue_name_for(t.name)
     ORDER BY t.name;
END
$$;

CREATE OR REPLACE FUNCTION pgqueue.queue_rates(queue_names text[], minutes integer DEFAULT 60)
RETURNS TABLE (
    queue_name text,
    minute timestamptz,
    sent bigint,
    acked bigint,
    nacked bigint,
    poisoned bigint
)
LANGUAGE plpgsql STABLE
SECURITY DEFINER SET search_path = pg_catalog, pgqueue, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_now timestamptz := date_trunc('minute', clock_timestamp());
    v_from timestamptz;
BEGIN
    IF queue_rates.minutes IS NULL THEN
        RAISE EXCEPTION 'minutes must not be NULL' USING ERRCODE = '22004';
    END IF;
    IF queue_rates.minutes < 1 OR queue_rates.minutes > 120 THEN
        RAISE EXCEPTION 'minutes must be 1 to 120, got %', queue_rates.minutes
            USING ERRCODE = '22023', HINT = 'Rates are kept for 2 hours.';
    END IF;
    v_from := v_now - make_interval(mins => queue_rates.minutes - 1);
    -- Per queue, one range scan of its primary key over the window (the series
    -- gives the minutes without a row; lead() the next minute's sample).
    RETURN QUERY
    SELECT q.queue_name, s.minute,
           CASE WHEN s.minute = v_now THEN coalesce(pg_sequence_last_value(q.msg_seq), 0)
                ELSE s.next_total END - s.sent_total,
           s.acked, s.nacked, s.poisoned
      FROM pgqueue.queue q
     CROSS JOIN LATERAL (
           SELECT g.minute, m.sent_total, lead(m.sent_total) OVER (ORDER BY g.minute) AS next_total,
                  coalesce(m.acked, 0::bigint) AS acked, coalesce(m.nacked, 0::bigint) AS nacked,
                  coalesce(m.poisoned, 0::bigint) AS poisoned
             FROM generate_series(v_from, v_now, interval '1 minute') AS g (minute)
             LEFT JOIN (SELECT x.minute, x.sent_total, x.acked, x.nacked, x.poisoned
                          FROM pgqueue.queue_minute x
                         WHERE x.queue_id = q.queue_id AND x.minute BETWEEN v_from AND v_now) m
                    ON m.minute = g.minute) s
     WHERE queue_rates.queue_names IS NULL
        OR q.queue_name IN (SELECT pgqueue._queue_name_for(x) FROM unnest(queue_rates.queue_names) x)
     ORDER BY q.queue_name, s.minute;
END
$$;

-- _take: a slow late sweep spaces out the next ones by 20 times its
-- duration; the duration is now its scans', up to the first round's rows,
-- and no longer what the read waited for afterwards. A pop whose member's
-- barrier row was held 3 s by an open add_members had put the next sweep a
-- minute away, and a lease rolled back under a moved fast floor waited that
-- long (a 30 s wait: 10 minutes).
CREATE OR REPLACE FUNCTION pgqueue._take(q pgqueue.queue, vt_seconds integer, qty integer, remove boolean,
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
    s_fast_f regclass;
    s_fast_f_id regclass;
    s_fast_t regclass;
    s_safe_f regclass;
    s_safe_t regclass;
    s_sweep regclass;
    s_server regclass;
    v_server bigint;
    v_here bigint := pgqueue._ts_us(pg_postmaster_start_time());
    v_new_f bigint;
    v_new_t bigint;
    v_set_f_id boolean := false;
    v_set_f boolean := false;
    v_set_t boolean := false;
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
    -- when the sweep's scans were done (the first round's): what follows may
    -- wait on locks (a barrier's row, when a member goes), which is no sweep's cost
    v_swept timestamptz;
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
    v_any_listed boolean;
    v_round_listed boolean;
    v_writer timestamptz;
    v_new bigint;
    v_dropped record;
BEGIN
    IF qty <= 0 THEN
        RETURN;
    END IF;
    -- The lanes' sequences, as the queue's row lists them (by name for a row
    -- without the list).
    IF q.lane_seqs IS NULL THEN
        q.lane_seqs := pgqueue._lane_seq_list(q.queue_id);
    END IF;
    s_fast_f := q.lane_seqs[1];
    s_fast_f_id := q.lane_seqs[2];
    s_fast_t := q.lane_seqs[3];
    s_safe_f := q.lane_seqs[4];
    s_safe_t := q.lane_seqs[5];
    s_sweep := q.lane_seqs[6];
    s_server := q.lane_seqs[7];
    -- vt before id: a writer sets id before vt, so a read racing it sees a
    -- pair no higher than the one written (see the fast floor update below);
    -- one statement, read in this order; and whether any row of the queue is
    -- listed for a recheck
    SELECT coalesce(pg_sequence_last_value(s_fast_f), 1), coalesce(pg_sequence_last_value(s_fast_f_id), 1),
           coalesce(pg_sequence_last_value(s_fast_t), 1), coalesce(pg_sequence_last_value(s_safe_f), 1),
           coalesce(pg_sequence_last_value(s_safe_t), 1), coalesce(pg_sequence_last_value(s_sweep), 1),
           coalesce(pg_sequence_last_value(s_server), 0),
           EXISTS (SELECT 1 FROM pgqueue.recheck r WHERE r.queue_id = q.queue_id)
      INTO v_fast_f, v_fast_f_id, v_fast_t, v_safe_f, v_safe_t, v_next_sweep, v_server, v_any_listed;

    -- A clock that went back (an NTP step, a failover to a server whose clock
    -- is behind): every floor was set at or below the time of the read that
    -- set it, so a floor above our start means rows written from now on may
    -- lie below it. Start the lanes over from the bottom and sweep now; this
    -- read's sweep then sets the safe floors from the clock as it is.
    -- The same when the floors were set on another server, or before this one
    -- restarted (its start time differs): after a failover to a clock behind,
    -- sends may have landed below the floors before this first read, with the
    -- clock caught up by now (tests/sql/test_read_lanes.py).
    IF pgqueue._ts_us(v_start) < greatest(v_fast_f, v_fast_t, v_safe_f, v_safe_t)
       OR v_server <> v_here THEN
        IF pgqueue._ts_us(v_start) < greatest(v_fast_f, v_fast_t, v_safe_f, v_safe_t) THEN
            RAISE LOG 'pgqueue: the clock of the server went back (read at %, lane floors up to %); queue % reads its lanes from the bottom',
                v_start, pgqueue._us_ts(greatest(v_fast_f, v_fast_t, v_safe_f, v_safe_t)), q.queue_name;
        END IF;
        PERFORM setval(s_fast_f_id, 1), setval(s_fast_f, 1), setval(s_fast_t, 1),
                setval(s_safe_f, 1), setval(s_safe_t, 1), setval(s_server, v_here);
        v_fast_f := 1;
        v_fast_f_id := 1;
        v_fast_t := 1;
        v_safe_f := 1;
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
        v_lo_f := pgqueue._us_ts(v_safe_f);
        v_lo_f_id := 0;
        v_lo_t := pgqueue._us_ts(v_safe_t);
        IF v_raise THEN
            v_writer := pgqueue._oldest_writer();
            -- Plain reads: a row being leased by a transaction still in
            -- progress shows its old version here, and holds the floor.
            SELECT m.vt INTO v_first_f FROM pgqueue.message m
             WHERE m.queue_id = q.queue_id AND m.read_ct = 0 AND m.vt <= m.enqueued_at AND m.group_key IS NULL
               AND m.vt >= v_lo_f AND m.vt <= v_start
             ORDER BY m.vt, m.msg_id LIMIT 1;
            SELECT m.vt INTO v_first_t FROM pgqueue.message m
             WHERE m.queue_id = q.queue_id AND (m.read_ct <> 0 OR m.vt > m.enqueued_at) AND m.group_key IS NULL
               AND m.vt >= v_lo_t AND m.vt <= v_start
             ORDER BY m.vt, m.msg_id LIMIT 1;
            -- nothing visible lies below those rows: the read starts there
            -- (a row committed since is above the safe floors raised below)
            v_lo_f := coalesce(v_first_f, v_start);
            v_lo_t := coalesce(v_first_t, v_start);
        END IF;
    ELSIF conditional IS NOT NULL THEN
        v_lo_f := pgqueue._us_ts(v_safe_f);
        v_lo_f_id := 0;
        v_lo_t := pgqueue._us_ts(v_safe_t);
    ELSE
        v_lo_f := pgqueue._us_ts(v_fast_f);
        v_lo_f_id := v_fast_f_id;
        v_lo_t := pgqueue._us_ts(v_fast_t);
    END IF;

    -- Rows are locked by the read (SKIP LOCKED), so two readers never get the
    -- same message; rows past max_attempts go to the poison table in the
    -- transaction that would have delivered them again; the batch is refilled
    -- for the places they left; no message is handed out twice in one call.
    -- Each lane gives its first rows in (vt, msg_id) order, the listed rows
    -- theirs, and the batch is the first of them all in that order.
    LOOP
        v_now := clock_timestamp();
        IF NOT q.has_groups AND NOT v_any_listed THEN
            -- The common round: a queue without groups, nothing listed. The
            -- lanes alone, in one statement of few plan nodes (starting the
            -- executor on the full statement below was the largest part of a
            -- one-message read). n ranks the rows of both lanes by (vt,
            -- msg_id), as the batch is chosen; the lanes are disjoint, so no
            -- row comes twice.
            SELECT (array_agg(u.vt ORDER BY u.n) FILTER (WHERE u.fresh))[1],
                   (array_agg(u.msg_id ORDER BY u.n) FILTER (WHERE u.fresh))[1],
                   min(u.vt) FILTER (WHERE NOT u.fresh), false,
                   coalesce(array_agg(u.msg_id) FILTER (WHERE u.n <= v_left AND u.read_ct < q.max_attempts), '{}'),
                   coalesce(array_agg(u.tid) FILTER (WHERE u.n <= v_left AND u.read_ct < q.max_attempts), '{}'),
                   coalesce(array_agg(u.tid) FILTER (WHERE u.n <= v_left AND u.read_ct >= q.max_attempts), '{}')
              INTO v_round_f, v_round_f_id, v_round_t, v_round_listed, v_ok, v_ok_tids, v_exhausted_tids
              FROM (SELECT x.*, row_number() OVER (ORDER BY x.vt, x.msg_id) AS n
                      FROM (SELECT * FROM (SELECT m.msg_id, m.vt, m.read_ct, m.ctid AS tid, true AS fresh FROM pgqueue.message m
                              WHERE m.queue_id = q.queue_id AND m.read_ct = 0 AND m.vt <= m.enqueued_at
                                AND m.group_key IS NULL
                                AND (m.vt, m.msg_id) >= (v_lo_f, v_lo_f_id) AND m.vt <= v_now
                                AND m.msg_id <> ALL (v_handed)
                                AND (conditional IS NULL OR m.message @> conditional)
                              ORDER BY m.vt, m.msg_id
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
                   AND (m.vt, m.msg_id) >= (v_lo_f, v_lo_f_id) AND m.vt <= v_now
                   AND m.msg_id <> ALL (v_handed)
                   AND (conditional IS NULL OR m.message @> conditional)
                 ORDER BY m.vt, m.msg_id
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
                       SELECT m.msg_id, m.vt, m.read_ct, m.ctid AS tid FROM pgqueue.message m
                        WHERE m.queue_id = q.queue_id AND m.msg_id = r.msg_id
                          AND m.vt <= v_now AND m.msg_id <> ALL (v_handed) AND m.group_key IS NULL
                          AND (conditional IS NULL OR m.message @> conditional)
                        LIMIT 1
                          FOR UPDATE SKIP LOCKED) x
                 ORDER BY x.vt, x.msg_id
                 LIMIT v_left
            ), c AS (
                SELECT DISTINCT ON (u.msg_id) u.msg_id, u.vt, u.read_ct, u.tid
                  FROM (SELECT * FROM f UNION ALL SELECT * FROM t UNION ALL SELECT * FROM l
                        UNION ALL SELECT * FROM g) u
            ), b AS (
                SELECT * FROM c ORDER BY c.vt, c.msg_id LIMIT v_left
            ), f1 AS (
                SELECT f.vt, f.msg_id FROM f ORDER BY f.vt, f.msg_id LIMIT 1
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
        IF v_round_f IS NOT NULL AND (v_locked_f IS NULL OR (v_round_f, v_round_f_id) < (v_locked_f, v_locked_f_id)) THEN
            v_locked_f := v_round_f;
            v_locked_f_id := v_round_f_id;
        END IF;
        v_locked_t := least(v_locked_t, v_round_t);
        v_listed := v_listed OR v_round_listed;

        IF cardinality(v_exhausted_tids) > 0 THEN
            -- One notice per message dropped, so the caller can log it: the
            -- rows a read returns are only the ones it delivered.
            FOR v_dropped IN
                WITH gone AS (
                    DELETE FROM pgqueue.message WHERE ctid = ANY (v_exhausted_tids)
                    RETURNING *
                )
                INSERT INTO pgqueue.poison (queue_id, msg_id, read_ct, enqueued_at, poisoned_at,
                                            reason, message, headers, dedupe_key, group_key)
                SELECT g.queue_id, g.msg_id, g.read_ct, g.enqueued_at, v_now,
                       pgqueue._exhausted_reason(g.read_ct, g.last_error),
                       g.message, g.headers, g.dedupe_key, g.group_key
                  FROM gone g
                RETURNING msg_id, read_ct, reason
            LOOP
                PERFORM pgqueue._notice_poisoned(q.queue_name, v_dropped.msg_id, v_dropped.read_ct,
                                                 v_dropped.reason);
            END LOOP;
            PERFORM set_config('pgqueue.read_poisoned', 'on', true);
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
                  -- a probe by primary key per listing (a scalar subquery with
                  -- LIMIT is not turned into a join over the queue's messages)
                  AND (SELECT 1 FROM pgqueue.message m
                        WHERE m.queue_id = x.queue_id AND m.msg_id = x.msg_id
                          AND m.vt <= v_now AND m.msg_id <> ALL (v_handed)
                        LIMIT 1) IS NULL
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
    IF (v_set_f OR v_set_t) AND conditional IS NULL AND NOT v_wrote THEN
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
        -- a slow sweep spaces out the next ones: sweeps take at most ~5% of
        -- reads; what it waited for after its scans does not count
        PERFORM setval(s_sweep, pgqueue._ts_us(clock_timestamp()
                       + greatest(interval '1 second', 20 * (coalesce(v_swept, clock_timestamp()) - v_start))));
    END IF;
END
$$;

SELECT pgqueue.grant_roles();
