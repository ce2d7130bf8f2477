-- pgqueue 0013: a keyed send that says whether it sent.
--
-- send() with a dedupe_key returns the id of the message holding the key,
-- whether this call inserted it or found another sender's unfinished one; a
-- caller (the CLI, an operator's script) could not tell "sent" from "already
-- pending". send_keyed returns both.

-- send under a dedupe_key, saying whether this call sent: (msg_id, sent).
-- sent is true when this call (or an earlier attempt of it, with the same
-- send_token, whose commit reply was lost) inserted the message, live or
-- consumed since; false when an unfinished message sent by someone else holds
-- the key (msg_id is then that message's, and nothing was inserted). Without a
-- send_token the call makes one, so a single call still knows what it did.
CREATE FUNCTION pgqueue.send_keyed(
    queue_name text,
    message jsonb,
    dedupe_key text,
    headers jsonb DEFAULT NULL,
    delay integer DEFAULT 0,
    send_token uuid DEFAULT NULL
) RETURNS TABLE (msg_id bigint, sent boolean)
LANGUAGE plpgsql
SECURITY DEFINER SET search_path = pg_catalog, pgqueue, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_token uuid := coalesce(send_keyed.send_token, gen_random_uuid());
    v_id bigint;
BEGIN
    IF send_keyed.dedupe_key IS NULL THEN
        RAISE EXCEPTION 'dedupe_key must not be NULL' USING ERRCODE = '22004',
            HINT = 'Use send() for a message without a key.';
    END IF;
    v_id := pgqueue.send(send_keyed.queue_name, send_keyed.message, send_keyed.headers,
                         send_keyed.delay, send_keyed.dedupe_key, v_token);
    RETURN QUERY
    SELECT v_id,
           EXISTS (SELECT FROM pgqueue.message m JOIN pgqueue.queue q ON q.queue_id = m.queue_id
                    WHERE q.queue_name = send_keyed.queue_name AND m.msg_id = v_id
                      AND m.send_token = v_token)
           OR EXISTS (SELECT FROM pgqueue.send_receipt r
                       WHERE r.send_token = v_token AND r.msg_id = v_id);
END
$$;

INSERT INTO pgqueue.role_grant (function_signature, roles) VALUES
    ('pgqueue.send_keyed(text,jsonb,text,jsonb,integer,uuid)',
     '{pgqueue_producer,pgqueue_consumer,pgqueue_operator}');

SELECT pgqueue.grant_roles();
