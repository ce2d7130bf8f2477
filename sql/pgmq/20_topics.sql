-- pgmq facade: topics (PGMQ 1.13's bind_topic / send_topic family), over pgqueue.
--
-- Applied by `pgqueue pgmq install` right after 10_facade.sql, into the
-- existing schema pgmq, by the schema's owner, in the installer's transaction.
-- Every statement is idempotent; an upgrade drops schema pgmq, installs
-- again and carries the rows of topic_bindings over (pgqueue/_pgmq.py).
-- It uses 10_facade.sql's name mapping (pgmq._name: PGMQ's name to pgqueue's
-- queue; pgmq._pgmq_name: back) and pgmq._delay_seconds.
--
-- A binding says: a message sent with a routing key that matches `pattern`
-- goes to queue `queue_name`. Routing keys are dot-separated words of
-- [A-Za-z0-9_-]; patterns may also hold `*` (one or more characters other than
-- a dot: a whole segment when it stands alone) and `#` (any run of characters,
-- dots included, possibly empty). These are PGMQ's matching rules exactly,
-- including where they differ from AMQP's: `logs.#` does not match `logs`, and
-- `a.#.b` does not match `a.b` (docs/pgmq.md, "Topics").
--
-- Why matching through a regular expression is safe: a pattern can only reach
-- the table through the CHECK below, which admits [A-Za-z0-9._*#-] and nothing
-- else, and compiled_regex maps each of those characters to a fixed piece of
-- regex (`.` is escaped); routing keys are validated before they are matched
-- and are only ever the subject of `~`, never the regex. No dynamic SQL here.
--
-- Why a binding cannot outlive its queue: a trigger on pgqueue.queue deletes a
-- dropped queue's bindings in the dropping transaction (pgqueue.drop_queue and
-- pgmq.drop_queue both delete that row), and bind_topic holds a KEY SHARE lock
-- on the queue row until it commits, so a concurrent drop (FOR UPDATE) either
-- waits for the binding and then deletes it, or commits first and bind_topic
-- finds no queue.

-- NULL when `value` is a valid routing key (wildcards false) or topic pattern
-- (wildcards true); else what is wrong with it, for the 22023 error.
CREATE OR REPLACE FUNCTION pgmq._topic_problem(what text, value text, wildcards boolean) RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT CASE
        WHEN value IS NULL OR value = '' THEN what || ' must not be NULL or empty'
        WHEN length(value) > 255 THEN format('%s is %s characters long; at most 255', what, length(value))
        WHEN value !~ CASE WHEN wildcards THEN '^[A-Za-z0-9._*#-]+$' ELSE '^[A-Za-z0-9._-]+$' END
            THEN format('%s %s holds a character other than %s', what, to_json(value),
                        CASE WHEN wildcards THEN 'letters, digits, ".", "_", "-", "*" and "#"'
                             ELSE 'letters, digits, ".", "_" and "-"' END)
        WHEN left(value, 1) = '.' OR right(value, 1) = '.' OR strpos(value, '..') > 0
            THEN format('%s %s has an empty segment (a leading, trailing or doubled dot)', what, to_json(value))
        WHEN strpos(value, '**') > 0 THEN format('%s %s has "**"; "#" matches many segments', what, to_json(value))
        WHEN strpos(value, '##') > 0 THEN format('%s %s has "##"; one "#" is enough', what, to_json(value))
        WHEN strpos(value, '*#') > 0 OR strpos(value, '#*') > 0
            THEN format('%s %s has "*" next to "#"; put a dot between wildcards', what, to_json(value))
    END;
$$;

-- Raises 22023 unless routing_key is a valid routing key; true otherwise.
CREATE OR REPLACE FUNCTION pgmq.validate_routing_key(routing_key text) RETURNS boolean
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE
SECURITY DEFINER SET search_path = pg_catalog, pgqueue, pg_temp
AS $$
DECLARE
    v_problem text := pgmq._topic_problem('routing_key', routing_key, false);
