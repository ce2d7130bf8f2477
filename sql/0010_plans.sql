-- pgqueue 0010: plans that need no statistics.
--
-- On a database never analyzed (a fresh install, autovacuum not yet round),
-- the planner knows nothing of pgqueue.message but its size, and a generic
-- plan is made once per session, when the table may be small. Every
-- statement that addressed messages by a list of ids (`queue_id = $1 AND
-- msg_id = ANY ($2)`: the lease of a read, every ack, a completion) was then
-- planned as a scan of all the queue's index entries with the ids as a
-- filter: to find 10 rows a read visited tens of thousands of entries, and a
-- fresh database fell to a third of its speed within a minute of churn, until
-- the first ANALYZE. The listed-rows part of a read, and the member lookups
-- of barrier counting (a join that could scan pgqueue.barrier_member whole),
-- had the same shape.
--
-- Now the plan of each such statement is fixed by its shape, whatever the
-- statistics:
--   * A list of ids is looked up one id at a time, by the full primary key,
--     in a scalar subquery (`ARRAY(SELECT (SELECT ... WHERE queue_id = q AND
--     msg_id = u.id ...) FROM unnest(ids) u)`) or a LATERAL subquery with
--     LIMIT. Neither can be turned into a join, so each is one probe of the
--     primary key: equality on a unique key, estimated at one row whatever
--     the statistics say.
--   * The probe that locks (FOR UPDATE) returns the row's ctid; the UPDATE or
--     DELETE that follows, in a statement of its own, finds the rows by ctid
--     (a TID scan). The rows are locked by then, so their ctids cannot
--     change; the next statement's snapshot sees the versions that were
--     locked.
--   * The functions that run such statements disable sequential scans
--     (SET enable_seqscan = off), and _take disables bitmap scans too: on a
--     table the planner believes small, `ctid = ANY (...)` would otherwise be
--     planned as a sequential scan, and a lane's walk as a bitmap scan and a
--     sort. Nothing these functions run wants either.
-- tests/sql/test_plans.py makes the generic plans on a tiny, never-analyzed
-- table, grows it with churn, and checks every plan and how many buffers a
-- read and an ack touch.

-- ---------------------------------------------------------------------------
-- acks by id array

CREATE OR REPLACE FUNCTION pgqueue.delete(queue_name text, msg_ids bigint[]) RETURNS SETOF bigint
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
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
                 WHERE m.queue_id = q.queue_id AND m.msg_id = u.id FOR UPDATE)
          FROM (SELECT DISTINCT i FROM unnest(delete.msg_ids) AS i ORDER BY i) AS u (id));
    RETURN QUERY
    DELETE FROM pgqueue.message m WHERE m.ctid = ANY (v_tids) RETURNING m.msg_id;
END
$$;

CREATE OR REPLACE FUNCTION pgqueue.archive(queue_name text, msg_ids bigint[]) RETURNS SETOF bigint
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
AS $$
#variable_conflict use_column
DECLARE
    q pgqueue.queue := pgqueue._queue(archive.queue_name);
    v_tids tid[];
BEGIN
    -- As delete(queue, ids): locked in msg_id order by primary-key probes.
    v_tids := ARRAY(
        SELECT (SELECT m.ctid FROM pgqueue.message m
                 WHERE m.queue_id = q.queue_id AND m.msg_id = u.id FOR UPDATE)
          FROM (SELECT DISTINCT i FROM unnest(archive.msg_ids) AS i ORDER BY i) AS u (id));
    RETURN QUERY
    WITH gone AS (
        DELETE FROM pgqueue.message m WHERE m.ctid = ANY (v_tids)
        RETURNING m.*
    ), kept AS (
        INSERT INTO pgqueue.archive (queue_id, msg_id, read_ct, enqueued_at, vt, message, headers)
        SELECT g.queue_id, g.msg_id, g.read_ct, g.enqueued_at, g.vt, g.message, g.headers FROM gone g
        RETURNING msg_id
    )
    SELECT k.msg_id FROM kept k;
END
$$;

