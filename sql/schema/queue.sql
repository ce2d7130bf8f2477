-- pgqueue schema, as it stands now: the queue core.
--
-- This folder (sql/schema/) is a readable view of the whole schema, one file
-- per area: every table, index, type and function as the migrations in sql/
-- leave them. The migrations are the history and what upgrades a database;
-- tests/sql/test_schema_view.py builds one database from them and one from
-- this folder and fails when the two differ in any table, column, index,
-- constraint, trigger, type, function body, security setting or grant. A
-- change is therefore made twice: in the file of its area here, and as a new
-- migration carrying the whole new body of every function it changes.
-- Files apply in this order: queue, reads, poison, barriers, workflows,
-- single_flight, guard, workers, roles (with check_function_bodies off: bodies
-- name objects of later files).
--
-- Physical design: shared tables keyed by queue_id (not one table per queue).
-- Every function is static SQL, so plans are cached and no queue name ever
-- reaches dynamic SQL; creating a queue is one row plus its sequences, not
-- DDL on hot tables. Message ids come from a per-queue sequence, so ids read
-- like PGMQ's and `total_messages` is that sequence's position.
--
-- A message lives in pgqueue.message while unacknowledged. delete and pop
-- remove it, archive moves it to pgqueue.archive, poison (poison.sql) to
-- pgqueue.poison. A row is in exactly one of those places at any time, and
-- each move is one statement, so no reader can see a message half-moved.
--
-- Error codes: the list is pgqueue/_errors.py's SQLSTATES (PGQ01 unknown
-- queue, 22023 an argument out of range, 22004 a required argument NULL, ...).

-- Created by the migrator before the first migration (pgqueue/_migrate.py).
CREATE TABLE IF NOT EXISTS pgqueue.schema_version (
    version integer PRIMARY KEY,
    name text NOT NULL,
    checksum text NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now()
);

CREATE TYPE pgqueue.message_record AS (
    msg_id bigint,
    read_ct integer,
    enqueued_at timestamptz,
    vt timestamptz,
    message jsonb,
    headers jsonb
);

-- What a read or pop hands out, with the time of the lease (NULL for a
-- message never read before a pop): PGMQ's message_record, field for field.
-- pgqueue.read returns message_record; the pgmq facade (docs/pgmq.md) this.
CREATE TYPE pgqueue.taken_record AS (
    msg_id bigint,
    read_ct integer,
    enqueued_at timestamptz,
    last_read_at timestamptz,
    vt timestamptz,
    message jsonb,
    headers jsonb
);

CREATE TYPE pgqueue.queue_metrics AS (
    queue_name text,
    queue_length bigint,
    visible_length bigint,
    oldest_msg_age_sec integer,
    newest_msg_age_sec integer,
    total_messages bigint,
    poison_length bigint,
    scrape_time timestamptz
);

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

CREATE SEQUENCE pgqueue.queue_id_seq AS integer;

