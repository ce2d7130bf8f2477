-- pgqueue 0022: the read lanes start over on a server other than the one
-- that set their floors.
--
-- A queue's floors are times of the server's clock. After a failover to a
-- server whose clock is behind, sends land below them; the first read resets
-- the floors only while the clock is still behind (0005). A read that comes
-- later, with the clock caught up, left those sends below the safe floor for
-- good. Each queue now keeps the start time of the server whose reads set its
-- floors (a seventh sequence, lane_<queue_id>_server), and a read on a server
-- started at another time (another node, or the same one restarted) resets
-- the floors to the bottom and sweeps, once.

-- The seven sequences of a queue (pgqueue.lane_<queue_id>_<which>): fast
-- floor of each lane (and msg_id of the fresh one), safe floor of each lane,
-- the earliest time of the next late sweep, and the start time of the server
-- whose reads set the floors.
-- One list of them, for creating (creating => true) and dropping.
CREATE OR REPLACE FUNCTION pgqueue._lane_seqs(queue_id integer, creating boolean) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    w text;
BEGIN
    FOREACH w IN ARRAY ARRAY['fast_f', 'fast_f_id', 'fast_t', 'safe_f', 'safe_t', 'sweep', 'server'] LOOP
        EXECUTE format(CASE WHEN creating THEN 'CREATE SEQUENCE IF NOT EXISTS pgqueue.%I AS bigint'
                            ELSE 'DROP SEQUENCE IF EXISTS pgqueue.%I' END,
                       'lane_' || queue_id || '_' || w);
    END LOOP;
END
$$;

SELECT pgqueue._lane_seqs(queue_id, true) FROM pgqueue.queue;

-- Hands out up to qty messages of queue q: leased for vt_seconds (a read), or
-- deleted (remove, a pop); poison-drops the ones whose attempts ran out, with
-- a notice for each. The read lanes, the floors and the late sweep are the
-- header of sql/schema/reads.sql. The rows a round locks carry their ctids,
-- and the lease (or the pop's delete, or the poison drop) finds them by those.
CREATE OR REPLACE FUNCTION pgqueue._take(q pgqueue.queue, vt_seconds integer, qty integer, remove boolean)
RETURNS SETOF pgqueue.message_record
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
    v_now timestamptz;
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
    SELECT x.ff, x.ffi, x.ft, x.sf, x.st, x.sw, x.sv,
           coalesce(pg_sequence_last_value(x.ff), 1), coalesce(pg_sequence_last_value(x.ffi), 1),
           coalesce(pg_sequence_last_value(x.ft), 1), coalesce(pg_sequence_last_value(x.sf), 1),
           coalesce(pg_sequence_last_value(x.st), 1), coalesce(pg_sequence_last_value(x.sw), 1),
           coalesce(pg_sequence_last_value(x.sv), 0)
      INTO s_fast_f, s_fast_f_id, s_fast_t, s_safe_f, s_safe_t, s_sweep, s_server,
           v_fast_f, v_fast_f_id, v_fast_t, v_safe_f, v_safe_t, v_next_sweep, v_server
      FROM (SELECT (y.p || 'fast_f')::regclass AS ff, (y.p || 'fast_f_id')::regclass AS ffi,
                   (y.p || 'fast_t')::regclass AS ft, (y.p || 'safe_f')::regclass AS sf,
                   (y.p || 'safe_t')::regclass AS st, (y.p || 'sweep')::regclass AS sw,
                   (y.p || 'server')::regclass AS sv
              FROM (SELECT 'pgqueue.lane_' || q.queue_id || '_' AS p) y) x;

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
            -- Plain reads: a row being leased by a transaction still in
            -- progress shows its old version here, and holds the floor.
            SELECT m.vt INTO v_first_f FROM pgqueue.message m
             WHERE m.queue_id = q.queue_id AND m.read_ct = 0 AND m.vt <= m.enqueued_at
               AND m.vt >= v_lo_f AND m.vt <= v_start
             ORDER BY m.vt, m.msg_id LIMIT 1;
            SELECT m.vt INTO v_first_t FROM pgqueue.message m
             WHERE m.queue_id = q.queue_id AND (m.read_ct <> 0 OR m.vt > m.enqueued_at)
               AND m.vt >= v_lo_t AND m.vt <= v_start
             ORDER BY m.vt, m.msg_id LIMIT 1;
            -- nothing visible lies below those rows: the read starts there
            -- (a row committed since is above the safe floors raised below)
            v_lo_f := coalesce(v_first_f, v_start);
            v_lo_t := coalesce(v_first_t, v_start);
        END IF;
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
        WITH f AS (
            SELECT m.msg_id, m.vt, m.read_ct, m.ctid AS tid FROM pgqueue.message m
             WHERE m.queue_id = q.queue_id AND m.read_ct = 0 AND m.vt <= m.enqueued_at
               AND (m.vt, m.msg_id) >= (v_lo_f, v_lo_f_id) AND m.vt <= v_now
               AND m.msg_id <> ALL (v_handed)
             ORDER BY m.vt, m.msg_id
             LIMIT v_left
               FOR UPDATE SKIP LOCKED
        ), t AS (
            SELECT m.msg_id, m.vt, m.read_ct, m.ctid AS tid FROM pgqueue.message m
             WHERE m.queue_id = q.queue_id AND (m.read_ct <> 0 OR m.vt > m.enqueued_at)
               AND m.vt >= v_lo_t AND m.vt <= v_now
               AND m.msg_id <> ALL (v_handed)
             ORDER BY m.vt, m.msg_id
             LIMIT v_left
               FOR UPDATE SKIP LOCKED
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
                      AND m.vt <= v_now AND m.msg_id <> ALL (v_handed)
                    LIMIT 1
                      FOR UPDATE SKIP LOCKED) x
             ORDER BY x.vt, x.msg_id
             LIMIT v_left
        ), c AS (
            SELECT DISTINCT ON (u.msg_id) u.msg_id, u.vt, u.read_ct, u.tid
              FROM (SELECT * FROM f UNION ALL SELECT * FROM t UNION ALL SELECT * FROM l) u
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
            PERFORM set_config('pgqueue.read_poisoned', 'on', true);
        END IF;

        IF cardinality(v_ok) > 0 THEN
            IF remove THEN
                RETURN QUERY
                WITH taken AS (
                    DELETE FROM pgqueue.message WHERE ctid = ANY (v_ok_tids)
                    RETURNING msg_id, read_ct + 1 AS read_ct, enqueued_at, vt, message, headers
                )
                SELECT * FROM taken t ORDER BY t.msg_id;
            ELSE
                RETURN QUERY
                WITH leased AS (
                    UPDATE pgqueue.message
                       SET vt = v_now + make_interval(secs => vt_seconds), read_ct = read_ct + 1
                     WHERE ctid = ANY (v_ok_tids)
                    RETURNING msg_id, read_ct, enqueued_at, vt, message, headers
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