BEGIN
    IF v_problem IS NOT NULL THEN
        RAISE EXCEPTION '%', v_problem USING ERRCODE = '22023',
            HINT = 'A routing key is words of letters, digits, "_" and "-" joined by single dots, e.g. orders.eu.created.';
    END IF;
    RETURN true;
END
$$;

-- Raises 22023 unless pattern is a valid topic pattern; true otherwise.
CREATE OR REPLACE FUNCTION pgmq.validate_topic_pattern(pattern text) RETURNS boolean
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE
SECURITY DEFINER SET search_path = pg_catalog, pgqueue, pg_temp
AS $$
DECLARE
    v_problem text := pgmq._topic_problem('pattern', pattern, true);
BEGIN
    IF v_problem IS NOT NULL THEN
        RAISE EXCEPTION '%', v_problem USING ERRCODE = '22023',
            HINT = 'A pattern is a routing key whose words may be "*" (one word) or "#" (any words), e.g. orders.*.created or orders.#.';
    END IF;
    RETURN true;
END
$$;

CREATE TABLE IF NOT EXISTS pgmq.topic_bindings (
    pattern text NOT NULL
        CONSTRAINT topic_bindings_pattern_valid CHECK (pgmq._topic_problem('pattern', pattern, true) IS NULL),
    queue_name text NOT NULL,
    bound_at timestamptz NOT NULL DEFAULT now(),
    -- The regex a routing key must match, as PGMQ shows it: anchored, `.`
    -- escaped, `*` one run of non-dots, `#` any run. The CHECK above leaves no
    -- other regex metacharacter to escape.
    compiled_regex text GENERATED ALWAYS AS (
        '^' || replace(replace(replace(pattern, '.', '\.'), '*', '[^.]+'), '#', '.*') || '$'
    ) STORED,
    CONSTRAINT topic_bindings_unique_pattern_queue UNIQUE (pattern, queue_name)
);

-- The drop trigger deletes by queue.
CREATE INDEX IF NOT EXISTS topic_bindings_queue_name_idx ON pgmq.topic_bindings (queue_name);

-- Installed as the extension pgmq (extension/), the table belongs to the
-- extension, and pg_dump skips an extension's tables unless they are marked as
-- holding the user's data: bindings are, so a dump and restore keeps them.
-- (`pgqueue pgmq install` makes no extension: nothing to mark.)
DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_extension WHERE extname = 'pgmq') THEN
        PERFORM pg_catalog.pg_extension_config_dump('pgmq.topic_bindings', '');
    END IF;
END
$$;

-- Deletes the bindings of the queues a statement deleted from pgqueue.queue.
CREATE OR REPLACE FUNCTION pgmq._unbind_dropped_queues() RETURNS trigger
LANGUAGE plpgsql
SECURITY DEFINER SET search_path = pg_catalog, pgqueue, pg_temp
AS $$
BEGIN
    DELETE FROM pgmq.topic_bindings b USING dropped d WHERE b.queue_name = d.queue_name;
    RETURN NULL;
END
$$;

CREATE OR REPLACE TRIGGER pgmq_topic_bindings_of_dropped_queue
    AFTER DELETE ON pgqueue.queue
    REFERENCING OLD TABLE AS dropped
    FOR EACH STATEMENT EXECUTE FUNCTION pgmq._unbind_dropped_queues();

-- Binds pattern to queue_name (an existing queue); binding twice is a no-op.
-- The table holds pgqueue's name of the queue (pgmq._name), which the drop
-- trigger matches; the functions show PGMQ's (pgmq._pgmq_name), as
-- list_queues does.
CREATE OR REPLACE FUNCTION pgmq.bind_topic(pattern text, queue_name text) RETURNS void
LANGUAGE plpgsql
SECURITY DEFINER SET search_path = pg_catalog, pgqueue, pg_temp
AS $$
BEGIN
    PERFORM pgmq.validate_topic_pattern(bind_topic.pattern);
    IF bind_topic.queue_name IS NULL OR bind_topic.queue_name = '' THEN
        RAISE EXCEPTION 'queue_name must not be NULL or empty' USING ERRCODE = '22023';
    END IF;
    -- KEY SHARE until commit: a concurrent drop_queue cannot slip between this
    -- check and the insert (see the header). Raises PGQ01 for no such queue.
    PERFORM pgqueue._queue_locked(pgmq._name(bind_topic.queue_name));
    INSERT INTO pgmq.topic_bindings AS b (pattern, queue_name)
    VALUES (bind_topic.pattern, pgmq._name(bind_topic.queue_name))
    ON CONFLICT ON CONSTRAINT topic_bindings_unique_pattern_queue DO NOTHING;
