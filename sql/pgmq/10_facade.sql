-- The pgmq facade: PGMQ 1.13's SQL API over pgqueue's queues (docs/pgmq.md).
--
-- Applied by `pgqueue._pgmq.install(conn)` as the owner of schema pgqueue, in
-- one transaction, into a schema pgmq that the installer has just created
-- (and found free of a real PGMQ). Not a numbered migration: an upgrade is
-- DROP SCHEMA pgmq CASCADE and install again (the installer carrying over
-- the rows of the facade's tables, queue_name_map and partition_config), so
-- this file creates every object and assumes none exists.
--
-- One queue, two APIs. A pgmq queue IS a pgqueue queue: the only state kept
-- here is the name PGMQ shows for a queue whose pgqueue name differs (below);
-- lose it and every queue still works. Every function names PGMQ's
-- arguments exactly (clients call them by name: `pgmq.send(queue_name=>...,
-- msg=>...)`), returns PGMQ's types, and works through pgqueue's functions
-- (send, send_batch, _take, delete, archive, purge_queue, drop_queue,
-- create_queue), so single flight, FIFO groups, poison drops, pausing and
-- wake-ups behave as they do for pgqueue's own callers. The few direct writes (set_vt, the notify columns)
-- are single statements on one queue's rows.
--
-- Where the two differ (the full table is docs/pgmq.md):
--   * Names. PGMQ lowercases a queue name into its table names, so 'MyQueue'
--     and 'myqueue' are one queue there, and accepts names pgqueue's rule
--     (1 to 48 of [a-z0-9_], not starting with a digit) does not: Celery's
--     'celery@host.celery.pidbox', say. Here a name is lowercased, and one
--     that is still not a pgqueue name stands for a pgqueue queue derived
--     from it (pgmq._name: its characters outside [a-z0-9_] as '_', a '_'
--     before a leading digit, cut to 39, then '_' and 8 hex digits of its
--     md5): the same PGMQ name always reaches the same queue, with no lookup.
--     The name a queue was created with, where it differs from pgqueue's, is
--     kept in pgmq.queue_name_map, so list_queues, metrics_all, pgmq.meta and
--     the views show PGMQ's names, and a create refuses a second name that
--     maps to the queue (pgmq._create). PGMQ's own limits stay: 1 to 47
--     characters, none of $ ; -- ' (22023); a pgqueue queue of 48 is reached
--     all the same, but not created through the facade.
--   * Attempts. PGMQ never drops a message; a queue created here gets
--     max_attempts = 2147483647, so it never does either, unless an operator
--     sets a limit through pgqueue.create_queue (then reads poison-drop into
--     pgqueue.poison, as for any pgqueue queue). pgmq.create on an existing
--     queue leaves it as it is.
--   * Groups. The header x-pgmq-group becomes the message's group_key
--     (pgqueue._pgmq_group). read, read_with_poll and pop hand out a grouped
--     message only while it is the oldest live message of its group: at most
--     one message per group per read, in order; messages without the header
--     form no group there. The read_grouped family (15_grouped.sql) hands out
--     PGMQ's batches, several of a group to one reader, messages without the
--     header one shared group, as PGMQ's do.
--   * Delays given as a timestamp become whole seconds from now, rounded up:
--     a message never becomes visible before the time asked for.
--   * Unlogged queues do not exist: create_unlogged makes an ordinary queue.
--     Partitioned queues and archives are ordinary queues whose messages and
--     archive pgmq.run_maintenance() keeps as pg_partman's retention would
--     (12_partitioned.sql).
--   * The tables pgmq.meta, pgmq.q_<name> and pgmq.a_<name> are views of
--     pgqueue's tables, kept in step with the queues by a trigger on
--     pgqueue.queue (queues created or dropped through either API). The
--     owner's writes to pgmq.q_<name> (UPDATE of vt, DELETE, INSERT) are the
--     facade's calls that do the same; pgmq.meta is read-only.
--
-- Security: functions that touch pgqueue's tables or internal functions are
-- SECURITY DEFINER with a fixed search_path, as pgqueue's own are; nothing is
-- granted to PUBLIC; pgqueue's roles (sql/schema/roles.sql) get, where they
-- exist: pgqueue_producer the sends, pgqueue_consumer what a worker does
-- (reads, acks, set_vt, sends, list and metrics), pgqueue_operator all of it.
-- A queue name only ever reaches dynamic SQL quoted by format('%I').

------------------------------------------------------------------------------
-- Types: PGMQ's, field for field and in its order (clients read them by
-- position: its Rust client does).
------------------------------------------------------------------------------

CREATE TYPE pgmq.message_record AS (
    msg_id bigint,
    read_ct integer,
    enqueued_at timestamptz,
    last_read_at timestamptz,
    vt timestamptz,
    message jsonb,
    headers jsonb
);

CREATE TYPE pgmq.queue_record AS (
    queue_name varchar,
    is_partitioned boolean,
    is_unlogged boolean,
    created_at timestamptz
);

CREATE TYPE pgmq.metrics_result AS (
    queue_name text,
    queue_length bigint,
    newest_msg_age_sec integer,
    oldest_msg_age_sec integer,
    total_messages bigint,
    scrape_time timestamptz,
    queue_visible_length bigint,
    default_partition_length bigint
);

------------------------------------------------------------------------------
-- Names
------------------------------------------------------------------------------

-- PGMQ's table name of a queue: lower(prefix || '_' || queue_name), refusing
-- the characters PGMQ refuses with PGMQ's error (P0001, its text; the RAISE
-- on the line of PGMQ's, so the CONTEXT psql prints is PGMQ's too). Here it
-- names the queue's view.
CREATE FUNCTION pgmq.format_table_name(queue_name text, prefix text) RETURNS text
LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF queue_name ~ '\$|;|--|'''
    THEN
        RAISE EXCEPTION 'queue name contains invalid characters: $, ;, --, or \''';
    END IF;
    RETURN lower(prefix || '_' || queue_name);
END
$$;

-- The pgqueue queue a PGMQ name stands for: the name lowercased, as PGMQ's
-- table names are, when that is a pgqueue name; else one derived from it
-- (the header above). Not checked here: a name never created is an unknown
-- queue (PGQ01) when used. pgqueue's own functions map a name that is not a
-- pgqueue name the same way (pgqueue._queue), so the hot calls (send, read,
-- pop, a one-message delete or archive) pass PGMQ's name as it is.
CREATE FUNCTION pgmq._name(queue_name text) RETURNS text
LANGUAGE sql IMMUTABLE
AS $$
    SELECT pgqueue._queue_name_for(queue_name);
$$;

-- PGMQ's check of a queue name's length, with PGMQ's error (P0001, its
-- text, the RAISE on the line of PGMQ's). The characters are
-- format_table_name's to refuse; what else a facade queue name needs is
-- pgmq._check_name's.
CREATE FUNCTION pgmq.validate_queue_name(queue_name text) RETURNS void
LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF length(queue_name) > 47 THEN
        -- PGMQ's limit: its longest table name (a partitioned queue's
        -- template, template_pgmq_q_ and the queue's name) must fit in an
        -- identifier's 63 bytes. Four lines of comment: the RAISE is on line
        -- 8 of the body, as PGMQ's is, for the CONTEXT line it prints.
        RAISE EXCEPTION 'queue name is too long, maximum length is 47 characters';
    END IF;
END
$$;

