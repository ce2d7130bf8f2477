-- pgqueue's pgmq facade, part 2: PGMQ's grouped reads (read_grouped,
-- read_grouped_rr, read_grouped_head and their _with_poll forms). Applied
-- after 10_facade.sql, by `pgqueue pgmq install` and in the extension's script.
--
-- What PGMQ 1.13 hands out, batch for batch. PGMQ keys a message's group by
-- its x-pgmq-group header, and the messages without one form one group of
-- their own, '_default_fifo_group'. Here a grouped message's group is its
-- group_key (the header's, pgqueue._pgmq_group), and the default group is the
-- ungrouped messages (in the read lanes) with those of a group_key
-- '_default_fifo_group' (a header naming PGMQ's default group joins it, as in
-- PGMQ). A group may be read while its head, its oldest message (whether
-- visible or not), is visible; the groups are taken oldest head first:
--   * read_grouped fills the batch with the first group's visible messages in
--     msg_id order, then the next group's (SQS FIFO); rows in msg_id order;
--   * read_grouped_rr takes the first visible message of every group, then
--     the second, ... (layered round-robin); rows in that order;
--   * read_grouped_head takes the heads of up to qty groups; rows in msg_id
--     order.
--
-- pgqueue's guarantee, kept: no two readers hold one group at once while
-- their leases run. A read takes a group only once it has locked the group's
-- head (FOR UPDATE SKIP LOCKED, rechecked visible on its newest version), so
-- of concurrent readers one gets the group and the others go on to other
-- groups, and every batch of a group holds its head: while the batch's lease
-- runs, the head is invisible, so neither another grouped read nor pgqueue's
-- own reads (_take: a group's head only, while visible) take anything of the
-- group. Two rules of pgqueue's where PGMQ hands a group to a second reader:
--   * a batch of a FIFO group is the run of visible messages from its head:
--     it ends at the first message that is not visible (delayed, leased,
--     nacked) or that this read could not lock, where PGMQ's read_grouped and
--     read_grouped_rr pass over it. So the messages of a group that have been
--     read are always its oldest ones;
--   * which makes "the group is held" a short look: a group whose oldest
--     messages have been read and are visible again (a lease given back by
--     set_vt or nack, or run out), followed by a read message still
--     invisible, is held by that message's reader and is not read (PGMQ hands
--     out the visible ones).
-- The default group is no FIFO group in pgqueue (its messages are anyone's
-- for pgmq.read, pgqueue.read and the worker; their sends take no group lock),
-- so the grouped reads treat it exactly as PGMQ does: the visible messages
-- from its head, passing over the invisible ones.
--
-- Poison: a message past its queue's max_attempts is dropped as every read
-- drops (pgqueue._drop_exhausted: the poison table, its reason, a PGQ10
-- notice) instead of being handed out, and the batch is chosen again without
-- it. A paused queue gives nothing (one PGQ11 notice). The read lanes: a
-- lease here writes a vt at or after its statement's start, as _take's do
-- (a negative vt is listed by the message_backdated trigger), and moves no
-- floor, so the floors and the late sweep hold as for any lease (a rolled
-- back one is the sweep's); it reads the lanes from their bottom, not from
-- the floors, for the default group's head.

-- What a batch of a group may take after its head (a message this read has
-- locked), up to n messages, as the calling statement's snapshot shows them,
-- in msg_id order: of a FIFO group the run of messages visible at seen_at
-- that follows the head, up to the first that is not; of the default group
-- (key '_default_fifo_group': the ungrouped messages, in the read lanes, and
-- those of that group_key) every visible one, as PGMQ takes them.
CREATE FUNCTION pgmq._after_head(q pgqueue.queue, key text, head bigint, n integer, seen_at timestamptz)
RETURNS bigint[]
LANGUAGE plpgsql STABLE
SET enable_seqscan = off
AS $$
BEGIN
    IF n <= 0 THEN
        RETURN '{}';
    END IF;
    IF key <> '_default_fifo_group' THEN
        RETURN ARRAY(
            SELECT r.msg_id
              FROM (SELECT s.msg_id, count(*) FILTER (WHERE s.vt > seen_at) OVER (ORDER BY s.msg_id) AS passed
                      FROM (SELECT m.msg_id, m.vt FROM pgqueue.message m
                             WHERE m.queue_id = q.queue_id AND m.group_key = key AND m.msg_id > head
                             ORDER BY m.group_key, m.msg_id LIMIT n) s) r
             WHERE r.passed = 0
             ORDER BY r.msg_id);
    END IF;
    RETURN ARRAY(
        SELECT x.msg_id FROM (
            (SELECT m.msg_id FROM pgqueue.message m
              WHERE m.queue_id = q.queue_id AND m.read_ct = 0 AND m.vt <= m.enqueued_at AND m.group_key IS NULL
                AND m.msg_id > head AND m.vt <= seen_at
              ORDER BY m.msg_id LIMIT n)
            UNION ALL
            (SELECT m.msg_id FROM pgqueue.message m
              WHERE m.queue_id = q.queue_id AND (m.read_ct <> 0 OR m.vt > m.enqueued_at) AND m.group_key IS NULL
                AND m.msg_id > head AND m.vt <= seen_at
              ORDER BY m.msg_id LIMIT n)
            UNION ALL
            (SELECT m.msg_id FROM pgqueue.message m
              WHERE q.has_groups AND m.queue_id = q.queue_id AND m.group_key = key
                AND m.msg_id > head AND m.vt <= seen_at
              ORDER BY m.group_key, m.msg_id LIMIT n)) x
         ORDER BY x.msg_id LIMIT n);
END
$$;

-- One grouped read, as the header says: how is 'sqs' (read_grouped), 'rr'
-- (read_grouped_rr) or 'head' (read_grouped_head).
CREATE FUNCTION pgmq._read_grouped(queue_name text, vt_seconds integer, qty integer, how text)
RETURNS SETOF pgmq.message_record
LANGUAGE plpgsql
SET enable_seqscan = off
SECURITY DEFINER SET search_path = pg_catalog, pgqueue, pg_temp
AS $$
DECLARE
    -- PGMQ's group of the messages without an x-pgmq-group header
    c_default constant text := '_default_fifo_group';
    q pgqueue.queue;
    v_now timestamptz;
    v_keys text[];
    v_heads bigint[];
    v_left integer;
    v_groups integer;
    v_tid tid;
    v_ct integer;
    v_run bigint[];
    -- the batch as chosen, one entry per message: its group's place among
    -- the groups taken, its place in its group, and whether the group is a
    -- FIFO group
    v_ids bigint[];
    v_grp integer[];
    v_rank integer[];
    v_fifo boolean[];
    v_head_tids tid[];
    v_head_cts integer[];
    v_got bigint[];
    v_got_tids tid[];
    v_got_cts integer[];
    v_taken integer[];
    v_out bigint[];
    v_out_tids tid[];
    v_out_cts integer[];
    v_leased_at timestamptz;
BEGIN
    IF vt_seconds IS NULL THEN
        RAISE EXCEPTION 'vt must not be NULL' USING ERRCODE = '22004';
    END IF;
    IF qty IS NULL OR qty < 0 THEN
        PERFORM pgmq._require_limit(qty);  -- as every read of the facade takes qty
    END IF;
    q := pgqueue._queue(pgmq._name(queue_name));
    IF q.paused_at IS NOT NULL THEN
        PERFORM pgqueue._notice_paused(q);
        RETURN;
    END IF;
    IF qty = 0 THEN
        RETURN;
    END IF;

    -- A round chooses the batch; one that meets messages whose attempts ran
    -- out drops them and chooses again (each round drops at least one).
    LOOP
        v_now := clock_timestamp();
        -- The groups that may be read, oldest head first: each FIFO group
        -- whose head is visible and which no reader holds (above), found by a
        -- skip scan of message_group_idx (one probe a group), and the default
        -- group when its head is visible.
        WITH RECURSIVE gk AS (
            (SELECT m.group_key FROM pgqueue.message m
              WHERE q.has_groups AND m.queue_id = q.queue_id AND m.group_key IS NOT NULL
              ORDER BY m.group_key LIMIT 1)
            UNION ALL
            SELECT (SELECT m.group_key FROM pgqueue.message m
                     WHERE m.queue_id = q.queue_id AND m.group_key > gk.group_key
                     ORDER BY m.group_key LIMIT 1)
              FROM gk WHERE gk.group_key IS NOT NULL
        ), heads AS (
            SELECT gk.group_key AS key, h.msg_id, h.vt, h.read_ct FROM gk
             CROSS JOIN LATERAL (
                   SELECT m.msg_id, m.vt, m.read_ct FROM pgqueue.message m
                    WHERE m.queue_id = q.queue_id AND m.group_key = gk.group_key
                    ORDER BY m.group_key, m.msg_id LIMIT 1) h
             WHERE gk.group_key IS NOT NULL AND gk.group_key <> c_default
        ), dflt AS (
            -- the default group's head: the lanes from their bottom (not the
            -- floors: an invisible head counts too), and the group that
            -- names PGMQ's default
            SELECT d.msg_id, d.vt FROM (
                (SELECT m.msg_id, m.vt FROM pgqueue.message m
                  WHERE m.queue_id = q.queue_id AND m.read_ct = 0 AND m.vt <= m.enqueued_at AND m.group_key IS NULL
                  ORDER BY m.msg_id LIMIT 1)
                UNION ALL
                (SELECT m.msg_id, m.vt FROM pgqueue.message m
                  WHERE m.queue_id = q.queue_id AND (m.read_ct <> 0 OR m.vt > m.enqueued_at) AND m.group_key IS NULL
                  ORDER BY m.msg_id LIMIT 1)
                UNION ALL
                (SELECT m.msg_id, m.vt FROM pgqueue.message m
                  WHERE q.has_groups AND m.queue_id = q.queue_id AND m.group_key = c_default
                  ORDER BY m.group_key, m.msg_id LIMIT 1)) d
             ORDER BY d.msg_id LIMIT 1
        )
        SELECT coalesce(array_agg(c.key ORDER BY c.msg_id), '{}'), coalesce(array_agg(c.msg_id ORDER BY c.msg_id), '{}')
          INTO v_keys, v_heads
          FROM (SELECT h.key, h.msg_id FROM heads h
                 WHERE h.vt <= v_now
                   -- held: after the visible messages already read, one read and invisible
                   AND (h.read_ct = 0
                        OR (SELECT x.vt > v_now AND x.read_ct > 0 FROM pgqueue.message x
                             WHERE x.queue_id = q.queue_id AND x.group_key = h.key
                               AND (x.vt > v_now OR x.read_ct = 0)
                             ORDER BY x.group_key, x.msg_id LIMIT 1) IS NOT TRUE)
                UNION ALL
                SELECT c_default, d.msg_id FROM dflt d WHERE d.vt <= v_now) c;

        -- Take the groups in that order, each by locking its head (skipped
        -- when another reader has it, or took it since this round looked):
        -- read_grouped with the messages after the head that the batch still
        -- needs, as this round saw them, until it is full; read_grouped_rr
        -- and read_grouped_head up to qty groups, read_grouped_rr then with
        -- what follows each head, up to what the other groups leave of qty.
        v_ids := '{}';
        v_grp := '{}';
        v_rank := '{}';
        v_fifo := '{}';
        v_head_tids := '{}';
        v_head_cts := '{}';
        v_taken := '{}';
        v_left := qty;
        v_groups := 0;
        FOR i IN 1 .. cardinality(v_keys) LOOP
            EXIT WHEN v_left <= 0 OR v_groups >= qty;
            SELECT m.ctid, m.read_ct INTO v_tid, v_ct FROM pgqueue.message m
             WHERE m.queue_id = q.queue_id AND m.msg_id = v_heads[i]
               AND pgqueue._keyed(m.read_ct, m.vt, m.enqueued_at, m.group_key) AND m.vt <= v_now
               FOR UPDATE SKIP LOCKED;
            CONTINUE WHEN NOT FOUND;
            v_groups := v_groups + 1;
            v_taken := v_taken || i;
            v_head_tids := v_head_tids || v_tid;
            v_head_cts := v_head_cts || v_ct;
            IF how = 'sqs' THEN
                v_run := v_heads[i] || pgmq._after_head(q, v_keys[i], v_heads[i], v_left - 1, v_now);
                v_left := v_left - cardinality(v_run);
                SELECT v_ids || array_agg(r.id ORDER BY r.n), v_grp || array_agg(v_groups ORDER BY r.n),
                       v_rank || array_agg(r.n::integer ORDER BY r.n), v_fifo || array_agg(v_keys[i] <> c_default)
                  INTO v_ids, v_grp, v_rank, v_fifo
                  FROM unnest(v_run) WITH ORDINALITY AS r (id, n);
            END IF;
        END LOOP;
        IF how <> 'sqs' THEN
            FOR g IN 1 .. v_groups LOOP
                v_run := v_heads[v_taken[g]]
                         || pgmq._after_head(q, v_keys[v_taken[g]], v_heads[v_taken[g]],
                                             CASE WHEN how = 'rr' THEN qty - v_groups ELSE 0 END, v_now);
                SELECT v_ids || array_agg(r.id ORDER BY r.n), v_grp || array_agg(g ORDER BY r.n),
                       v_rank || array_agg(r.n::integer ORDER BY r.n),
                       v_fifo || array_agg(v_keys[v_taken[g]] <> c_default)
                  INTO v_ids, v_grp, v_rank, v_fifo
                  FROM unnest(v_run) WITH ORDINALITY AS r (id, n);
            END LOOP;
        END IF;

        -- read_grouped_rr: the first message of every group taken, then the
        -- second, ..., up to qty.
        IF how = 'rr' THEN
            SELECT coalesce(array_agg(u.id ORDER BY u.rank, u.grp), '{}'), coalesce(array_agg(u.grp ORDER BY u.rank, u.grp), '{}'),
                   coalesce(array_agg(u.rank ORDER BY u.rank, u.grp), '{}'), coalesce(array_agg(u.fifo ORDER BY u.rank, u.grp), '{}')
              INTO v_ids, v_grp, v_rank, v_fifo
              FROM (SELECT * FROM unnest(v_ids, v_grp, v_rank, v_fifo) AS b (id, grp, rank, fifo)
                     ORDER BY b.rank, b.grp LIMIT qty) u;
        END IF;

        -- Lock the batch's other messages (the heads are locked), each still
        -- visible on its newest version; one this read cannot have ends its
        -- FIFO group's run there, and is only left out of the default group.
        SELECT coalesce(array_agg(x.msg_id), '{}'), coalesce(array_agg(x.tid), '{}'), coalesce(array_agg(x.read_ct), '{}')
          INTO v_got, v_got_tids, v_got_cts
          FROM (SELECT DISTINCT b.id FROM unnest(v_ids, v_rank) AS b (id, rank) WHERE b.rank > 1 ORDER BY b.id) u
         CROSS JOIN LATERAL (
               SELECT m.msg_id, m.ctid AS tid, m.read_ct FROM pgqueue.message m
                WHERE m.queue_id = q.queue_id AND m.msg_id = u.id
                  AND pgqueue._keyed(m.read_ct, m.vt, m.enqueued_at, m.group_key) AND m.vt <= v_now
                  FOR UPDATE SKIP LOCKED) x;
        -- The batch: the heads, and each other message this read locked, up
        -- to its FIFO group's first one it could not lock.
        SELECT coalesce(array_agg(k.id ORDER BY k.ord), '{}'),
               coalesce(array_agg(coalesce(k.tid, v_head_tids[k.grp]) ORDER BY k.ord), '{}'),
               coalesce(array_agg(coalesce(k.ct, v_head_cts[k.grp]) ORDER BY k.ord), '{}')
          INTO v_out, v_out_tids, v_out_cts
          FROM (SELECT j.*, min(j.rank) FILTER (WHERE j.missing) OVER (PARTITION BY j.grp) AS cut
                  FROM (SELECT b.*, l.tid, l.ct, b.rank > 1 AND l.tid IS NULL AS missing
                          FROM unnest(v_ids, v_grp, v_rank, v_fifo) WITH ORDINALITY AS b (id, grp, rank, fifo, ord)
                          LEFT JOIN unnest(v_got, v_got_tids, v_got_cts) AS l (id, tid, ct) ON l.id = b.id) j) k
         WHERE NOT k.missing AND (NOT k.fifo OR k.cut IS NULL OR k.rank < k.cut);

        IF EXISTS (SELECT 1 FROM unnest(v_out_cts) AS c (ct) WHERE c.ct >= q.max_attempts) THEN
            PERFORM pgqueue._drop_exhausted(
                q, ARRAY(SELECT b.tid FROM unnest(v_out_tids, v_out_cts) AS b (tid, ct) WHERE b.ct >= q.max_attempts),
                v_now);
            CONTINUE;
        END IF;
        EXIT;
    END LOOP;

    IF cardinality(v_out) = 0 THEN
        RETURN;
    END IF;
    -- the lease starts now, when the rows are ours
    v_leased_at := clock_timestamp();
    RETURN QUERY
    WITH leased AS (
        UPDATE pgqueue.message m
           SET vt = v_leased_at + make_interval(secs => vt_seconds), read_ct = m.read_ct + 1,
               last_read_at = v_leased_at
         WHERE m.ctid = ANY (v_out_tids)
        RETURNING m.msg_id, m.read_ct, m.enqueued_at, m.last_read_at, m.vt, m.message, m.headers
    )
    SELECT l.msg_id, l.read_ct, l.enqueued_at, l.last_read_at, l.vt, l.message, l.headers FROM leased l
     ORDER BY CASE WHEN how = 'rr' THEN array_position(v_out, l.msg_id) END, l.msg_id;
END
$$;

-- PGMQ's polling: until a read hands something out or max_poll_seconds have
-- passed, looked at before each read (so 0 seconds reads nothing, as in
-- PGMQ), poll_interval_ms between reads. A paused queue is waited on like an
-- empty one (one PGQ11 notice); a resume ends the wait at the next read. A
-- read that poison-dropped something returns at once, empty or not, rather
-- than hold the rows it dropped for the rest of the wait.
CREATE FUNCTION pgmq._read_grouped_with_poll(
    queue_name text,
    vt_seconds integer,
    qty integer,
    max_poll_seconds integer,
    poll_interval_ms integer,
    how text
) RETURNS SETOF pgmq.message_record
LANGUAGE plpgsql
SECURITY DEFINER SET search_path = pg_catalog, pgqueue, pg_temp
AS $$
DECLARE
    q pgqueue.queue;
    v_stop timestamptz;
    v_told boolean := false;
BEGIN
    IF vt_seconds IS NULL THEN
        RAISE EXCEPTION 'vt must not be NULL' USING ERRCODE = '22004';
    END IF;
    PERFORM pgmq._require_limit(qty);
    PERFORM pgqueue._require_nonnegative('max_poll_seconds', max_poll_seconds);
    PERFORM pgqueue._require_nonnegative('poll_interval_ms', poll_interval_ms);
    q := pgqueue._queue(pgmq._name(queue_name));
    v_stop := clock_timestamp() + make_interval(secs => max_poll_seconds);
    PERFORM set_config('pgqueue.read_poisoned', 'off', true);
    LOOP
        EXIT WHEN clock_timestamp() >= v_stop;
        IF q.paused_at IS NULL THEN
            RETURN QUERY SELECT * FROM pgmq._read_grouped(q.queue_name, vt_seconds, qty, how);
            EXIT WHEN FOUND OR current_setting('pgqueue.read_poisoned', true) = 'on';
        ELSIF NOT v_told THEN
            PERFORM pgqueue._notice_paused(q);
            v_told := true;
        END IF;
        PERFORM pg_sleep(greatest(poll_interval_ms, 1) / 1000.0);
        q := pgqueue._queue(q.queue_name);  -- a pause or resume since
    END LOOP;
END
$$;

CREATE FUNCTION pgmq.read_grouped(queue_name text, vt integer, qty integer)
RETURNS SETOF pgmq.message_record
LANGUAGE plpgsql
SECURITY DEFINER SET search_path = pg_catalog, pgqueue, pg_temp
AS $$
BEGIN
    RETURN QUERY SELECT * FROM pgmq._read_grouped(queue_name, vt, qty, 'sqs');
END
$$;

CREATE FUNCTION pgmq.read_grouped_rr(queue_name text, vt integer, qty integer)
RETURNS SETOF pgmq.message_record
LANGUAGE plpgsql
SECURITY DEFINER SET search_path = pg_catalog, pgqueue, pg_temp
AS $$
BEGIN
    RETURN QUERY SELECT * FROM pgmq._read_grouped(queue_name, vt, qty, 'rr');
END
$$;

CREATE FUNCTION pgmq.read_grouped_head(queue_name text, vt integer, qty integer)
RETURNS SETOF pgmq.message_record
LANGUAGE plpgsql
SECURITY DEFINER SET search_path = pg_catalog, pgqueue, pg_temp
AS $$
BEGIN
    RETURN QUERY SELECT * FROM pgmq._read_grouped(queue_name, vt, qty, 'head');
END
$$;

CREATE FUNCTION pgmq.read_grouped_with_poll(
    queue_name text,
    vt integer,
    qty integer,
    max_poll_seconds integer DEFAULT 5,
    poll_interval_ms integer DEFAULT 100
) RETURNS SETOF pgmq.message_record
LANGUAGE plpgsql
SECURITY DEFINER SET search_path = pg_catalog, pgqueue, pg_temp
AS $$
BEGIN
    RETURN QUERY SELECT * FROM pgmq._read_grouped_with_poll(queue_name, vt, qty, max_poll_seconds,
                                                            poll_interval_ms, 'sqs');
END
$$;

CREATE FUNCTION pgmq.read_grouped_rr_with_poll(
    queue_name text,
    vt integer,
    qty integer,
    max_poll_seconds integer DEFAULT 5,
    poll_interval_ms integer DEFAULT 100
) RETURNS SETOF pgmq.message_record
LANGUAGE plpgsql
SECURITY DEFINER SET search_path = pg_catalog, pgqueue, pg_temp
AS $$
BEGIN
    RETURN QUERY SELECT * FROM pgmq._read_grouped_with_poll(queue_name, vt, qty, max_poll_seconds,
                                                            poll_interval_ms, 'rr');
END
$$;

CREATE FUNCTION pgmq.read_grouped_head_with_poll(
    queue_name text,
    vt integer,
    qty integer,
    max_poll_seconds integer DEFAULT 5,
    poll_interval_ms integer DEFAULT 100
) RETURNS SETOF pgmq.message_record
LANGUAGE plpgsql
SECURITY DEFINER SET search_path = pg_catalog, pgqueue, pg_temp
AS $$
BEGIN
    RETURN QUERY SELECT * FROM pgmq._read_grouped_with_poll(queue_name, vt, qty, max_poll_seconds,
                                                            poll_interval_ms, 'head');
END
$$;

-- Rights, as pgqueue.role_grant says (10_facade.sql): reads are the consumer's.
INSERT INTO pgqueue.role_grant (object, roles, kind)
SELECT 'pgmq.' || f, '{pgqueue_consumer}', 'function'
  FROM unnest(ARRAY['read_grouped', 'read_grouped_with_poll', 'read_grouped_rr', 'read_grouped_rr_with_poll',
                    'read_grouped_head', 'read_grouped_head_with_poll']) AS f;
SELECT pgqueue.grant_roles();