END
$$;

-- Removes the binding of pattern to queue_name; whether there was one.
CREATE OR REPLACE FUNCTION pgmq.unbind_topic(pattern text, queue_name text) RETURNS boolean
LANGUAGE plpgsql
SECURITY DEFINER SET search_path = pg_catalog, pgqueue, pg_temp
AS $$
BEGIN
    IF unbind_topic.pattern IS NULL OR unbind_topic.pattern = '' THEN
        RAISE EXCEPTION 'pattern must not be NULL or empty' USING ERRCODE = '22023';
    END IF;
    IF unbind_topic.queue_name IS NULL OR unbind_topic.queue_name = '' THEN
        RAISE EXCEPTION 'queue_name must not be NULL or empty' USING ERRCODE = '22023';
    END IF;
    DELETE FROM pgmq.topic_bindings b
     WHERE b.pattern = unbind_topic.pattern AND b.queue_name = pgmq._name(unbind_topic.queue_name);
    RETURN FOUND;
END
$$;

-- The bindings routing_key matches, by pattern: where a send_topic would go.
CREATE OR REPLACE FUNCTION pgmq.test_routing(routing_key text)
RETURNS TABLE (pattern text, queue_name text, compiled_regex text)
LANGUAGE plpgsql STABLE
SECURITY DEFINER SET search_path = pg_catalog, pgqueue, pg_temp
AS $$
BEGIN
    PERFORM pgmq.validate_routing_key(test_routing.routing_key);
    RETURN QUERY
    SELECT b.pattern, pgmq._pgmq_name(b.queue_name), b.compiled_regex
      FROM pgmq.topic_bindings b
     WHERE test_routing.routing_key ~ b.compiled_regex
     ORDER BY 1, 2;
END
$$;

-- Every binding, newest first.
CREATE OR REPLACE FUNCTION pgmq.list_topic_bindings()
RETURNS TABLE (pattern text, queue_name text, bound_at timestamptz, compiled_regex text)
LANGUAGE sql STABLE
SECURITY DEFINER SET search_path = pg_catalog, pgqueue, pg_temp
AS $$
    SELECT b.pattern, pgmq._pgmq_name(b.queue_name), b.bound_at, b.compiled_regex
      FROM pgmq.topic_bindings b
     ORDER BY 3 DESC, 1, 2;
$$;

-- The bindings of one queue, newest first.
CREATE OR REPLACE FUNCTION pgmq.list_topic_bindings(queue_name text)
RETURNS TABLE (pattern text, queue_name text, bound_at timestamptz, compiled_regex text)
LANGUAGE sql STABLE
SECURITY DEFINER SET search_path = pg_catalog, pgqueue, pg_temp
AS $$
    SELECT b.pattern, pgmq._pgmq_name(b.queue_name), b.bound_at, b.compiled_regex
      FROM pgmq.topic_bindings b
     WHERE b.queue_name = pgmq._name($1)
     ORDER BY b.bound_at DESC, b.pattern;
$$;

-- The queues routing_key reaches, each once, by PGMQ's name (as PGMQ orders
-- them), locked FOR KEY SHARE until commit: a queue dropped meanwhile is
-- skipped (its row is gone when the lock is granted) instead of failing the
-- send, and a drop that comes later waits for this send to commit, then
-- deletes what it sent.
CREATE OR REPLACE FUNCTION pgmq._topic_queues(routing_key text)
RETURNS TABLE (queue_name text, pgmq_name text)
LANGUAGE sql VOLATILE AS $$
    SELECT q.queue_name, pgmq._pgmq_name(q.queue_name)
      FROM pgqueue.queue q
     WHERE q.queue_name IN (SELECT b.queue_name FROM pgmq.topic_bindings b WHERE $1 ~ b.compiled_regex)
     ORDER BY 2
       FOR KEY SHARE OF q;