-- Raises unless a queue may be created by this name beyond PGMQ's checks,
-- which the creates make first (format_table_name: the characters;
-- validate_queue_name: the length): a name, not empty, at most 61 bytes
-- (the views' names are identifiers: 63 bytes with the prefix). 22004 for
-- NULL, else 22023.
CREATE FUNCTION pgmq._check_name(queue_name text) RETURNS void
LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF queue_name IS NULL THEN
        RAISE EXCEPTION 'queue_name must not be NULL' USING ERRCODE = '22004';
    END IF;
    IF queue_name = '' OR octet_length(queue_name) > 61 THEN
        RAISE EXCEPTION 'invalid queue name %', quote_nullable(queue_name)
            USING ERRCODE = '22023',
                  HINT = 'A queue name is 1 to 47 characters (61 bytes), none of $ ; -- '' (PGMQ''s limits).'
                         ' A pgqueue name (letters, digits and underscores, not starting with a digit) is'
                         ' used as it is, lowercased; any other stands for a pgqueue queue named after it'
                         ' (docs/pgmq.md).';
    END IF;
END
$$;

-- The name a queue was created with through the facade, where it is not the
-- pgqueue queue's name (a mixed-case name, or one pgmq._name derives a queue
-- from). Kept across reinstalls by the installer; rows go with their queue.
CREATE TABLE pgmq.queue_name_map (
    queue_name text PRIMARY KEY,  -- pgqueue's
    pgmq_name text NOT NULL       -- as PGMQ shows it
);

-- PGMQ's partitioned queues and archives (12_partitioned.sql): what
-- create_partitioned and convert_archive_partitioned asked pg_partman to keep,
-- which pgmq.run_maintenance() keeps. Kept across reinstalls by the
-- installer; rows go with their queue.
CREATE TABLE pgmq.partition_config (
    queue_name text PRIMARY KEY,  -- pgqueue's
    -- the queue's partitions and retention, as create_partitioned was given
    -- them: a whole number (msg_ids) or an interval (enqueued_at); NULL for a
    -- queue whose archive alone was converted
    partition_interval text,
    retention_interval text,
    premake integer,
    -- the archive's (msg_ids, or archived_at)
    archive_interval text NOT NULL,
    archive_retention text NOT NULL,
    -- where time partitions start, as pg_partman lays them out
    anchor timestamptz NOT NULL
);

-- True for a queue made by create_partitioned.
CREATE FUNCTION pgmq._is_partitioned(queue_name text) RETURNS boolean
LANGUAGE sql STABLE
AS $$
    SELECT EXISTS (SELECT 1 FROM pgmq.partition_config c
                    WHERE c.queue_name = _is_partitioned.queue_name AND c.partition_interval IS NOT NULL);
$$;

-- PGMQ's name of a pgqueue queue.
CREATE FUNCTION pgmq._pgmq_name(queue_name text) RETURNS text
LANGUAGE sql STABLE
AS $$
    SELECT coalesce((SELECT n.pgmq_name FROM pgmq.queue_name_map n WHERE n.queue_name = _pgmq_name.queue_name),
                    queue_name);
$$;

-- Serializes the creation and dropping of one queue name until commit, as
-- PGMQ's does (same lock key).
CREATE FUNCTION pgmq.acquire_queue_lock(queue_name text) RETURNS void
LANGUAGE sql
AS $$
    SELECT pg_catalog.pg_advisory_xact_lock(pg_catalog.hashtext('pgmq.queue_' || queue_name));
$$;

-- PGMQ's notify-on-insert channel of a queue: 'pgmq.q_<name>.INSERT', which is
-- what PGMQ's trigger notifies and its clients LISTEN on.
CREATE FUNCTION pgmq._channel(queue_name text) RETURNS text
LANGUAGE sql IMMUTABLE
AS $$
    SELECT 'pgmq.q_' || lower(queue_name) || '.INSERT';
$$;

-- Whole seconds from now until `delay`, rounded up (so never early), at least
-- 0 (a time in the past is now) and at most 2147483647 (about 68 years, which
-- 'infinity' becomes); NULL for NULL, which the send refuses (22004). A
-- negative integer delay is 0 and a NULL one stays NULL likewise.
CREATE FUNCTION pgmq._delay_seconds(delay timestamptz) RETURNS integer
LANGUAGE sql VOLATILE
AS $$
    SELECT CASE WHEN delay IS NOT NULL
                THEN least(greatest(ceil(extract(epoch FROM delay) - extract(epoch FROM clock_timestamp())), 0),
                           2147483647)::integer END;
$$;

------------------------------------------------------------------------------
-- The tables PGMQ's tools select from and its users write: views
------------------------------------------------------------------------------

-- Raised by a write to any of the views.
CREATE FUNCTION pgmq._read_only() RETURNS trigger
LANGUAGE plpgsql
AS $$
BEGIN
    RAISE EXCEPTION 'pgmq.% is a read-only view of pgqueue''s tables', TG_TABLE_NAME
        USING ERRCODE = '0A000',
              HINT = 'Write through the functions (pgmq.send, pgmq.delete, pgmq.archive, pgmq.set_vt,'
                     ' pgmq.create, pgmq.drop_queue); see docs/pgmq.md.';
END
$$;

