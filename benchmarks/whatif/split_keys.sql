-- What-if, for measurement only (not a migration): a fresh message keeps one
-- index entry instead of two. The primary key is split in two partial unique
-- indexes, one holding fresh messages (which then also serves as the fresh
-- read lane, in msg_id order) and one holding every other message; the fresh
-- lane on (queue_id, vt, msg_id) goes. Reads and acks are NOT rewritten for
-- it, so only sends are meaningful with it:
--
--   python -m benchmarks.pgmq_instructions --calls 'send_batch of 100' \
--       --facade-sql benchmarks/whatif/split_keys.sql
--   python -m benchmarks.pgmq_facade --only send_batch --rounds 15 --scale 2 \
--       --facade-sql benchmarks/whatif/split_keys.sql
--
-- docs/design/one-entry-sends.md is the design this measures; it writes the
-- second predicate as `(...) IS NOT TRUE`, so that lookups by id probe that
-- index once (counted so: 4,720k instructions per batch, where this file's
-- form counts 4,718k).
ALTER TABLE pgqueue.message DROP CONSTRAINT message_pkey;
DROP INDEX pgqueue.message_fresh_idx;
CREATE UNIQUE INDEX message_fresh_id_idx ON pgqueue.message (queue_id, msg_id)
    WHERE read_ct = 0 AND vt <= enqueued_at AND group_key IS NULL;
CREATE UNIQUE INDEX message_rest_id_idx ON pgqueue.message (queue_id, msg_id)
    WHERE NOT (read_ct = 0 AND vt <= enqueued_at AND group_key IS NULL);
