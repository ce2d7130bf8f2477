-- pgmq facade: topics (PGMQ 1.13's bind_topic / send_topic family), over pgqueue.
--
-- Applied by `pgqueue pgmq install` right after 10_facade.sql, into the
-- existing schema pgmq, by the schema's owner, in the installer's transaction.
-- Every statement is idempotent; an upgrade drops schema pgmq, installs
-- again and carries the rows of topic_bindings over (pgqueue/_pgmq.py).
-- It uses 10_facade.sql's name mapping (pgmq._name: PGMQ's name to pgqueue's
-- queue; pgmq._pgmq_name: back), pgmq._delay_seconds and PGMQ's batch check
-- pgmq._validate_batch_params.
--
-- A binding says: a message sent with a routing key that matches `pattern`
-- goes to queue `queue_name`. Routing keys are dot-separated words of
-- [A-Za-z0-9_-]; patterns may also hold `*` (one or more characters other than
-- a dot: a whole segment when it stands alone) and `#` (any run of characters,
-- dots included, possibly empty). These are PGMQ's matching rules exactly,
-- including where they differ from AMQP's: `logs.#` does not match `logs`, and
-- `a.#.b` does not match `a.b` (docs/pgmq.md, "Topics").
--
-- Errors are PGMQ's: its checks in its order, raised as it raises them (a
-- plain RAISE EXCEPTION: SQLSTATE P0001, its text, no hint), and PGMQ's
-- clients and its regression file match on the texts. psql prints a CONTEXT
-- line per function on the stack, naming the function, the statement and the
-- line of the function's body: so the functions call each other as PGMQ's
-- do (send_topic's and send_batch_topic's short forms call the long one,
-- the long forms call validate_routing_key, bind_topic validate_topic_pattern,
-- send_batch_topic pgmq._validate_batch_params, each by PGMQ's statement
-- text), and every RAISE and PERFORM of theirs is on the line of PGMQ's.
-- Mind the line numbers when editing a function body here. What pgqueue
-- refuses beyond PGMQ comes after PGMQ's checks: the header rule (no _pg_
-- key; headers a JSON object), enforced even when no queue is bound, so a
-- refusal never depends on routing (docs/security.md).
--
-- Why matching through a regular expression is safe: a pattern can only reach
-- the table through the CHECK below, which is validate_topic_pattern (it
-- admits [A-Za-z0-9._*#-] and nothing else), and compiled_regex maps each of
-- those characters to a fixed piece of regex (`.` is escaped); routing keys
-- are validated before they are matched and are only ever the subject of `~`,
-- never the regex. No dynamic SQL here.
--
-- Why a binding cannot outlive its queue: a trigger on pgqueue.queue deletes a
-- dropped queue's bindings in the dropping transaction (pgqueue.drop_queue and
-- pgmq.drop_queue both delete that row), and bind_topic holds a KEY SHARE lock
-- on the queue row until it commits, so a concurrent drop (FOR UPDATE) either
-- waits for the binding and then deletes it, or commits first and bind_topic
-- finds no queue.

-- True when routing_key is a valid routing key; else raises PGMQ's error.
CREATE OR REPLACE FUNCTION pgmq.validate_routing_key(routing_key text) RETURNS boolean
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    -- A routing key is what a message is sent with: dot-separated words of
    -- ASCII letters, digits, '_' and '-', at most 255 characters, no
    -- wildcards (those are for patterns). For instance:
    --     orders.eu.created    accepted
    --     orders..created      refused (an empty word)
    --     orders.*             refused ('*' is a pattern's)
    --
    -- The checks run in PGMQ's order, so a key that breaks several rules
    -- gets PGMQ's message for the first. Each RAISE is on the line of the
    -- body where PGMQ's is (18, 22, ... 38), so the CONTEXT line psql prints
    -- under the error ("... validate_routing_key(text) line 18 at RAISE")
    -- is PGMQ's too: add no line above a RAISE without taking one away.
    -- A key holding any other character is refused before it is ever the
    -- subject of a regex match (test_routing, send_topic).
    IF routing_key IS NULL OR routing_key = '' THEN
        RAISE EXCEPTION 'routing_key cannot be NULL or empty';
    END IF;

    IF length(routing_key) > 255 THEN
        RAISE EXCEPTION 'routing_key length cannot exceed 255 characters, got % characters', length(routing_key);
    END IF;

    IF routing_key ~ '[^A-Za-z0-9._-]' THEN
        RAISE EXCEPTION 'routing_key contains invalid characters. Only alphanumeric, dots, hyphens, and underscores are allowed. Got: %', routing_key;
    END IF;

    IF left(routing_key, 1) = '.' THEN
        RAISE EXCEPTION 'routing_key cannot start with a dot. Got: %', routing_key;
    END IF;

    IF right(routing_key, 1) = '.' THEN
        RAISE EXCEPTION 'routing_key cannot end with a dot. Got: %', routing_key;
    END IF;

    IF strpos(routing_key, '..') > 0 THEN
        RAISE EXCEPTION 'routing_key cannot contain consecutive dots. Got: %', routing_key;
    END IF;

    RETURN true;
END
$$;

-- True when pattern is a valid topic pattern; else raises PGMQ's error.
CREATE OR REPLACE FUNCTION pgmq.validate_topic_pattern(pattern text) RETURNS boolean
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    -- A pattern is a routing key whose words may hold wildcards: '*' (one or
    -- more characters other than a dot) and '#' (any run of characters,
    -- dots included, possibly none). For instance:
    --     orders.*.created     accepted
    --     orders.#             accepted (matches orders.eu.created, not orders)
    --     #                    accepted (matches every key)
    --     orders.**            refused ('#' is the wildcard for many words)
    --     orders.*#            refused (two wildcards side by side)
    --
    -- As in validate_routing_key: PGMQ's checks in PGMQ's order, each RAISE
    -- on the line of PGMQ's (21, 25, ... 53) for PGMQ's CONTEXT line. The
    -- table's CHECK is this function too (pgmq._is_topic_pattern), so no
    -- row can hold a pattern this refuses: compiled_regex, built from the
    -- pattern's characters, relies on it.
    --
    -- Keep the line count above each RAISE: the first is on line 21 of the
    -- body (line 1 is the rest of the line that opens the body).
    IF pattern IS NULL OR pattern = '' THEN
        RAISE EXCEPTION 'pattern cannot be NULL or empty';
    END IF;

    IF length(pattern) > 255 THEN
        RAISE EXCEPTION 'pattern length cannot exceed 255 characters, got % characters', length(pattern);
    END IF;

    IF pattern ~ '[^A-Za-z0-9._*#-]' THEN
        RAISE EXCEPTION 'pattern contains invalid characters. Only alphanumeric, dots, hyphens, underscores, *, and # are allowed. Got: %', pattern;
    END IF;

    IF left(pattern, 1) = '.' THEN
        RAISE EXCEPTION 'pattern cannot start with a dot. Got: %', pattern;
    END IF;

    IF right(pattern, 1) = '.' THEN
        RAISE EXCEPTION 'pattern cannot end with a dot. Got: %', pattern;
    END IF;

    IF strpos(pattern, '..') > 0 THEN
        RAISE EXCEPTION 'pattern cannot contain consecutive dots. Got: %', pattern;
    END IF;

    IF strpos(pattern, '**') > 0 THEN
        RAISE EXCEPTION 'pattern cannot contain consecutive stars (**). Use # for multi-segment matching. Got: %', pattern;
    END IF;

    IF strpos(pattern, '##') > 0 THEN
        RAISE EXCEPTION 'pattern cannot contain consecutive hashes (##). A single # already matches zero or more segments. Got: %', pattern;
    END IF;

    IF strpos(pattern, '*#') > 0 OR strpos(pattern, '#*') > 0 THEN
        RAISE EXCEPTION 'pattern cannot contain adjacent wildcards (*# or #*). Separate wildcards with dots. Got: %', pattern;
    END IF;

    RETURN true;
END
$$;

-- The table's CHECK: whether validate_topic_pattern accepts pattern (one
-- rule for bind_topic and the table, so neither can drift from the other).
CREATE OR REPLACE FUNCTION pgmq._is_topic_pattern(pattern text) RETURNS boolean
LANGUAGE plpgsql IMMUTABLE  -- not PARALLEL SAFE: the EXCEPTION block is a subtransaction
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    RETURN pgmq.validate_topic_pattern(pattern);
EXCEPTION
    WHEN raise_exception THEN
        RETURN false;
END
$$;

CREATE TABLE IF NOT EXISTS pgmq.topic_bindings (
    pattern text NOT NULL
        CONSTRAINT topic_bindings_pattern_valid CHECK (pgmq._is_topic_pattern(pattern)),
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
-- list_queues does. The queue row stays locked FOR KEY SHARE until commit: a
-- concurrent drop_queue cannot slip between the check and the insert (see
-- the header). An unknown queue is PGMQ's error, with the name as given.
CREATE OR REPLACE FUNCTION pgmq.bind_topic(pattern text, queue_name text) RETURNS void
LANGUAGE plpgsql
SECURITY DEFINER SET search_path = pg_catalog, pgqueue, pg_temp
AS $$
BEGIN
    PERFORM pgmq.validate_topic_pattern(pattern);
    IF queue_name IS NULL OR queue_name = '' THEN
        RAISE EXCEPTION 'queue_name cannot be NULL or empty';
    END IF;
    PERFORM FROM pgqueue.queue q WHERE q.queue_name = pgmq._name(bind_topic.queue_name) FOR KEY SHARE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'Queue "%" does not exist. Create the queue first using pgmq.create()', queue_name;
    END IF;
    INSERT INTO pgmq.topic_bindings AS b (pattern, queue_name)
    VALUES (bind_topic.pattern, pgmq._name(bind_topic.queue_name))
    ON CONFLICT ON CONSTRAINT topic_bindings_unique_pattern_queue DO NOTHING;
END
$$;

-- Removes the binding of pattern to queue_name; whether there was one. The
-- pattern is not validated (a binding that cannot exist is simply not
-- found), as in PGMQ.
CREATE OR REPLACE FUNCTION pgmq.unbind_topic(pattern text, queue_name text) RETURNS boolean
LANGUAGE plpgsql
SECURITY DEFINER SET search_path = pg_catalog, pgqueue, pg_temp
AS $$
-- Both arguments are required; each RAISE is on the line of PGMQ's (6 and
-- 10), for PGMQ's CONTEXT line.
BEGIN
    IF pattern IS NULL OR pattern = '' THEN
        RAISE EXCEPTION 'pattern cannot be NULL or empty';
    END IF;

    IF queue_name IS NULL OR queue_name = '' THEN
        RAISE EXCEPTION 'queue_name cannot be NULL or empty';
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
    PERFORM pgmq.validate_routing_key(routing_key);
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
-- message's FIFO group, notify-on-insert fires), as PGMQ's send_topic does.
-- The number of queues sent to; 0 when none matched. All or nothing: one
-- failing send fails all. A NULL delay is refused by the send (22004) when a
-- queue matched, and sends nothing otherwise, as in PGMQ (which raises
-- 23502 there).
CREATE OR REPLACE FUNCTION pgmq.send_topic(routing_key text, msg jsonb, headers jsonb, delay integer)
RETURNS integer
LANGUAGE plpgsql
SECURITY DEFINER SET search_path = pg_catalog, pgqueue, pg_temp
AS $$
DECLARE
    v_queue text;
    v_sent integer := 0;
BEGIN
    PERFORM pgmq.validate_routing_key(routing_key);
    -- PGMQ's checks, on PGMQ's lines (9 and 13); a JSON null is 'null'::jsonb
    IF msg IS NULL THEN
        RAISE EXCEPTION 'msg cannot be NULL';
    END IF;
    -- refused here, though pgmq.send takes a negative delay as none
    IF delay < 0 THEN
        RAISE EXCEPTION 'delay cannot be negative, got: %', delay;
    END IF;
    -- pgqueue's header rule, also when no queue is bound
    PERFORM pgqueue._require_headers(headers);
    FOR v_queue IN SELECT t.queue_name FROM pgmq._topic_queues(routing_key) t LOOP
        PERFORM pgmq.send(v_queue, msg, headers, delay);
        v_sent := v_sent + 1;
    END LOOP;
    RETURN v_sent;
END
$$;

-- The short forms call the long one by PGMQ's statement (its CONTEXT line).
CREATE OR REPLACE FUNCTION pgmq.send_topic(routing_key text, msg jsonb) RETURNS integer
LANGUAGE plpgsql
AS $$
BEGIN
    RETURN pgmq.send_topic(routing_key, msg, NULL, 0);
END
$$;

CREATE OR REPLACE FUNCTION pgmq.send_topic(routing_key text, msg jsonb, delay integer) RETURNS integer
LANGUAGE plpgsql
AS $$
BEGIN
    RETURN pgmq.send_topic(routing_key, msg, NULL, delay);
END
$$;

-- Each queue bound by a pattern routing_key matches gets the whole batch
-- through the facade's pgmq.send_batch (so pgqueue.send_batch: ids in input
-- order, each message's x-pgmq-group header its FIFO group, a NULL body JSON
-- null), queues by name. As in PGMQ this form, with a timestamp delay, is
-- the one the others call (an integer delay as clock_timestamp() plus that
-- many seconds); the delay becomes whole seconds from now, rounded up, once
-- for all queues (pgmq._delay_seconds, as pgmq.send does), a time past being
-- none. PGMQ's checks first (the routing key, then the batch: msgs neither
-- NULL nor empty, headers NULL or one per message), then pgqueue's header
-- rule. A NULL delay is refused by the send (22004) when a queue matched,
-- and sends nothing otherwise, as in PGMQ (which raises 23502 there). All
-- or nothing.
CREATE OR REPLACE FUNCTION pgmq.send_batch_topic(routing_key text, msgs jsonb[], headers jsonb[],
                                                 delay timestamptz)