-- Gives a view its writes (`writes`, a trigger function of schema pgmq, with
-- the queue's name as its argument; none: read-only), and SELECT to the
-- roles pgqueue.role_grant names for it. Writing takes a right on the view
-- itself, which pgqueue.role_grant gives no role: only the owner (the role
-- that installed the facade) writes, as only PGMQ's owner writes its tables.
CREATE FUNCTION pgmq._publish_view(view_name text, writes text DEFAULT '_read_only', queue_name text DEFAULT NULL)
RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    EXECUTE format('CREATE TRIGGER writes INSTEAD OF INSERT OR UPDATE OR DELETE ON pgmq.%I'
                   ' FOR EACH ROW EXECUTE FUNCTION pgmq.%I(%L)', view_name, writes, queue_name);
    -- its readers as pgqueue.role_grant says (q_* and a_*: the operator's,
    -- as peek is; meta: the consumer's and the operator's, as list_queues)
    PERFORM pgqueue._grant_relation(format('pgmq.%I', view_name)::regclass);
END
$$;

-- The writes PGMQ's users make to a queue's table, on its view (the queue's
-- pgqueue name is the trigger's argument), each the facade's function that
-- does the same, so every pgqueue rule holds as for a call: an UPDATE of vt
-- is pgmq.set_vt (unfenced, as PGMQ's; read_ct and so poison drops are not
-- touched), a DELETE is pgmq.delete (an ack: a barrier's member counts), an
-- INSERT of message, headers and vt is pgmq.send with vt as its delay (the
-- header rule applies; pgqueue draws msg_id, read_ct and enqueued_at). A
-- change to any other column is refused (0A000): a message is as it was
-- sent. A row gone meanwhile (acked by another) is not counted.
CREATE FUNCTION pgmq._write_queue_view() RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_queue text := TG_ARGV[0];
BEGIN
    IF TG_OP = 'DELETE' THEN
        RETURN CASE WHEN pgmq.delete(v_queue, OLD.msg_id) THEN OLD END;
    ELSIF TG_OP = 'UPDATE' THEN
        IF (NEW.msg_id, NEW.read_ct, NEW.enqueued_at, NEW.last_read_at, NEW.message, NEW.headers)
           IS DISTINCT FROM (OLD.msg_id, OLD.read_ct, OLD.enqueued_at, OLD.last_read_at, OLD.message, OLD.headers) THEN
            RAISE EXCEPTION 'pgmq.%: only vt can be updated, a message is as it was sent', TG_TABLE_NAME
                USING ERRCODE = '0A000',
                      HINT = 'To deliver something else, delete the message and send another (pgmq.send).';
        END IF;
        IF NEW.vt IS NULL THEN
            RAISE EXCEPTION 'vt must not be NULL' USING ERRCODE = '22004';
        END IF;
        IF NEW.vt IS NOT DISTINCT FROM OLD.vt THEN
            RETURN NEW;
        END IF;
        RETURN (SELECT NEW FROM pgmq.set_vt(v_queue, OLD.msg_id, NEW.vt) LIMIT 1);
    END IF;
    IF (NEW.msg_id, NEW.read_ct, NEW.enqueued_at, NEW.last_read_at) IS DISTINCT FROM (NULL, NULL, NULL, NULL) THEN
        RAISE EXCEPTION 'pgmq.%: an insert gives message, headers and vt only', TG_TABLE_NAME
            USING ERRCODE = '0A000',
                  HINT = 'pgqueue draws msg_id, read_ct and enqueued_at, as pgmq.send does.';
    END IF;
    SELECT s, 0, clock_timestamp() INTO NEW.msg_id, NEW.read_ct, NEW.enqueued_at
      FROM pgmq.send(v_queue, NEW.message, NEW.headers, coalesce(NEW.vt, clock_timestamp())) AS s;
    RETURN NEW;
END
$$;

-- A DELETE from a queue's archive view removes the archived rows (PGMQ's
-- users trim their archives so); archived rows are not changed or added.
CREATE FUNCTION pgmq._write_archive_view() RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF TG_OP <> 'DELETE' THEN
        RAISE EXCEPTION 'pgmq.%: archived messages are not changed or added', TG_TABLE_NAME
            USING ERRCODE = '0A000', HINT = 'Archive a live message with pgmq.archive; DELETE removes archived rows.';
    END IF;
    DELETE FROM pgqueue.archive a
     WHERE a.queue_id = (SELECT q.queue_id FROM pgqueue.queue q WHERE q.queue_name = TG_ARGV[0])
       AND a.msg_id = OLD.msg_id;
    RETURN CASE WHEN FOUND THEN OLD END;
END
$$;

-- PGMQ's queue table and archive table of one queue, as views named as PGMQ
-- names its tables (format_table_name of PGMQ's name of the queue): the
-- queue's live messages in pgqueue.message and its rows of pgqueue.archive,
-- with PGMQ's columns in PGMQ's order.
CREATE FUNCTION pgmq._create_views(queue_id integer, queue_name text) RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_q text := 'q_' || lower(pgmq._pgmq_name(queue_name));
    v_a text := 'a_' || lower(pgmq._pgmq_name(queue_name));
BEGIN
    EXECUTE format('CREATE VIEW pgmq.%I AS'
                   ' SELECT m.msg_id, m.read_ct, m.enqueued_at, m.last_read_at, m.vt, m.message, m.headers'
                   '   FROM pgqueue.message m WHERE m.queue_id = %s'
                   -- both halves of the key (sql/schema/queue.sql), as _keyed
                   -- names them, written out: the views' readers need no grant
                   '    AND ((m.read_ct = 0 AND m.vt <= m.enqueued_at AND m.group_key IS NULL)'
                   '         OR (m.read_ct = 0 AND m.vt <= m.enqueued_at AND m.group_key IS NULL) IS NOT TRUE)',
                   v_q, queue_id);
    EXECUTE format('COMMENT ON VIEW pgmq.%I IS %L', v_q,
                   format('Live messages of pgqueue queue %s (the pgmq facade: an UPDATE of vt is pgmq.set_vt,'
                          ' a DELETE pgmq.delete, an INSERT pgmq.send; docs/pgmq.md)',
                          queue_name));
    PERFORM pgmq._publish_view(v_q, '_write_queue_view', queue_name);
    EXECUTE format('CREATE VIEW pgmq.%I AS'
                   ' SELECT a.msg_id, a.read_ct, a.enqueued_at, a.last_read_at, a.archived_at, a.vt,'
                   '        a.message, a.headers'
                   '   FROM pgqueue.archive a WHERE a.queue_id = %s', v_a, queue_id);
    EXECUTE format('COMMENT ON VIEW pgmq.%I IS %L', v_a,
                   format('Archived messages of pgqueue queue %s (the pgmq facade: a DELETE removes the'
                          ' archived row; docs/pgmq.md)',
                          queue_name));
    PERFORM pgmq._publish_view(v_a, '_write_archive_view', queue_name);
END
$$;

-- Keeps the views in step with pgqueue.queue, whichever API creates or drops
-- the queue: the views come and go in the transaction that makes the change
-- (and the queue's row of queue_name_map goes with it).
CREATE FUNCTION pgmq._sync_views() RETURNS trigger
LANGUAGE plpgsql
SECURITY DEFINER SET search_path = pg_catalog, pgqueue, pg_temp
AS $$
DECLARE
    v_name text;
    v_view text;
BEGIN
    IF TG_OP = 'INSERT' THEN
        PERFORM pgmq._create_views(NEW.queue_id, NEW.queue_name);
    ELSE
        DELETE FROM pgmq.queue_name_map n WHERE n.queue_name = OLD.queue_name RETURNING lower(n.pgmq_name)
          INTO v_name;
        DELETE FROM pgmq.partition_config c WHERE c.queue_name = OLD.queue_name;
        -- by PGMQ's name, or by pgqueue's (a name recorded before its views were renamed)
        FOR v_view IN SELECT DISTINCT p || '_' || n
                        FROM unnest(ARRAY['q', 'a']) p, unnest(ARRAY[v_name, lower(OLD.queue_name)]) n
                       WHERE n IS NOT NULL
        LOOP
            IF to_regclass(format('pgmq.%I', v_view)) IS NOT NULL THEN
                EXECUTE format('DROP VIEW pgmq.%I', v_view);
            END IF;
        END LOOP;
    END IF;
    RETURN NULL;
END
$$;

CREATE TRIGGER pgmq_views
    AFTER INSERT OR DELETE ON pgqueue.queue
    FOR EACH ROW EXECUTE FUNCTION pgmq._sync_views();

-- A name recorded for a queue whose views already exist (a reinstall puts
-- the rows back after this file ran): the views take PGMQ's names.
CREATE FUNCTION pgmq._rename_views() RETURNS trigger
LANGUAGE plpgsql
SECURITY DEFINER SET search_path = pg_catalog, pgqueue, pg_temp
AS $$
BEGIN
    IF lower(NEW.pgmq_name) <> NEW.queue_name
       AND to_regclass(format('pgmq.%I', 'q_' || NEW.queue_name)) IS NOT NULL
       AND to_regclass(format('pgmq.%I', 'q_' || lower(NEW.pgmq_name))) IS NULL THEN
        EXECUTE format('ALTER VIEW pgmq.%I RENAME TO %I', 'q_' || NEW.queue_name, 'q_' || lower(NEW.pgmq_name));
        EXECUTE format('ALTER VIEW pgmq.%I RENAME TO %I', 'a_' || NEW.queue_name, 'a_' || lower(NEW.pgmq_name));
    END IF;
    RETURN NULL;
END
$$;

CREATE TRIGGER rename_views
    AFTER INSERT ON pgmq.queue_name_map
    FOR EACH ROW EXECUTE FUNCTION pgmq._rename_views();

SELECT pgmq._create_views(q.queue_id, q.queue_name) FROM pgqueue.queue q ORDER BY q.queue_id;

-- PGMQ's list of queues. pgqueue has no unlogged queues.
CREATE VIEW pgmq.meta AS
    SELECT coalesce(n.pgmq_name, q.queue_name)::varchar AS queue_name, pgmq._is_partitioned(q.queue_name) AS is_partitioned,
           false AS is_unlogged, q.created_at
      FROM pgqueue.queue q LEFT JOIN pgmq.queue_name_map n ON n.queue_name = q.queue_name;
COMMENT ON VIEW pgmq.meta IS 'pgqueue''s queues, as PGMQ lists them (read-only; the pgmq facade, docs/pgmq.md)';
SELECT pgmq._publish_view('meta');

------------------------------------------------------------------------------
-- Queues
------------------------------------------------------------------------------

-- Creates the queue unless it exists; an existing queue, whichever API made
-- it, is left as it is (its max_attempts kept). A new one never poison-drops,
-- as PGMQ never does: max_attempts = 2147483647. PGMQ's name of it is
-- recorded first, where it differs, so its views are made with that name.
--
-- One pgqueue queue, one PGMQ name. pgmq._name keeps 8 hex digits of an md5,
-- so two names PGMQ tells apart can map to one pgqueue queue (a pair is found
-- in about 2^16 tries), and the second would be handed the first's messages:
-- a name whose queue exists is refused (42P07), changing nothing, unless it
-- is the name the queue holds, compared as PGMQ compares them (lowercased).
-- A queue no name was recorded for (made by pgqueue.create_queue, moved by
-- an import of some queues, or kept while the facade was uninstalled, which
-- takes its names with it) is claimed by the first name created for it, and
-- recorded: a reinstalled facade's clients (Celery's pidbox queues) find
-- their queues again. The lock serializes the facade's creates and drops of
-- one pgqueue queue, so of two names racing for it one wins, the other is
-- told.
CREATE FUNCTION pgmq._create(queue_name text) RETURNS void
LANGUAGE plpgsql
SECURITY DEFINER SET search_path = pg_catalog, pgqueue, pg_temp
AS $$
DECLARE
    v_name text := pgmq._name(queue_name);
    v_held text;  -- the PGMQ name recorded for the queue, if any
BEGIN
    PERFORM pgmq._check_name(queue_name);
    PERFORM pgmq.acquire_queue_lock(v_name);
    SELECT n.pgmq_name INTO v_held
      FROM pgqueue.queue q LEFT JOIN pgmq.queue_name_map n ON n.queue_name = q.queue_name
     WHERE q.queue_name = v_name;
    IF NOT FOUND THEN
        -- a name recorded by hand for a queue that does not exist names nothing
        DELETE FROM pgmq.queue_name_map n WHERE n.queue_name = v_name;
    ELSIF v_held IS NOT NULL AND lower(v_held) <> lower(_create.queue_name) THEN
        RAISE EXCEPTION 'queue name % maps to pgqueue queue %, which holds PGMQ queue %: use another name',
            quote_literal(_create.queue_name), quote_literal(v_name), quote_literal(v_held)
            USING ERRCODE = '42P07',
                  HINT = 'A name pgqueue cannot hold as it is maps to a queue named after 39 of its characters'
                         ' and 8 hex digits of its md5, and two names can map to one (docs/pgmq.md).';
    END IF;
    IF _create.queue_name <> v_name THEN
        INSERT INTO pgmq.queue_name_map (queue_name, pgmq_name) VALUES (v_name, _create.queue_name)
        ON CONFLICT ON CONSTRAINT queue_name_map_pkey DO NOTHING;
    END IF;
    IF NOT EXISTS (SELECT 1 FROM pgqueue.queue q WHERE q.queue_name = v_name) THEN
        PERFORM pgqueue.create_queue(v_name, max_attempts => 2147483647);
    ELSE
        -- what PGMQ's CREATE ... IF NOT EXISTS print for a queue that exists
        RAISE NOTICE 'relation "%" already exists, skipping', lower('q_' || queue_name);
        RAISE NOTICE 'relation "%" already exists, skipping', lower('a_' || queue_name);
        RAISE NOTICE 'relation "%" already exists, skipping', lower('q_' || queue_name) || '_vt_idx';
        RAISE NOTICE 'relation "%" already exists, skipping', 'archived_at_idx_' || queue_name;
    END IF;
END
$$;

-- The creates check as PGMQ's do, in PGMQ's order and on the lines of
-- PGMQ's (so an error prints PGMQ's text and CONTEXT): the name's characters
-- (format_table_name, declaring the table names), then its length
-- (validate_queue_name); then pgmq._create.
CREATE FUNCTION pgmq.create(queue_name text) RETURNS void
LANGUAGE plpgsql
SECURITY DEFINER SET search_path = pg_catalog, pgqueue, pg_temp
AS $$
BEGIN
    PERFORM pgmq.create_non_partitioned(queue_name);
END
$$;

CREATE FUNCTION pgmq.create_non_partitioned(queue_name text) RETURNS void
LANGUAGE plpgsql
SECURITY DEFINER SET search_path = pg_catalog, pgqueue, pg_temp
AS $$
DECLARE
    qtable text := pgmq.format_table_name(queue_name, 'q');
    atable text := pgmq.format_table_name(queue_name, 'a');
    -- the names of the queue's views
BEGIN
    PERFORM pgmq.validate_queue_name(queue_name);
    PERFORM pgmq._create(queue_name);
END
$$;

-- pgqueue's tables are logged: an unlogged queue is an ordinary one here,
-- as durable as any (more than asked).
CREATE FUNCTION pgmq.create_unlogged(queue_name text) RETURNS void
LANGUAGE plpgsql
SECURITY DEFINER SET search_path = pg_catalog, pgqueue, pg_temp
AS $$
DECLARE
    qtable text := pgmq.format_table_name(queue_name, 'q');
    atable text := pgmq.format_table_name(queue_name, 'a');
    -- the names of the queue's views
BEGIN
    PERFORM pgmq.validate_queue_name(queue_name);
    PERFORM pgmq._create(queue_name);
END
$$;

-- Drops the queue with its messages, archive and poison; false (and a
-- NOTICE) when there is no such queue.
CREATE FUNCTION pgmq.drop_queue(queue_name text) RETURNS boolean
LANGUAGE plpgsql
SECURITY DEFINER SET search_path = pg_catalog, pgqueue, pg_temp
AS $$
DECLARE
    qtable text := pgmq.format_table_name(queue_name, 'q');  -- PGMQ's check of the characters
    v_name text := pgmq._name(queue_name);
BEGIN
    PERFORM pgmq.acquire_queue_lock(v_name);
    IF pgqueue.drop_queue(v_name) THEN
        RETURN true;
    END IF;
    RAISE NOTICE 'pgmq queue `%` does not exist', queue_name;
    RETURN false;
END
$$;

-- PGMQ's deprecated form; `partitioned` means nothing here. True, as PGMQ's
-- is, even when there was no such queue (the NOTICE says so).
CREATE FUNCTION pgmq.drop_queue(queue_name text, partitioned boolean) RETURNS boolean
LANGUAGE plpgsql
SECURITY DEFINER SET search_path = pg_catalog, pgqueue, pg_temp
AS $$
DECLARE
    qtable text := pgmq.format_table_name(queue_name, 'q');  -- PGMQ's check of the characters
BEGIN
    RAISE WARNING 'drop_queue(queue_name, partitioned) is deprecated and will be removed in PGMQ v2.0. Use drop_queue(queue_name) instead';
    PERFORM pgmq.drop_queue(queue_name);
    RETURN true;
END
$$;

CREATE FUNCTION pgmq.purge_queue(queue_name text) RETURNS bigint
LANGUAGE plpgsql
SECURITY DEFINER SET search_path = pg_catalog, pgqueue, pg_temp
AS $$
BEGIN
    RETURN pgqueue.purge_queue(pgmq._name(queue_name));
END
$$;

-- Deprecated by PGMQ and a no-op there too: an archive here is never part of
-- its queue's tables.
CREATE FUNCTION pgmq.detach_archive(queue_name text) RETURNS void
LANGUAGE plpgsql
AS $$
BEGIN
    RAISE WARNING 'detach_archive(queue_name) is deprecated and is a no-op. It will be removed in PGMQ v2.0. Archive tables are no longer member objects.';
END
$$;

-- pgqueue indexes every group (message_group_idx): nothing to create.
CREATE FUNCTION pgmq.create_fifo_index(queue_name text) RETURNS void
LANGUAGE plpgsql
SECURITY DEFINER SET search_path = pg_catalog, pgqueue, pg_temp
AS $$
BEGIN
    PERFORM pgqueue._queue(pgmq._name(queue_name));  -- PGQ01 for an unknown queue
END
$$;

CREATE FUNCTION pgmq.create_fifo_indexes_all() RETURNS void
LANGUAGE sql
AS $$
$$;

CREATE FUNCTION pgmq.list_queues() RETURNS SETOF pgmq.queue_record
LANGUAGE sql STABLE
SECURITY DEFINER SET search_path = pg_catalog, pgqueue, pg_temp
AS $$
    SELECT coalesce(n.pgmq_name, q.queue_name)::varchar, pgmq._is_partitioned(q.queue_name), false, q.created_at
      FROM pgqueue.queue q LEFT JOIN pgmq.queue_name_map n ON n.queue_name = q.queue_name
     ORDER BY q.queue_id;
$$;

-- total_messages is every msg_id the queue handed out (its sequence's
-- position), as PGMQ counts. default_partition_length is NULL for a queue
-- that is not partitioned, as PGMQ's; 0 for a partitioned one: no message
-- here waits in a default partition for pg_partman's maintenance.
CREATE FUNCTION pgmq.metrics(queue_name text) RETURNS pgmq.metrics_result
LANGUAGE plpgsql
SECURITY DEFINER SET search_path = pg_catalog, pgqueue, pg_temp
AS $$
DECLARE
    r pgmq.metrics_result;
BEGIN
    SELECT metrics.queue_name, m.queue_length, m.newest_msg_age_sec, m.oldest_msg_age_sec, m.total_messages,
           m.scrape_time, m.visible_length, CASE WHEN pgmq._is_partitioned(m.queue_name) THEN 0 END
      INTO r
      FROM pgqueue._metrics(pgqueue._queue(pgmq._name(metrics.queue_name))) m;
    RETURN r;
END
$$;

CREATE FUNCTION pgmq.metrics_all() RETURNS SETOF pgmq.metrics_result
LANGUAGE sql
SECURITY DEFINER SET search_path = pg_catalog, pgqueue, pg_temp
AS $$
    SELECT pgmq._pgmq_name(m.queue_name), m.queue_length, m.newest_msg_age_sec, m.oldest_msg_age_sec,
           m.total_messages, m.scrape_time, m.visible_length, CASE WHEN pgmq._is_partitioned(q.queue_name) THEN 0 END
      FROM pgqueue.queue q, LATERAL pgqueue._metrics(q) m
     ORDER BY q.queue_id;
$$;

------------------------------------------------------------------------------
-- Sending: through pgqueue.send and pgqueue.send_batch, the header
-- x-pgmq-group as the group key.
------------------------------------------------------------------------------

-- The six overloads of send, as PGMQ has them (SETOF bigint, one row).
CREATE FUNCTION pgmq.send(queue_name text, msg jsonb) RETURNS SETOF bigint
LANGUAGE plpgsql
SECURITY DEFINER SET search_path = pg_catalog, pgqueue, pg_temp
AS $$
BEGIN
    RETURN NEXT pgqueue.send(queue_name, coalesce(msg, 'null'));
END
$$;

CREATE FUNCTION pgmq.send(queue_name text, msg jsonb, headers jsonb) RETURNS SETOF bigint
LANGUAGE plpgsql
SECURITY DEFINER SET search_path = pg_catalog, pgqueue, pg_temp
AS $$
BEGIN
    RETURN NEXT pgqueue.send(queue_name, coalesce(msg, 'null'), headers, group_key => pgqueue._pgmq_group(headers ->> 'x-pgmq-group'));
END
$$;

CREATE FUNCTION pgmq.send(queue_name text, msg jsonb, delay integer) RETURNS SETOF bigint
LANGUAGE plpgsql
SECURITY DEFINER SET search_path = pg_catalog, pgqueue, pg_temp
AS $$
BEGIN
    RETURN NEXT pgqueue.send(queue_name, coalesce(msg, 'null'), delay => CASE WHEN delay < 0 THEN 0 ELSE delay END);
END
$$;

CREATE FUNCTION pgmq.send(queue_name text, msg jsonb, delay timestamptz) RETURNS SETOF bigint
LANGUAGE plpgsql
SECURITY DEFINER SET search_path = pg_catalog, pgqueue, pg_temp
AS $$
BEGIN
    RETURN NEXT pgqueue.send(queue_name, coalesce(msg, 'null'), delay => pgmq._delay_seconds(delay));
END
$$;

CREATE FUNCTION pgmq.send(queue_name text, msg jsonb, headers jsonb, delay integer) RETURNS SETOF bigint
LANGUAGE plpgsql
SECURITY DEFINER SET search_path = pg_catalog, pgqueue, pg_temp
AS $$
BEGIN
    RETURN NEXT pgqueue.send(queue_name, coalesce(msg, 'null'), headers, CASE WHEN delay < 0 THEN 0 ELSE delay END,
                             group_key => pgqueue._pgmq_group(headers ->> 'x-pgmq-group'));
END
$$;

CREATE FUNCTION pgmq.send(queue_name text, msg jsonb, headers jsonb, delay timestamptz) RETURNS SETOF bigint
LANGUAGE plpgsql
SECURITY DEFINER SET search_path = pg_catalog, pgqueue, pg_temp
AS $$
BEGIN
    RETURN NEXT pgqueue.send(queue_name, coalesce(msg, 'null'), headers, pgmq._delay_seconds(delay),
                             group_key => pgqueue._pgmq_group(headers ->> 'x-pgmq-group'));
END
$$;

-- PGMQ's checks of a batch, with its errors (P0001, its texts): msgs NULL
-- or empty, headers given but not one per message. The sends call it only
-- when one fails (the checks are inline), so a good batch pays nothing.
CREATE FUNCTION pgmq._validate_batch_params(msgs jsonb[], headers jsonb[]) RETURNS void
LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    -- each RAISE on the line of PGMQ's (5 and 11), for the CONTEXT psql prints
    IF msgs IS NULL OR array_length(msgs, 1) IS NULL THEN
        RAISE EXCEPTION 'msgs cannot be NULL or empty';
    END IF;

    -- headers, where given, one per message (an empty array counts
    -- as none given only when msgs is empty too: refused above)
    IF headers IS NOT NULL AND coalesce(array_length(headers, 1), 0) <> array_length(msgs, 1) THEN
        RAISE EXCEPTION 'headers array length (%) must match msgs array length (%)',
            coalesce(array_length(headers, 1), 0), array_length(msgs, 1);
    END IF;
END
$$;

-- A batch's bodies as pgqueue stores them: PGMQ stores a NULL body as SQL
-- NULL; here it is JSON null (None to a client).
CREATE FUNCTION pgmq._bodies(msgs jsonb[]) RETURNS jsonb[]
LANGUAGE sql IMMUTABLE
AS $$
    SELECT coalesce(array_replace(msgs, NULL, 'null'::jsonb), '{}');
$$;

-- One batch with headers, the ids in the order of msgs: each message's
-- x-pgmq-group header is its group key.
CREATE FUNCTION pgmq._send_many(queue_name text, msgs jsonb[], headers jsonb[], delay integer)
RETURNS SETOF bigint
LANGUAGE plpgsql
SECURITY DEFINER SET search_path = pg_catalog, pgqueue, pg_temp
AS $$
BEGIN
    IF msgs IS NULL OR cardinality(msgs) = 0 OR cardinality(headers) <> cardinality(msgs) THEN
        PERFORM pgmq._validate_batch_params(msgs, headers);
    END IF;
    RETURN QUERY
    SELECT * FROM pgqueue.send_batch(
               queue_name, pgmq._bodies(msgs), headers, CASE WHEN delay < 0 THEN 0 ELSE delay END,
               group_keys => CASE WHEN headers IS NOT NULL THEN
                                 ARRAY(SELECT pgqueue._pgmq_group(h ->> 'x-pgmq-group')
                                         FROM unnest(headers) WITH ORDINALITY AS u (h, i) ORDER BY u.i)
                             END);
END
$$;

-- The batches without headers go to pgqueue.send_batch directly.
CREATE FUNCTION pgmq.send_batch(queue_name text, msgs jsonb[]) RETURNS SETOF bigint
LANGUAGE plpgsql
SECURITY DEFINER SET search_path = pg_catalog, pgqueue, pg_temp
AS $$
BEGIN
    IF msgs IS NULL OR cardinality(msgs) = 0 THEN
        PERFORM pgmq._validate_batch_params(msgs, NULL);
    END IF;
    RETURN QUERY SELECT * FROM pgqueue.send_batch(queue_name, pgmq._bodies(msgs));
END
$$;

CREATE FUNCTION pgmq.send_batch(queue_name text, msgs jsonb[], headers jsonb[]) RETURNS SETOF bigint
LANGUAGE plpgsql
SECURITY DEFINER SET search_path = pg_catalog, pgqueue, pg_temp
AS $$
BEGIN
    RETURN QUERY SELECT * FROM pgmq._send_many(queue_name, msgs, headers, 0);
END
$$;

CREATE FUNCTION pgmq.send_batch(queue_name text, msgs jsonb[], delay integer) RETURNS SETOF bigint
LANGUAGE plpgsql
SECURITY DEFINER SET search_path = pg_catalog, pgqueue, pg_temp
AS $$
BEGIN
    IF msgs IS NULL OR cardinality(msgs) = 0 THEN
        PERFORM pgmq._validate_batch_params(msgs, NULL);
    END IF;
    RETURN QUERY SELECT * FROM pgqueue.send_batch(queue_name, pgmq._bodies(msgs), NULL, CASE WHEN delay < 0 THEN 0 ELSE delay END);
END
$$;

CREATE FUNCTION pgmq.send_batch(queue_name text, msgs jsonb[], delay timestamptz) RETURNS SETOF bigint
LANGUAGE plpgsql
SECURITY DEFINER SET search_path = pg_catalog, pgqueue, pg_temp
AS $$
BEGIN
    IF msgs IS NULL OR cardinality(msgs) = 0 THEN
        PERFORM pgmq._validate_batch_params(msgs, NULL);
    END IF;
    RETURN QUERY SELECT * FROM pgqueue.send_batch(queue_name, pgmq._bodies(msgs), NULL, pgmq._delay_seconds(delay));
END
$$;

CREATE FUNCTION pgmq.send_batch(queue_name text, msgs jsonb[], headers jsonb[], delay integer)
RETURNS SETOF bigint
LANGUAGE plpgsql
SECURITY DEFINER SET search_path = pg_catalog, pgqueue, pg_temp
AS $$
BEGIN
    RETURN QUERY SELECT * FROM pgmq._send_many(queue_name, msgs, headers, delay);
END
$$;

CREATE FUNCTION pgmq.send_batch(queue_name text, msgs jsonb[], headers jsonb[], delay timestamptz)
RETURNS SETOF bigint
LANGUAGE plpgsql
SECURITY DEFINER SET search_path = pg_catalog, pgqueue, pg_temp
AS $$
BEGIN
    RETURN QUERY SELECT * FROM pgmq._send_many(queue_name, msgs, headers, pgmq._delay_seconds(delay));
END
$$;

------------------------------------------------------------------------------
-- Reading: every read is pgqueue._take_by_name, checked and paused as pgqueue.read.
------------------------------------------------------------------------------

-- A read's qty: PGMQ's reads take it as a LIMIT, so a negative one is the
-- server's error for a negative LIMIT (2201W); NULL is refused (22004),
-- where PGMQ's LIMIT NULL would read every visible message.
CREATE FUNCTION pgmq._require_limit(qty integer) RETURNS void
LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF qty < 0 THEN
        RAISE EXCEPTION 'LIMIT must not be negative' USING ERRCODE = '2201W';
    END IF;
    PERFORM pgqueue._require_nonnegative('qty', qty);
END
$$;

-- Leases up to qty visible messages for vt seconds, those whose message
-- contains `conditional` when it is not '{}'. FIFO groups are honoured (at
-- most one message of a group, its oldest); a message past the queue's
-- max_attempts is poison-dropped (PGQ10 notice) instead of handed out.
CREATE FUNCTION pgmq.read(queue_name text, vt integer, qty integer, conditional jsonb DEFAULT '{}')
RETURNS SETOF pgmq.message_record
LANGUAGE plpgsql
SECURITY DEFINER SET search_path = pg_catalog, pgqueue, pg_temp
AS $$
BEGIN
    -- a negative vt is a lease that ends in the past, as in PGMQ (visible at once)
    IF qty IS NULL OR qty < 0 THEN
        PERFORM pgmq._require_limit(qty);
    END IF;
    RETURN QUERY SELECT * FROM pgqueue._take_by_name(queue_name, vt, qty, false, nullif(conditional, '{}'));
END
$$;

-- read, again every poll_interval_ms until it hands something out or
-- max_poll_seconds have passed (reading once more at the deadline). A paused
-- queue is waited on like an empty one (one PGQ11 notice), so a client's poll
-- loop does not spin; a resume ends the wait at the next round.
CREATE FUNCTION pgmq.read_with_poll(
    queue_name text,
    vt integer,
    qty integer,
    max_poll_seconds integer DEFAULT 5,
    poll_interval_ms integer DEFAULT 100,
    conditional jsonb DEFAULT '{}'
) RETURNS SETOF pgmq.message_record
LANGUAGE plpgsql
SECURITY DEFINER SET search_path = pg_catalog, pgqueue, pg_temp
AS $$
DECLARE
    q pgqueue.queue;
    v_conditional jsonb := nullif(conditional, '{}');
    v_deadline timestamptz;
    v_told boolean := false;
BEGIN
    -- a negative vt is a lease that ends in the past, as in PGMQ (visible at once)
    PERFORM pgmq._require_limit(qty);
    PERFORM pgqueue._require_nonnegative('max_poll_seconds', max_poll_seconds);
    PERFORM pgqueue._require_nonnegative('poll_interval_ms', poll_interval_ms);
    q := pgqueue._queue(pgmq._name(queue_name));
    v_deadline := clock_timestamp() + make_interval(secs => max_poll_seconds);
    LOOP
        IF q.paused_at IS NULL THEN
            RETURN QUERY SELECT * FROM pgqueue._take_by_name(q.queue_name, vt, qty, false, v_conditional);
            EXIT WHEN FOUND;
        ELSIF NOT v_told THEN
            PERFORM pgqueue._notice_paused(q);
            v_told := true;
        END IF;
        EXIT WHEN clock_timestamp() >= v_deadline;
        PERFORM pg_sleep(least(greatest(poll_interval_ms, 1) / 1000.0,
                               extract(epoch FROM v_deadline - clock_timestamp())));
        q := pgqueue._queue(q.queue_name);  -- a pause or resume since; PGQ01 once dropped
    END LOOP;
END
$$;

-- Removes and returns up to qty visible messages (FIFO groups honoured), as
-- they were: PGMQ's pop does not count itself as a read (pgqueue's does,
-- which is what _take returns, so the count is taken back here).
CREATE FUNCTION pgmq.pop(queue_name text, qty integer DEFAULT 1)
RETURNS SETOF pgmq.message_record
LANGUAGE plpgsql
SECURITY DEFINER SET search_path = pg_catalog, pgqueue, pg_temp
AS $$
BEGIN
    IF qty IS NULL OR qty < 0 THEN
        PERFORM pgmq._require_limit(qty);
    END IF;
    RETURN QUERY
    SELECT t.msg_id, t.read_ct - 1, t.enqueued_at, t.last_read_at, t.vt, t.message, t.headers
      FROM pgqueue._take_by_name(queue_name, 0, qty, true) t;
END
$$;

------------------------------------------------------------------------------
-- Acks and leases
------------------------------------------------------------------------------

CREATE FUNCTION pgmq.delete(queue_name text, msg_id bigint) RETURNS boolean
LANGUAGE plpgsql
SECURITY DEFINER SET search_path = pg_catalog, pgqueue, pg_temp
AS $$
BEGIN
    RETURN coalesce(pgqueue._remove(queue_name, msg_id, false), pgqueue.delete(queue_name, msg_id));
END
$$;

CREATE FUNCTION pgmq.delete(queue_name text, msg_ids bigint[]) RETURNS SETOF bigint
LANGUAGE plpgsql
SECURITY DEFINER SET search_path = pg_catalog, pgqueue, pg_temp
AS $$
BEGIN
    RETURN QUERY SELECT pgqueue.delete(pgmq._name(queue_name), msg_ids);
END
$$;

CREATE FUNCTION pgmq.archive(queue_name text, msg_id bigint) RETURNS boolean
LANGUAGE plpgsql
SECURITY DEFINER SET search_path = pg_catalog, pgqueue, pg_temp
AS $$
BEGIN
    RETURN coalesce(pgqueue._remove(queue_name, msg_id, true), pgqueue.archive(queue_name, msg_id));
END
$$;

CREATE FUNCTION pgmq.archive(queue_name text, msg_ids bigint[]) RETURNS SETOF bigint
LANGUAGE plpgsql
SECURITY DEFINER SET search_path = pg_catalog, pgqueue, pg_temp
AS $$
BEGIN
    RETURN QUERY SELECT pgqueue.archive(pgmq._name(queue_name), msg_ids);
END
$$;

-- PGMQ's set_vt: unfenced (it changes the lease of whoever holds the message
-- now), any time, past ones included (the message is then visible at once;
-- pgqueue's message_backdated trigger lists it for the reads). The messages
-- are locked in msg_id order, as every multi-row write of pgqueue's locks
-- (in any other order two such writes could deadlock); missing ids are
-- skipped.
CREATE FUNCTION pgmq.set_vt(queue_name text, msg_ids bigint[], vt timestamptz)
RETURNS SETOF pgmq.message_record
LANGUAGE plpgsql
SECURITY DEFINER SET search_path = pg_catalog, pgqueue, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    q pgqueue.queue := pgqueue._queue(pgmq._name(set_vt.queue_name));
    v_tids tid[];
BEGIN
    IF set_vt.vt IS NULL THEN
        RAISE EXCEPTION 'vt must not be NULL' USING ERRCODE = '22004';
    END IF;
    v_tids := ARRAY(
        SELECT (SELECT m.ctid FROM pgqueue.message m
                 WHERE m.queue_id = q.queue_id AND m.msg_id = u.id AND pgqueue._keyed(m.read_ct, m.vt, m.enqueued_at, m.group_key) FOR UPDATE)
          FROM (SELECT DISTINCT i FROM unnest(set_vt.msg_ids) AS i ORDER BY i) AS u (id));
    RETURN QUERY
    UPDATE pgqueue.message m SET vt = set_vt.vt
     WHERE m.ctid = ANY (v_tids)
    RETURNING m.msg_id, m.read_ct, m.enqueued_at, m.last_read_at, m.vt, m.message, m.headers;
END
$$;

CREATE FUNCTION pgmq.set_vt(queue_name text, msg_ids bigint[], vt integer)
RETURNS SETOF pgmq.message_record
LANGUAGE plpgsql
SECURITY DEFINER SET search_path = pg_catalog, pgqueue, pg_temp
AS $$
BEGIN
    RETURN QUERY
    SELECT * FROM pgmq.set_vt(queue_name, msg_ids, clock_timestamp() + make_interval(secs => vt));
END
$$;

CREATE FUNCTION pgmq.set_vt(queue_name text, msg_id bigint, vt timestamptz)
RETURNS SETOF pgmq.message_record
LANGUAGE plpgsql
SECURITY DEFINER SET search_path = pg_catalog, pgqueue, pg_temp
AS $$
BEGIN
    RETURN QUERY SELECT * FROM pgmq.set_vt(queue_name, ARRAY[msg_id], vt);
END
$$;

CREATE FUNCTION pgmq.set_vt(queue_name text, msg_id bigint, vt integer)
RETURNS SETOF pgmq.message_record
LANGUAGE plpgsql
SECURITY DEFINER SET search_path = pg_catalog, pgqueue, pg_temp
AS $$
BEGIN
    RETURN QUERY
    SELECT * FROM pgmq.set_vt(queue_name, ARRAY[msg_id], clock_timestamp() + make_interval(secs => vt));
END
$$;

------------------------------------------------------------------------------
-- Notify on insert: pgqueue.queue.notify_channel set to PGMQ's channel, so
-- every send (of either API) notifies it, at most once per
-- notify_throttle_ms (0: every send).
------------------------------------------------------------------------------

-- The notify functions check as PGMQ's do, with its errors (P0001, its
-- texts) and its notice for a queue that did not notify.
CREATE FUNCTION pgmq.enable_notify_insert(queue_name text, throttle_interval_ms integer DEFAULT 250)
RETURNS void
LANGUAGE plpgsql
SECURITY DEFINER SET search_path = pg_catalog, pgqueue, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    q pgqueue.queue;
BEGIN
    IF enable_notify_insert.throttle_interval_ms < 0 THEN
        RAISE EXCEPTION 'throttle_interval_ms must be non-negative';
    END IF;
    PERFORM pgqueue._require_nonnegative('throttle_interval_ms', enable_notify_insert.throttle_interval_ms);
    IF NOT EXISTS (SELECT 1 FROM pgqueue.queue WHERE queue_name = pgmq._name(enable_notify_insert.queue_name)) THEN
        RAISE EXCEPTION 'Queue "%" does not exist. Create it first using pgmq.create()', enable_notify_insert.queue_name;
    END IF;
    PERFORM pgmq.disable_notify_insert(enable_notify_insert.queue_name);
    UPDATE pgqueue.queue
       SET notify_channel = pgmq._channel(pgmq._pgmq_name(queue_name)),
           notify_throttle_ms = enable_notify_insert.throttle_interval_ms
     WHERE queue_name = pgmq._name(enable_notify_insert.queue_name)
    RETURNING * INTO q;
    DELETE FROM pgqueue.notify_sent WHERE queue_id = q.queue_id;  -- the next send notifies