-- Locks, until the caller's transaction ends, the messages whose current
-- lease is the one each read_ct names; their ids. A caller that commits its
-- own writes with the ack calls it first in that transaction and rolls back
-- when a message is missing: its lease was taken over (or the message acked),
-- so the writes are another run's to commit. Locked rows cannot be read,
-- changed or acked by anyone else until then.
CREATE OR REPLACE FUNCTION pgqueue.hold_leases(queue_name text, msg_ids bigint[], read_cts integer[])
RETURNS SETOF bigint
LANGUAGE plpgsql
SET enable_seqscan = off
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
                 WHERE m.queue_id = q.queue_id AND m.msg_id = l.msg_id AND m.read_ct = l.read_ct
                   FOR UPDATE) AS id
          FROM (SELECT DISTINCT ON (x.msg_id) x.msg_id, x.read_ct
                  FROM unnest(hold_leases.msg_ids, hold_leases.read_cts) AS x (msg_id, read_ct)
                 ORDER BY x.msg_id) AS l) AS h
     WHERE h.id IS NOT NULL;
END
$$;

-- ---------------------------------------------------------------------------
-- barriers

CREATE OR REPLACE FUNCTION pgqueue._complete(p_queue_ids integer[], p_msg_ids bigint[], p_outcomes text[],
                                             p_results jsonb[])
RETURNS void
LANGUAGE plpgsql
SET enable_seqscan = off
AS $$
DECLARE
    v_ids text[];
    v_counted integer[];
    v_ok integer[];
    v_remaining integer;
BEGIN
    -- Each member row is found by one probe of (queue_id, msg_id) and counted
    -- by ctid, only while its outcome is NULL: a completion racing this one
    -- for the same member updates the row first, and then its ctid no longer
    -- matches here (nor does its outcome): the member counts once.
    WITH i AS (
        SELECT DISTINCT ON (u.queue_id, u.msg_id) u.queue_id, u.msg_id, u.outcome, u.result
          FROM unnest(p_queue_ids, p_msg_ids, p_outcomes, p_results) WITH ORDINALITY
               AS u (queue_id, msg_id, outcome, result, ord)
         ORDER BY u.queue_id, u.msg_id, u.ord  -- listed twice: the first entry counts
    ), t AS (
        SELECT i.outcome, i.result,
               (SELECT bm.ctid FROM pgqueue.barrier_member bm
                 WHERE bm.queue_id = i.queue_id AND bm.msg_id = i.msg_id) AS tid
          FROM i
    ), counted AS (
        UPDATE pgqueue.barrier_member bm
           SET outcome = t.outcome, result = t.result, completed_at = clock_timestamp()
          FROM t
         WHERE bm.ctid = t.tid AND bm.outcome IS NULL
        RETURNING bm.barrier_id, bm.outcome
    )
    SELECT array_agg(g.barrier_id ORDER BY g.barrier_id),
           array_agg(g.n ORDER BY g.barrier_id),
           array_agg(g.ok ORDER BY g.barrier_id)
      INTO v_ids, v_counted, v_ok
      FROM (SELECT c.barrier_id, count(*)::integer AS n,
                   (count(*) FILTER (WHERE c.outcome = 'succeeded'))::integer AS ok
              FROM counted c GROUP BY c.barrier_id) g;

    FOR i IN 1 .. coalesce(cardinality(v_ids), 0) LOOP
        UPDATE pgqueue.barrier
           SET remaining = remaining - v_counted[i],
               succeeded = succeeded + v_ok[i],
               failed = failed + (v_counted[i] - v_ok[i])
         WHERE barrier_id = v_ids[i] AND state = 'open'
        RETURNING remaining INTO v_remaining;
        IF FOUND AND v_remaining = 0 THEN
            PERFORM pgqueue._fire(v_ids[i], 'fired');
        END IF;
    END LOOP;
END
$$;

-- Members leaving the live table that nothing counted yet: 'poisoned' when
-- they went to the poison table in the same statement, else 'succeeded' (an
-- ack by delete, archive or pop). Every path that means another outcome
-- (complete_members, the purges) counts its members first, so they are
-- skipped here; nothing a session sets is read. Each gone row looks up its
-- member row and its poison row by one primary-key probe each.
CREATE OR REPLACE FUNCTION pgqueue._members_gone() RETURNS trigger
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
      FROM gone g
     CROSS JOIN LATERAL (SELECT bm.outcome FROM pgqueue.barrier_member bm
                          WHERE bm.queue_id = g.queue_id AND bm.msg_id = g.msg_id LIMIT 1) bm
      LEFT JOIN LATERAL (SELECT x.reason FROM pgqueue.poison x
                          WHERE x.queue_id = g.queue_id AND x.msg_id = g.msg_id LIMIT 1) p ON true
     WHERE g.member_of IS NOT NULL AND bm.outcome IS NULL;
    IF v_msg_ids IS NOT NULL THEN
        PERFORM pgqueue._complete(v_queue_ids, v_msg_ids, v_outcomes, v_results);
    END IF;
    RETURN NULL;
