-- pgqueue 0004: what operators need at 3 a.m.
--
--   * The last error a consumer reported travels with the message: a nack
--     (set_vt with an error) records it, and when the message is poison-dropped
--     after max_attempts the poison reason says what kept failing.
--   * Looking without touching: peek shows live messages without claiming
--     them (no vt or read_ct change).
--   * The poison table searched and paged: by age and reason, one row by id,
--     ids in keyset pages and counts, so bulk requeue/purge can work in chunks.
--   * Purging a large queue in chunks (short transactions, a progress bar).
--   * A barrier's failed members with the reason each failed.

ALTER TABLE pgqueue.message ADD COLUMN last_error text;

-- Longest error text kept per message; the rest is cut (with a marker).
CREATE FUNCTION pgqueue._clip_error(error text) RETURNS text
LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE WHEN length(error) > 2000 THEN left(error, 2000) || ' [...]' ELSE error END;
$$;

-- ---------------------------------------------------------------------------
-- nack with an error

CREATE FUNCTION pgqueue.set_vt(queue_name text, msg_id bigint, vt integer, last_error text)
RETURNS SETOF pgqueue.message_record
LANGUAGE plpgsql AS $$
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
     WHERE queue_id = q.queue_id AND msg_id = set_vt.msg_id
    RETURNING msg_id, read_ct, enqueued_at, vt, message, headers;
END
$$;

-- The claim of 0001, unchanged but for the poison reason, which is shorter
-- (operators read it in a table) and carries the last error a consumer reported.
CREATE OR REPLACE FUNCTION pgqueue._claim(q pgqueue.queue, vt_seconds integer, qty integer, remove boolean)
RETURNS SETOF pgqueue.message_record
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_now timestamptz;
    v_left integer := qty;
    v_ok bigint[];
    v_exhausted bigint[];
    v_handed bigint[] := '{}';
BEGIN
    -- See 0001_core.sql for the argument: rows locked by the claim (SKIP
    -- LOCKED); rows past max_attempts moved to the poison table in the
    -- transaction that would have delivered them again; the batch refilled for
    -- the places they left; no message handed out twice in one call.
    LOOP
        v_now := clock_timestamp();
        SELECT coalesce(array_agg(c.msg_id) FILTER (WHERE c.read_ct < q.max_attempts), '{}'),
               coalesce(array_agg(c.msg_id) FILTER (WHERE c.read_ct >= q.max_attempts), '{}')
          INTO v_ok, v_exhausted
          FROM (SELECT m.msg_id, m.read_ct
                  FROM pgqueue.message m
                 WHERE m.queue_id = q.queue_id AND m.vt <= v_now
                   AND m.msg_id <> ALL (v_handed)
                 ORDER BY m.vt, m.msg_id
                 LIMIT v_left
                   FOR UPDATE SKIP LOCKED) c;

        IF cardinality(v_exhausted) > 0 THEN
            WITH gone AS (
                DELETE FROM pgqueue.message
                 WHERE queue_id = q.queue_id AND msg_id = ANY (v_exhausted)
                RETURNING *
            )
            INSERT INTO pgqueue.poison (queue_id, msg_id, read_ct, enqueued_at, poisoned_at,
                                        reason, message, headers, dedupe_key)
            SELECT g.queue_id, g.msg_id, g.read_ct, g.enqueued_at, v_now,
                   format('max_attempts exceeded (read %s times)', g.read_ct)
                     || coalesce('; last error: ' || g.last_error, ''),
                   g.message, g.headers, g.dedupe_key
              FROM gone g;
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
END
$$;

-- ---------------------------------------------------------------------------
-- looking without touching

CREATE TYPE pgqueue.peek_record AS (
    msg_id bigint,
    read_ct integer,
    enqueued_at timestamptz,
    vt timestamptz,
    message jsonb,
    headers jsonb,
    dedupe_key text,
    last_error text
);

-- Live messages in msg_id order, visible or not, after `after_msg_id`; a plain
-- read: it takes no locks that a consumer would wait on and changes nothing.
CREATE FUNCTION pgqueue.peek(queue_name text, qty integer DEFAULT 10, after_msg_id bigint DEFAULT 0)
RETURNS SETOF pgqueue.peek_record
LANGUAGE plpgsql STABLE AS $$
#variable_conflict use_column
DECLARE
    q pgqueue.queue := pgqueue._queue(peek.queue_name);
BEGIN
    PERFORM pgqueue._require_nonnegative('qty', peek.qty);
    RETURN QUERY
    SELECT m.msg_id, m.read_ct, m.enqueued_at, m.vt, m.message, m.headers, m.dedupe_key, m.last_error
      FROM pgqueue.message m
     WHERE m.queue_id = q.queue_id AND m.msg_id > coalesce(peek.after_msg_id, 0)
     ORDER BY m.msg_id
     LIMIT peek.qty;
END
$$;

-- ---------------------------------------------------------------------------
-- the poison table, searched and paged