END
$$;

CREATE FUNCTION pgmq.update_notify_insert(queue_name text, throttle_interval_ms integer)
RETURNS void
LANGUAGE plpgsql
SECURITY DEFINER SET search_path = pg_catalog, pgqueue, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    q pgqueue.queue;
BEGIN
    IF update_notify_insert.throttle_interval_ms < 0 THEN
        RAISE EXCEPTION 'throttle_interval_ms must be non-negative, got: %', update_notify_insert.throttle_interval_ms;
    END IF;
    PERFORM pgqueue._require_nonnegative('throttle_interval_ms', update_notify_insert.throttle_interval_ms);
    SELECT * INTO q FROM pgqueue.queue WHERE queue_name = pgmq._name(update_notify_insert.queue_name);
    IF NOT FOUND THEN
        RAISE EXCEPTION 'Queue "%" does not exist. Create the queue first using pgmq.create()',
            update_notify_insert.queue_name;
    END IF;
    UPDATE pgqueue.queue SET notify_throttle_ms = update_notify_insert.throttle_interval_ms
     WHERE queue_id = q.queue_id AND notify_channel IS NOT NULL;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'Queue "%" does not have notify_insert enabled. Enable it first using pgmq.enable_notify_insert()',
            update_notify_insert.queue_name;
    END IF;
    DELETE FROM pgqueue.notify_sent WHERE queue_id = q.queue_id;