END
$$;

-- complete_members with read_cts: an entry with a read_ct acts only while
-- that read still holds the message's lease (else it is left alone: not
-- counted, not acked); an entry without one acts unfenced. Meant for
-- failures ('failed' speaks for one attempt, and the current holder may
-- still succeed); a success may go unfenced. The statuses returned are those
-- of the barriers of the entries that acted.
CREATE OR REPLACE FUNCTION pgqueue.complete_members(
    queue_name text,
    msg_ids bigint[],
    outcomes text[] DEFAULT NULL,
    results jsonb[] DEFAULT NULL,
    read_cts integer[] DEFAULT NULL
) RETURNS SETOF pgqueue.barrier_status
LANGUAGE plpgsql
SET enable_seqscan = off
AS $$
#variable_conflict use_column
DECLARE
    q pgqueue.queue := pgqueue._queue(complete_members.queue_name);
    v_ids bigint[] := complete_members.msg_ids;
    v_n integer := cardinality(complete_members.msg_ids);
    v_outcomes text[];
    v_results jsonb[];
    v_tids tid[];
    v_bad text;
BEGIN
    IF complete_members.msg_ids IS NULL THEN
        RAISE EXCEPTION 'msg_ids must not be NULL' USING ERRCODE = '22004';
    END IF;
    v_outcomes := coalesce(complete_members.outcomes, array_fill('succeeded'::text, ARRAY[v_n]));
    v_results := coalesce(complete_members.results, array_fill(NULL::jsonb, ARRAY[v_n]));
    IF cardinality(v_outcomes) <> v_n OR cardinality(v_results) <> v_n
       OR cardinality(complete_members.read_cts) <> v_n THEN
        RAISE EXCEPTION 'msg_ids, outcomes, results and read_cts must have the same length'
            USING ERRCODE = '22023';
    END IF;
    SELECT o INTO v_bad FROM unnest(v_outcomes) o WHERE o IS NULL OR o NOT IN ('succeeded', 'failed') LIMIT 1;
    IF FOUND THEN
        RAISE EXCEPTION 'outcome must be ''succeeded'' or ''failed'', got %', quote_nullable(v_bad)
            USING ERRCODE = '22023';
    END IF;

    -- Lock order everywhere is message rows, then member rows, then barrier
    -- rows (a reader that poison-drops a member holds its message row when its
    -- trigger reaches the barrier), so take the message rows first, in
    -- msg_id order, one primary-key probe each.
    PERFORM (SELECT 1 FROM pgqueue.message m
              WHERE m.queue_id = q.queue_id AND m.msg_id = u.id FOR UPDATE)
       FROM (SELECT DISTINCT i FROM unnest(v_ids) AS i ORDER BY i) AS u (id);
    IF complete_members.read_cts IS NOT NULL THEN
        -- The rows are locked: what this sees holds until we commit.
        SELECT coalesce(array_agg(u.msg_id ORDER BY u.ord), '{}'),
               coalesce(array_agg(u.outcome ORDER BY u.ord), '{}'),
               coalesce(array_agg(u.result ORDER BY u.ord), '{}')
          INTO v_ids, v_outcomes, v_results
          FROM unnest(complete_members.msg_ids, v_outcomes, v_results, complete_members.read_cts)
               WITH ORDINALITY AS u (msg_id, outcome, result, read_ct, ord)
         WHERE u.read_ct IS NULL
            OR (SELECT m.read_ct FROM pgqueue.message m
                 WHERE m.queue_id = q.queue_id AND m.msg_id = u.msg_id) = u.read_ct;
        v_n := cardinality(v_ids);
        IF v_n = 0 THEN
            RETURN;
        END IF;
    END IF;
    -- Count the outcomes, then ack: the ack's trigger finds the members
    -- counted and leaves them alone.
    PERFORM pgqueue._complete(array_fill(q.queue_id, ARRAY[v_n]), v_ids, v_outcomes, v_results);
    v_tids := ARRAY(SELECT (SELECT m.ctid FROM pgqueue.message m
                             WHERE m.queue_id = q.queue_id AND m.msg_id = u.id)
                      FROM unnest(v_ids) AS u (id));
    DELETE FROM pgqueue.message m WHERE m.ctid = ANY (v_tids);

    RETURN QUERY
    SELECT s.* FROM (SELECT DISTINCT x.barrier_id
                       FROM unnest(v_ids) AS u (id)
                      CROSS JOIN LATERAL (SELECT bm.barrier_id FROM pgqueue.barrier_member bm
                                           WHERE bm.queue_id = q.queue_id AND bm.msg_id = u.id
                                           LIMIT 1) x) d,
           LATERAL pgqueue._barrier_status(d.barrier_id) s
     ORDER BY s.barrier_id;
