-- pgqueue's pgmq facade, part 2: PGMQ's grouped reads (read_grouped,
-- read_grouped_rr, read_grouped_head and their _with_poll forms). Applied
-- after 10_facade.sql, by `pgqueue pgmq install` and in the extension's script.

-- PGMQ's grouped reads. pgqueue's reads always honour groups, handing out a
-- group's oldest message only, so each is read (and read_with_poll): the
-- heads of up to qty groups, oldest first, with ungrouped messages beside
-- them. PGMQ's read_grouped fills a batch from one group; here a batch holds
-- at most one message per group.
CREATE FUNCTION pgmq.read_grouped(queue_name text, vt integer, qty integer)
RETURNS SETOF pgmq.message_record
LANGUAGE plpgsql
SECURITY DEFINER SET search_path = pg_catalog, pgqueue, pg_temp
AS $$
BEGIN
    RETURN QUERY SELECT * FROM pgmq.read(queue_name, vt, qty);
END
$$;

CREATE FUNCTION pgmq.read_grouped_rr(queue_name text, vt integer, qty integer)
RETURNS SETOF pgmq.message_record
LANGUAGE plpgsql
SECURITY DEFINER SET search_path = pg_catalog, pgqueue, pg_temp
AS $$
BEGIN
    RETURN QUERY SELECT * FROM pgmq.read(queue_name, vt, qty);
END
$$;

CREATE FUNCTION pgmq.read_grouped_head(queue_name text, vt integer, qty integer)
RETURNS SETOF pgmq.message_record
LANGUAGE plpgsql
SECURITY DEFINER SET search_path = pg_catalog, pgqueue, pg_temp
AS $$
BEGIN
    RETURN QUERY SELECT * FROM pgmq.read(queue_name, vt, qty);
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
    RETURN QUERY SELECT * FROM pgmq.read_with_poll(queue_name, vt, qty, max_poll_seconds, poll_interval_ms);
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
    RETURN QUERY SELECT * FROM pgmq.read_with_poll(queue_name, vt, qty, max_poll_seconds, poll_interval_ms);
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
    RETURN QUERY SELECT * FROM pgmq.read_with_poll(queue_name, vt, qty, max_poll_seconds, poll_interval_ms);
END
$$;

-- Rights, as pgqueue.role_grant says (10_facade.sql): reads are the consumer's.
INSERT INTO pgqueue.role_grant (object, roles, kind)
SELECT 'pgmq.' || f, '{pgqueue_consumer}', 'function'
  FROM unnest(ARRAY['read_grouped', 'read_grouped_with_poll', 'read_grouped_rr', 'read_grouped_rr_with_poll',
                    'read_grouped_head', 'read_grouped_head_with_poll']) AS f;
SELECT pgqueue.grant_roles();