END
$$;

CREATE FUNCTION pgmq.disable_notify_insert(queue_name text) RETURNS void
LANGUAGE plpgsql
SECURITY DEFINER SET search_path = pg_catalog, pgqueue, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    q pgqueue.queue;
BEGIN
    SELECT * INTO q FROM pgqueue.queue WHERE queue_name = pgmq._name(disable_notify_insert.queue_name);
    IF NOT FOUND THEN
        -- what PGMQ's DROP TRIGGER IF EXISTS prints for a table that does not exist
        RAISE NOTICE 'relation "%" does not exist, skipping', 'pgmq.' || lower('q_' || disable_notify_insert.queue_name);
        RETURN;
    END IF;
    UPDATE pgqueue.queue SET notify_channel = NULL, notify_throttle_ms = 0
     WHERE queue_id = q.queue_id AND notify_channel IS NOT NULL;
    IF NOT FOUND THEN
        -- what PGMQ's DROP TRIGGER IF EXISTS prints
        RAISE NOTICE 'trigger "trigger_notify_queue_insert_listeners" for relation "%" does not exist, skipping',
            'pgmq.' || lower('q_' || disable_notify_insert.queue_name);
    END IF;
    DELETE FROM pgqueue.notify_sent WHERE queue_id = q.queue_id;
