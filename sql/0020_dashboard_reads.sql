-- The dashboard's reads (docs/dashboard.md): poison by keyset, newest first,
-- with filters and a capped reason search; a barrier's outcome counts and the
-- members it still waits on; barriers newest first by keyset. Their indexes:
-- poison pages across queues and within one (replacing the poisoned_at index),
-- and barrier_created_idx gains barrier_id so its keyset reads only the index.

CREATE INDEX poison_page_idx ON pgqueue.poison (poisoned_at, queue_id, msg_id);
CREATE INDEX poison_queue_page_idx ON pgqueue.poison (queue_id, poisoned_at, msg_id);
DROP INDEX pgqueue.poison_poisoned_at_idx;
DROP INDEX pgqueue.barrier_created_idx;
CREATE INDEX barrier_created_idx ON pgqueue.barrier (created_at, barrier_id);

-- One page of poison messages for the dashboard, newest first, by keyset:
-- rows strictly after the cursor (poisoned_at, queue_id, msg_id) in that
-- descending order; NULL cursor for the first page. With no reason filter, a
-- page reads about qty index entries however many rows the table holds
-- (poison_page_idx across queues, poison_queue_page_idx within one). A
-- reason filter cannot use an index: one call examines at most scan_limit
-- rows; when it stops there before filling the page, its last row has
-- capped = true and no message, and names where the scan stopped (pass it
-- as the cursor to go on). `message` is the payload's text cut to
-- preview_chars; `message_chars` the whole text's length.
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
    capped boolean
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
    p pgqueue.poison;
    c refcursor;
    v_names text[];  -- queue names by queue_id, looked up once each
    v_text text;
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
        SELECT x.* FROM pgqueue.poison x
         WHERE (x.poisoned_at, x.queue_id, x.msg_id) < (v_at, v_qid, v_mid)
           AND (poison_page.poisoned_after IS NULL OR x.poisoned_at >= poison_page.poisoned_after)
           AND (poison_page.poisoned_before IS NULL OR x.poisoned_at < poison_page.poisoned_before)
         ORDER BY x.poisoned_at DESC, x.queue_id DESC, x.msg_id DESC;
    ELSE
        OPEN c FOR
        SELECT x.* FROM pgqueue.poison x
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
            v_text := p.message::text;
            message := left(v_text, poison_page.preview_chars);
            message_chars := length(v_text);
            headers := p.headers;
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
            capped := true;
            RETURN NEXT;
            EXIT;
        END IF;
    END LOOP;
    CLOSE c;
END
$$;

-- A barrier's members counted by outcome, 'pending' for those without one: a
-- progress bar's segments. One scan of its primary key's prefix.
CREATE FUNCTION pgqueue.barrier_outcomes(barrier_id text)
RETURNS TABLE (outcome text, members bigint)
LANGUAGE plpgsql STABLE
SECURITY DEFINER SET search_path = pg_catalog, pgqueue, pg_temp
AS $$
#variable_conflict use_column
BEGIN
    PERFORM pgqueue._barrier_or_raise(barrier_outcomes.barrier_id);
    RETURN QUERY
    SELECT coalesce(m.outcome, 'pending'), count(*)
      FROM pgqueue.barrier_member m
     WHERE m.barrier_id = barrier_outcomes.barrier_id
     GROUP BY 1
     ORDER BY 1;
END
$$;

-- The members a barrier still waits on, by member index after after_index,
-- with the live message each is (NULL columns when the message is gone but
-- its completion is not yet counted): what a stuck fan-out waits for.
CREATE FUNCTION pgqueue.barrier_pending(barrier_id text, qty integer DEFAULT 100,
                                        after_index integer DEFAULT -1)
