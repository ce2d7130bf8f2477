
-- Marks schema pgmq as pgqueue's facade (`pgqueue pgmq status` reads it), and
-- lets pgqueue's roles, where they exist, into the schema; what each may call
-- is granted above, function by function.
COMMENT ON SCHEMA pgmq IS 'pgqueue pgmq facade @VERSION@';

DO $pgqueue_grants$
DECLARE
    r text;
BEGIN
    FOREACH r IN ARRAY ARRAY['pgqueue_consumer', 'pgqueue_operator', 'pgqueue_producer'] LOOP
        IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = r) THEN
            EXECUTE format('GRANT USAGE ON SCHEMA pgmq TO %I', r);
        END IF;
    END LOOP;
END
$pgqueue_grants$;
