-- pgqueue 0029: the dashboard's figures. Sends counted from a queue's
-- creation, and which workflow step a barrier is.
--
-- * queue_rates counted a minute's sends as the next minute's sample of the
--   queue's sequence minus its own, NULL where either was missing. A queue
--   created after its minute's sample (the first heartbeat of a minute
--   samples every queue there is), or sampled only after its first sends,
--   had no start for those sends: the dashboard showed "Sent, last hour" 0
--   beside "Acked" 60 for the same messages. Now a queue's sequence is known
--   to be 0 at the start of the minute it was created in, and a minute no
--   one sampled adds its sends to the sampled minute before it instead of
--   losing them: the sends of a window add up to the sequence now minus its
--   first known start (tests/web/test_web_figures.py).
-- * barrier_steps(barrier_ids) says which of these barriers are workflow
--   steps, and of which workflow: a step's members are a barrier with a
--   generated id, which the barriers page listed as a bare UUID. For
--   pgqueue_operator, as list_barriers.
-- * list_workers leaves out rows unseen for 10 minutes. Only a heartbeat
--   pruned them: when the last worker was killed (SIGKILL, a closed
--   terminal), no heartbeat came and `pgqueue workers list` showed it as
--   lost forever.
--
-- Every statement can run again over its own result.

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
CREATE OR REPLACE FUNCTION pgqueue.queue_rates(queue_names text[], minutes integer DEFAULT 60)
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

-- The workflow step each of these barriers is (a step sends its messages as
-- the members of a barrier with a generated id), for the ones that are a
-- step; the others are left out. One probe of the steps' barrier index each.
CREATE OR REPLACE FUNCTION pgqueue.barrier_steps(barrier_ids text[])
RETURNS TABLE (barrier_id text, workflow_id text, step text)
LANGUAGE sql STABLE
SECURITY DEFINER SET search_path = pg_catalog, pgqueue, pg_temp
AS $$
    SELECT s.barrier_id, s.workflow_id, s.step
      FROM pgqueue.workflow_step s
     WHERE s.barrier_id = ANY (barrier_steps.barrier_ids)
     ORDER BY s.barrier_id;
$$;

INSERT INTO pgqueue.role_grant (object, roles) VALUES
    ('pgqueue.barrier_steps(text[])', '{pgqueue_operator}')
ON CONFLICT (object) DO UPDATE SET roles = EXCLUDED.roles;

SELECT pgqueue.grant_roles();

-- Every registered worker seen in the last 10 minutes, newest started first;
-- alive when its last heartbeat is at most 15 s old (three missed heartbeats
-- at the default 5 s). An older row is one the next heartbeat prunes.
CREATE OR REPLACE FUNCTION pgqueue.list_workers()
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
