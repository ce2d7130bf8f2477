-- pgqueue 0009: one meaning per word. "Claim" now means single flight only
-- (pgqueue.claim and its friends); the internal function that hands messages
-- out to reads, pop and read_with_poll is _take (0001-0008 called it _claim),
-- and the lane design is the read lanes (docs/design/read-lanes.md). The body
-- of _take is 0008's _claim, its comments in the new words, and the setting
-- that tells read_with_poll a round poison-dropped is pgqueue.read_poisoned.

-- Hands out up to qty messages of queue q: leased for vt_seconds (a read), or
-- deleted (remove, a pop); poison-drops the ones whose attempts ran out. See
-- 0005 for the read lanes, 0008 for the clock check and the poison notices.
CREATE FUNCTION pgqueue._take(q pgqueue.queue, vt_seconds integer, qty integer, remove boolean)
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
            PERFORM set_config('pgqueue.read_poisoned', 'on', true);
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

    -- Listed rows that are gone, taken or not due need no listing any more
    -- (rows we took: if this transaction rolls back, so does this delete).
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


CREATE OR REPLACE FUNCTION pgqueue.read(queue_name text, vt integer, qty integer)
RETURNS SETOF pgqueue.message_record
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pgqueue._require_nonnegative('vt', vt);
    PERFORM pgqueue._require_nonnegative('qty', qty);
    RETURN QUERY SELECT * FROM pgqueue._take(pgqueue._queue(queue_name), vt, qty, false);
END
$$;

-- Returns as soon as a round hands something out; at once, too, when the
-- caller's transaction had written before it or a round poison-dropped
-- something, rather than sleep on the locks it holds.
CREATE OR REPLACE FUNCTION pgqueue.read_with_poll(
    queue_name text,
    vt integer,
    qty integer,
    max_poll_seconds integer DEFAULT 5,
    poll_interval_ms integer DEFAULT 100
) RETURNS SETOF pgqueue.message_record
LANGUAGE plpgsql AS $$
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
        RETURN QUERY SELECT * FROM pgqueue._take(q, vt, qty, false);
        EXIT WHEN FOUND OR clock_timestamp() >= v_deadline OR v_had_written
                  OR current_setting('pgqueue.read_poisoned', true) = 'on';
        PERFORM pg_sleep(greatest(poll_interval_ms, 1) / 1000.0);
    END LOOP;
END
$$;

CREATE OR REPLACE FUNCTION pgqueue.pop(queue_name text, qty integer DEFAULT 1)
RETURNS SETOF pgqueue.message_record
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pgqueue._require_nonnegative('qty', qty);
    RETURN QUERY SELECT * FROM pgqueue._take(pgqueue._queue(queue_name), 0, qty, true);
END
$$;

DROP FUNCTION pgqueue._claim(pgqueue.queue, integer, integer, boolean);

-- 0007's grant_roles(), its notice in the new words.
CREATE OR REPLACE FUNCTION pgqueue.grant_roles() RETURNS text[]
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    c_config constant text := 'search_path=pg_catalog, pgqueue, pg_temp';
    v_ready text[] := '{}';
    v_missing text[] := '{}';
    v_owner regrole;
    r text;
    f record;
BEGIN
    FOR r IN SELECT DISTINCT x FROM pgqueue.role_grant g, unnest(g.roles) x ORDER BY x LOOP
        IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = r) THEN
            BEGIN
                EXECUTE format('CREATE ROLE %I NOLOGIN', r);
            EXCEPTION
                WHEN duplicate_object OR unique_violation THEN
                    NULL;  -- created meanwhile by a migration of another database
                WHEN insufficient_privilege THEN
                    v_missing := v_missing || r;
                    CONTINUE;
            END;
        END IF;
        v_ready := v_ready || r;
    END LOOP;

    FOR f IN SELECT p.oid::regprocedure AS fn, p.prosecdef, p.proconfig
               FROM pgqueue.role_grant g JOIN pg_proc p ON p.oid = g.function_signature::regprocedure
    LOOP
        IF NOT f.prosecdef OR NOT coalesce(f.proconfig @> ARRAY[c_config], false) THEN
            EXECUTE format('ALTER FUNCTION %s SECURITY DEFINER SET search_path = pg_catalog, pgqueue, pg_temp',
                           f.fn);
        END IF;
    END LOOP;

    REVOKE ALL ON ALL FUNCTIONS IN SCHEMA pgqueue FROM PUBLIC;
    REVOKE ALL ON ALL TABLES IN SCHEMA pgqueue FROM PUBLIC;
    REVOKE ALL ON ALL SEQUENCES IN SCHEMA pgqueue FROM PUBLIC;

    FOREACH r IN ARRAY v_ready LOOP
        -- exactly the listed functions, also after a row changed its roles
        EXECUTE format('REVOKE ALL ON ALL FUNCTIONS IN SCHEMA pgqueue FROM %I', r);
        EXECUTE format('GRANT USAGE ON SCHEMA pgqueue TO %I', r);
        EXECUTE format('GRANT SELECT ON pgqueue.schema_version TO %I', r);
        FOR f IN SELECT g.function_signature::regprocedure AS fn FROM pgqueue.role_grant g
                  WHERE r = ANY (g.roles) ORDER BY 1
        LOOP
            EXECUTE format('GRANT EXECUTE ON FUNCTION %s TO %I', f.fn, r);
        END LOOP;
    END LOOP;

    -- The late sweep of the read lanes (0005) reads pg_stat_activity as the
    -- owner: sessions of roles whose details the owner may not see count as
    -- infinitely old, and then no sweep raises the safe floors.
    SELECT n.nspowner::regrole INTO v_owner FROM pg_namespace n WHERE n.nspname = 'pgqueue';
    IF NOT pg_has_role(v_owner, 'pg_read_all_stats', 'USAGE') THEN
        RAISE NOTICE 'pgqueue: role %, the owner of schema pgqueue, cannot see other roles'' sessions in pg_stat_activity',
            v_owner
            USING HINT = format('Have an administrator run GRANT pg_read_all_stats TO %s; without it, reads'
                                ' cannot raise the read lanes'' safe floors while sessions of other roles'
                                ' are connected (see docs/security.md).', v_owner);
    END IF;

    IF cardinality(v_missing) > 0 THEN
        RAISE NOTICE 'pgqueue: role % may not create roles, so % do not exist and nobody may call pgqueue''s functions but the owner',
            current_user, array_to_string(v_missing, ', ')
            USING HINT = format('Have an administrator run %s then run SELECT pgqueue.grant_roles(); as %s (see docs/security.md).',
                                (SELECT string_agg(format('CREATE ROLE %I NOLOGIN;', m), ' ') FROM unnest(v_missing) m),
                                current_user);
    END IF;
    RETURN v_ready;
END
$$;

-- CREATE OR REPLACE above reset SECURITY DEFINER and search_path.
SELECT pgqueue.grant_roles();
