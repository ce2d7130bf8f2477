
-- Marks schema pgmq as pgqueue's facade (`pgqueue pgmq status` reads it).
-- Who may call and read what is granted above, by pgqueue.grant_roles()
-- from pgqueue.role_grant (the one role model, docs/security.md).
COMMENT ON SCHEMA pgmq IS 'pgqueue pgmq facade @VERSION@';
