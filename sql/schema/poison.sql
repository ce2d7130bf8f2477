-- pgqueue schema, as it stands now: the poison (dead-letter) table.
--
-- A message whose attempts ran out (the read that would deliver it again, or
-- the nack of its last attempt) or that was poisoned on purpose moves here
-- with its reason, in one statement. Operators look, requeue (under a new
-- msg_id, so no lease of its earlier life can name it) or purge.

CREATE TYPE pgqueue.poison_record AS (
    queue_name text,
    msg_id bigint,
    read_ct integer,
    enqueued_at timestamptz,
    poisoned_at timestamptz,
    reason text,
    message jsonb,
    headers jsonb
);

CREATE TABLE pgqueue.poison (
    queue_id integer NOT NULL,
    msg_id bigint NOT NULL,
    read_ct integer NOT NULL,
    enqueued_at timestamptz NOT NULL,
    poisoned_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    reason text NOT NULL,
    message jsonb NOT NULL,
    headers jsonb,
    dedupe_key text,
    -- its FIFO group: a requeued message goes back to the end of it
    group_key text,
    PRIMARY KEY (queue_id, msg_id)
);
-- Keyset pages newest first (poison_page), across queues and within one; the
-- first also serves the time filters and purge_poison's age cut.
CREATE INDEX poison_page_idx ON pgqueue.poison (poisoned_at, queue_id, msg_id);
CREATE INDEX poison_queue_page_idx ON pgqueue.poison (queue_id, poisoned_at, msg_id);

CREATE FUNCTION pgqueue.poison(queue_name text, msg_id bigint, reason text) RETURNS boolean
LANGUAGE plpgsql
SECURITY DEFINER SET search_path = pg_catalog, pgqueue, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    q pgqueue.queue := pgqueue._queue(poison.queue_name);
BEGIN
    IF poison.reason IS NULL OR poison.reason = '' THEN
        RAISE EXCEPTION 'reason must not be empty' USING ERRCODE = '22023',
            HINT = 'Say why the message is poisoned: operators read it in pgqueue.poison_list().';
    END IF;
    WITH gone AS (
        DELETE FROM pgqueue.message WHERE queue_id = q.queue_id AND msg_id = poison.msg_id AND pgqueue._keyed(read_ct, vt, enqueued_at, group_key)
        RETURNING *
    )
    INSERT INTO pgqueue.poison (queue_id, msg_id, read_ct, enqueued_at, reason, message, headers, dedupe_key,
                                group_key)
    SELECT g.queue_id, g.msg_id, g.read_ct, g.enqueued_at, poison.reason, g.message, g.headers, g.dedupe_key,
           g.group_key
      FROM gone g;
    RETURN FOUND;
END
$$;

CREATE FUNCTION pgqueue.poison_list(queue_name text DEFAULT NULL, qty integer DEFAULT 100)
RETURNS SETOF pgqueue.poison_record
LANGUAGE plpgsql STABLE
SECURITY DEFINER SET search_path = pg_catalog, pgqueue, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_queue_id integer;
BEGIN
    PERFORM pgqueue._require_nonnegative('qty', poison_list.qty);
    IF poison_list.queue_name IS NOT NULL THEN
        v_queue_id := (pgqueue._queue(poison_list.queue_name)).queue_id;
    END IF;
    RETURN QUERY
    SELECT q.queue_name, p.msg_id, p.read_ct, p.enqueued_at, p.poisoned_at, p.reason, p.message, p.headers
      FROM pgqueue.poison p
      JOIN pgqueue.queue q USING (queue_id)
     WHERE v_queue_id IS NULL OR p.queue_id = v_queue_id
     ORDER BY p.poisoned_at DESC, p.msg_id DESC
     LIMIT poison_list.qty;
END
$$;

-- Deletes poison rows of a queue (all of them when msg_ids is NULL); how many.
CREATE FUNCTION pgqueue.poison_purge(queue_name text, msg_ids bigint[] DEFAULT NULL) RETURNS bigint
LANGUAGE plpgsql
SET enable_seqscan = off
SECURITY DEFINER SET search_path = pg_catalog, pgqueue, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    q pgqueue.queue := pgqueue._queue(poison_purge.queue_name);
    n bigint;
