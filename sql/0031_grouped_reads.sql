-- pgqueue 0031: one poison drop for every read.
--
-- The pgmq facade's grouped reads (read_grouped, read_grouped_rr,
-- read_grouped_head: sql/pgmq/15_grouped.sql) now hand out what PGMQ's do, a
-- batch of a group's messages, which _take's rounds cannot find (they take a
-- group's head only). They pick their rows themselves, and drop the ones
-- whose attempts ran out as every read does: _take's poison drop is now a
-- function of its own, _drop_exhausted, which both call. _take is otherwise
-- unchanged: a round whose rows all have attempts left never reaches it, so
-- its statements, and the one-message read of _take_by_name, are as before.
--
-- Every statement can run again over its own result.

-- The poison drop of a read, for every read that hands messages out (_take,
-- and the pgmq facade's grouped reads, sql/pgmq/15_grouped.sql): moves the
-- messages that tids name (rows the caller has locked, whose attempts ran
-- out) to the poison table with their reason, poisoned at dropped_at. One
-- notice per message (_notice_poisoned), so the caller can log it: the rows
-- a read returns are only the ones it delivered. And marks the transaction
-- (pgqueue.read_poisoned), so a polling read returns instead of sleeping on
-- the rows it now holds.
CREATE OR REPLACE FUNCTION pgqueue._drop_exhausted(q pgqueue.queue, tids tid[], dropped_at timestamptz) RETURNS void
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

-- _drop_exhausted is internal: granted to no one (pgqueue.role_grant has no
-- row for it); grant_roles takes PUBLIC's default EXECUTE away.
SELECT pgqueue.grant_roles();
