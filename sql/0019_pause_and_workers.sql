-- pgqueue 0019: pausing a queue, the worker registry and per-minute rates
-- (the foundation of the dashboard, docs/design/dashboard.md).
--
-- Pausing: queue gains paused_at and paused_by; pause_queue and resume_queue
-- change them (one conditional UPDATE each: exactly one of two concurrent
-- calls reports the change), and resume wakes the queue's waiters with the
-- payload 'resumed'. read, read_with_poll and pop of a paused queue return no
-- rows with one NOTICE (PGQ11) before _take; sends, acks, nacks, lease
-- changes and completions are unaffected. list_queues and exporter_metrics
-- gain columns: their result types change, so they are dropped and created
-- again (grant_roles below grants them again).
--
-- The registry and the rates: sql/schema/workers.sql, whose header carries
-- the argument (an UNLOGGED table of workers upserted by their heartbeats;
-- sends per minute from samples of each queue's message sequence, acks, nacks
-- and poisons from the workers' tallies, all written in queue_id order).

ALTER TABLE pgqueue.queue ADD COLUMN paused_at timestamptz, ADD COLUMN paused_by text;

DROP FUNCTION pgqueue.list_queues();

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

-- Pauses the queue; true when this call paused it, false when it already was.
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
    UPDATE pgqueue.queue SET paused_at = clock_timestamp(), paused_by = pause_queue.actor
     WHERE queue_name = pause_queue.queue_name AND paused_at IS NULL;
    IF FOUND THEN
        RETURN true;
    END IF;
    PERFORM pgqueue._queue(pause_queue.queue_name);  -- raises PGQ01 when there is no such queue
    RETURN false;
END
$$;

-- Resumes the queue; true when this call resumed it (waking its waiters with
-- the payload 'resumed'), false when it was not paused.
CREATE FUNCTION pgqueue.resume_queue(queue_name text) RETURNS boolean
LANGUAGE plpgsql
SECURITY DEFINER SET search_path = pg_catalog, pgqueue, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    q pgqueue.queue;
BEGIN
    UPDATE pgqueue.queue SET paused_at = NULL, paused_by = NULL
     WHERE queue_name = resume_queue.queue_name AND paused_at IS NOT NULL
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

DROP FUNCTION pgqueue.exporter_metrics();

-- The exporter's figures, one row per queue (sql/0014_exporter_metrics.sql),
-- and whether the queue is paused.
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

-- A read of a paused queue says so (reads.sql).
CREATE FUNCTION pgqueue._notice_paused(q pgqueue.queue) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    RAISE NOTICE USING
        ERRCODE = 'PGQ11',
        MESSAGE = format('pgqueue: queue %s is paused, so reads return nothing; resume it with'
                         ' `pgqueue queue resume %s` (or SELECT pgqueue.resume_queue(%L))',
                         q.queue_name, q.queue_name, q.queue_name),
        DETAIL = json_build_object('queue', q.queue_name, 'paused_at', q.paused_at,
                                   'paused_by', q.paused_by)::text;
END
$$;

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
    RETURN QUERY SELECT * FROM pgqueue._take(q, vt, qty, false);
END
$$;

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
        RETURN QUERY SELECT * FROM pgqueue._take(q, vt, qty, false);
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
    RETURN QUERY SELECT * FROM pgqueue._take(q, 0, qty, true);
END
$$;

CREATE UNLOGGED TABLE pgqueue.worker (
    worker_id uuid PRIMARY KEY,
    host text NOT NULL,
    pid integer NOT NULL,
    queues text[] NOT NULL,
    concurrency integer NOT NULL,
    in_flight integer NOT NULL,
    started_at timestamptz NOT NULL,
    last_seen_at timestamptz NOT NULL,
    stopping boolean NOT NULL DEFAULT false
) WITH (fillfactor = 50);  -- a heartbeat updates no indexed column: HOT, in place

CREATE TABLE pgqueue.queue_minute (
    queue_id integer NOT NULL REFERENCES pgqueue.queue ON DELETE CASCADE,
    minute timestamptz NOT NULL,
    -- the queue's message sequence when this minute was first sampled; NULL
    -- while only tallies arrived
    sent_total bigint,
    acked bigint NOT NULL DEFAULT 0,
    nacked bigint NOT NULL DEFAULT 0,
    poisoned bigint NOT NULL DEFAULT 0,
    PRIMARY KEY (queue_id, minute)
);

-- The minute (in minutes since the epoch) last sampled: a heartbeat samples
-- only when this is not the current minute, so sampling costs one
-- sequence read per heartbeat and one statement per minute per database.
-- A sequence, so marking leaves no dead tuple and is seen at once.
CREATE SEQUENCE pgqueue.rates_sampled_minute AS bigint;

CREATE FUNCTION pgqueue._sample_rates(minute timestamptz) RETURNS integer
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    n integer;
BEGIN
    PERFORM setval('pgqueue.rates_sampled_minute', (extract(epoch FROM _sample_rates.minute) / 60)::bigint);
    INSERT INTO pgqueue.queue_minute AS m (queue_id, minute, sent_total)
    SELECT q.queue_id, _sample_rates.minute, coalesce(pg_sequence_last_value(q.msg_seq), 0)
      FROM pgqueue.queue q
     ORDER BY q.queue_id
    ON CONFLICT (queue_id, minute) DO UPDATE SET sent_total = EXCLUDED.sent_total
     WHERE m.sent_total IS NULL;
    GET DIAGNOSTICS n = ROW_COUNT;
    DELETE FROM pgqueue.queue_minute m WHERE m.minute < _sample_rates.minute - interval '2 hours';
    RETURN n;
END
$$;

CREATE FUNCTION pgqueue.sample_rates() RETURNS integer
LANGUAGE sql
SECURITY DEFINER SET search_path = pg_catalog, pgqueue, pg_temp
AS $$
    SELECT pgqueue._sample_rates(date_trunc('minute', clock_timestamp()));
$$;

CREATE FUNCTION pgqueue.worker_heartbeat(
    worker_id uuid,
    host text,
    pid integer,
    queues text[],
    concurrency integer,
    in_flight integer,
    started_at timestamptz,
    stopping boolean,
    tally_queues text[],
    acked bigint[],
    nacked bigint[],
    poisoned bigint[]
) RETURNS TABLE (queue_name text, paused boolean)
LANGUAGE plpgsql
SECURITY DEFINER SET search_path = pg_catalog, pgqueue, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_now timestamptz := clock_timestamp();
    v_minute timestamptz := date_trunc('minute', v_now);
    v_null text;
BEGIN
    v_null := CASE WHEN worker_heartbeat.worker_id IS NULL THEN 'worker_id'
                   WHEN worker_heartbeat.host IS NULL THEN 'host'
                   WHEN worker_heartbeat.pid IS NULL THEN 'pid'
                   WHEN worker_heartbeat.queues IS NULL THEN 'queues'
                   WHEN worker_heartbeat.concurrency IS NULL THEN 'concurrency'
                   WHEN worker_heartbeat.in_flight IS NULL THEN 'in_flight'
                   WHEN worker_heartbeat.stopping IS NULL THEN 'stopping'
                   WHEN worker_heartbeat.tally_queues IS NULL THEN 'tally_queues'
                   WHEN worker_heartbeat.acked IS NULL THEN 'acked'
                   WHEN worker_heartbeat.nacked IS NULL THEN 'nacked'
                   WHEN worker_heartbeat.poisoned IS NULL THEN 'poisoned' END;
    IF v_null IS NOT NULL THEN
        RAISE EXCEPTION '% must not be NULL', v_null USING ERRCODE = '22004',
            HINT = 'Only started_at may be NULL (the first heartbeat''s time); pass empty arrays for no tallies.';
    END IF;
    IF worker_heartbeat.host = '' OR length(worker_heartbeat.host) > 255 THEN
        RAISE EXCEPTION 'host must be 1 to 255 characters, got %', length(worker_heartbeat.host)
            USING ERRCODE = '22023';
    END IF;
    IF worker_heartbeat.pid < 1 THEN
        RAISE EXCEPTION 'pid must be >= 1, got %', worker_heartbeat.pid USING ERRCODE = '22023';
    END IF;
    IF worker_heartbeat.concurrency < 1 THEN
        RAISE EXCEPTION 'concurrency must be >= 1, got %', worker_heartbeat.concurrency
            USING ERRCODE = '22023';
    END IF;
    PERFORM pgqueue._require_nonnegative('in_flight', worker_heartbeat.in_flight);
    IF array_position(worker_heartbeat.queues, NULL) IS NOT NULL THEN
        RAISE EXCEPTION 'queues[%] is NULL', array_position(worker_heartbeat.queues, NULL)
            USING ERRCODE = '22004';
    END IF;
    IF cardinality(worker_heartbeat.acked) <> cardinality(worker_heartbeat.tally_queues)
       OR cardinality(worker_heartbeat.nacked) <> cardinality(worker_heartbeat.tally_queues)
       OR cardinality(worker_heartbeat.poisoned) <> cardinality(worker_heartbeat.tally_queues) THEN
        RAISE EXCEPTION 'tally_queues, acked, nacked and poisoned have %, %, % and % elements',
            cardinality(worker_heartbeat.tally_queues), cardinality(worker_heartbeat.acked),
            cardinality(worker_heartbeat.nacked), cardinality(worker_heartbeat.poisoned)
            USING ERRCODE = '22023', HINT = 'Pass one count of each kind per queue of tally_queues.';
    END IF;
    IF EXISTS (SELECT 1 FROM unnest(worker_heartbeat.tally_queues, worker_heartbeat.acked,
                                    worker_heartbeat.nacked, worker_heartbeat.poisoned) AS t (name, a, n, p)
                WHERE t.name IS NULL OR t.a IS NULL OR t.n IS NULL OR t.p IS NULL) THEN
        RAISE EXCEPTION 'tally_queues, acked, nacked and poisoned must not hold NULLs' USING ERRCODE = '22004';
    END IF;
    IF EXISTS (SELECT 1 FROM unnest(worker_heartbeat.acked, worker_heartbeat.nacked,
                                    worker_heartbeat.poisoned) AS t (a, n, p)
                WHERE t.a < 0 OR t.n < 0 OR t.p < 0) THEN
        RAISE EXCEPTION 'acked, nacked and poisoned must be >= 0' USING ERRCODE = '22023',
            HINT = 'They count what happened since the last successful heartbeat.';
    END IF;

    DELETE FROM pgqueue.worker w
     WHERE w.worker_id IN (SELECT s.worker_id FROM pgqueue.worker s
                            WHERE s.last_seen_at < v_now - interval '10 minutes'
                              FOR UPDATE SKIP LOCKED);
    INSERT INTO pgqueue.worker AS w
           (worker_id, host, pid, queues, concurrency, in_flight, started_at, last_seen_at, stopping)
    VALUES (worker_heartbeat.worker_id, worker_heartbeat.host, worker_heartbeat.pid,
            worker_heartbeat.queues, worker_heartbeat.concurrency, worker_heartbeat.in_flight,
            coalesce(worker_heartbeat.started_at, v_now), v_now, worker_heartbeat.stopping)
    ON CONFLICT (worker_id) DO UPDATE
       SET host = EXCLUDED.host, pid = EXCLUDED.pid, queues = EXCLUDED.queues,
           concurrency = EXCLUDED.concurrency, in_flight = EXCLUDED.in_flight,
           started_at = coalesce(worker_heartbeat.started_at, w.started_at),
           last_seen_at = EXCLUDED.last_seen_at, stopping = EXCLUDED.stopping;

    -- Sample before adding tallies: both write this minute's rows in
    -- queue_id order, the sample all of them, so the tallies only take rows
    -- this transaction holds already.
    IF pg_sequence_last_value('pgqueue.rates_sampled_minute')
       IS DISTINCT FROM (extract(epoch FROM v_minute) / 60)::bigint THEN
        PERFORM pgqueue._sample_rates(v_minute);
    END IF;
    INSERT INTO pgqueue.queue_minute AS m (queue_id, minute, acked, nacked, poisoned)
    SELECT q.queue_id, v_minute, sum(t.a), sum(t.n), sum(t.p)
      FROM unnest(worker_heartbeat.tally_queues, worker_heartbeat.acked,
                  worker_heartbeat.nacked, worker_heartbeat.poisoned) AS t (name, a, n, p)
      JOIN pgqueue.queue q ON q.queue_name = t.name
     GROUP BY q.queue_id
    HAVING sum(t.a) + sum(t.n) + sum(t.p) > 0
     ORDER BY q.queue_id
    ON CONFLICT (queue_id, minute) DO UPDATE
       SET acked = m.acked + EXCLUDED.acked, nacked = m.nacked + EXCLUDED.nacked,
           poisoned = m.poisoned + EXCLUDED.poisoned;

    RETURN QUERY
    SELECT q.queue_name, q.paused_at IS NOT NULL FROM pgqueue.queue q
     WHERE q.queue_name = ANY (worker_heartbeat.queues)
     ORDER BY q.queue_name;
END
$$;

CREATE FUNCTION pgqueue.worker_deregister(worker_id uuid) RETURNS boolean
LANGUAGE plpgsql
SECURITY DEFINER SET search_path = pg_catalog, pgqueue, pg_temp
AS $$
#variable_conflict use_column
BEGIN
    IF worker_deregister.worker_id IS NULL THEN
        RAISE EXCEPTION 'worker_id must not be NULL' USING ERRCODE = '22004';
    END IF;
    DELETE FROM pgqueue.worker WHERE worker_id = worker_deregister.worker_id;
    RETURN FOUND;
END
$$;

CREATE FUNCTION pgqueue.list_workers()
RETURNS TABLE (
    worker_id uuid,
    host text,
    pid integer,
    queues text[],
    concurrency integer,
    in_flight integer,
    started_at timestamptz,
    last_seen_at timestamptz,
    stopping boolean,
    alive boolean
)
LANGUAGE sql STABLE
SECURITY DEFINER SET search_path = pg_catalog, pgqueue, pg_temp
AS $$
    SELECT w.worker_id, w.host, w.pid, w.queues, w.concurrency, w.in_flight, w.started_at,
           w.last_seen_at, w.stopping, w.last_seen_at >= clock_timestamp() - interval '15 seconds'
      FROM pgqueue.worker w
     ORDER BY w.started_at DESC, w.worker_id;
$$;

CREATE FUNCTION pgqueue.queue_rates(queue_names text[], minutes integer DEFAULT 60)
RETURNS TABLE (
    queue_name text,
    minute timestamptz,
    sent bigint,
    acked bigint,
    nacked bigint,
    poisoned bigint
)
LANGUAGE plpgsql STABLE
SECURITY DEFINER SET search_path = pg_catalog, pgqueue, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_now timestamptz := date_trunc('minute', clock_timestamp());
    v_from timestamptz;
BEGIN
    IF queue_rates.minutes IS NULL THEN
        RAISE EXCEPTION 'minutes must not be NULL' USING ERRCODE = '22004';
    END IF;
    IF queue_rates.minutes < 1 OR queue_rates.minutes > 120 THEN
        RAISE EXCEPTION 'minutes must be 1 to 120, got %', queue_rates.minutes
            USING ERRCODE = '22023', HINT = 'Rates are kept for 2 hours.';
    END IF;
    v_from := v_now - make_interval(mins => queue_rates.minutes - 1);
    -- Per queue, one range scan of its primary key over the window (the series
    -- gives the minutes without a row; lead() the next minute's sample).
    RETURN QUERY
    SELECT q.queue_name, s.minute,
           CASE WHEN s.minute = v_now THEN coalesce(pg_sequence_last_value(q.msg_seq), 0)
                ELSE s.next_total END - s.sent_total,
           s.acked, s.nacked, s.poisoned
      FROM pgqueue.queue q
     CROSS JOIN LATERAL (
           SELECT g.minute, m.sent_total, lead(m.sent_total) OVER (ORDER BY g.minute) AS next_total,
                  coalesce(m.acked, 0::bigint) AS acked, coalesce(m.nacked, 0::bigint) AS nacked,
                  coalesce(m.poisoned, 0::bigint) AS poisoned
             FROM generate_series(v_from, v_now, interval '1 minute') AS g (minute)
             LEFT JOIN (SELECT x.minute, x.sent_total, x.acked, x.nacked, x.poisoned
                          FROM pgqueue.queue_minute x
                         WHERE x.queue_id = q.queue_id AND x.minute BETWEEN v_from AND v_now) m
                    ON m.minute = g.minute) s
     WHERE queue_rates.queue_names IS NULL OR q.queue_name = ANY (queue_rates.queue_names)
     ORDER BY q.queue_name, s.minute;
END
$$;

INSERT INTO pgqueue.role_grant (function_signature, roles) VALUES
    ('pgqueue.pause_queue(text,text)', '{pgqueue_operator}'),
    ('pgqueue.resume_queue(text)', '{pgqueue_operator}'),
    ('pgqueue.sample_rates()', '{pgqueue_consumer,pgqueue_operator}'),
    ('pgqueue.worker_heartbeat(uuid,text,integer,text[],integer,integer,timestamp with time zone,boolean,text[],bigint[],bigint[],bigint[])', '{pgqueue_consumer}'),
    ('pgqueue.worker_deregister(uuid)', '{pgqueue_consumer}'),
    ('pgqueue.list_workers()', '{pgqueue_operator}'),
    ('pgqueue.queue_rates(text[],integer)', '{pgqueue_operator}');

SELECT pgqueue.grant_roles();