END
$$;

CREATE OR REPLACE FUNCTION pgqueue.expire_barriers() RETURNS integer
LANGUAGE plpgsql
SET enable_seqscan = off
SET enable_bitmapscan = off
AS $$
DECLARE
    v_id text;
    v_tids tid[];
    v_n integer;
    v_remaining integer;
    v_expired integer := 0;
BEGIN
    -- Safe from every consumer at once, and with completions in flight:
    --   * barriers are taken in barrier_id order, the order completions lock
    --     them in, so a sweep and a batch completion never wait on each other
    --     in a cycle;
    --   * members being completed right now are skipped (SKIP LOCKED): their
    --     completion counts them, and the barrier then fires as `fired`, or
    --     stays open for the next sweep if that completion rolls back;
    --   * only the statement that takes remaining to 0 fires.
    FOR v_id IN
        SELECT b.barrier_id FROM pgqueue.barrier b
         WHERE b.state = 'open' AND b.deadline <= clock_timestamp()
         ORDER BY b.barrier_id LIMIT 1000
    LOOP
        -- the barrier's pending members, by its primary key's prefix, locked;
        -- then timed out by ctid
        v_tids := ARRAY(SELECT x.ctid FROM pgqueue.barrier_member x
                         WHERE x.barrier_id = v_id AND x.outcome IS NULL
                           FOR UPDATE SKIP LOCKED);
        UPDATE pgqueue.barrier_member m
           SET outcome = 'timed_out', completed_at = clock_timestamp()
         WHERE m.ctid = ANY (v_tids) AND m.outcome IS NULL;
        GET DIAGNOSTICS v_n = ROW_COUNT;
        UPDATE pgqueue.barrier
           SET remaining = remaining - v_n, failed = failed + v_n
         WHERE barrier_id = v_id AND state = 'open'
        RETURNING remaining INTO v_remaining;
        IF FOUND AND v_remaining = 0 THEN
            PERFORM pgqueue._fire(v_id, 'expired');
            v_expired := v_expired + 1;
        END IF;
    END LOOP;
    RETURN v_expired;
END
$$;

-- ---------------------------------------------------------------------------
-- purges and the poison table

CREATE OR REPLACE FUNCTION pgqueue.purge_queue_chunk(queue_name text, up_to_msg_id bigint, qty integer)
RETURNS bigint
LANGUAGE plpgsql
SET enable_seqscan = off
SET enable_bitmapscan = off
AS $$
#variable_conflict use_column
DECLARE
    q pgqueue.queue := pgqueue._queue(purge_queue_chunk.queue_name);
    v_tids tid[];
    n bigint;
BEGIN
    PERFORM pgqueue._require_nonnegative('qty', purge_queue_chunk.qty);
    -- the oldest qty, in msg_id order along the primary key, locked
    v_tids := ARRAY(SELECT c.ctid FROM pgqueue.message c
                     WHERE c.queue_id = q.queue_id AND c.msg_id <= purge_queue_chunk.up_to_msg_id
                     ORDER BY c.msg_id
                     LIMIT purge_queue_chunk.qty
                       FOR UPDATE);
    -- Members are counted as purged in the statement that deletes them.
    WITH gone AS (
        DELETE FROM pgqueue.message m WHERE m.ctid = ANY (v_tids)
        RETURNING m.msg_id, m.member_of
    ), agg AS (
        SELECT count(*) AS n, array_agg(g.msg_id) FILTER (WHERE g.member_of IS NOT NULL) AS members
          FROM gone g
    )
    SELECT agg.n INTO n FROM agg, LATERAL pgqueue._count_purged(q.queue_id, agg.members) AS c;
    RETURN n;
END
$$;