-- The filter every poison search shares: queue (NULL: all), poisoned in
-- [poisoned_after, poisoned_before), reason containing a text (any case).
CREATE FUNCTION pgqueue._poison_matches(p pgqueue.poison, p_queue_id integer, p_after timestamptz,
                                        p_before timestamptz, p_reason text)
RETURNS boolean
LANGUAGE sql IMMUTABLE AS $$
    SELECT (p_queue_id IS NULL OR p.queue_id = p_queue_id)
       AND (p_after IS NULL OR p.poisoned_at >= p_after)
       AND (p_before IS NULL OR p.poisoned_at < p_before)
       AND (p_reason IS NULL OR strpos(lower(p.reason), lower(p_reason)) > 0);
$$;

CREATE FUNCTION pgqueue._queue_id_or_null(queue_name text) RETURNS integer
LANGUAGE sql STABLE AS $$
    SELECT CASE WHEN queue_name IS NULL THEN NULL ELSE (pgqueue._queue(queue_name)).queue_id END;
$$;

-- Newest first, filtered; poison_list(queue, qty) of 0001 is this without filters.
CREATE FUNCTION pgqueue.poison_list(queue_name text, qty integer, poisoned_after timestamptz,
                                    reason_contains text)
RETURNS SETOF pgqueue.poison_record
LANGUAGE plpgsql STABLE AS $$
#variable_conflict use_column
DECLARE
    v_queue_id integer := pgqueue._queue_id_or_null(poison_list.queue_name);
BEGIN
    PERFORM pgqueue._require_nonnegative('qty', poison_list.qty);
    RETURN QUERY
    SELECT q.queue_name, p.msg_id, p.read_ct, p.enqueued_at, p.poisoned_at, p.reason, p.message, p.headers
      FROM pgqueue.poison p
      JOIN pgqueue.queue q USING (queue_id)
     WHERE pgqueue._poison_matches(p, v_queue_id, poison_list.poisoned_after, NULL,
                                   poison_list.reason_contains)
     ORDER BY p.poisoned_at DESC, p.msg_id DESC
     LIMIT poison_list.qty;
END
$$;

-- One poison message of a queue; no row if there is none with that id.
CREATE FUNCTION pgqueue.poison_get(queue_name text, msg_id bigint)
RETURNS SETOF pgqueue.poison_record
LANGUAGE plpgsql STABLE AS $$
#variable_conflict use_column
DECLARE
    q pgqueue.queue := pgqueue._queue(poison_get.queue_name);
BEGIN
    RETURN QUERY
    SELECT q.queue_name, p.msg_id, p.read_ct, p.enqueued_at, p.poisoned_at, p.reason, p.message, p.headers
      FROM pgqueue.poison p
     WHERE p.queue_id = q.queue_id AND p.msg_id = poison_get.msg_id;
END
$$;

-- The ids of a queue's matching poison messages, in msg_id order, after
-- `after_msg_id`: a keyset page for bulk requeue and purge.
CREATE FUNCTION pgqueue.poison_ids(queue_name text, after_msg_id bigint, qty integer,
                                   poisoned_after timestamptz DEFAULT NULL,
                                   poisoned_before timestamptz DEFAULT NULL,
                                   reason_contains text DEFAULT NULL)
RETURNS SETOF bigint
LANGUAGE plpgsql STABLE AS $$
#variable_conflict use_column
DECLARE
    q pgqueue.queue := pgqueue._queue(poison_ids.queue_name);
BEGIN
    PERFORM pgqueue._require_nonnegative('qty', poison_ids.qty);
    RETURN QUERY
    SELECT p.msg_id
      FROM pgqueue.poison p
     WHERE p.queue_id = q.queue_id AND p.msg_id > coalesce(poison_ids.after_msg_id, 0)
       AND pgqueue._poison_matches(p, q.queue_id, poison_ids.poisoned_after,
                                   poison_ids.poisoned_before, poison_ids.reason_contains)
     ORDER BY p.msg_id
     LIMIT poison_ids.qty;
END
$$;

CREATE FUNCTION pgqueue.poison_count(queue_name text DEFAULT NULL,
                                     poisoned_after timestamptz DEFAULT NULL,
                                     poisoned_before timestamptz DEFAULT NULL,
                                     reason_contains text DEFAULT NULL)
RETURNS bigint
LANGUAGE plpgsql STABLE AS $$
#variable_conflict use_column
DECLARE
    v_queue_id integer := pgqueue._queue_id_or_null(poison_count.queue_name);
BEGIN
    RETURN (SELECT count(*) FROM pgqueue.poison p
             WHERE pgqueue._poison_matches(p, v_queue_id, poison_count.poisoned_after,
                                           poison_count.poisoned_before, poison_count.reason_contains));
END
$$;

-- ---------------------------------------------------------------------------
-- purging in chunks