RETURNS TABLE (queue_name text, msg_id bigint)
LANGUAGE plpgsql
SECURITY DEFINER SET search_path = pg_catalog, pgqueue, pg_temp
AS $$
DECLARE
    v_queue record; v_seconds integer;  -- a queue it goes to; the delay, in seconds from now
BEGIN
    PERFORM pgmq.validate_routing_key(routing_key);
    -- PGMQ's checks of a batch, once for all queues, in 10_facade.sql; the
    -- PERFORM on line 8, as PGMQ's, for its CONTEXT line
    PERFORM pgmq._validate_batch_params(msgs, headers);
    IF headers IS NOT NULL THEN  -- pgqueue's header rule, also when no queue is bound
        PERFORM pgqueue._require_headers(h) FROM unnest(headers) h;
    END IF;
    v_seconds := pgmq._delay_seconds(delay);
    FOR v_queue IN SELECT * FROM pgmq._topic_queues(routing_key) LOOP
        RETURN QUERY
        SELECT v_queue.pgmq_name, s.id
          FROM pgmq.send_batch(v_queue.queue_name, msgs, headers, v_seconds) AS s (id);
    END LOOP;
END
$$;

-- The other forms, as PGMQ's: plain SQL calling the one above.
CREATE OR REPLACE FUNCTION pgmq.send_batch_topic(routing_key text, msgs jsonb[])
RETURNS TABLE (queue_name text, msg_id bigint)
LANGUAGE sql AS $$
    SELECT * FROM pgmq.send_batch_topic(routing_key, msgs, NULL, clock_timestamp());