BEGIN
    IF poison_purge.msg_ids IS NULL THEN
        DELETE FROM pgqueue.poison WHERE queue_id = q.queue_id;
    ELSE
        -- one primary-key probe per id
        DELETE FROM pgqueue.poison p
         WHERE p.ctid = ANY (ARRAY(
               SELECT (SELECT x.ctid FROM pgqueue.poison x
                        WHERE x.queue_id = q.queue_id AND x.msg_id = u.id)
                 FROM unnest(poison_purge.msg_ids) AS u (id)));
    END IF;
    GET DIAGNOSTICS n = ROW_COUNT;
    RETURN n;
END
$$;

-- The filter every poison search shares: queue (NULL: all), poisoned in
-- [poisoned_after, poisoned_before), reason containing a text (any case).
CREATE FUNCTION pgqueue._poison_matches(p pgqueue.poison, p_queue_id integer, p_after timestamptz,
                                        p_before timestamptz, p_reason text)
RETURNS boolean
LANGUAGE sql IMMUTABLE AS $$
    SELECT (p_queue_id IS NULL OR p.queue_id = p_queue_id)
       AND (p_after IS NULL OR p.poisoned_at >= p_after)
       AND (p_before IS NULL OR p.poisoned_at < p_before)
       AND (p_reason IS NULL OR strpos(lower(p.reason), lower(p_reason)) > 0);
$$;

CREATE FUNCTION pgqueue._queue_id_or_null(queue_name text) RETURNS integer
LANGUAGE sql STABLE AS $$
    SELECT CASE WHEN queue_name IS NULL THEN NULL ELSE (pgqueue._queue(queue_name)).queue_id END;
$$;

-- Newest first, filtered; poison_list(queue, qty) is this without filters.
CREATE FUNCTION pgqueue.poison_list(queue_name text, qty integer, poisoned_after timestamptz,
                                    reason_contains text)
RETURNS SETOF pgqueue.poison_record
LANGUAGE plpgsql STABLE
SECURITY DEFINER SET search_path = pg_catalog, pgqueue, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_queue_id integer := pgqueue._queue_id_or_null(poison_list.queue_name);
BEGIN
    PERFORM pgqueue._require_nonnegative('qty', poison_list.qty);
    RETURN QUERY
    SELECT q.queue_name, p.msg_id, p.read_ct, p.enqueued_at, p.poisoned_at, p.reason, p.message, p.headers
      FROM pgqueue.poison p
      JOIN pgqueue.queue q USING (queue_id)
     WHERE pgqueue._poison_matches(p, v_queue_id, poison_list.poisoned_after, NULL,
                                   poison_list.reason_contains)
     ORDER BY p.poisoned_at DESC, p.msg_id DESC
     LIMIT poison_list.qty;
END
$$;

-- One poison message of a queue; no row if there is none with that id.
CREATE FUNCTION pgqueue.poison_get(queue_name text, msg_id bigint)
RETURNS SETOF pgqueue.poison_record
LANGUAGE plpgsql STABLE
SECURITY DEFINER SET search_path = pg_catalog, pgqueue, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    q pgqueue.queue := pgqueue._queue(poison_get.queue_name);
BEGIN
    RETURN QUERY
    SELECT q.queue_name, p.msg_id, p.read_ct, p.enqueued_at, p.poisoned_at, p.reason, p.message, p.headers
      FROM pgqueue.poison p
     WHERE p.queue_id = q.queue_id AND p.msg_id = poison_get.msg_id;
END
$$;

-- The ids of a queue's matching poison messages, in msg_id order, after
-- `after_msg_id`: a keyset page for bulk requeue and purge.
CREATE FUNCTION pgqueue.poison_ids(queue_name text, after_msg_id bigint, qty integer,
                                   poisoned_after timestamptz DEFAULT NULL,
                                   poisoned_before timestamptz DEFAULT NULL,
                                   reason_contains text DEFAULT NULL)
RETURNS SETOF bigint
LANGUAGE plpgsql STABLE
SECURITY DEFINER SET search_path = pg_catalog, pgqueue, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    q pgqueue.queue := pgqueue._queue(poison_ids.queue_name);
BEGIN
    PERFORM pgqueue._require_nonnegative('qty', poison_ids.qty);
    RETURN QUERY
    SELECT p.msg_id
      FROM pgqueue.poison p
     WHERE p.queue_id = q.queue_id AND p.msg_id > coalesce(poison_ids.after_msg_id, 0)
       AND pgqueue._poison_matches(p, q.queue_id, poison_ids.poisoned_after,
                                   poison_ids.poisoned_before, poison_ids.reason_contains)
     ORDER BY p.msg_id
     LIMIT poison_ids.qty;