-- Delete up to qty live messages with msg_id <= up_to_msg_id, oldest first;
-- how many. Barrier members removed this way count as purged (failed), as
-- with purge_queue. Call until it returns 0: the bound keeps a purge from
-- chasing messages sent after it started.
CREATE FUNCTION pgqueue.purge_queue_chunk(queue_name text, up_to_msg_id bigint, qty integer)
RETURNS bigint
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    q pgqueue.queue := pgqueue._queue(purge_queue_chunk.queue_name);
    n bigint;
BEGIN
    PERFORM pgqueue._require_nonnegative('qty', purge_queue_chunk.qty);
    PERFORM set_config('pgqueue.removal_reason', 'purged', true);
    DELETE FROM pgqueue.message m
     WHERE m.queue_id = q.queue_id
       AND m.msg_id IN (SELECT c.msg_id FROM pgqueue.message c
                         WHERE c.queue_id = q.queue_id AND c.msg_id <= purge_queue_chunk.up_to_msg_id
                         ORDER BY c.msg_id
                         LIMIT purge_queue_chunk.qty
                           FOR UPDATE);
    GET DIAGNOSTICS n = ROW_COUNT;
    PERFORM set_config('pgqueue.removal_reason', '', true);
    RETURN n;
END
$$;

-- ---------------------------------------------------------------------------
-- why a barrier's members failed

CREATE TYPE pgqueue.member_failure AS (
    member_index integer,
    msg_id bigint,
    outcome text,
    reason text,
    result jsonb,
    completed_at timestamptz
);

-- Every member that completed other than 'succeeded', by member index, with a
-- one-line reason: the poison reason, the failure's own result, or what the
-- outcome means.
CREATE FUNCTION pgqueue.barrier_failures(barrier_id text, qty integer DEFAULT 100)
RETURNS SETOF pgqueue.member_failure
LANGUAGE plpgsql STABLE AS $$
#variable_conflict use_column
BEGIN
    PERFORM pgqueue._barrier_or_raise(barrier_failures.barrier_id);
    PERFORM pgqueue._require_nonnegative('qty', barrier_failures.qty);
    RETURN QUERY
    SELECT m.member_index, m.msg_id, m.outcome,
           CASE m.outcome
               WHEN 'poisoned' THEN coalesce(m.result ->> 'reason', 'poisoned')
               WHEN 'purged' THEN 'purged from the queue before it was processed'
               WHEN 'timed_out' THEN 'still pending when the barrier''s deadline passed'
               ELSE coalesce(m.result ->> 'error', m.result ->> 'reason', m.result::text,
                             'completed as failed')
           END,
           m.result, m.completed_at
      FROM pgqueue.barrier_member m
     WHERE m.barrier_id = barrier_failures.barrier_id
       AND m.outcome IS NOT NULL AND m.outcome <> 'succeeded'
     ORDER BY m.member_index
     LIMIT barrier_failures.qty;
END
$$;

-- ---------------------------------------------------------------------------
-- multi-row acks lock in msg_id order

-- complete_members locks its message rows in msg_id order; a multi-row delete
-- or archive locked them in whatever order its plan visited them (a bitmap
-- scan: heap order), so the two could each hold a row the other wanted (seen:
-- a deadlock in test_multi_row_acks_and_batch_completions_do_not_deadlock).
-- Every multi-row remover now takes its row locks in msg_id order first.
CREATE OR REPLACE FUNCTION pgqueue.delete(queue_name text, msg_ids bigint[]) RETURNS SETOF bigint
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    q pgqueue.queue := pgqueue._queue(delete.queue_name);
BEGIN
    RETURN QUERY
    DELETE FROM pgqueue.message m
     WHERE m.queue_id = q.queue_id
       AND m.msg_id IN (SELECT l.msg_id FROM pgqueue.message l
                         WHERE l.queue_id = q.queue_id AND l.msg_id = ANY (delete.msg_ids)
                         ORDER BY l.msg_id FOR UPDATE)
    RETURNING m.msg_id;
END
$$;

CREATE OR REPLACE FUNCTION pgqueue.archive(queue_name text, msg_ids bigint[]) RETURNS SETOF bigint
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    q pgqueue.queue := pgqueue._queue(archive.queue_name);
BEGIN
    RETURN QUERY
    WITH gone AS (
        DELETE FROM pgqueue.message m
         WHERE m.queue_id = q.queue_id
           AND m.msg_id IN (SELECT l.msg_id FROM pgqueue.message l
                             WHERE l.queue_id = q.queue_id AND l.msg_id = ANY (archive.msg_ids)
                             ORDER BY l.msg_id FOR UPDATE)
        RETURNING m.*
    ), kept AS (
        INSERT INTO pgqueue.archive (queue_id, msg_id, read_ct, enqueued_at, vt, message, headers)
        SELECT g.queue_id, g.msg_id, g.read_ct, g.enqueued_at, g.vt, g.message, g.headers FROM gone g
        RETURNING msg_id
    )
    SELECT k.msg_id FROM kept k;
END
$$;
