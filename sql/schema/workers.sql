-- pgqueue schema, as it stands now: the worker registry and the per-minute rates.
--
-- Registry. Each running worker upserts its row every few seconds
-- (worker_heartbeat) and deletes it when it stops (worker_deregister), so
-- list_workers shows who consumes what, and a worker that stopped heartbeating
-- (SIGKILL, a frozen host) shows as not alive 15 s later. Rows unseen for 10
-- minutes are pruned by the next heartbeat, and list_workers leaves them out
-- meanwhile: with no worker left to heartbeat, a killed one is not listed
-- as lost forever. The table is UNLOGGED, like
-- pgqueue.waiter: a crash empties it and live workers are back within a
-- heartbeat; a replica has it empty. All times are the database's clock.
--
-- Rates. A counter touched by every ack would put one hot row on the ack
-- path, so nothing is counted there. Instead:
--   * sent: once a minute the first sampler (a heartbeat, the web app,
--     sample_rates()) writes every queue's message sequence into this
--     minute's row; the sends of a minute are the difference between two
--     consecutive samples, exact for any sender. A rolled-back send used an id
--     too, and so does a poison requeue.
--   * acked, nacked, poisoned: workers tally them in memory and add them in
--     their heartbeat, one upsert for all their queues. Acks made outside
--     pgqueue's workers are not counted; a SIGKILLed worker's last seconds
--     of tallies are lost.
-- Rows older than 2 hours are pruned by the sampler. Every statement that
-- writes rows of queue_minute writes them in queue_id order, so two
-- heartbeats (or a heartbeat and a sampler) never deadlock on them.

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

-- Samples every queue's message sequence into `minute`'s row; the rows written.
-- The first sampler of a minute wins (a row with a sample keeps it); the rest
-- write nothing, not even a dead tuple. Then prunes rows older than 2 hours.
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

-- This minute's sample of every queue (see _sample_rates); the rows written.
-- Workers call it through their heartbeat; a dashboard may call it every
-- 30 s so that sends are counted while no worker runs.
CREATE FUNCTION pgqueue.sample_rates() RETURNS integer
LANGUAGE sql
SECURITY DEFINER SET search_path = pg_catalog, pgqueue, pg_temp
AS $$
    SELECT pgqueue._sample_rates(date_trunc('minute', clock_timestamp()));
$$;

-- A worker says it is alive: upserts its row (last_seen_at = now, started_at
-- kept from its first heartbeat; NULL started_at means now), prunes rows
-- unseen for 10 minutes (never waiting on one being heartbeated), samples
-- this minute's sends if no one has yet, and adds its tallies since its last
-- successful heartbeat to this minute's rows: tally_queues[i] had acked[i],
-- nacked[i] and poisoned[i] (queues that no longer exist are left out).
-- Returns each of its queues that exists, and whether it is paused.
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
      JOIN pgqueue.queue q ON q.queue_name = pgqueue._queue_name_for(t.name)  -- as _queue finds it
     GROUP BY q.queue_id
    HAVING sum(t.a) + sum(t.n) + sum(t.p) > 0
     ORDER BY q.queue_id
    ON CONFLICT (queue_id, minute) DO UPDATE
       SET acked = m.acked + EXCLUDED.acked, nacked = m.nacked + EXCLUDED.nacked,
           poisoned = m.poisoned + EXCLUDED.poisoned;

    -- each queue under the name the worker gave
    RETURN QUERY
    SELECT DISTINCT t.name, q.paused_at IS NOT NULL
      FROM unnest(worker_heartbeat.queues) AS t (name)
      JOIN pgqueue.queue q ON q.queue_name = pgqueue._queue_name_for(t.name)
     ORDER BY t.name;
END
$$;

-- A worker that stopped removes its row; false when there was none.
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

-- Every registered worker seen in the last 10 minutes, newest started first;
-- alive when its last heartbeat is at most 15 s old (three missed heartbeats
-- at the default 5 s). An older row is one the next heartbeat prunes.
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
     WHERE w.last_seen_at >= clock_timestamp() - interval '10 minutes'
     ORDER BY w.started_at DESC, w.worker_id;
$$;

-- One row per queue per minute of the last `minutes` (this one included, its
-- counts so far), by queue name, oldest minute first; only the named queues
-- (names that are no queue are left out), or every queue for NULL. sent is
-- the next known sample minus this minute's (after the last sample: the
-- sequence now), so a minute no one sampled adds its sends to the sampled
-- minute before it, and the sends of the window add up to the sequence now
-- minus its first known sample; a queue's sequence is 0 at the start of the
-- minute it was created in, its first sample whenever it was taken. sent is
-- NULL for a minute without a sample. acked, nacked and poisoned are what
-- workers' heartbeats reported in that minute, 0 without a report. Reads one
-- range of the primary key per queue.
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
    -- gives the minutes without a row). A minute's start is its sample, or 0
    -- up to the queue's creation: a queue created after this minute's sample
    -- (or sampled after its first sends) would otherwise count no sends for
    -- the minutes its workers acked them in. Samples never decrease (a
    -- sequence only goes up), so the next known one is the least of the later
    -- minutes' starts.
    RETURN QUERY
    SELECT q.queue_name, s.minute,
           coalesce(s.next_start, pg_sequence_last_value(q.msg_seq), 0) - s.start,
           s.acked, s.nacked, s.poisoned
      FROM pgqueue.queue q
     CROSS JOIN LATERAL (
           SELECT r.minute, r.start,
                  min(r.start) OVER (ORDER BY r.minute DESC
                                     ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS next_start,
                  r.acked, r.nacked, r.poisoned
             FROM (SELECT g.minute,
                          CASE WHEN g.minute <= date_trunc('minute', q.created_at) THEN 0::bigint
                               ELSE m.sent_total END AS start,
                          coalesce(m.acked, 0::bigint) AS acked, coalesce(m.nacked, 0::bigint) AS nacked,
                          coalesce(m.poisoned, 0::bigint) AS poisoned
                     FROM generate_series(v_from, v_now, interval '1 minute') AS g (minute)
                     LEFT JOIN (SELECT x.minute, x.sent_total, x.acked, x.nacked, x.poisoned
                                  FROM pgqueue.queue_minute x
                                 WHERE x.queue_id = q.queue_id AND x.minute BETWEEN v_from AND v_now) m
                            ON m.minute = g.minute) r) s
     WHERE queue_rates.queue_names IS NULL
        OR q.queue_name IN (SELECT pgqueue._queue_name_for(x) FROM unnest(queue_rates.queue_names) x)
     ORDER BY q.queue_name, s.minute;
END
$$;
