-- pgqueue 0030: what PGMQ's clients match on, through the pgmq facade.
--
-- * An unknown queue. pgqueue's functions raise PGQ01 "queue ... does not
--   exist". Called through the facade (a function of schema pgmq on the call
--   stack), they now raise what PGMQ raises there: 42P01 'relation
--   "pgmq.q_<name>" does not exist' (pgmq-py's HTTP API answers it with 404,
--   PGQ01 with 500), or P0001 'queue name contains invalid characters' for a
--   name no queue can have (PGMQ's own SQL-injection test). The stack is
--   looked at on the error path only.
-- * Group keys of any length. PGMQ accepts an x-pgmq-group header of any
--   text, the empty string included; pgqueue's group keys are 1 to 200
--   characters (they are indexed). _pgmq_group maps PGMQ's header to a key:
--   the text itself, or for '' and longer texts a digest of it, one key per
--   text. The facade's sends and `pgqueue pgmq import` use it.
--
-- Every statement can run again over its own result.

-- The queue of that name, or of the name a PGMQ client means by it (a name
-- that is not a pgqueue name stands for _queue_name_for's: docs/pgmq.md,
-- "What is the same, what differs"); PGQ01 when there is none, or, called
-- through the pgmq facade, what PGMQ raises there (_pgmq_unknown_queue).
CREATE OR REPLACE FUNCTION pgqueue._queue(queue_name text) RETURNS pgqueue.queue
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
CREATE OR REPLACE FUNCTION pgqueue._pgmq_unknown_queue(queue_name text) RETURNS void
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
CREATE OR REPLACE FUNCTION pgqueue._pgmq_group(x_pgmq_group text) RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT CASE WHEN x_pgmq_group = '' OR length(x_pgmq_group) > 200
                THEN 'pgmq-group:' || encode(sha256(convert_to(x_pgmq_group, 'UTF8')), 'hex')
                ELSE x_pgmq_group END;
$$;

-- Internal functions: granted to no one (pgqueue.role_grant has no rows for
-- them); grant_roles takes PUBLIC's default EXECUTE away.
SELECT pgqueue.grant_roles();