END
$$;

CREATE FUNCTION pgqueue.poison_count(queue_name text DEFAULT NULL,
                                     poisoned_after timestamptz DEFAULT NULL,
                                     poisoned_before timestamptz DEFAULT NULL,
                                     reason_contains text DEFAULT NULL)
RETURNS bigint
LANGUAGE plpgsql STABLE
SECURITY DEFINER SET search_path = pg_catalog, pgqueue, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_queue_id integer := pgqueue._queue_id_or_null(poison_count.queue_name);
BEGIN
    RETURN (SELECT count(*) FROM pgqueue.poison p
             WHERE pgqueue._poison_matches(p, v_queue_id, poison_count.poisoned_after,
                                           poison_count.poisoned_before, poison_count.reason_contains));
END
$$;

-- Poison for the holder of the lease that read_ct names; false when that lease
-- is not the current one (nothing changes then).
CREATE FUNCTION pgqueue.poison(queue_name text, msg_id bigint, reason text, read_ct integer) RETURNS boolean
LANGUAGE plpgsql
SECURITY DEFINER SET search_path = pg_catalog, pgqueue, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    q pgqueue.queue := pgqueue._queue(poison.queue_name);
BEGIN
    PERFORM pgqueue._require_read_ct(poison.read_ct);
    IF poison.reason IS NULL OR poison.reason = '' THEN
        RAISE EXCEPTION 'reason must not be empty' USING ERRCODE = '22023',
            HINT = 'Say why the message is poisoned: operators read it in pgqueue.poison_list().';
    END IF;
    WITH gone AS (
        DELETE FROM pgqueue.message
         WHERE queue_id = q.queue_id AND msg_id = poison.msg_id AND pgqueue._keyed(read_ct, vt, enqueued_at, group_key) AND read_ct = poison.read_ct
        RETURNING *
    )
    INSERT INTO pgqueue.poison (queue_id, msg_id, read_ct, enqueued_at, reason, message, headers, dedupe_key,
                                group_key)
    SELECT g.queue_id, g.msg_id, g.read_ct, g.enqueued_at, poison.reason, g.message, g.headers, g.dedupe_key,
           g.group_key
      FROM gone g;
    RETURN FOUND;
END
$$;

-- A requeued message gets a new msg_id: its lease history starts over, and no
-- holder of an old lease can name it. The poison row is gone either way; the
-- returned ids are the new ones, in the order of the old.
CREATE FUNCTION pgqueue.poison_requeue(queue_name text, msg_ids bigint[]) RETURNS SETOF bigint
LANGUAGE plpgsql
SET enable_seqscan = off
SECURITY DEFINER SET search_path = pg_catalog, pgqueue, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    q pgqueue.queue := pgqueue._queue_locked(poison_requeue.queue_name);
    v_now timestamptz := clock_timestamp();
    v_tids tid[];
    v_rows pgqueue.poison[];
    v_new bigint[];
    v_keyed bigint[];
