-- pgqueue's pgmq facade, part 2: PGMQ's partitioned queues and archives
-- (create_partitioned, convert_archive_partitioned) and their retention.
-- Applied after 10_facade.sql, by `pgqueue pgmq install` and in the
-- extension's script.
--
-- In PGMQ a partitioned queue is a table pg_partman splits by msg_id (a whole
-- number as partition_interval: that many ids a partition) or by time (an
-- interval: enqueued_at for the queue, archived_at for its archive), and its
-- maintenance drops every partition past retention_interval, with the
-- messages in it, read or not. Here such a queue is an ordinary pgqueue
-- queue, its messages in pgqueue's one table like every queue's, so pgqueue's
-- guarantees (fencing, poison drops, barrier counting) hold for it; what
-- create_partitioned asked pg_partman to keep is a row of
-- pgmq.partition_config, and pgmq.run_maintenance() keeps it: it removes
-- what pg_partman's maintenance would drop, partition for partition, drawing
-- the partitions where pg_partman draws them:
--   * by msg_id: partition k holds ids [k*n, (k+1)*n); it goes when
--     retention <= max - (k+1)*n, max the table's highest msg_id (the live
--     messages' for the queue, the archived ones' for the archive), so the
--     ids below floor((max - retention) / n) * n go;
--   * by time: partitions start at the anchor (the creation time truncated
--     to the year, month, day, hour or minute, by the interval's size) and
--     step by the interval; one goes when its end is before now - retention.
-- What differs, and why (docs/pgmq.md): a live message past retention is
-- poison-dropped (pgqueue.poison, reason 'retention'), not deleted, so a
-- barrier it belongs to counts it as failed and never waits for it; and the
-- partitions themselves (pg_partman's part_config rows, the child tables,
-- relkind 'p') do not exist.
--
-- pg_partman is asked for as PGMQ asks for it (create_partitioned raises
-- PGMQ's error without it), but not used: its background worker or a cron
-- job runs partman.run_maintenance(); a partitioned queue here needs
-- pgmq.run_maintenance() scheduled the same way (docs/pgmq.md).

-- What PGMQ raises for a partitioned queue on a database without pg_partman.
CREATE FUNCTION pgmq._ensure_pg_partman_installed() RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_extension e WHERE e.extname = 'pg_partman') THEN
        RAISE EXCEPTION 'pg_partman is required for partitioned queues';
    END IF;
END
$$;

-- True when partition_interval counts msg_ids (a whole number), false when
-- it is a time interval: PGMQ's choice of partition column.
CREATE FUNCTION pgmq._by_msg_id(partition_interval text) RETURNS boolean
LANGUAGE plpgsql IMMUTABLE
AS $$
BEGIN
    PERFORM partition_interval::integer;
    RETURN true;
EXCEPTION WHEN others THEN
    RETURN false;
END
$$;

-- Checks an interval and its retention as pg_partman would take them: a
-- positive whole number with a whole-number retention, or a positive time
-- interval with an interval retention (NULL: kept for ever). 22023 naming
-- the argument otherwise.
CREATE FUNCTION pgmq._check_partitions(partition_interval text, retention_interval text) RETURNS void
LANGUAGE plpgsql IMMUTABLE
AS $$
DECLARE
    v_by_id boolean := pgmq._by_msg_id(partition_interval);
    v_ok boolean;
    v_hint text := 'A whole number partitions by msg_id (and its retention is a number of msg_ids); an'
                   ' interval such as ''1 day'' partitions by time (and its retention is an interval).';
BEGIN
    BEGIN
        v_ok := CASE WHEN v_by_id THEN partition_interval::bigint > 0
                     ELSE partition_interval::interval > interval '0' END;
    EXCEPTION WHEN data_exception THEN
        v_ok := false;
    END;
    IF v_ok IS NOT TRUE THEN
        RAISE EXCEPTION 'partition_interval % is neither a positive whole number nor a positive interval',
            quote_nullable(partition_interval) USING ERRCODE = '22023', HINT = v_hint;
    END IF;
    BEGIN
        v_ok := retention_interval IS NULL
                OR CASE WHEN v_by_id THEN retention_interval::bigint >= 0
                        ELSE retention_interval::interval >= interval '0' END;
    EXCEPTION WHEN data_exception THEN
        v_ok := false;
    END;
    IF v_ok IS NOT TRUE THEN
        RAISE EXCEPTION 'retention_interval % does not go with partition_interval %: want %',
            quote_nullable(retention_interval), quote_nullable(partition_interval),
            CASE WHEN v_by_id THEN 'a whole number of msg_ids, 0 or more' ELSE 'an interval, 0 or more' END
            USING ERRCODE = '22023', HINT = v_hint;
    END IF;
END
$$;

-- Where pg_partman starts a time partition set made at `at`: `at` truncated
-- to the year, month, day, hour or minute, by the interval's size (`at`
-- itself for msg_id partitions, which start at 0 whenever made).
CREATE FUNCTION pgmq._anchor(partition_interval text, at timestamptz) RETURNS timestamptz
LANGUAGE plpgsql STABLE
AS $$
DECLARE
    step interval;
