-- pgqueue 0014: the exporter's figures for every queue in one statement.
--
-- `pgqueue exporter` serves queue-level gauges to Prometheus, computed at
-- scrape time. metrics_all() scans the live messages once per queue and says
-- nothing of leases, delays or barriers; exporter_metrics() reads each table
-- once for all queues (docs/observability.md).

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
    sent_total bigint
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
           coalesce(pg_sequence_last_value(q.msg_seq), 0)
      FROM pgqueue.queue q
     CROSS JOIN clock c
      LEFT JOIN live l ON l.queue_id = q.queue_id
      LEFT JOIN dead d ON d.queue_id = q.queue_id
      LEFT JOIN open o ON o.queue_id = q.queue_id
     ORDER BY q.queue_name;
$$;

INSERT INTO pgqueue.role_grant (function_signature, roles) VALUES
    ('pgqueue.exporter_metrics()', '{pgqueue_operator}');

SELECT pgqueue.grant_roles();
