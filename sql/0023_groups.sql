-- pgqueue 0023: FIFO groups, the lease time of a message, filtered reads and
-- a notify channel per queue (what the pgmq facade, docs/pgmq.md, builds on).
--
-- Groups. A message sent with a group_key is handed out only while it is
-- the oldest live message of its group, so at most one reader holds a group
-- at a time and a group is delivered in msg_id order, redeliveries and
-- poison drops included. The sends of one group take a transaction lock on
-- it before drawing their msg_ids, so a group's ids follow its commit order.
-- Grouped messages leave the read lanes (both lane indexes are rebuilt with
-- group_key IS NULL in their predicates); reads find group heads by a skip
-- scan of a new index, only for queues that ever had a group.
--
-- last_read_at: when a message's latest lease began (PGMQ's column), kept in
-- the archive too. _take returns it (pgqueue.taken_record); the public reads
-- keep their message_record.
--
-- conditional: _take can filter by `message @> conditional` (PGMQ's filtered
-- read); such a read starts at the safe floors and moves none.
--
-- A read in a transaction that has written moves no fast floor: a message its
-- own delete hid is back for the next read at once when it rolls back.
--
-- notify_channel: a queue can ask that every send NOTIFY a channel of its
-- choosing, throttled (PGMQ's notify-on-insert).
--
-- send and send_batch get trailing group_key / group_keys parameters with
-- defaults: dropped and created, as 0016 did, with their grants.
--
-- Every statement can run again over its own result (a database that
-- recorded no 0023 but has it, as a restore of an older version table may).

ALTER TABLE pgqueue.queue
    ADD COLUMN IF NOT EXISTS has_groups boolean NOT NULL DEFAULT false,
    ADD COLUMN IF NOT EXISTS notify_channel text,
    ADD COLUMN IF NOT EXISTS notify_throttle_ms integer NOT NULL DEFAULT 0 CHECK (notify_throttle_ms >= 0);
ALTER TABLE pgqueue.message ADD COLUMN IF NOT EXISTS group_key text,
    ADD COLUMN IF NOT EXISTS last_read_at timestamptz;
ALTER TABLE pgqueue.archive ADD COLUMN IF NOT EXISTS last_read_at timestamptz;
ALTER TABLE pgqueue.poison ADD COLUMN IF NOT EXISTS group_key text;

DO $$
BEGIN
    IF to_regtype('pgqueue.taken_record') IS NULL THEN
        CREATE TYPE pgqueue.taken_record AS (
            msg_id bigint,
            read_ct integer,
            enqueued_at timestamptz,
            last_read_at timestamptz,
            vt timestamptz,
            message jsonb,
            headers jsonb
        );
    END IF;
END
$$;

CREATE UNLOGGED TABLE IF NOT EXISTS pgqueue.notify_sent (
    queue_id integer PRIMARY KEY,
    sent_at timestamptz NOT NULL
);

CREATE INDEX IF NOT EXISTS message_group_idx ON pgqueue.message (queue_id, group_key, msg_id)
    WHERE group_key IS NOT NULL;
DROP INDEX IF EXISTS pgqueue.message_fresh_idx;
DROP INDEX IF EXISTS pgqueue.message_timed_idx;
CREATE INDEX message_fresh_idx ON pgqueue.message (queue_id, vt, msg_id)
    WHERE read_ct = 0 AND vt <= enqueued_at AND group_key IS NULL;
CREATE INDEX message_timed_idx ON pgqueue.message (queue_id, vt, msg_id)
    WHERE (read_ct <> 0 OR vt > enqueued_at) AND group_key IS NULL;

DROP TRIGGER IF EXISTS message_backdated ON pgqueue.message;
CREATE TRIGGER message_backdated
    AFTER INSERT OR UPDATE ON pgqueue.message
    FOR EACH ROW WHEN (NEW.vt < statement_timestamp() AND NEW.group_key IS NULL)
    EXECUTE FUNCTION pgqueue._list_backdated();

DROP FUNCTION IF EXISTS pgqueue.send(text, jsonb, jsonb, integer, text, uuid, text, text);
DROP FUNCTION IF EXISTS pgqueue.send_batch(text, jsonb[], jsonb[], integer, text, text);
DELETE FROM pgqueue.role_grant WHERE function_signature IN (
    'pgqueue.send(text,jsonb,jsonb,integer,text,uuid,text,text)',
    'pgqueue.send_batch(text,jsonb[],jsonb[],integer,text,text)');

-- The queue's notify_channel, unless it was notified less than
-- notify_throttle_ms ago (a send of any delay: listeners of that channel ask
-- to hear of every insert, as PGMQ's do). Two racing sends may both notify.
CREATE OR REPLACE FUNCTION pgqueue._notify_channel(q pgqueue.queue) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    IF q.notify_throttle_ms > 0 THEN
        INSERT INTO pgqueue.notify_sent AS n (queue_id, sent_at) VALUES (q.queue_id, clock_timestamp())
        ON CONFLICT (queue_id) DO UPDATE SET sent_at = EXCLUDED.sent_at
         WHERE n.sent_at <= EXCLUDED.sent_at - make_interval(secs => q.notify_throttle_ms / 1000.0);
        IF NOT FOUND THEN
            RETURN;
        END IF;
    END IF;
    PERFORM pg_notify(q.notify_channel, NULL);
END
$$;

-- Raises unless group_key is NULL or 1 to 200 characters.
CREATE OR REPLACE FUNCTION pgqueue._require_group_key(group_key text) RETURNS void
LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    IF group_key = '' OR length(group_key) > 200 THEN
        RAISE EXCEPTION 'a group key must be 1 to 200 characters, got %', length(group_key)
            USING ERRCODE = '22023', HINT = 'Name the group by a short key, e.g. a customer id.';
    END IF;
END
$$;

-- Serializes the sends of one group until their transactions end, taken before
-- the msg_id is drawn: a group's msg_ids then follow its commit order, so no
-- message can appear ahead of a group's head once that head is handed out.
-- Keys are sorted, so two transactions lock shared groups in one order. A hash
-- collision only makes two groups' sends wait for each other. Called only with
-- at least one key; marks the queue as having groups.
CREATE OR REPLACE FUNCTION pgqueue._lock_groups(q pgqueue.queue, group_keys text[]) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_advisory_xact_lock(q.queue_id, hashtext(k))
       FROM (SELECT DISTINCT k FROM unnest(group_keys) AS k WHERE k IS NOT NULL ORDER BY k) AS u (k);
    IF NOT q.has_groups THEN
        UPDATE pgqueue.queue SET has_groups = true WHERE queue_id = q.queue_id AND NOT has_groups;
    END IF;
END
$$;

-- Enqueues one message; its msg_id. The argument checks run as one inline
-- condition on the fast path (a header key starting with _pg_ always shows as
-- "_pg_ in the headers' text; a value that merely contains it costs only the
-- full check). With a dedupe_key: single flight, decided by the unique index;
-- a retry that carries its send_token returns its own message, live or
-- consumed (its receipt), before it considers another sender's.
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
    v_now timestamptz;
    v_id bigint;
    v_token uuid;
    v_own bigint;
    v_headers jsonb := send.headers;
BEGIN
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
    IF send.traceparent IS NOT NULL THEN
        -- after the caller's headers were checked: only this writes _pg_ keys
        v_headers := coalesce(v_headers, '{}') || pgqueue._trace_headers(send.traceparent, send.tracestate);
    END IF;
    SELECT * INTO q FROM pgqueue.queue AS t WHERE t.queue_name = send.queue_name;
    IF NOT FOUND THEN
        q := pgqueue._queue(send.queue_name);  -- raises "queue ... does not exist"
    END IF;
    IF send.group_key IS NOT NULL THEN
        PERFORM pgqueue._lock_groups(q, ARRAY[send.group_key]);
    END IF;
    -- after the group's lock: a send that waited for it is stamped when it goes on
    v_now := clock_timestamp();

    IF send.dedupe_key IS NULL THEN
        INSERT INTO pgqueue.message (queue_id, msg_id, enqueued_at, vt, message, headers, send_token, group_key)
        VALUES (q.queue_id, nextval(q.msg_seq), v_now, v_now + make_interval(secs => send.delay),
                send.message, v_headers, send.send_token, send.group_key)
        RETURNING msg_id INTO v_id;
    ELSE
        -- Single flight. The unique index decides; the loop only covers the
        -- window where the holder of the key is acked between our INSERT
        -- conflicting and our SELECT looking (each statement sees a new snapshot).
        FOR attempt IN 1..100 LOOP
            SELECT m.msg_id, m.send_token INTO v_id, v_token FROM pgqueue.message m
             WHERE m.queue_id = q.queue_id AND m.dedupe_key = send.dedupe_key;
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
                 WHERE r.send_token = send.send_token AND r.queue_id = q.queue_id;
                IF FOUND THEN
                    RETURN v_own;  -- a retry of a send that did commit and was consumed since
                END IF;
                IF v_id IS NOT NULL THEN
                    RETURN v_id;  -- our earlier attempt never committed: single flight
                END IF;
            END IF;
            INSERT INTO pgqueue.message (queue_id, msg_id, enqueued_at, vt, message, headers, dedupe_key, send_token,
                                         group_key)
            VALUES (q.queue_id, nextval(q.msg_seq), v_now, v_now + make_interval(secs => send.delay),
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
    IF send.delay = 0 AND EXISTS (SELECT 1 FROM pgqueue.waiter w WHERE w.queue_id = q.queue_id) THEN
        PERFORM pg_notify(pgqueue._channel(q.queue_name), '');
    END IF;
    IF q.notify_channel IS NOT NULL THEN
        PERFORM pgqueue._notify_channel(q);
    END IF;
    RETURN v_id;
END
$$;

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
    v_trace jsonb := pgqueue._trace_headers(send_batch.traceparent, send_batch.tracestate);
BEGIN
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
    PERFORM pgqueue._require_nonnegative('delay', send_batch.delay);
    PERFORM pgqueue._require_headers(h) FROM unnest(send_batch.headers) h;
    PERFORM pgqueue._require_group_key(k) FROM unnest(send_batch.group_keys) k;
    q := pgqueue._queue(send_batch.queue_name);
    IF EXISTS (SELECT 1 FROM unnest(send_batch.group_keys) k WHERE k IS NOT NULL) THEN
        PERFORM pgqueue._lock_groups(q, send_batch.group_keys);
    END IF;
    v_now := clock_timestamp();

    RETURN QUERY
    INSERT INTO pgqueue.message (queue_id, msg_id, enqueued_at, vt, message, headers, group_key)
    SELECT q.queue_id, nextval(q.msg_seq), v_now, v_now + make_interval(secs => send_batch.delay),
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

-- Acks many messages by moving them to pgqueue.archive, locked as delete does.
CREATE OR REPLACE FUNCTION pgqueue.archive(queue_name text, msg_ids bigint[]) RETURNS SETOF bigint
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
                 WHERE m.queue_id = q.queue_id AND m.msg_id = u.id FOR UPDATE)
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

-- Acks many messages by archiving them, fenced by enqueued_at as the
-- delete above.
CREATE OR REPLACE FUNCTION pgqueue.archive(queue_name text, msg_ids bigint[], enqueued_ats timestamptz[])
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
                 WHERE m.queue_id = q.queue_id AND m.msg_id = u.id AND m.enqueued_at = u.at
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

-- The nack of a consumer whose handler failed, for the holder of the lease
-- that read_ct names: 'retry' when the message is visible again after `delay`
-- seconds; 'poisoned' when that was its last attempt (read_ct has reached the
-- queue's max_attempts), so it went to the poison table now, with the error,
-- rather than at the next read; NULL when that lease is not the current one
-- (nothing changed).
CREATE OR REPLACE FUNCTION pgqueue.nack(queue_name text, msg_id bigint, read_ct integer, delay integer,
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
             WHERE queue_id = q.queue_id AND msg_id = nack.msg_id AND read_ct = nack.read_ct
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
     WHERE queue_id = q.queue_id AND msg_id = nack.msg_id AND read_ct = nack.read_ct;
    RETURN CASE WHEN FOUND THEN 'retry' END;
END
$$;

DROP FUNCTION IF EXISTS pgqueue._take(pgqueue.queue, integer, integer, boolean);

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

-- Reads, read_with_poll and pop of a paused queue return no rows, with one
-- NOTICE (_notice_paused), before _take: no lane, floor or lock is touched.
CREATE OR REPLACE FUNCTION pgqueue.read(queue_name text, vt integer, qty integer)
RETURNS SETOF pgqueue.message_record
LANGUAGE plpgsql
SECURITY DEFINER SET search_path = pg_catalog, pgqueue, pg_temp
AS $$
DECLARE
    q pgqueue.queue;
BEGIN
    PERFORM pgqueue._require_nonnegative('vt', vt);
    PERFORM pgqueue._require_nonnegative('qty', qty);
    q := pgqueue._queue(queue_name);
    IF q.paused_at IS NOT NULL THEN
        PERFORM pgqueue._notice_paused(q);
        RETURN;
    END IF;
    RETURN QUERY SELECT t.msg_id, t.read_ct, t.enqueued_at, t.vt, t.message, t.headers
                   FROM pgqueue._take(q, vt, qty, false) t;
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
                       FROM pgqueue._take(q, vt, qty, false) t;
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
DECLARE
    q pgqueue.queue;
BEGIN
    PERFORM pgqueue._require_nonnegative('qty', qty);
    q := pgqueue._queue(queue_name);
    IF q.paused_at IS NOT NULL THEN
        PERFORM pgqueue._notice_paused(q);
        RETURN;
    END IF;
    RETURN QUERY SELECT t.msg_id, t.read_ct, t.enqueued_at, t.vt, t.message, t.headers
                   FROM pgqueue._take(q, 0, qty, true) t;
END
$$;

CREATE OR REPLACE FUNCTION pgqueue.poison(queue_name text, msg_id bigint, reason text) RETURNS boolean
LANGUAGE plpgsql
SECURITY DEFINER SET search_path = pg_catalog, pgqueue, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    q pgqueue.queue := pgqueue._queue(poison.queue_name);
BEGIN
    IF poison.reason IS NULL OR poison.reason = '' THEN
        RAISE EXCEPTION 'reason must not be empty' USING ERRCODE = '22023',
            HINT = 'Say why the message is poisoned: operators read it in pgqueue.poison_list().';
    END IF;
    WITH gone AS (
        DELETE FROM pgqueue.message WHERE queue_id = q.queue_id AND msg_id = poison.msg_id
        RETURNING *
    )
    INSERT INTO pgqueue.poison (queue_id, msg_id, read_ct, enqueued_at, reason, message, headers, dedupe_key,
                                group_key)
    SELECT g.queue_id, g.msg_id, g.read_ct, g.enqueued_at, poison.reason, g.message, g.headers, g.dedupe_key,
           g.group_key
      FROM gone g;
    RETURN FOUND;
END
$$;

-- Poison for the holder of the lease that read_ct names; false when that lease
-- is not the current one (nothing changes then).
CREATE OR REPLACE FUNCTION pgqueue.poison(queue_name text, msg_id bigint, reason text, read_ct integer) RETURNS boolean
LANGUAGE plpgsql
SECURITY DEFINER SET search_path = pg_catalog, pgqueue, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    q pgqueue.queue := pgqueue._queue(poison.queue_name);
BEGIN
    PERFORM pgqueue._require_read_ct(poison.read_ct);
    IF poison.reason IS NULL OR poison.reason = '' THEN
        RAISE EXCEPTION 'reason must not be empty' USING ERRCODE = '22023',
            HINT = 'Say why the message is poisoned: operators read it in pgqueue.poison_list().';
    END IF;
    WITH gone AS (
        DELETE FROM pgqueue.message
         WHERE queue_id = q.queue_id AND msg_id = poison.msg_id AND read_ct = poison.read_ct
        RETURNING *
    )
    INSERT INTO pgqueue.poison (queue_id, msg_id, read_ct, enqueued_at, reason, message, headers, dedupe_key,
                                group_key)
    SELECT g.queue_id, g.msg_id, g.read_ct, g.enqueued_at, poison.reason, g.message, g.headers, g.dedupe_key,
           g.group_key
      FROM gone g;
    RETURN FOUND;
END
$$;

-- A requeued message gets a new msg_id: its lease history starts over, and no
-- holder of an old lease can name it. The poison row is gone either way; the
-- returned ids are the new ones, in the order of the old.
CREATE OR REPLACE FUNCTION pgqueue.poison_requeue(queue_name text, msg_ids bigint[]) RETURNS SETOF bigint
LANGUAGE plpgsql
SET enable_seqscan = off
SECURITY DEFINER SET search_path = pg_catalog, pgqueue, pg_temp
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
    -- to the end of their groups: ids drawn under the groups' send locks
    IF EXISTS (SELECT 1 FROM unnest(v_rows) r WHERE r.group_key IS NOT NULL) THEN
        PERFORM pgqueue._lock_groups(q, ARRAY(SELECT r.group_key FROM unnest(v_rows) r));
    END IF;
    SELECT array_agg(nextval(q.msg_seq) ORDER BY r.ord) INTO v_new
      FROM unnest(v_rows) WITH ORDINALITY AS r (queue_id, msg_id, read_ct, enqueued_at, poisoned_at,
                                                reason, message, headers, dedupe_key, group_key, ord);

    WITH ins AS (
        INSERT INTO pgqueue.message (queue_id, msg_id, read_ct, enqueued_at, vt, message, headers, dedupe_key,
                                     group_key)
        SELECT r.queue_id, v_new[r.ord], 0, r.enqueued_at, v_now, r.message, r.headers, r.dedupe_key,
               r.group_key
          FROM unnest(v_rows) WITH ORDINALITY AS r (queue_id, msg_id, read_ct, enqueued_at, poisoned_at,
                                                    reason, message, headers, dedupe_key, group_key, ord)
         WHERE r.dedupe_key IS NOT NULL
         ORDER BY r.ord
        ON CONFLICT (queue_id, dedupe_key) WHERE dedupe_key IS NOT NULL DO NOTHING
        RETURNING msg_id
    )
    SELECT coalesce(array_agg(i.msg_id), '{}') INTO v_keyed FROM ins i;

    INSERT INTO pgqueue.message (queue_id, msg_id, read_ct, enqueued_at, vt, message, headers, group_key)
    SELECT r.queue_id, v_new[r.ord], 0, r.enqueued_at, v_now, r.message, r.headers, r.group_key
      FROM unnest(v_rows) WITH ORDINALITY AS r (queue_id, msg_id, read_ct, enqueued_at, poisoned_at,
                                                reason, message, headers, dedupe_key, group_key, ord)
     WHERE v_new[r.ord] <> ALL (v_keyed)
     ORDER BY r.ord;

    PERFORM pgqueue._notify(q);
    RETURN QUERY SELECT u.id FROM unnest(v_new) WITH ORDINALITY AS u (id, ord) ORDER BY u.ord;
END
$$;

INSERT INTO pgqueue.role_grant (function_signature, roles) VALUES
    ('pgqueue.send(text,jsonb,jsonb,integer,text,uuid,text,text,text)', '{pgqueue_producer,pgqueue_consumer,pgqueue_operator}'),
    ('pgqueue.send_batch(text,jsonb[],jsonb[],integer,text,text,text[])', '{pgqueue_producer,pgqueue_consumer,pgqueue_operator}')
ON CONFLICT (function_signature) DO NOTHING;

SELECT pgqueue.grant_roles();
