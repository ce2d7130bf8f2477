-- pgqueue 0024: less fixed work in a one-message read and pop.
--
-- Measured on a fresh database (benchmarks/pgmq_facade.py, docs/pgmq.md
-- "Speed"), a one-message read spent its server time on fixed costs, not on
-- finding rows. Three of them shrink:
--
-- * The round statement of _take holds the lanes, the listed rows and the
--   group heads in one plan, and starting its executor was the largest part
--   of a read. A round now runs a statement of the lanes alone when the queue
--   never had a group and nothing of it is listed for a recheck (one probe,
--   in the statement that reads the floors); any other round runs the full
--   statement, as before. What a read hands out, and in which order, is the
--   same either way.
-- * _take found the queue's seven lane sequences by name on every call, in
--   a statement whose plan repeated each lookup. The queue's row now lists
--   them (queue.lane_seqs, kept by _lane_seqs, filled here for the queues
--   there are); a read falls back to the names when the list is missing.
-- * The trigger of every delete from the live table (_members_gone) looked up
--   barrier members with a plan of two probes per row, under a setting of its
--   own. It now makes one pass over the deleted rows and hands the members,
--   if any, to _count_gone, which does the lookups.
--
-- Together: a pop through the pgmq facade executes 13% fewer instructions on
-- the server (callgrind, 799k against 915k a call).
--
-- Every statement can run again over its own result.

ALTER TABLE pgqueue.queue ADD COLUMN IF NOT EXISTS lane_seqs regclass[];

-- The seven sequences of a queue (pgqueue.lane_<queue_id>_<which>): fast
-- floor of each lane (and msg_id of the fresh one), safe floor of each lane,
-- the earliest time of the next late sweep, and the start time of the server
-- whose reads set the floors. One list of their names.
CREATE OR REPLACE FUNCTION pgqueue._lane_names() RETURNS text[]
LANGUAGE sql IMMUTABLE AS $$
    SELECT ARRAY['fast_f', 'fast_f_id', 'fast_t', 'safe_f', 'safe_t', 'sweep', 'server'];
$$;

-- A queue's lane sequences, in the order of _lane_names (queue.lane_seqs).
CREATE OR REPLACE FUNCTION pgqueue._lane_seq_list(queue_id integer) RETURNS regclass[]
LANGUAGE sql STABLE AS $$
    SELECT ARRAY(SELECT ('pgqueue.lane_' || queue_id || '_' || u.w)::regclass
                   FROM unnest(pgqueue._lane_names()) WITH ORDINALITY AS u (w, i)
                  ORDER BY u.i);
$$;

-- Creates (creating => true) or drops a queue's lane sequences. Once they
-- are created, the queue's row lists them (queue.lane_seqs): a read finds
-- them there, not by name (seven lookups by name cost a one-message read
-- about a tenth of its server time).
CREATE OR REPLACE FUNCTION pgqueue._lane_seqs(queue_id integer, creating boolean) RETURNS void
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

-- The queues there are: their lanes' sequences by OID (each queue has had all
-- seven since 0022).
UPDATE pgqueue.queue x SET lane_seqs = pgqueue._lane_seq_list(x.queue_id) WHERE x.lane_seqs IS NULL;

-- Members leaving the live table that nothing counted yet: 'poisoned' when
-- they went to the poison table in the same statement, else 'succeeded' (an
-- ack by delete, archive or pop). Every path that means another outcome
-- (complete_members, the purges) counts its members first, so they are
-- skipped here; nothing a session sets is read. Each gone row looks up its
-- member row and its poison row by one primary-key probe each.
CREATE OR REPLACE FUNCTION pgqueue._count_gone(p_queue_ids integer[], p_msg_ids bigint[]) RETURNS void
LANGUAGE plpgsql
SET enable_seqscan = off
AS $$
DECLARE
    v_queue_ids integer[];
    v_msg_ids bigint[];
    v_outcomes text[];
    v_results jsonb[];
BEGIN
    SELECT array_agg(g.queue_id), array_agg(g.msg_id),
           array_agg(CASE WHEN p.reason IS NOT NULL THEN 'poisoned' ELSE 'succeeded' END),
           array_agg(CASE WHEN p.reason IS NOT NULL THEN jsonb_build_object('reason', p.reason) END)
      INTO v_queue_ids, v_msg_ids, v_outcomes, v_results
      FROM unnest(p_queue_ids, p_msg_ids) AS g (queue_id, msg_id)
     CROSS JOIN LATERAL (SELECT bm.outcome FROM pgqueue.barrier_member bm
                          WHERE bm.queue_id = g.queue_id AND bm.msg_id = g.msg_id LIMIT 1) bm
      LEFT JOIN LATERAL (SELECT x.reason FROM pgqueue.poison x
                          WHERE x.queue_id = g.queue_id AND x.msg_id = g.msg_id LIMIT 1) p ON true
     WHERE bm.outcome IS NULL;
    IF v_msg_ids IS NOT NULL THEN
        PERFORM pgqueue._complete(v_queue_ids, v_msg_ids, v_outcomes, v_results);
    END IF;
END
$$;

-- The trigger of every delete from the live table: the gone rows that were
-- barrier members, counted by _count_gone. A delete that took no member
-- (nearly all of them) costs one pass over its own rows and no lookup.
CREATE OR REPLACE FUNCTION pgqueue._members_gone() RETURNS trigger
LANGUAGE plpgsql
AS $$
DECLARE
    v_queue_ids integer[];
    v_msg_ids bigint[];
BEGIN
    SELECT array_agg(g.queue_id), array_agg(g.msg_id)
      INTO v_queue_ids, v_msg_ids
      FROM gone g
     WHERE g.member_of IS NOT NULL;
    IF v_msg_ids IS NOT NULL THEN
        PERFORM pgqueue._count_gone(v_queue_ids, v_msg_ids);
    END IF;
    RETURN NULL;
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
-- is visible. So at most one message of a group is leased at any time (a
-- group's later messages wait until its head is acked, popped or poisoned),
-- and a group is delivered in msg_id order, redeliveries and poison drops
-- included; sends of a group draw their msg_ids in commit order (_lock_groups).
-- The heads are found by a skip scan of message_group_idx (one probe per
-- group), only for queues that ever had a group (queue.has_groups), and
-- compete with the lanes' rows by (vt, msg_id).
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
        -- a slow sweep spaces out the next ones: sweeps take at most ~5% of reads
        PERFORM setval(s_sweep, pgqueue._ts_us(clock_timestamp()
                       + greatest(interval '1 second', 20 * (clock_timestamp() - v_start))));
    END IF;
END
$$;

SELECT pgqueue.grant_roles();