BEGIN
    IF pgmq._by_msg_id(partition_interval) THEN
        RETURN at;
    END IF;
    step := partition_interval::interval;
    RETURN date_trunc(CASE WHEN step >= interval '1 year' THEN 'year'
                           WHEN step >= interval '1 month' THEN 'month'
                           WHEN step >= interval '1 day' THEN 'day'
                           WHEN step >= interval '1 hour' THEN 'hour'
                           ELSE 'minute' END, at);
END
$$;

-- The start of the oldest time partition pg_partman's retention keeps at
-- `at`: the first boundary (anchor + k * step) at or after at - keep - step.
-- Everything older is past retention. Month-long steps count in months.
CREATE FUNCTION pgmq._time_cut(anchor timestamptz, step interval, keep interval, at timestamptz)
RETURNS timestamptz
LANGUAGE plpgsql STABLE
AS $$
DECLARE
    v_edge timestamptz := at - keep - step;
    v_months integer := extract(year FROM step)::integer * 12 + extract(month FROM step)::integer;
    v_k bigint;
BEGIN
    IF v_months > 0 AND step = make_interval(months => v_months) THEN
        v_k := floor(((extract(year FROM v_edge) - extract(year FROM anchor)) * 12
                      + extract(month FROM v_edge) - extract(month FROM anchor)) / v_months)::bigint - 1;
    ELSE
        v_k := floor(extract(epoch FROM v_edge - anchor) / extract(epoch FROM step))::bigint - 1;
    END IF;
    -- from a boundary just below the edge, up to the first at or after it
    WHILE anchor + step * v_k < v_edge LOOP
        v_k := v_k + 1;
    END LOOP;
    RETURN anchor + step * v_k;
END
$$;

-- The lowest msg_id pg_partman's retention keeps in a table whose highest is
-- max_id, partitions holding `step` ids: floor((max - keep) / step) * step
-- (0 at least: the first partition starts at 0).
-- 0 (nothing goes) for an empty table.
CREATE FUNCTION pgmq._id_cut(max_id bigint, step bigint, keep bigint) RETURNS bigint
LANGUAGE sql IMMUTABLE
AS $$
    SELECT greatest(floor((max_id - keep)::numeric / step) * step, 0)::bigint;
$$;