$$;

CREATE OR REPLACE FUNCTION pgmq.send_batch_topic(routing_key text, msgs jsonb[], headers jsonb[])
RETURNS TABLE (queue_name text, msg_id bigint)
LANGUAGE sql AS $$
    SELECT * FROM pgmq.send_batch_topic(routing_key, msgs, headers, clock_timestamp());
$$;

CREATE OR REPLACE FUNCTION pgmq.send_batch_topic(routing_key text, msgs jsonb[], delay integer)
RETURNS TABLE (queue_name text, msg_id bigint)
LANGUAGE sql AS $$
    SELECT * FROM pgmq.send_batch_topic(routing_key, msgs, NULL, clock_timestamp() + make_interval(secs => delay));
$$;

CREATE OR REPLACE FUNCTION pgmq.send_batch_topic(routing_key text, msgs jsonb[], delay timestamptz)
RETURNS TABLE (queue_name text, msg_id bigint)
LANGUAGE sql AS $$
    SELECT * FROM pgmq.send_batch_topic(routing_key, msgs, NULL, delay);
$$;

CREATE OR REPLACE FUNCTION pgmq.send_batch_topic(routing_key text, msgs jsonb[], headers jsonb[], delay integer)
RETURNS TABLE (queue_name text, msg_id bigint)
LANGUAGE sql AS $$
    SELECT * FROM pgmq.send_batch_topic(routing_key, msgs, headers, clock_timestamp() + make_interval(secs => delay));
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