BEGIN
    -- Rows go back with their single-flight key where it is free; where a live
    -- message (or an earlier row of this batch) holds the key, they go back
    -- without one. Nothing is lost: every row taken from the poison table is
    -- inserted by one of the two statements below, in this transaction.
    v_tids := ARRAY(
        SELECT (SELECT p.ctid FROM pgqueue.poison p
                 WHERE p.queue_id = q.queue_id AND p.msg_id = u.id FOR UPDATE)
          FROM (SELECT DISTINCT i FROM unnest(poison_requeue.msg_ids) AS i ORDER BY i) AS u (id));
    WITH back AS (
        DELETE FROM pgqueue.poison p WHERE p.ctid = ANY (v_tids)
        RETURNING *
    )
    SELECT array_agg(b ORDER BY b.msg_id) INTO v_rows FROM back b;
    IF v_rows IS NULL THEN
        RETURN;
    END IF;
    -- to the end of their groups: ids drawn under the groups' send locks
    IF EXISTS (SELECT 1 FROM unnest(v_rows) r WHERE r.group_key IS NOT NULL) THEN
        PERFORM pgqueue._lock_groups(q, ARRAY(SELECT r.group_key FROM unnest(v_rows) r));
    END IF;
    SELECT array_agg(nextval(q.msg_seq) ORDER BY r.ord) INTO v_new
      FROM unnest(v_rows) WITH ORDINALITY AS r (queue_id, msg_id, read_ct, enqueued_at, poisoned_at,
                                                reason, message, headers, dedupe_key, group_key, ord);

    WITH ins AS (
        INSERT INTO pgqueue.message (queue_id, msg_id, read_ct, enqueued_at, vt, message, headers, dedupe_key,
                                     group_key)
        SELECT r.queue_id, v_new[r.ord], 0, r.enqueued_at, v_now, r.message, r.headers, r.dedupe_key,
               r.group_key
          FROM unnest(v_rows) WITH ORDINALITY AS r (queue_id, msg_id, read_ct, enqueued_at, poisoned_at,
                                                    reason, message, headers, dedupe_key, group_key, ord)
         WHERE r.dedupe_key IS NOT NULL
         ORDER BY r.ord
        ON CONFLICT (queue_id, dedupe_key) WHERE dedupe_key IS NOT NULL DO NOTHING
        RETURNING msg_id
    )
    SELECT coalesce(array_agg(i.msg_id), '{}') INTO v_keyed FROM ins i;

    INSERT INTO pgqueue.message (queue_id, msg_id, read_ct, enqueued_at, vt, message, headers, group_key)
    SELECT r.queue_id, v_new[r.ord], 0, r.enqueued_at, v_now, r.message, r.headers, r.group_key
      FROM unnest(v_rows) WITH ORDINALITY AS r (queue_id, msg_id, read_ct, enqueued_at, poisoned_at,
                                                reason, message, headers, dedupe_key, group_key, ord)
     WHERE v_new[r.ord] <> ALL (v_keyed)
     ORDER BY r.ord;

    PERFORM pgqueue._notify(q);
    RETURN QUERY SELECT u.id FROM unnest(v_new) WITH ORDINALITY AS u (id, ord) ORDER BY u.ord;
END
$$;

-- One page of poison messages for the dashboard, newest first, by keyset:
-- rows strictly after the cursor (poisoned_at, queue_id, msg_id) in that
-- descending order; NULL cursor for the first page. With no reason filter, a
-- page reads about qty index entries however many rows the table holds
-- (poison_page_idx across queues, poison_queue_page_idx within one). A
-- reason filter cannot use an index: one call examines at most scan_limit
-- rows; when it stops there before filling the page, its last row has
-- capped = true and no message, and names where the scan stopped (pass it
-- as the cursor to go on). `message` is the payload's text cut to
-- preview_chars; `message_chars` the whole text's length; `message_bytes`
-- its stored size. A payload (or headers) stored in more than 16 kB is not
-- read for a preview: message, message_chars (headers) are NULL for it.
CREATE FUNCTION pgqueue.poison_page(
    queue_name text,
    qty integer,
    poisoned_after timestamptz DEFAULT NULL,
    poisoned_before timestamptz DEFAULT NULL,
    reason_contains text DEFAULT NULL,
    cursor_poisoned_at timestamptz DEFAULT NULL,
    cursor_queue_id integer DEFAULT NULL,
    cursor_msg_id bigint DEFAULT NULL,
    scan_limit integer DEFAULT 100000,
    preview_chars integer DEFAULT 300
) RETURNS TABLE (
    queue text,
    queue_id integer,
    msg_id bigint,
    read_ct integer,
    enqueued_at timestamptz,
    poisoned_at timestamptz,
    reason text,
    message text,
    message_chars integer,
    headers jsonb,
    capped boolean,
    message_bytes integer
)
LANGUAGE plpgsql STABLE
SECURITY DEFINER SET search_path = pg_catalog, pgqueue, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_queue_id integer := pgqueue._queue_id_or_null(poison_page.queue_name);
    v_at timestamptz := coalesce(poison_page.cursor_poisoned_at, 'infinity');
    v_qid integer := coalesce(poison_page.cursor_queue_id, 2147483647);
    v_mid bigint := coalesce(poison_page.cursor_msg_id, 9223372036854775807);
    v_needle text := lower(nullif(poison_page.reason_contains, ''));
    v_scanned integer := 0;
    v_found integer := 0;
    p record;
    c refcursor;
    v_names text[];  -- queue names by queue_id, looked up once each
    v_text text;
    -- a payload or headers stored in more bytes than this are not read
    -- (nor detoasted) for a preview: a page of them costs what its rows'
    -- other columns cost, not their size
    c_preview_bytes constant integer := 16384;
