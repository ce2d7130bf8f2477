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
--   passes its clients' names as they are.
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

SELECT pgqueue.grant_roles();