RETURNS TABLE (
    member_index integer,
    queue_name text,
    msg_id bigint,
    read_ct integer,
    enqueued_at timestamptz,
    vt timestamptz,
    last_error text
)
LANGUAGE plpgsql STABLE
SECURITY DEFINER SET search_path = pg_catalog, pgqueue, pg_temp
AS $$
#variable_conflict use_column
BEGIN
    PERFORM pgqueue._barrier_or_raise(barrier_pending.barrier_id);
    PERFORM pgqueue._require_nonnegative('qty', barrier_pending.qty);
    RETURN QUERY
    SELECT b.member_index, q.queue_name, b.msg_id, m.read_ct, m.enqueued_at, m.vt, m.last_error
      FROM pgqueue.barrier_member b
      JOIN pgqueue.queue q ON q.queue_id = b.queue_id
      LEFT JOIN pgqueue.message m ON m.queue_id = b.queue_id AND m.msg_id = b.msg_id
     WHERE b.barrier_id = barrier_pending.barrier_id
       AND b.member_index > coalesce(barrier_pending.after_index, -1)
       AND b.outcome IS NULL
     ORDER BY b.member_index
     LIMIT barrier_pending.qty;
END
$$;

-- Barriers newest first, by keyset: those created before (before_created_at,
-- before_barrier_id) in (created_at, barrier_id) descending order; NULLs for
-- the first page. Reads barrier_created_idx backwards.
CREATE FUNCTION pgqueue.list_barriers(state text, qty integer, before_created_at timestamptz,
                                      before_barrier_id text)
RETURNS SETOF pgqueue.barrier_status
LANGUAGE plpgsql STABLE
SECURITY DEFINER SET search_path = pg_catalog, pgqueue, pg_temp
AS $$
#variable_conflict use_column
BEGIN
    IF list_barriers.state IS NOT NULL AND list_barriers.state NOT IN ('open', 'fired', 'expired') THEN
        RAISE EXCEPTION 'state must be open, fired or expired, got %', quote_literal(list_barriers.state)
            USING ERRCODE = '22023';
    END IF;
    PERFORM pgqueue._require_nonnegative('qty', list_barriers.qty);
    IF list_barriers.before_created_at IS NULL THEN
        RETURN QUERY
        SELECT s.*
          FROM (SELECT b.barrier_id FROM pgqueue.barrier b
                 WHERE list_barriers.state IS NULL OR b.state = list_barriers.state
                 ORDER BY b.created_at DESC, b.barrier_id DESC
                 LIMIT list_barriers.qty) ids,
               LATERAL pgqueue._barrier_status(ids.barrier_id) s
         ORDER BY s.created_at DESC, s.barrier_id DESC;
    ELSE
        RETURN QUERY
        SELECT s.*
          FROM (SELECT b.barrier_id FROM pgqueue.barrier b
                 WHERE (b.created_at, b.barrier_id)
                       < (list_barriers.before_created_at, coalesce(list_barriers.before_barrier_id, ''))
                   AND (list_barriers.state IS NULL OR b.state = list_barriers.state)
                 ORDER BY b.created_at DESC, b.barrier_id DESC
                 LIMIT list_barriers.qty) ids,
               LATERAL pgqueue._barrier_status(ids.barrier_id) s
         ORDER BY s.created_at DESC, s.barrier_id DESC;
    END IF;
END
$$;

DELETE FROM pgqueue.role_grant WHERE function_signature IN (
    'pgqueue.poison_page(text,integer,timestamp with time zone,timestamp with time zone,text,timestamp with time zone,integer,bigint,integer,integer)',
    'pgqueue.barrier_outcomes(text)',
    'pgqueue.barrier_pending(text,integer,integer)',
    'pgqueue.list_barriers(text,integer,timestamp with time zone,text)');
INSERT INTO pgqueue.role_grant (function_signature, roles) VALUES
    ('pgqueue.poison_page(text,integer,timestamp with time zone,timestamp with time zone,text,timestamp with time zone,integer,bigint,integer,integer)', '{pgqueue_operator}'),
    ('pgqueue.barrier_outcomes(text)', '{pgqueue_operator}'),
    ('pgqueue.barrier_pending(text,integer,integer)', '{pgqueue_operator}'),
    ('pgqueue.list_barriers(text,integer,timestamp with time zone,text)', '{pgqueue_operator}');

SELECT pgqueue.grant_roles();