$$;

-- Sends msg to every queue bound by a pattern routing_key matches (once per
-- queue, even when several of its patterns match), through the facade's
-- pgmq.send (so through pgqueue.send: the x-pgmq-group header names the
-- message's FIFO group, notify-on-insert fires), as PGMQ's send_topic does. The number of queues
-- sent to; 0 when none matched. All or nothing: one failing send fails all.
CREATE OR REPLACE FUNCTION pgmq.send_topic(routing_key text, msg jsonb, headers jsonb, delay integer)
RETURNS integer
LANGUAGE plpgsql
SECURITY DEFINER SET search_path = pg_catalog, pgqueue, pg_temp
AS $$
DECLARE
    v_queue text;
    v_sent integer := 0;
BEGIN
    PERFORM pgmq.validate_routing_key(send_topic.routing_key);
    IF send_topic.msg IS NULL THEN
        RAISE EXCEPTION 'msg must not be NULL' USING ERRCODE = '22004',
            HINT = 'Send a JSON value; use ''null''::jsonb for a JSON null.';
    END IF;
    PERFORM pgqueue._require_nonnegative('delay', send_topic.delay);
    -- the header rule holds when no queue is bound too: a refusal never depends on routing
    PERFORM pgqueue._require_headers(send_topic.headers);
    FOR v_queue IN SELECT t.queue_name FROM pgmq._topic_queues(send_topic.routing_key) t LOOP
        PERFORM pgmq.send(v_queue, send_topic.msg, send_topic.headers, send_topic.delay);
        v_sent := v_sent + 1;
    END LOOP;
    RETURN v_sent;
END
$$;

CREATE OR REPLACE FUNCTION pgmq.send_topic(routing_key text, msg jsonb) RETURNS integer
LANGUAGE sql AS $$
    SELECT pgmq.send_topic($1, $2, NULL::jsonb, 0);
$$;

CREATE OR REPLACE FUNCTION pgmq.send_topic(routing_key text, msg jsonb, delay integer) RETURNS integer
LANGUAGE sql AS $$
    SELECT pgmq.send_topic($1, $2, NULL::jsonb, $3);
$$;

-- Each queue bound by a pattern routing_key matches gets the whole batch
-- through the facade's pgmq.send_batch (so pgqueue.send_batch: ids in input
-- order, each message's x-pgmq-group header its FIFO group, a NULL body JSON
-- null, a negative delay none, as for pgmq.send_batch), queues by name. The other
-- overloads come here, a timestamp delay rounded up to whole seconds from now
-- by pgmq._delay_seconds (10_facade.sql), as pgmq.send does. PGMQ
-- refuses an empty batch: so do we. All or nothing.
CREATE OR REPLACE FUNCTION pgmq.send_batch_topic(routing_key text, msgs jsonb[], headers jsonb[], delay integer)
RETURNS TABLE (queue_name text, msg_id bigint)
LANGUAGE plpgsql
SECURITY DEFINER SET search_path = pg_catalog, pgqueue, pg_temp
AS $$
DECLARE
    v_queue record;
BEGIN
    PERFORM pgmq.validate_routing_key(send_batch_topic.routing_key);
    IF send_batch_topic.msgs IS NULL OR cardinality(send_batch_topic.msgs) = 0 THEN
        RAISE EXCEPTION 'msgs must not be NULL or empty' USING ERRCODE = '22023';
    END IF;
    IF send_batch_topic.headers IS NOT NULL
       AND cardinality(send_batch_topic.headers) <> cardinality(send_batch_topic.msgs) THEN
        RAISE EXCEPTION 'headers has % elements but msgs has %',
            cardinality(send_batch_topic.headers), cardinality(send_batch_topic.msgs)
            USING ERRCODE = '22023', HINT = 'Pass one headers value per message, or NULL for none.';
    END IF;
    IF send_batch_topic.delay IS NULL THEN
        RAISE EXCEPTION 'delay must not be NULL' USING ERRCODE = '22004';
    END IF;
    IF send_batch_topic.headers IS NOT NULL THEN
        PERFORM pgqueue._require_headers(h) FROM unnest(send_batch_topic.headers) h;
    END IF;
    FOR v_queue IN SELECT * FROM pgmq._topic_queues(send_batch_topic.routing_key) LOOP
        RETURN QUERY
        SELECT v_queue.pgmq_name, s.id
          FROM pgmq.send_batch(v_queue.queue_name, send_batch_topic.msgs, send_batch_topic.headers,
                               send_batch_topic.delay) AS s (id);
    END LOOP;