-- A queue; its messages take their ids from msg_seq, and its read lanes keep
-- their floors in the sequences pgqueue.lane_<queue_id>_* (reads.sql).
-- paused_at is set while the queue is paused (pause_queue): reads hand out
-- nothing until resume_queue clears it; paused_by is who paused it, if said.
-- has_groups turns true at the first send with a group key and stays so: reads
-- of a queue that never had one skip the group path at no cost.
-- notify_channel: every send to the queue NOTIFYs it, at most once per
-- notify_throttle_ms (the pgmq facade's notify-on-insert; NULL: none).
CREATE TABLE pgqueue.queue (
    queue_id integer PRIMARY KEY,
    queue_name text NOT NULL UNIQUE,
    max_attempts integer NOT NULL CHECK (max_attempts >= 1),
    msg_seq regclass NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    paused_at timestamptz,
    paused_by text,
    has_groups boolean NOT NULL DEFAULT false,
    notify_channel text,
    notify_throttle_ms integer NOT NULL DEFAULT 0 CHECK (notify_throttle_ms >= 0),
    -- the read lanes' sequences, in _lane_seqs's order (reads.sql)
    lane_seqs regclass[]
);

-- Live (unacknowledged) messages of every queue. Reads find them by the two
-- lane indexes of reads.sql.
CREATE TABLE pgqueue.message (
    queue_id integer NOT NULL,
    msg_id bigint NOT NULL,
    read_ct integer NOT NULL DEFAULT 0,
    enqueued_at timestamptz NOT NULL,
    vt timestamptz NOT NULL,
    message jsonb NOT NULL,
    headers jsonb,
    -- single-flight key: at most one live message per (queue, key)
    dedupe_key text,
    -- set by clients that may retry a send: lets a retry recognise its own
    -- earlier, already committed attempt (see pgqueue.send_receipt)
    send_token uuid,
    -- the barrier this message is a member of (barriers.sql)
    member_of text,
    -- the error of the latest nack, quoted in the poison reason
    last_error text,
    -- FIFO group: a message with a key is handed out only while it is the
    -- oldest live message of its (queue, key), so a group is held by one
    -- reader at a time, in msg_id order (reads.sql, "Groups")
    group_key text,
    -- when the current (or latest) lease began; NULL until the first read
    last_read_at timestamptz
) WITH (fillfactor = 90);

-- The key, (queue_id, msg_id), in two halves: a fresh message (never read,
-- sent without delay) is in message_fresh_idx, the fresh read lane
-- (reads.sql), and every other message in message_rest_idx; both are unique.
-- So a sent message costs one index entry, not a primary key's and a lane's.
-- A msg_id comes from its queue's sequence, once (pgqueue pgmq import, which
-- copies PGMQ's ids, checks both halves). A lookup by id names both halves in
-- one qual (_keyed): a statement that waits for a row locked by a lease
-- rechecks its qual on the leased version, which the other half holds, and
-- the qual still holds there (docs/design/one-entry-sends.md).
CREATE UNIQUE INDEX message_rest_idx ON pgqueue.message (queue_id, msg_id)
    WHERE (read_ct = 0 AND vt <= enqueued_at AND group_key IS NULL) IS NOT TRUE;

-- Without a primary key, logical replication of the table (a publication FOR
-- ALL TABLES, say) identifies a changed row by all its columns.
ALTER TABLE pgqueue.message REPLICA IDENTITY FULL;

-- True for every message: the qual of a lookup by (queue_id, msg_id), which
-- the planner inlines and plans as one probe of each half of the key (a
-- BitmapOr). Written as the two indexes' predicates, ORed.
CREATE FUNCTION pgqueue._keyed(read_ct integer, vt timestamptz, enqueued_at timestamptz, group_key text)
RETURNS boolean
LANGUAGE sql IMMUTABLE AS $$
    SELECT (read_ct = 0 AND vt <= enqueued_at AND group_key IS NULL)
           OR (read_ct = 0 AND vt <= enqueued_at AND group_key IS NULL) IS NOT TRUE;
$$;

-- A group's head is the first entry of its range; reads walk the heads.
CREATE INDEX message_group_idx ON pgqueue.message (queue_id, group_key, msg_id)
    WHERE group_key IS NOT NULL;

-- Single flight is decided by this index, never by read-then-write.
CREATE UNIQUE INDEX message_dedupe_idx ON pgqueue.message (queue_id, dedupe_key)
    WHERE dedupe_key IS NOT NULL;

CREATE TABLE pgqueue.archive (
    queue_id integer NOT NULL,
    msg_id bigint NOT NULL,
    read_ct integer NOT NULL,
    enqueued_at timestamptz NOT NULL,
    archived_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    vt timestamptz NOT NULL,
    message jsonb NOT NULL,
    headers jsonb,
    last_read_at timestamptz,
    PRIMARY KEY (queue_id, msg_id)
);

-- When a message that carries a send_token leaves the live table, its token is
-- remembered here for a while. A send retried after a dead connection presents
-- the same token; if the first attempt had committed and the message was
-- already consumed, the retry returns that msg_id instead of sending again.
CREATE TABLE pgqueue.send_receipt (
    send_token uuid PRIMARY KEY,
    queue_id integer NOT NULL,
    msg_id bigint NOT NULL,
    finished_at timestamptz NOT NULL DEFAULT clock_timestamp()
);

-- Wake-ups. A NOTIFY makes its transaction take a cluster-wide lock at
-- commit, which serializes every notifying commit (measured: single sends on 4
-- connections lost 40% of their rate to it). So a send notifies only while some
-- session has declared itself waiting on that queue: a consumer calls
-- pgqueue.listen() when it runs dry and pgqueue.unlisten() when it has work, and
-- busy queues pay nothing. Rows of sessions that died are pruned by listen();
-- until then they only cost a spare notification. UNLOGGED: a crash empties it,
-- which is the right state after a crash.
CREATE UNLOGGED TABLE pgqueue.waiter (
    queue_id integer NOT NULL,
    pid integer NOT NULL,
    since timestamptz NOT NULL DEFAULT clock_timestamp(),
    PRIMARY KEY (queue_id, pid)
);

-- When a queue's notify_channel was last notified, for its throttle. UNLOGGED:
-- after a crash the next send notifies, which is what a listener wants.
CREATE UNLOGGED TABLE pgqueue.notify_sent (
    queue_id integer PRIMARY KEY,
    sent_at timestamptz NOT NULL
);

CREATE FUNCTION pgqueue._remember_send_token() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO pgqueue.send_receipt (send_token, queue_id, msg_id)
    VALUES (OLD.send_token, OLD.queue_id, OLD.msg_id)
    ON CONFLICT (send_token) DO NOTHING;
    RETURN NULL;
END
$$;

-- The queue a name given by a PGMQ client stands for (docs/pgmq.md, "What
-- is the same, what differs"): the name lowercased when that is a pgqueue
-- name, else one made of it (its characters outside a-z, 0-9 and _
-- replaced, a digit first prefixed, cut, and a hash of the whole name added).
CREATE FUNCTION pgqueue._queue_name_for(pgmq_name text) RETURNS text
LANGUAGE sql IMMUTABLE
AS $$
    SELECT CASE WHEN lower(pgmq_name) ~ '^[a-z_][a-z0-9_]{0,47}$' THEN lower(pgmq_name)
                ELSE left(regexp_replace(regexp_replace(lower(pgmq_name), '[^a-z0-9_]', '_', 'g'),
                                         '^([0-9])', '_\1'), 39)
                     || '_' || left(md5(lower(pgmq_name)), 8) END;
$$;

-- The queue of that name, or of the name a PGMQ client means by it (a name
-- that is not a pgqueue name stands for _queue_name_for's: docs/pgmq.md,
-- "What is the same, what differs"); PGQ01 when there is none, or, called
-- through the pgmq facade, what PGMQ raises there (_pgmq_unknown_queue).
CREATE FUNCTION pgqueue._queue(queue_name text) RETURNS pgqueue.queue
LANGUAGE plpgsql STABLE AS $$
DECLARE
    q pgqueue.queue;
BEGIN
    SELECT * INTO q FROM pgqueue.queue AS t WHERE t.queue_name = _queue.queue_name;
    IF NOT FOUND AND pgqueue._queue_name_for(queue_name) <> queue_name THEN
        SELECT * INTO q FROM pgqueue.queue AS t WHERE t.queue_name = pgqueue._queue_name_for(_queue.queue_name);
    END IF;
    IF NOT FOUND THEN
        PERFORM pgqueue._pgmq_unknown_queue(queue_name);
        RAISE EXCEPTION 'queue "%" does not exist', queue_name
            USING ERRCODE = 'PGQ01',
                  HINT = 'Create it with pgqueue.create_queue(), or check the name with pgqueue.list_queues().';
    END IF;
    RETURN q;
END
$$;

-- Raises what PGMQ raises for a queue that does not exist, when a function
-- of the pgmq facade (schema pgmq) is on the call stack: PGMQ's clients
-- match on it (42P01 "relation ... does not exist", which pgmq-py's HTTP API
-- answers with 404, or P0001 for a name with a character PGMQ refuses).
-- Returns otherwise. Run on the error path only: a call that finds its
-- queue never looks at the stack.
CREATE FUNCTION pgqueue._pgmq_unknown_queue(queue_name text) RETURNS void
LANGUAGE plpgsql STABLE AS $$
DECLARE
    v_stack text;
BEGIN
    GET DIAGNOSTICS v_stack = PG_CONTEXT;
    IF v_stack !~ '\mfunction pgmq\.' THEN
        RETURN;
    END IF;
    IF queue_name ~ '\$|;|--|''' THEN
        RAISE EXCEPTION 'queue name contains invalid characters: $, ;, --, or \''';
    END IF;
    RAISE EXCEPTION 'relation "pgmq.%" does not exist', lower('q_' || queue_name) USING ERRCODE = '42P01';
END
$$;

-- The group key of a message PGMQ's clients send with an x-pgmq-group
-- header: the header's text when it is 1 to 200 characters (a key pgqueue
-- holds as it is), else, for the empty string and longer texts, which PGMQ
-- accepts too, 'pgmq-group:' and the hex SHA-256 of the text: one key per
-- text, short enough for the group index. NULL (no header) is no group.
CREATE FUNCTION pgqueue._pgmq_group(x_pgmq_group text) RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT CASE WHEN x_pgmq_group = '' OR length(x_pgmq_group) > 200
                THEN 'pgmq-group:' || encode(sha256(convert_to(x_pgmq_group, 'UTF8')), 'hex')
                ELSE x_pgmq_group END;
$$;

-- The same, holding a KEY SHARE lock on the queue row until commit: writers
-- that must not race drop_queue (which locks the row FOR UPDATE) use this, so
-- either they commit first and the drop sees their rows, or the drop commits
-- first and they find no queue.
CREATE FUNCTION pgqueue._queue_locked(queue_name text) RETURNS pgqueue.queue
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

CREATE FUNCTION pgqueue._require_nonnegative(arg_name text, value integer) RETURNS void
LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    IF value IS NULL THEN
        RAISE EXCEPTION '% must not be NULL', arg_name USING ERRCODE = '22004';
    END IF;
    IF value < 0 THEN
        RAISE EXCEPTION '% must be >= 0, got %', arg_name, value
            USING ERRCODE = '22023', HINT = 'Pass 0 or a positive number of seconds or messages.';
    END IF;
END
$$;

CREATE FUNCTION pgqueue._channel(queue_name text) RETURNS text
LANGUAGE sql IMMUTABLE AS $$
    SELECT 'pgqueue_' || queue_name;
$$;

CREATE FUNCTION pgqueue._notify(q pgqueue.queue) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM pgqueue.waiter w WHERE w.queue_id = q.queue_id) THEN
        -- Identical notifications fold within a transaction: a batch costs one.
        PERFORM pg_notify(pgqueue._channel(q.queue_name), '');
    END IF;