END
$$;

-- last_notified_at is the epoch until a throttled queue's first notification
-- (an unthrottled queue keeps no time), as PGMQ shows it.
CREATE FUNCTION pgmq.list_notify_insert_throttles()
RETURNS TABLE (queue_name text, throttle_interval_ms integer, last_notified_at timestamptz)
LANGUAGE sql STABLE
SECURITY DEFINER SET search_path = pg_catalog, pgqueue, pg_temp
AS $$
    SELECT pgmq._pgmq_name(q.queue_name) AS queue_name, q.notify_throttle_ms,
           coalesce(n.sent_at, to_timestamp(0))
      FROM pgqueue.queue q LEFT JOIN pgqueue.notify_sent n ON n.queue_id = q.queue_id
     WHERE q.notify_channel IS NOT NULL
     ORDER BY 1;
$$;

-- PGMQ's table of the queues that notify, which its tests and tools read:
-- a read-only view of the same rows.
CREATE VIEW pgmq.notify_insert_throttle AS
    SELECT t.queue_name::varchar AS queue_name, t.throttle_interval_ms, t.last_notified_at
      FROM pgmq.list_notify_insert_throttles() t;
COMMENT ON VIEW pgmq.notify_insert_throttle IS
    'pgqueue''s queues that notify on insert, as PGMQ keeps them (read-only; the pgmq facade, docs/pgmq.md)';