BEGIN
    PERFORM pgqueue._require_nonnegative('qty', poison_page.qty);
    PERFORM pgqueue._require_nonnegative('scan_limit', poison_page.scan_limit);
    PERFORM pgqueue._require_nonnegative('preview_chars', poison_page.preview_chars);
    IF (poison_page.cursor_poisoned_at IS NULL) <> (poison_page.cursor_msg_id IS NULL) THEN
        RAISE EXCEPTION 'cursor_poisoned_at and cursor_msg_id go together' USING ERRCODE = '22023',
            HINT = 'Pass both from the last row of the previous page, or neither for the first page.';
    END IF;
    IF poison_page.qty = 0 THEN
        RETURN;
    END IF;
    IF v_queue_id IS NULL THEN
        OPEN c FOR
        SELECT x.ctid AS tid, x.queue_id, x.msg_id, x.read_ct, x.enqueued_at, x.poisoned_at, x.reason,
               pg_column_size(x.message) AS bytes, pg_column_size(x.headers) AS header_bytes
          FROM pgqueue.poison x
         WHERE (x.poisoned_at, x.queue_id, x.msg_id) < (v_at, v_qid, v_mid)
           AND (poison_page.poisoned_after IS NULL OR x.poisoned_at >= poison_page.poisoned_after)
           AND (poison_page.poisoned_before IS NULL OR x.poisoned_at < poison_page.poisoned_before)
         ORDER BY x.poisoned_at DESC, x.queue_id DESC, x.msg_id DESC;
    ELSE
        OPEN c FOR
        SELECT x.ctid AS tid, x.queue_id, x.msg_id, x.read_ct, x.enqueued_at, x.poisoned_at, x.reason,
               pg_column_size(x.message) AS bytes, pg_column_size(x.headers) AS header_bytes
          FROM pgqueue.poison x
         WHERE x.queue_id = v_queue_id
           AND (x.poisoned_at, x.msg_id) < (v_at, v_mid)
           AND (poison_page.poisoned_after IS NULL OR x.poisoned_at >= poison_page.poisoned_after)
           AND (poison_page.poisoned_before IS NULL OR x.poisoned_at < poison_page.poisoned_before)
         ORDER BY x.poisoned_at DESC, x.msg_id DESC;
    END IF;
    LOOP
        FETCH c INTO p;
        EXIT WHEN NOT FOUND;
        v_scanned := v_scanned + 1;
        IF v_needle IS NULL OR strpos(lower(p.reason), v_needle) > 0 THEN
            v_found := v_found + 1;
            queue := v_names[p.queue_id];
            IF queue IS NULL THEN
                SELECT q.queue_name INTO queue FROM pgqueue.queue q WHERE q.queue_id = p.queue_id;
                v_names[p.queue_id] := queue;
            END IF;
            queue_id := p.queue_id;
            msg_id := p.msg_id;
            read_ct := p.read_ct;
            enqueued_at := p.enqueued_at;
            poisoned_at := p.poisoned_at;
            reason := p.reason;
            -- the payload read only for the rows shown, and only when small
            -- (by ctid: poison rows are never updated, and one gone since is NULL)
            SELECT CASE WHEN p.bytes <= c_preview_bytes THEN x.message::text END,
                   CASE WHEN p.header_bytes <= c_preview_bytes THEN x.headers END
              INTO v_text, headers
              FROM pgqueue.poison x WHERE x.ctid = p.tid;
            message := left(v_text, poison_page.preview_chars);
            message_chars := length(v_text);
            message_bytes := p.bytes;
            capped := false;
            RETURN NEXT;
            EXIT WHEN v_found >= poison_page.qty;
        ELSIF v_scanned >= poison_page.scan_limit THEN
            SELECT q.queue_name INTO queue FROM pgqueue.queue q WHERE q.queue_id = p.queue_id;
            queue_id := p.queue_id;
            msg_id := p.msg_id;
            poisoned_at := p.poisoned_at;
            read_ct := NULL;
            enqueued_at := NULL;
            reason := NULL;
            message := NULL;
            message_chars := NULL;
            headers := NULL;
            message_bytes := NULL;
            capped := true;
            RETURN NEXT;
            EXIT;
        END IF;
    END LOOP;
    CLOSE c;
END
$$;