-- A requeued message gets a new msg_id: its lease history starts over, and no
-- holder of an old lease can name it. The poison row is gone either way; the
-- returned ids are the new ones, in the order of the old.
CREATE OR REPLACE FUNCTION pgqueue.poison_requeue(queue_name text, msg_ids bigint[]) RETURNS SETOF bigint
LANGUAGE plpgsql
SET enable_seqscan = off
AS $$
#variable_conflict use_column
DECLARE
    q pgqueue.queue := pgqueue._queue_locked(poison_requeue.queue_name);
    v_now timestamptz := clock_timestamp();
    v_tids tid[];
    v_rows pgqueue.poison[];
    v_new bigint[];
    v_keyed bigint[];
BEGIN
    -- Rows go back with their single-flight key where it is free; where a live
    -- message (or an earlier row of this batch) holds the key, they go back
    -- without one. Nothing is lost: every row taken from the poison table is
    -- inserted by one of the two statements below, in this transaction.
    v_tids := ARRAY(
        SELECT (SELECT p.ctid FROM pgqueue.poison p
                 WHERE p.queue_id = q.queue_id AND p.msg_id = u.id FOR UPDATE)
          FROM (SELECT DISTINCT i FROM unnest(poison_requeue.msg_ids) AS i ORDER BY i) AS u (id));
    WITH back AS (
        DELETE FROM pgqueue.poison p WHERE p.ctid = ANY (v_tids)
        RETURNING *
    )
    SELECT array_agg(b ORDER BY b.msg_id) INTO v_rows FROM back b;
    IF v_rows IS NULL THEN
        RETURN;
    END IF;
    SELECT array_agg(nextval(q.msg_seq) ORDER BY r.ord) INTO v_new
      FROM unnest(v_rows) WITH ORDINALITY AS r (queue_id, msg_id, read_ct, enqueued_at, poisoned_at,
                                                reason, message, headers, dedupe_key, ord);

    WITH ins AS (
        INSERT INTO pgqueue.message (queue_id, msg_id, read_ct, enqueued_at, vt, message, headers, dedupe_key)
        SELECT r.queue_id, v_new[r.ord], 0, r.enqueued_at, v_now, r.message, r.headers, r.dedupe_key
          FROM unnest(v_rows) WITH ORDINALITY AS r (queue_id, msg_id, read_ct, enqueued_at, poisoned_at,
                                                    reason, message, headers, dedupe_key, ord)
         WHERE r.dedupe_key IS NOT NULL
         ORDER BY r.ord
        ON CONFLICT (queue_id, dedupe_key) WHERE dedupe_key IS NOT NULL DO NOTHING
        RETURNING msg_id
    )
    SELECT coalesce(array_agg(i.msg_id), '{}') INTO v_keyed FROM ins i;

    INSERT INTO pgqueue.message (queue_id, msg_id, read_ct, enqueued_at, vt, message, headers)
    SELECT r.queue_id, v_new[r.ord], 0, r.enqueued_at, v_now, r.message, r.headers
      FROM unnest(v_rows) WITH ORDINALITY AS r (queue_id, msg_id, read_ct, enqueued_at, poisoned_at,
                                                reason, message, headers, dedupe_key, ord)
     WHERE v_new[r.ord] <> ALL (v_keyed)
     ORDER BY r.ord;

    PERFORM pgqueue._notify(q);
    RETURN QUERY SELECT u.id FROM unnest(v_new) WITH ORDINALITY AS u (id, ord) ORDER BY u.ord;
END
$$;

CREATE OR REPLACE FUNCTION pgqueue.poison_purge(queue_name text, msg_ids bigint[] DEFAULT NULL) RETURNS bigint
LANGUAGE plpgsql
SET enable_seqscan = off
AS $$
#variable_conflict use_column
DECLARE
    q pgqueue.queue := pgqueue._queue(poison_purge.queue_name);
    n bigint;
BEGIN
    IF poison_purge.msg_ids IS NULL THEN
        DELETE FROM pgqueue.poison WHERE queue_id = q.queue_id;
    ELSE
        -- one primary-key probe per id
        DELETE FROM pgqueue.poison p
         WHERE p.ctid = ANY (ARRAY(
               SELECT (SELECT x.ctid FROM pgqueue.poison x
                        WHERE x.queue_id = q.queue_id AND x.msg_id = u.id)
                 FROM unnest(poison_purge.msg_ids) AS u (id)));
    END IF;
    GET DIAGNOSTICS n = ROW_COUNT;
    RETURN n;
END
$$;

-- ---------------------------------------------------------------------------
-- the read

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

-- CREATE OR REPLACE above reset SECURITY DEFINER and search_path.
SELECT pgqueue.grant_roles();
