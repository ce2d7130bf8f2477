-- pgqueue schema, as it stands now: the duplicate guard.
--
-- Delivery is at-least-once, so a handler may run twice for one message. A
-- handler that writes to the database can call pgqueue.guard(key) in the same
-- transaction as its writes: the first transaction to insert the key wins,
-- every later one (a redelivery, a duplicate callback run) gets false and skips
-- the work. Because the key commits or rolls back with the writes, a crash
-- between them cannot leave one without the other.

CREATE TABLE pgqueue.idempotency (
    key text PRIMARY KEY,
    created_at timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE INDEX idempotency_created_idx ON pgqueue.idempotency (created_at);

CREATE FUNCTION pgqueue.guard(key text) RETURNS boolean
LANGUAGE plpgsql
SECURITY DEFINER SET search_path = pg_catalog, pgqueue, pg_temp
AS $$
#variable_conflict use_column
BEGIN
    IF guard.key IS NULL OR guard.key = '' OR length(guard.key) > 1000 THEN
        RAISE EXCEPTION 'guard key must be 1 to 1000 characters' USING ERRCODE = '22023';
    END IF;
    INSERT INTO pgqueue.idempotency (key) VALUES (guard.key) ON CONFLICT (key) DO NOTHING;
    RETURN FOUND;
END
$$;

CREATE FUNCTION pgqueue.purge_guards(older_than_seconds integer) RETURNS bigint
LANGUAGE plpgsql
SECURITY DEFINER SET search_path = pg_catalog, pgqueue, pg_temp
AS $$
DECLARE
    n bigint;
BEGIN
    PERFORM pgqueue._require_nonnegative('older_than_seconds', older_than_seconds);
    DELETE FROM pgqueue.idempotency
     WHERE created_at < clock_timestamp() - make_interval(secs => older_than_seconds);
    GET DIAGNOSTICS n = ROW_COUNT;
    RETURN n;
END
$$;
