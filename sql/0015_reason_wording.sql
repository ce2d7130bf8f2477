-- pgqueue 0015: a poison reason says "read 1 time", not "read 1 times".

-- The poison reason of a message whose attempts ran out.
CREATE OR REPLACE FUNCTION pgqueue._exhausted_reason(read_ct integer, last_error text) RETURNS text
LANGUAGE sql STABLE AS $$
    SELECT format('max_attempts exceeded (read %s %s)', read_ct,
                  CASE WHEN read_ct = 1 THEN 'time' ELSE 'times' END)
           || coalesce('; last error: ' || last_error, '');
$$;