END
$$;

CREATE OR REPLACE FUNCTION pgmq.send_batch_topic(routing_key text, msgs jsonb[], headers jsonb[],
                                                 delay timestamptz)
RETURNS TABLE (queue_name text, msg_id bigint)
LANGUAGE plpgsql
SECURITY DEFINER SET search_path = pg_catalog, pgqueue, pg_temp  -- for pgmq._delay_seconds
AS $$
BEGIN
    IF send_batch_topic.delay IS NULL THEN
        RAISE EXCEPTION 'delay must not be NULL' USING ERRCODE = '22004';
    END IF;
    IF send_batch_topic.headers IS NOT NULL THEN
        PERFORM pgqueue._require_headers(h) FROM unnest(send_batch_topic.headers) h;
    END IF;
    RETURN QUERY
    SELECT * FROM pgmq.send_batch_topic(
        $1, $2, $3,
        pgmq._delay_seconds($4));
END
$$;

CREATE OR REPLACE FUNCTION pgmq.send_batch_topic(routing_key text, msgs jsonb[])
RETURNS TABLE (queue_name text, msg_id bigint)
LANGUAGE sql AS $$
    SELECT * FROM pgmq.send_batch_topic($1, $2, NULL::jsonb[], 0);
$$;

CREATE OR REPLACE FUNCTION pgmq.send_batch_topic(routing_key text, msgs jsonb[], headers jsonb[])
RETURNS TABLE (queue_name text, msg_id bigint)
LANGUAGE sql AS $$
    SELECT * FROM pgmq.send_batch_topic($1, $2, $3, 0);
$$;

CREATE OR REPLACE FUNCTION pgmq.send_batch_topic(routing_key text, msgs jsonb[], delay integer)
RETURNS TABLE (queue_name text, msg_id bigint)
LANGUAGE sql AS $$
    SELECT * FROM pgmq.send_batch_topic($1, $2, NULL::jsonb[], $3);
$$;

CREATE OR REPLACE FUNCTION pgmq.send_batch_topic(routing_key text, msgs jsonb[], delay timestamptz)
RETURNS TABLE (queue_name text, msg_id bigint)
LANGUAGE sql AS $$
    SELECT * FROM pgmq.send_batch_topic($1, $2, NULL::jsonb[], $3);
$$;

-- Rights, as pgqueue.role_grant says (10_facade.sql): sending by topic is
-- everyone's who may send, as send is; looking at the bindings and where a
-- key routes too; binding is administration (the operator's). The table is
-- read through the functions only.
INSERT INTO pgqueue.role_grant (object, roles, kind)
SELECT 'pgmq.' || f, r, 'function'
  FROM (VALUES
        ('{pgqueue_producer,pgqueue_consumer,pgqueue_operator}'::text[],
         ARRAY['send_topic', 'send_batch_topic', 'validate_routing_key', 'validate_topic_pattern',
               'test_routing', 'list_topic_bindings']),
        ('{pgqueue_operator}', ARRAY['bind_topic', 'unbind_topic'])
       ) AS a (r, fs), unnest(a.fs) AS f
ON CONFLICT (object) DO UPDATE SET roles = excluded.roles, kind = excluded.kind;
INSERT INTO pgqueue.role_grant (object, roles, kind) VALUES ('pgmq.topic_bindings', '{}', 'relation')
ON CONFLICT (object) DO UPDATE SET roles = excluded.roles, kind = excluded.kind;
SELECT pgqueue.grant_roles();