END
$$;

-- The queue's notify_channel, unless it was notified less than
-- notify_throttle_ms ago (a send of any delay: listeners of that channel ask
-- to hear of every insert, as PGMQ's do). Two racing sends may both notify.
CREATE FUNCTION pgqueue._notify_channel(q pgqueue.queue) RETURNS void
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
CREATE FUNCTION pgqueue._require_group_key(group_key text) RETURNS void
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
CREATE FUNCTION pgqueue._lock_groups(q pgqueue.queue, group_keys text[]) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_advisory_xact_lock(q.queue_id, hashtext(k))
       FROM (SELECT DISTINCT k FROM unnest(group_keys) AS k WHERE k IS NOT NULL ORDER BY k) AS u (k);
    IF NOT q.has_groups THEN
        UPDATE pgqueue.queue SET has_groups = true WHERE queue_id = q.queue_id AND NOT has_groups;
    END IF;
END
$$;

CREATE FUNCTION pgqueue.listen(queue_name text) RETURNS text
LANGUAGE plpgsql
SECURITY DEFINER SET search_path = pg_catalog, pgqueue, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    q pgqueue.queue := pgqueue._queue(listen.queue_name);
    v_channel text := pgqueue._channel(q.queue_name);
BEGIN
    DELETE FROM pgqueue.waiter w
     WHERE NOT EXISTS (SELECT 1 FROM pg_stat_activity a WHERE a.pid = w.pid);
    INSERT INTO pgqueue.waiter (queue_id, pid) VALUES (q.queue_id, pg_backend_pid())
    ON CONFLICT (queue_id, pid) DO UPDATE SET since = EXCLUDED.since;
    EXECUTE format('LISTEN %I', v_channel);
    RETURN v_channel;
END
$$;

CREATE FUNCTION pgqueue.unlisten(queue_name text) RETURNS void
LANGUAGE plpgsql
SECURITY DEFINER SET search_path = pg_catalog, pgqueue, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    q pgqueue.queue := pgqueue._queue(unlisten.queue_name);
BEGIN
    DELETE FROM pgqueue.waiter WHERE queue_id = q.queue_id AND pid = pg_backend_pid();
    EXECUTE format('UNLISTEN %I', pgqueue._channel(q.queue_name));
END
$$;

-- Every queue; paused_at and paused_by are NULL while it runs.
CREATE FUNCTION pgqueue.list_queues()
RETURNS TABLE (
    queue_name text,
    max_attempts integer,
    created_at timestamptz,
    paused_at timestamptz,
    paused_by text
)
LANGUAGE sql STABLE
SECURITY DEFINER SET search_path = pg_catalog, pgqueue, pg_temp
AS $$
    SELECT q.queue_name, q.max_attempts, q.created_at, q.paused_at, q.paused_by
      FROM pgqueue.queue q ORDER BY q.queue_name;
$$;

-- Pausing: a paused queue takes sends, acks, nacks, lease changes and member
-- completions as ever, but read, read_with_poll and pop hand out nothing
-- (reads.sql). Each says so by a NOTICE (PGQ11), so a consumer can tell a
-- paused queue from an empty one and poll it instead of waking on its sends.
-- The state is one column of the queue's row, changed by one conditional
-- UPDATE: of two pauses (or resumes) at once, exactly one reports the change.
-- Pausing does not stop the clock of anything already handed out (leases
-- expire, barrier deadlines pass); it only stops new reads.

-- Pauses the queue; true when this call paused it, false when it already was.
-- `actor` is kept as paused_by (who or what paused it: a user, a web login).
CREATE FUNCTION pgqueue.pause_queue(queue_name text, actor text DEFAULT NULL) RETURNS boolean
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

-- Resumes the queue; true when this call resumed it, false when it was not
-- paused. Consumers waiting on the queue's channel are woken with the payload
-- 'resumed' (a send's notification has an empty one): pgqueue's worker ignores
-- the sends to a queue it knows is paused, and reads again at once on this.
CREATE FUNCTION pgqueue.resume_queue(queue_name text) RETURNS boolean
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

-- The reserved headers that carry a message's trace context (W3C Trace
-- Context): {"_pg_traceparent": ..., "_pg_tracestate": ...}, the latter only
-- when non-empty; NULL for no traceparent. Only pgqueue's functions write
-- these keys, from their traceparent/tracestate arguments; a caller's headers
-- cannot hold them (_require_headers).
CREATE FUNCTION pgqueue._trace_headers(traceparent text, tracestate text) RETURNS jsonb
LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    IF traceparent IS NULL THEN
        RETURN NULL;
    END IF;
    PERFORM pgqueue._require_traceparent('traceparent', traceparent);
    IF length(tracestate) > 512 OR tracestate ~ '[^\x20-\x7e]' THEN
        RAISE EXCEPTION 'tracestate must be at most 512 printable ASCII characters'
            USING ERRCODE = '22023', HINT = 'Pass the W3C tracestate header as the propagator wrote it.';
    END IF;
    RETURN jsonb_build_object('_pg_traceparent', traceparent)
           || CASE WHEN tracestate <> '' THEN jsonb_build_object('_pg_tracestate', tracestate)
                   ELSE '{}'::jsonb END;
END
$$;

-- A W3C traceparent of version 00 with non-zero ids, else 22023 naming `what`.
CREATE FUNCTION pgqueue._require_traceparent(what text, traceparent text) RETURNS void
LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    IF traceparent !~ '^00-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$'
       OR substr(traceparent, 4, 32) = repeat('0', 32) OR substr(traceparent, 37, 16) = repeat('0', 16) THEN
        RAISE EXCEPTION '% is not a W3C traceparent: %', what, quote_literal(left(traceparent, 80))
            USING ERRCODE = '22023',
                  HINT = 'Expected 00-<32 hex trace id>-<16 hex span id>-<2 hex flags>, ids not all zero.';
    END IF;
END
$$;

-- The one header rule (docs/security.md, "What a handler may trust"): a
-- caller's header keys never start with _pg_ (_require_headers, at every
-- entry that takes headers); every key pgqueue writes does, and only the
-- three functions that follow write them: _trace_headers above (the trace
-- context), _member_headers (a barrier member, a workflow step's message)
-- and _callback_headers (a barrier's or a workflow's callback). A caller's
-- headers travel on members and callbacks as they are: the two sets of keys
-- cannot meet, so nothing a caller writes passes for what pgqueue wrote.
-- tests/sql/test_header_rule.py fails on any other function that names a
-- _pg_ key.

-- A barrier member's headers: its fan-out's headers as they are, then
-- {"_pg_member": {"barrier_id", "index"}} and, on a workflow step's message,
-- {"_pg_step": {"workflow_id", "step"}}, then the trace context. Inlined.
CREATE FUNCTION pgqueue._member_headers(p_headers jsonb, p_barrier_id text, p_index integer,
                                        p_workflow_id text, p_step text, p_trace jsonb)
RETURNS jsonb
LANGUAGE sql IMMUTABLE
AS $$
    SELECT coalesce(p_headers, '{}'::jsonb)
           || jsonb_build_object('_pg_member', jsonb_build_object('barrier_id', p_barrier_id, 'index', p_index))
           || CASE WHEN p_workflow_id IS NULL THEN '{}'::jsonb
                   ELSE jsonb_build_object('_pg_step', jsonb_build_object('workflow_id', p_workflow_id,
                                                                          'step', p_step)) END
           || coalesce(p_trace, '{}'::jsonb);
$$;

-- A callback's headers: its fan-out's (or workflow's) headers as they are,
-- then the transport marker and {"_pg_callback": p_callback}, the firing's
-- record ({"kind": "barrier" | "workflow", ...}), then the trace context.
CREATE FUNCTION pgqueue._callback_headers(p_headers jsonb, p_callback jsonb, p_trace jsonb)
RETURNS jsonb
LANGUAGE sql IMMUTABLE
AS $$
    SELECT coalesce(p_headers, '{}'::jsonb)
           || jsonb_build_object('_pg_transport', true, '_pg_callback', p_callback)
           || coalesce(p_trace, '{}'::jsonb);
$$;

CREATE FUNCTION pgqueue.send_batch(
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
           -- each message checked as it goes in (a statement of its own cost
           -- a batch of 100 about 7% more): the check raises, naming it
           CASE WHEN pgqueue._undecodable(b.message)
                THEN pgqueue._decodable_or_raise(format('messages[%s]', b.ord), b.message)
                ELSE b.message END,
           CASE WHEN v_trace IS NULL THEN b.headers ELSE coalesce(b.headers, '{}') || v_trace END,
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

CREATE FUNCTION pgqueue._metrics(q pgqueue.queue)
RETURNS SETOF pgqueue.queue_metrics
LANGUAGE sql AS $$
    SELECT q.queue_name,
           live.n,
           live.visible,
           extract(epoch FROM (clock_timestamp() - live.oldest))::integer,
           extract(epoch FROM (clock_timestamp() - live.newest))::integer,
           coalesce(pg_sequence_last_value(q.msg_seq), 0),
           (SELECT count(*) FROM pgqueue.poison p WHERE p.queue_id = q.queue_id),
           clock_timestamp()
      FROM (SELECT count(*) AS n,
                   count(*) FILTER (WHERE m.vt <= clock_timestamp()) AS visible,
                   min(m.enqueued_at) AS oldest,
                   max(m.enqueued_at) AS newest
              FROM pgqueue.message m WHERE m.queue_id = q.queue_id AND pgqueue._keyed(m.read_ct, m.vt, m.enqueued_at, m.group_key)) live;
$$;

CREATE FUNCTION pgqueue.metrics(queue_name text)
RETURNS SETOF pgqueue.queue_metrics
LANGUAGE sql
SECURITY DEFINER SET search_path = pg_catalog, pgqueue, pg_temp
AS $$
    SELECT * FROM pgqueue._metrics(pgqueue._queue(metrics.queue_name));
$$;

CREATE FUNCTION pgqueue.metrics_all()
RETURNS SETOF pgqueue.queue_metrics
LANGUAGE sql
SECURITY DEFINER SET search_path = pg_catalog, pgqueue, pg_temp
AS $$
    SELECT m.* FROM pgqueue.queue q, LATERAL pgqueue._metrics(q) m ORDER BY q.queue_name;
$$;

-- Every figure the Prometheus exporter (`pgqueue exporter`) serves, one row per
-- queue, in one statement however many queues there are: a scrape must not
-- cost a round trip (or a scan of the live table) per queue, as calling
-- metrics() for each would. Each table is read once, grouped by queue_id:
-- the live messages (one pass, which every count of live messages needs),
-- the poison table (its primary key starts with queue_id), and the open
-- barriers only (barrier_deadline_idx is partial on state = 'open').
-- A message is visible when its vt has passed; delayed when it is hidden and
-- was never read (sent with a delay); leased when it is hidden after a read
-- (held by a consumer, or waiting out a nack's backoff: the row does not say
-- which). oldest_visible_age_seconds is the age (since send) of the oldest
-- visible message, NULL when none is visible. sent_total is the queue's
-- message sequence: every id handed out, which a rolled-back send also uses.
-- paused: the queue is paused (pause_queue).
CREATE FUNCTION pgqueue.exporter_metrics()
RETURNS TABLE (
    queue_name text,
    visible bigint,
    leased bigint,
    delayed bigint,
    oldest_visible_age_seconds double precision,
    poison bigint,
    barriers_open bigint,
    barrier_oldest_open_age_seconds double precision,
    sent_total bigint,
    paused boolean
)
LANGUAGE sql
SECURITY DEFINER SET search_path = pg_catalog, pgqueue, pg_temp
AS $$
    WITH clock AS (SELECT clock_timestamp() AS t),
    live AS (
        SELECT m.queue_id,
               count(*) FILTER (WHERE m.vt <= c.t) AS visible,
               count(*) FILTER (WHERE m.vt > c.t AND m.read_ct > 0) AS leased,
               count(*) FILTER (WHERE m.vt > c.t AND m.read_ct = 0) AS delayed,
               min(m.enqueued_at) FILTER (WHERE m.vt <= c.t) AS oldest_visible
          FROM pgqueue.message m CROSS JOIN clock c
         GROUP BY m.queue_id
    ),
    dead AS (
        SELECT p.queue_id, count(*) AS n FROM pgqueue.poison p GROUP BY p.queue_id
    ),
    open AS (
        SELECT b.queue_id, count(*) AS n, min(b.created_at) AS oldest
          FROM pgqueue.barrier b WHERE b.state = 'open'
         GROUP BY b.queue_id
    )
    SELECT q.queue_name,
           coalesce(l.visible, 0),
           coalesce(l.leased, 0),
           coalesce(l.delayed, 0),
           extract(epoch FROM c.t - l.oldest_visible)::double precision,
           coalesce(d.n, 0),
           coalesce(o.n, 0),
           extract(epoch FROM c.t - o.oldest)::double precision,
           coalesce(pg_sequence_last_value(q.msg_seq), 0),
           q.paused_at IS NOT NULL
      FROM pgqueue.queue q
     CROSS JOIN clock c
      LEFT JOIN live l ON l.queue_id = q.queue_id
      LEFT JOIN dead d ON d.queue_id = q.queue_id
      LEFT JOIN open o ON o.queue_id = q.queue_id
     ORDER BY q.queue_name;
$$;

-- Live messages in msg_id order, visible or not, after `after_msg_id`; a plain
-- read: it takes no locks that a consumer would wait on and changes nothing.
CREATE FUNCTION pgqueue.peek(queue_name text, qty integer DEFAULT 10, after_msg_id bigint DEFAULT 0)
RETURNS SETOF pgqueue.peek_record
LANGUAGE plpgsql STABLE
SECURITY DEFINER SET search_path = pg_catalog, pgqueue, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    q pgqueue.queue := pgqueue._queue(peek.queue_name);
BEGIN
    PERFORM pgqueue._require_nonnegative('qty', peek.qty);
    RETURN QUERY
    -- each half of the key in msg_id order, merged (the version this
    -- statement sees of a message is in one of them)
    SELECT x.msg_id, x.read_ct, x.enqueued_at, x.vt, x.message, x.headers, x.dedupe_key, x.last_error
      FROM ((SELECT m.* FROM pgqueue.message m
              WHERE m.queue_id = q.queue_id AND m.msg_id > coalesce(peek.after_msg_id, 0) AND m.read_ct = 0 AND m.vt <= m.enqueued_at AND m.group_key IS NULL
              ORDER BY m.msg_id LIMIT peek.qty)
            UNION ALL
            (SELECT m.* FROM pgqueue.message m
              WHERE m.queue_id = q.queue_id AND m.msg_id > coalesce(peek.after_msg_id, 0) AND (m.read_ct = 0 AND m.vt <= m.enqueued_at AND m.group_key IS NULL) IS NOT TRUE
              ORDER BY m.msg_id LIMIT peek.qty)) x
     ORDER BY x.msg_id
     LIMIT peek.qty;
END
$$;

CREATE FUNCTION pgqueue.create_queue(queue_name text, max_attempts integer DEFAULT 5)
RETURNS void
LANGUAGE plpgsql
SECURITY DEFINER SET search_path = pg_catalog, pgqueue, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_id integer;
    v_seq text;
BEGIN
    IF create_queue.queue_name IS NULL OR create_queue.queue_name !~ '^[a-z_][a-z0-9_]{0,47}$' THEN
        RAISE EXCEPTION 'invalid queue name %', quote_nullable(create_queue.queue_name)
            USING ERRCODE = '22023',
                  HINT = 'A queue name is 1 to 48 lowercase letters, digits or underscores, not starting with a digit.';
    END IF;
    IF create_queue.max_attempts IS NULL OR create_queue.max_attempts < 1 THEN
        RAISE EXCEPTION 'max_attempts must be >= 1, got %', create_queue.max_attempts
            USING ERRCODE = '22023', HINT = 'max_attempts is how many times a message may be read before it is poisoned.';
    END IF;

    -- Existing queue: creation is idempotent and applies the new max_attempts.
    UPDATE pgqueue.queue SET max_attempts = create_queue.max_attempts
     WHERE queue_name = create_queue.queue_name;
    IF FOUND THEN
        RETURN;
    END IF;

    v_id := nextval('pgqueue.queue_id_seq');
    v_seq := 'msg_id_seq_' || v_id;
    EXECUTE format('CREATE SEQUENCE pgqueue.%I AS bigint', v_seq);
    INSERT INTO pgqueue.queue (queue_id, queue_name, max_attempts, msg_seq)
    VALUES (v_id, create_queue.queue_name, create_queue.max_attempts, ('pgqueue.' || v_seq)::regclass)
    ON CONFLICT (queue_name) DO NOTHING;
    IF FOUND THEN
        PERFORM pgqueue._lane_seqs(v_id, true);
    ELSE
        -- A concurrent create_queue committed first: keep its row, drop our sequence.
        EXECUTE format('DROP SEQUENCE pgqueue.%I', v_seq);
        UPDATE pgqueue.queue SET max_attempts = create_queue.max_attempts
         WHERE queue_name = create_queue.queue_name;
    END IF;
END
$$;

-- Deletes up to qty archived rows archived more than older_than_seconds ago;
-- how many. Call until it returns 0: short transactions on a large archive.
CREATE FUNCTION pgqueue.purge_archive(older_than_seconds integer, qty integer DEFAULT 10000)
RETURNS bigint
LANGUAGE plpgsql
SECURITY DEFINER SET search_path = pg_catalog, pgqueue, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    n bigint;
BEGIN
    PERFORM pgqueue._require_nonnegative('older_than_seconds', purge_archive.older_than_seconds);
    PERFORM pgqueue._require_nonnegative('qty', purge_archive.qty);
    -- archived rows are never updated, so a ctid found here still names its row
    DELETE FROM pgqueue.archive a
     WHERE a.ctid = ANY (ARRAY(
           SELECT x.ctid FROM pgqueue.archive x
            WHERE x.archived_at < clock_timestamp() - make_interval(secs => purge_archive.older_than_seconds)
            LIMIT purge_archive.qty));
    GET DIAGNOSTICS n = ROW_COUNT;
    RETURN n;
END
$$;

-- True when a JSON document is nested more than 255 levels deep (a value
-- lies inside 256 arrays or objects), which readers cannot decode: Python's
-- json stops near 1,000 levels, less deep in a deep stack, other decoders
-- sooner. Such a document takes more than 2 kB (8 bytes a level at least),
-- so a smaller one, uncompressed, is never walked. NULL for NULL. Inlined
-- (STABLE, as the size functions are: an IMMUTABLE one would not be).
CREATE FUNCTION pgqueue._undecodable(doc jsonb) RETURNS boolean
LANGUAGE sql STABLE PARALLEL SAFE
AS $$
    SELECT (pg_column_size(doc) > 2048 OR pg_column_compression(doc) IS NOT NULL)
           AND jsonb_path_exists(doc, 'strict $.**{256}');
$$;

-- Raises 22023 naming `what` when a document is _undecodable.
CREATE FUNCTION pgqueue._require_decodable(what text, doc jsonb) RETURNS void
LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    IF pgqueue._undecodable(doc) THEN
        RAISE EXCEPTION '% is nested more than 255 levels deep', what
            USING ERRCODE = '22023',
                  HINT = 'Readers cannot decode it (Python''s json stops near 1,000 levels, other decoders'
                         ' sooner). Flatten it, or send the deep part as a string.';
    END IF;
END
$$;

-- The document, when it is not _undecodable; else raises as _require_decodable.
-- For a statement that checks each row as it goes (send_batch).
CREATE FUNCTION pgqueue._decodable_or_raise(what text, doc jsonb) RETURNS jsonb
LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    PERFORM pgqueue._require_decodable(what, doc);
    RETURN doc;
END
$$;

-- Raises 22023 at the first of docs that is _undecodable, naming it what[i]
-- (from 1, as Postgres counts an array's elements).
CREATE FUNCTION pgqueue._require_all_decodable(what text, docs jsonb[]) RETURNS void
LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    v_bad bigint;
BEGIN
    IF EXISTS (SELECT 1 FROM unnest(docs) AS d (doc) WHERE pgqueue._undecodable(d.doc)) THEN
        SELECT d.ord INTO v_bad FROM unnest(docs) WITH ORDINALITY AS d (doc, ord)
         WHERE pgqueue._undecodable(d.doc) ORDER BY d.ord LIMIT 1;
        PERFORM pgqueue._require_decodable(format('%s[%s]', what, v_bad), docs[v_bad]);
    END IF;
END
$$;

-- Why a caller's headers are refused, or NULL when they are not: not a JSON
-- object, or a key starting with _pg_ (the header rule's first half). The
-- entries raise it (_require_headers); `pgqueue pgmq import` counts by it.
CREATE FUNCTION pgqueue._headers_problem(headers jsonb) RETURNS text
LANGUAGE sql IMMUTABLE
AS $$
    SELECT CASE WHEN headers IS NULL THEN NULL
                WHEN jsonb_typeof(headers) <> 'object'
                THEN format('headers must be a JSON object, got a JSON %s', jsonb_typeof(headers))
                ELSE (SELECT format('header %s is reserved: keys starting with _pg_ are written by pgqueue only',
                                    to_json(k)::text)
                        FROM jsonb_object_keys(headers) AS k WHERE left(k, 4) = '_pg_' ORDER BY k LIMIT 1)
           END;
$$;

-- Headers must be a JSON object (or NULL) whose keys do not start with _pg_,
-- and a document every reader can decode.
CREATE FUNCTION pgqueue._require_headers(headers jsonb) RETURNS void
LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    v_problem text := pgqueue._headers_problem(headers);
BEGIN
    IF v_problem LIKE 'headers must be%' THEN
        RAISE EXCEPTION '%', v_problem
            USING ERRCODE = '22023', HINT = 'Pass headers as {"key": value, ...}, or NULL.';
    ELSIF v_problem IS NOT NULL THEN
        RAISE EXCEPTION '%', v_problem
            USING ERRCODE = '22023',
                  HINT = 'Rename it. pgqueue writes the _pg_ keys (a callback''s, a member''s, a trace''s)'
                         ' itself; when passing on the headers of a message you got, leave out the keys'
                         ' that start with _pg_.';
    END IF;
    PERFORM pgqueue._require_decodable('headers', headers);
END
$$;

-- Enqueues one message; its msg_id. The argument checks run as one inline
-- condition on the fast path (a header key starting with _pg_ always shows as
-- "_pg_ in the headers' text; a value that merely contains it costs only the
-- full check). With a dedupe_key: single flight, decided by the unique index;
-- a retry that carries its send_token returns its own message, live or
-- consumed (its receipt), before it considers another sender's.
CREATE FUNCTION pgqueue.send(
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
       OR send.headers IS NOT NULL OR send.dedupe_key IS NOT NULL OR send.group_key IS NOT NULL
       OR pgqueue._undecodable(send.message) THEN
        IF send.message IS NULL OR send.delay IS NULL OR send.delay < 0
           OR jsonb_typeof(send.headers) <> 'object' OR strpos(send.headers::text, '"_pg_') > 0
           OR length(send.dedupe_key) > 1000 OR send.group_key = '' OR length(send.group_key) > 200
           OR pgqueue._undecodable(send.message) OR pgqueue._undecodable(send.headers) THEN
            IF send.message IS NULL THEN
                RAISE EXCEPTION 'message must not be NULL' USING ERRCODE = '22004',
                    HINT = 'Send a JSON value; use ''null''::jsonb for a JSON null.';
            END IF;
            PERFORM pgqueue._require_decodable('message', send.message);
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

-- send under a dedupe_key, saying whether this call sent: (msg_id, sent).
-- sent is true when this call (or an earlier attempt of it, with the same
-- send_token, whose commit reply was lost) inserted the message, live or
-- consumed since; false when an unfinished message sent by someone else holds
-- the key (msg_id is then that message's, and nothing was inserted). Without a
-- send_token the call makes one, so a single call still knows what it did.
CREATE FUNCTION pgqueue.send_keyed(
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
           (SELECT 1 FROM pgqueue.message m
             WHERE m.queue_id = (pgqueue._queue(send_keyed.queue_name)).queue_id
               AND m.msg_id = v_id AND pgqueue._keyed(m.read_ct, m.vt, m.enqueued_at, m.group_key) AND m.send_token = v_token
             LIMIT 1) IS NOT NULL
           OR EXISTS (SELECT FROM pgqueue.send_receipt r
                       WHERE r.send_token = v_token AND r.msg_id = v_id);
END
$$;

CREATE FUNCTION pgqueue.purge_queue(queue_name text) RETURNS bigint
LANGUAGE plpgsql
SECURITY DEFINER SET search_path = pg_catalog, pgqueue, pg_temp
AS $$
DECLARE
    q pgqueue.queue := pgqueue._queue(queue_name);
    n bigint;
BEGIN
    -- Members are counted as purged in the statement that deletes them.
    WITH gone AS (
        DELETE FROM pgqueue.message m WHERE m.queue_id = q.queue_id AND pgqueue._keyed(m.read_ct, m.vt, m.enqueued_at, m.group_key)
        RETURNING m.msg_id, m.member_of
    ), agg AS (
        SELECT count(*) AS n, array_agg(g.msg_id) FILTER (WHERE g.member_of IS NOT NULL) AS members
          FROM gone g
    )
    SELECT agg.n INTO n FROM agg, LATERAL pgqueue._count_purged(q.queue_id, agg.members) AS c;
    RETURN n;
END
$$;

-- Deletes up to qty live messages with msg_id <= up_to_msg_id, oldest first;
-- how many. Barrier members removed this way count as purged (failed), as
-- with purge_queue. Call until it returns 0: the bound keeps a purge from
-- chasing messages sent after it started.
CREATE FUNCTION pgqueue.purge_queue_chunk(queue_name text, up_to_msg_id bigint, qty integer)
RETURNS bigint
LANGUAGE plpgsql
SET enable_seqscan = off
SET enable_bitmapscan = off
SECURITY DEFINER SET search_path = pg_catalog, pgqueue, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    q pgqueue.queue := pgqueue._queue(purge_queue_chunk.queue_name);
    v_ids bigint[];
    v_tids tid[];
    n bigint;
BEGIN
    PERFORM pgqueue._require_nonnegative('qty', purge_queue_chunk.qty);
    -- The oldest qty, in msg_id order along each half of the key, then
    -- locked one by one in that order. A message whose lease committed while
    -- this waited for it moved to the other half, where its probe does not
    -- look: it is left for the next round, which runs at once when nothing
    -- was locked, so that 0 means none is left.
    LOOP
        v_ids := ARRAY(SELECT x.msg_id
                         FROM ((SELECT m.msg_id FROM pgqueue.message m
                                 WHERE m.queue_id = q.queue_id AND m.msg_id <= purge_queue_chunk.up_to_msg_id
                                   AND m.read_ct = 0 AND m.vt <= m.enqueued_at AND m.group_key IS NULL
                                 ORDER BY m.msg_id LIMIT purge_queue_chunk.qty)
                               UNION ALL
                               (SELECT m.msg_id FROM pgqueue.message m
                                 WHERE m.queue_id = q.queue_id AND m.msg_id <= purge_queue_chunk.up_to_msg_id
                                   AND (m.read_ct = 0 AND m.vt <= m.enqueued_at AND m.group_key IS NULL) IS NOT TRUE
                                 ORDER BY m.msg_id LIMIT purge_queue_chunk.qty)) x
                        ORDER BY x.msg_id
                        LIMIT purge_queue_chunk.qty);
        EXIT WHEN cardinality(v_ids) = 0;
        v_tids := array_remove(ARRAY(
            SELECT coalesce((SELECT m.ctid FROM pgqueue.message m
                              WHERE m.queue_id = q.queue_id AND m.msg_id = u.id AND m.read_ct = 0 AND m.vt <= m.enqueued_at AND m.group_key IS NULL
                                FOR UPDATE),
                            (SELECT m.ctid FROM pgqueue.message m
                              WHERE m.queue_id = q.queue_id AND m.msg_id = u.id AND (m.read_ct = 0 AND m.vt <= m.enqueued_at AND m.group_key IS NULL) IS NOT TRUE
                                FOR UPDATE))
              FROM unnest(v_ids) AS u (id) ORDER BY u.id), NULL);
        EXIT WHEN cardinality(v_tids) > 0;
    END LOOP;
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

CREATE FUNCTION pgqueue.drop_queue(queue_name text) RETURNS boolean
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
        DELETE FROM pgqueue.message m WHERE m.queue_id = q.queue_id AND pgqueue._keyed(m.read_ct, m.vt, m.enqueued_at, m.group_key)
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

-- Every path that removes a live row (delete, pop, archive, poison, purge)
-- goes through DELETE, so one trigger covers them all; the WHEN clause keeps it
-- free for the common message that has no token.
CREATE TRIGGER message_send_receipt
    AFTER DELETE ON pgqueue.message
    FOR EACH ROW WHEN (OLD.send_token IS NOT NULL)
    EXECUTE FUNCTION pgqueue._remember_send_token();