------------------------------------------------------------------------------
-- Privileges: the facade's rows of pgqueue.role_grant, the one role model
------------------------------------------------------------------------------

-- Each function by name (every overload), each relation by name: the roles
-- that may call or read it, as for pgqueue's functions that do the same
-- (docs/security.md, "The one role model"): sends are everyone's; reads,
-- acks and set_vt the consumer's alone (not the operator's, which may not
-- ack or complete a barrier's member); queue administration the operator's;
-- the queue and archive views the operator's alone (reading them is a peek);
-- the queue list and metrics the consumer's and the operator's. Internal
-- functions (`_` names) are granted to no one. The topics' rows are in
-- 20_topics.sql. pgqueue.grant_roles() applies them, with pgqueue's own.
DELETE FROM pgqueue.role_grant WHERE object LIKE 'pgmq.%';
INSERT INTO pgqueue.role_grant (object, roles, kind)
SELECT 'pgmq.' || f, r, 'function'
  FROM (VALUES
        ('{pgqueue_producer,pgqueue_consumer,pgqueue_operator}'::text[],
         ARRAY['send', 'send_batch', 'format_table_name', 'validate_queue_name']),
        ('{pgqueue_consumer}', ARRAY['read', 'read_with_poll', 'pop', 'delete', 'archive', 'set_vt']),
        ('{pgqueue_consumer,pgqueue_operator}',
         ARRAY['list_queues', 'metrics', 'metrics_all', 'list_notify_insert_throttles']),
        ('{pgqueue_operator}', ARRAY['create', 'create_non_partitioned', 'create_unlogged', 'detach_archive',
                                     'drop_queue', 'purge_queue',
                                     'enable_notify_insert', 'disable_notify_insert', 'update_notify_insert',
                                     'create_fifo_index', 'create_fifo_indexes_all', 'acquire_queue_lock'])
       ) AS a (r, fs), unnest(a.fs) AS f;
INSERT INTO pgqueue.role_grant (object, roles, kind) VALUES
    ('pgmq.meta', '{pgqueue_consumer,pgqueue_operator}', 'relation'),
    ('pgmq.notify_insert_throttle', '{pgqueue_consumer,pgqueue_operator}', 'relation'),
    ('pgmq.q_*', '{pgqueue_operator}', 'relation'),
    ('pgmq.a_*', '{pgqueue_operator}', 'relation'),
    ('pgmq.queue_name_map', '{}', 'relation'),
    ('pgmq.partition_config', '{}', 'relation');
SELECT pgmq._publish_view('notify_insert_throttle');
SELECT pgqueue.grant_roles();