-- PGMQ's checks, in its order and on its lines: the name's characters
-- (declaring the views' names), its length, the lock, pg_partman (without
-- it, PGMQ's error), premake; then the intervals as pg_partman takes them.
-- Creates the queue as pgmq.create does and records its partitions and
-- retention, for it and for its archive. On a queue that exists: its
-- retention is recorded if none was (a queue whose archive alone was
-- converted keeps the archive's), else left as it is.
CREATE FUNCTION pgmq.create_partitioned(
    queue_name text,
    partition_interval text DEFAULT '10000',
    retention_interval text DEFAULT '100000',
    premake integer DEFAULT 4
) RETURNS void
LANGUAGE plpgsql
SECURITY DEFINER SET search_path = pg_catalog, pgqueue, pg_temp
AS $$
DECLARE
    -- each of PGMQ's checks on PGMQ's line, so its errors print PGMQ's
    -- context: the name's characters (line 5), ...
    qtable text := pgmq.format_table_name(queue_name, 'q');
    atable text := pgmq.format_table_name(queue_name, 'a');
    v_name text := pgmq._name(queue_name);
    v_anchor timestamptz;
    -- ... then its length (line 11), the lock, pg_partman (line 13), premake
BEGIN
    PERFORM pgmq.validate_queue_name(queue_name);
    PERFORM pgmq.acquire_queue_lock(queue_name);
    PERFORM pgmq._ensure_pg_partman_installed();
    IF premake < 1 THEN
        RAISE EXCEPTION 'premake must be at least 1, got %', premake;
    END IF;
    PERFORM pgmq._check_partitions(partition_interval, retention_interval);
    PERFORM pgmq._create(queue_name);
    v_anchor := pgmq._anchor(partition_interval, now());
    INSERT INTO pgmq.partition_config AS c (queue_name, partition_interval, retention_interval, premake,
                                            archive_interval, archive_retention, anchor)
    VALUES (v_name, create_partitioned.partition_interval, create_partitioned.retention_interval,
            create_partitioned.premake, create_partitioned.partition_interval,
            create_partitioned.retention_interval, v_anchor)
    ON CONFLICT ON CONSTRAINT partition_config_pkey DO UPDATE
       SET partition_interval = excluded.partition_interval, retention_interval = excluded.retention_interval,
           premake = excluded.premake
     WHERE c.partition_interval IS NULL;
END
$$;

-- PGMQ's outcomes: a queue that does not exist is a NOTICE (PGMQ's words,
-- its stray 's' included), as is an archive already partitioned; without
-- pg_partman PGMQ fails where it asks for pg_partman's schema (22004), after
-- its notice for an index name too long to keep; a name whose archive index
-- would be cut to itself fails as PGMQ's rename of it does (42P07).
-- Otherwise the archive's retention is recorded.
CREATE FUNCTION pgmq.convert_archive_partitioned(
    table_name text,
    partition_interval text DEFAULT '10000',
    retention_interval text DEFAULT '100000',
    leading_partition integer DEFAULT 10
) RETURNS void
LANGUAGE plpgsql
SECURITY DEFINER SET search_path = pg_catalog, pgqueue, pg_temp
AS $$
DECLARE
    a_table_name text := pgmq.format_table_name(table_name, 'a');
    v_name text := pgmq._name(table_name);
    v_index text := 'archived_at_idx_' || table_name;
BEGIN
    IF EXISTS (SELECT 1 FROM pgmq.partition_config c WHERE c.queue_name = v_name) THEN
        RAISE NOTICE 'Table %s is already partitioned', a_table_name;
        RETURN;
    END IF;
    IF NOT EXISTS (SELECT 1 FROM pgqueue.queue q WHERE q.queue_name = v_name) THEN
        RAISE NOTICE 'Table %s does not exists', a_table_name;
        RETURN;
    END IF;
    IF left(v_index || '_old', 63) <> v_index THEN
        IF octet_length(v_index || '_old') > 63 THEN
            RAISE NOTICE 'identifier "%" will be truncated to "%"', v_index || '_old', left(v_index || '_old', 63);
        END IF;
        IF NOT EXISTS (SELECT 1 FROM pg_extension e WHERE e.extname = 'pg_partman') THEN
            RAISE EXCEPTION 'null values cannot be formatted as an SQL identifier' USING ERRCODE = '22004';
        END IF;
        PERFORM pgmq._check_partitions(partition_interval, retention_interval);
        INSERT INTO pgmq.partition_config (queue_name, archive_interval, archive_retention, anchor)
        VALUES (v_name, convert_archive_partitioned.partition_interval,
                convert_archive_partitioned.retention_interval,
                pgmq._anchor(convert_archive_partitioned.partition_interval, now()));
        RETURN;
    END IF;
    -- A name of 47 characters: PGMQ renames the archive's index to its name
    -- and '_old', which Postgres cuts to 63 bytes, the index's own name, and
    -- fails. The same statement fails here the same way, on PGMQ's line (52),
    -- against a stand-in index that the failure rolls back with it.
    EXECUTE format('CREATE TABLE pgmq.%I (archived_at timestamptz)', 'convert_' || md5(v_index));
    EXECUTE format('CREATE INDEX %I ON pgmq.%I (archived_at)', v_index, 'convert_' || md5(v_index));
    -- (the empty comment lines keep the rename on PGMQ's line)
    --
    --
    --
    --
    --
    --
    --
    --
    --
    --
    --
    --
    --
    --
    --
    --
    EXECUTE 'ALTER INDEX pgmq.archived_at_idx_' || table_name || ' RENAME TO archived_at_idx_' || table_name || '_old';
END
$$;

-- Removes what pg_partman's maintenance would drop from the partitioned
-- queues and archives (of one queue, by PGMQ's or pgqueue's name, or of
-- all): up to qty rows of each a call, in short statements; the number
-- removed. Call it until it returns 0, or on a schedule (pg_cron, say) as
-- partman.run_maintenance() is called. A live message past retention is
-- poison-dropped with reason 'retention', so a barrier counts it as failed;
-- an archived one is deleted. Safe to run from many sessions at once: each
-- row is removed by one of them (locked rows are left to their holder).
CREATE FUNCTION pgmq.run_maintenance(queue_name text DEFAULT NULL, qty integer DEFAULT 10000) RETURNS bigint
LANGUAGE plpgsql
SECURITY DEFINER SET search_path = pg_catalog, pgqueue, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    c record;
    v_cut_id bigint;
    v_cut_at timestamptz;
    v_max bigint;
    v_now timestamptz := now();
    v_reason text;
    n bigint;
    v_total bigint := 0;
BEGIN
    PERFORM pgqueue._require_nonnegative('qty', run_maintenance.qty);
    IF run_maintenance.queue_name IS NOT NULL THEN
        PERFORM pgqueue._queue(pgmq._name(run_maintenance.queue_name));  -- PGMQ's error for an unknown queue
    END IF;
    FOR c IN
        SELECT p.*, q.queue_id
          FROM pgmq.partition_config p JOIN pgqueue.queue q ON q.queue_name = p.queue_name
         WHERE run_maintenance.queue_name IS NULL OR p.queue_name = pgmq._name(run_maintenance.queue_name)
         ORDER BY q.queue_id
    LOOP
        IF c.partition_interval IS NOT NULL THEN
            v_reason := format('retention: older than the queue''s retention_interval %s (pgmq.create_partitioned)',
                               quote_literal(c.retention_interval));
            IF pgmq._by_msg_id(c.partition_interval) THEN
                -- the highest live msg_id: one probe of each half of the key
                v_max := greatest(
                    (SELECT max(m.msg_id) FROM pgqueue.message m
                      WHERE m.queue_id = c.queue_id AND m.read_ct = 0 AND m.vt <= m.enqueued_at
                        AND m.group_key IS NULL),
                    (SELECT max(m.msg_id) FROM pgqueue.message m
                      WHERE m.queue_id = c.queue_id
                        AND (m.read_ct = 0 AND m.vt <= m.enqueued_at AND m.group_key IS NULL) IS NOT TRUE));
                v_cut_id := pgmq._id_cut(v_max, c.partition_interval::bigint, c.retention_interval::bigint);
                v_cut_at := NULL;
            ELSE
                v_cut_id := NULL;
                v_cut_at := pgmq._time_cut(c.anchor, c.partition_interval::interval,
                                           c.retention_interval::interval, v_now);
            END IF;
            IF v_cut_id IS NOT NULL OR v_cut_at IS NOT NULL THEN
                WITH doomed AS (
                    SELECT m.ctid FROM pgqueue.message m
                     WHERE m.queue_id = c.queue_id
                       AND pgqueue._keyed(m.read_ct, m.vt, m.enqueued_at, m.group_key)
                       AND (m.msg_id < v_cut_id OR m.enqueued_at < v_cut_at)
                     ORDER BY m.msg_id
                     LIMIT run_maintenance.qty
                       FOR UPDATE SKIP LOCKED
                ), gone AS (
                    DELETE FROM pgqueue.message m WHERE m.ctid = ANY (ARRAY(SELECT d.ctid FROM doomed d))
                    RETURNING m.*
                )
                INSERT INTO pgqueue.poison (queue_id, msg_id, read_ct, enqueued_at, poisoned_at, reason, message,
                                            headers, dedupe_key, group_key)
                SELECT g.queue_id, g.msg_id, g.read_ct, g.enqueued_at, v_now, v_reason, g.message, g.headers,
                       g.dedupe_key, g.group_key
                  FROM gone g;
                GET DIAGNOSTICS n = ROW_COUNT;
                v_total := v_total + n;
            END IF;
        END IF;
        IF pgmq._by_msg_id(c.archive_interval) THEN
            SELECT max(a.msg_id) INTO v_max FROM pgqueue.archive a WHERE a.queue_id = c.queue_id;
            v_cut_id := pgmq._id_cut(v_max, c.archive_interval::bigint, c.archive_retention::bigint);
            v_cut_at := NULL;
        ELSE
            v_cut_id := NULL;
            v_cut_at := pgmq._time_cut(c.anchor, c.archive_interval::interval, c.archive_retention::interval, v_now);
        END IF;
        IF v_cut_id IS NOT NULL OR v_cut_at IS NOT NULL THEN
            -- archived rows are never updated: a ctid found here still names its row
            DELETE FROM pgqueue.archive a
             WHERE a.ctid = ANY (ARRAY(
                   SELECT x.ctid FROM pgqueue.archive x
                    WHERE x.queue_id = c.queue_id AND (x.msg_id < v_cut_id OR x.archived_at < v_cut_at)
                    ORDER BY x.msg_id
                    LIMIT run_maintenance.qty
                      FOR UPDATE SKIP LOCKED));
            GET DIAGNOSTICS n = ROW_COUNT;
            v_total := v_total + n;
        END IF;
    END LOOP;
    RETURN v_total;
END
$$;

-- Rights, as pgqueue.role_grant says (10_facade.sql): queue administration
-- and its maintenance are the operator's.
INSERT INTO pgqueue.role_grant (object, roles, kind)
SELECT 'pgmq.' || f, '{pgqueue_operator}', 'function'
  FROM unnest(ARRAY['create_partitioned', 'convert_archive_partitioned', 'run_maintenance']) AS f;
SELECT pgqueue.grant_roles();
