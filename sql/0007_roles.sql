-- pgqueue 0007: a least-privilege role layout.
--
-- Three group roles (NOLOGIN); an administrator grants them to login roles:
--   pgqueue_producer  sends (send, send_batch, fan_out) and nothing else: it
--                     cannot read, ack, purge, drop or look at any message.
--   pgqueue_consumer  what a worker does: read, ack, nack, complete barrier
--                     members, poison, wait for sends (listen), the duplicate
--                     guard, claims, the barrier sweep, barrier status and
--                     results, list_queues and metrics; and send, because
--                     handlers fan out nested work.
--   pgqueue_operator  what the `pgqueue` command does: queue administration,
--                     peek, metrics, the poison table, barriers, claims, the
--                     periodic purges, and send. Not the migrations: schema
--                     changes stay with the role that migrates, the owner of
--                     everything in schema pgqueue.
-- pgqueue.role_grant below is the whole table, one row per API function.
--
-- The model. Callers get USAGE on the schema, EXECUTE on their API functions
-- and nothing on tables or sequences (but SELECT on schema_version, for the
-- version check at startup). The API functions are SECURITY DEFINER: they run
-- as their owner, so they may touch the tables the caller may not. That is
-- safe because:
--   * each of them runs with a fixed search_path (pg_catalog, pgqueue,
--     pg_temp). A caller's own search_path cannot put a function, operator or
--     table of theirs in front of pg_catalog's; pg_temp comes last (and is never
--     searched for functions or operators); nobody but the owner may create
--     objects in schema pgqueue. Every table the bodies use is written
--     schema-qualified anyway.
--   * none of them turns a caller's text into SQL: dynamic SQL only ever
--     quotes a queue name that create_queue validated, or uses a regclass or
--     an integer id.
--   * what a function does is exactly what its role is meant to do; a role can
--     do nothing else with the tables.
-- Internal helpers get no grants and stay SECURITY INVOKER without SET
-- clauses: they are only ever called from the API functions, as the owner,
-- and the small SQL ones (_ts_us, _us_ts, _channel, _clip_error, ...) are
-- inlined into their callers' statements, which a SET clause or SECURITY
-- DEFINER would prevent (0005 measured what a call costs instead).
--
-- Default privileges. A function is executable by PUBLIC when it is created,
-- and ALTER DEFAULT PRIVILEGES IN SCHEMA cannot take that away (per-schema
-- defaults only add to the global ones); the global form would change the
-- migrating role's defaults in every schema of the database, the
-- application's own included. So grant_roles() revokes PUBLIC's rights on
-- every function of the schema each time it runs, and a later migration that
-- adds an API function inserts its row into pgqueue.role_grant and ends with
-- SELECT pgqueue.grant_roles(); one that replaces an API function with CREATE
-- OR REPLACE does the same, since that resets SECURITY DEFINER and SET (it
-- keeps the grants). Tables and sequences are never PUBLIC's by default, so
-- the sequences create_queue makes for each queue (now as the owner) are
-- private too.
--
-- Roles are cluster-wide, and other databases of the cluster may be migrated
-- at the same moment: a role created by such a migration between our check
-- and our CREATE ROLE is fine (duplicate_object, or unique_violation while its
-- creator has not committed yet). A migrating role that may not create roles
-- gets a NOTICE instead; an administrator then creates the three roles and the
-- owner runs SELECT pgqueue.grant_roles() (docs/security.md).
--
-- Callers logging in as other roles than the owner also exposed a bug in
-- 0005's _oldest_writer(), replaced below: sessions hidden from the owner were
-- left out instead of counted as infinitely old.
--
-- One more right the owner needs once callers log in as other roles:
-- pg_read_all_stats (superusers have it). The reads' late sweep (0005) runs
-- _oldest_writer() as the owner, and a session whose details the owner may
-- not see in pg_stat_activity counts as infinitely old: the safe floors of
-- the claim lanes then never rise while such a session is connected, and
-- every late sweep walks all the dead index entries left since they stopped.
-- grant_roles() says so in a NOTICE.

-- ---------------------------------------------------------------------------
-- sessions the owner may not see

-- 0005's _oldest_writer(), but a session whose details are hidden from the
-- owner is counted as infinitely old, as 0005 meant: pg_stat_activity hides
-- backend_type too (not only state and times), and `NULL NOT IN (...)` left
-- such sessions out altogether. Once callers log in as roles other than the
-- owner, that made a sweep raise the safe floors past a send still open in a
-- producer's transaction, and the message, committed later below every floor,
-- was never read (test_a_late_send_by_another_role_is_found_even_when_the_
-- owner_cannot_see_it). The cost of counting them: without pg_read_all_stats
-- (see the end of grant_roles) the safe floors do not rise while such a
-- session is connected.
CREATE OR REPLACE FUNCTION pgqueue._oldest_writer() RETURNS timestamptz
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_oldest timestamptz;
BEGIN
    PERFORM pg_stat_clear_snapshot();
    IF EXISTS (SELECT 1 FROM pg_prepared_xacts p WHERE p.database = current_database()) THEN
        -- a prepared transaction may hold rows stamped at any earlier time
        RETURN '-infinity';
    END IF;
    SELECT min(CASE WHEN a.backend_xid IS NOT NULL
                    THEN coalesce(a.xact_start, '-infinity')
                    ELSE coalesce(a.query_start, a.xact_start, '-infinity') END)
      INTO v_oldest
      FROM pg_stat_activity a
     WHERE a.datname = current_database()
       AND a.pid <> pg_backend_pid()
       -- every process that can write rows here (client backends, background
       -- and logical replication workers); vacuum never writes message rows;
       -- a hidden session (NULL type) may be any of them
       AND (a.backend_type IS NULL OR a.backend_type NOT IN ('autovacuum worker', 'autovacuum launcher'))
       -- state and times of another role's session are NULL without
       -- pg_read_all_stats: counted as -infinity
       AND (a.backend_xid IS NOT NULL OR a.state IS NULL
            OR a.state NOT IN ('idle', 'idle in transaction', 'idle in transaction (aborted)'));
    RETURN coalesce(v_oldest, 'infinity');
END
$$;

-- ---------------------------------------------------------------------------
-- the archive, trimmed by the operator role (which has no rights on the table)

-- Deletes up to qty archived rows archived more than older_than_seconds ago;
-- how many. Call until it returns 0: short transactions on a large archive.
CREATE FUNCTION pgqueue.purge_archive(older_than_seconds integer, qty integer DEFAULT 10000)
RETURNS bigint
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    n bigint;
BEGIN
    PERFORM pgqueue._require_nonnegative('older_than_seconds', purge_archive.older_than_seconds);
    PERFORM pgqueue._require_nonnegative('qty', purge_archive.qty);
    -- archived rows are never updated, so a ctid found here still names its row
    DELETE FROM pgqueue.archive a
     WHERE a.ctid = ANY (ARRAY(
           SELECT x.ctid FROM pgqueue.archive x
            WHERE x.archived_at < clock_timestamp() - make_interval(secs => purge_archive.older_than_seconds)
            LIMIT purge_archive.qty));
    GET DIAGNOSTICS n = ROW_COUNT;
    RETURN n;
END
$$;

-- ---------------------------------------------------------------------------
-- who may call what

CREATE TABLE pgqueue.role_grant (
    function_signature text PRIMARY KEY,  -- as regprocedure spells it, schema-qualified
    roles text[] NOT NULL
);

INSERT INTO pgqueue.role_grant (function_signature, roles) VALUES
    -- sending: everyone
    ('pgqueue.send(text,jsonb,jsonb,integer,text,uuid)', '{pgqueue_producer,pgqueue_consumer,pgqueue_operator}'),
    ('pgqueue.send_batch(text,jsonb[],jsonb[],integer)', '{pgqueue_producer,pgqueue_consumer,pgqueue_operator}'),
    ('pgqueue.fan_out(text,jsonb[],text,jsonb,text,jsonb,integer)', '{pgqueue_producer,pgqueue_consumer}'),
    -- consuming
    ('pgqueue.read(text,integer,integer)', '{pgqueue_consumer}'),
    ('pgqueue.read_with_poll(text,integer,integer,integer,integer)', '{pgqueue_consumer}'),
    ('pgqueue.pop(text,integer)', '{pgqueue_consumer}'),
    ('pgqueue.delete(text,bigint)', '{pgqueue_consumer}'),
    ('pgqueue.delete(text,bigint[])', '{pgqueue_consumer}'),
    ('pgqueue.archive(text,bigint)', '{pgqueue_consumer}'),
    ('pgqueue.archive(text,bigint[])', '{pgqueue_consumer}'),
    ('pgqueue.set_vt(text,bigint,integer)', '{pgqueue_consumer}'),
    ('pgqueue.set_vt(text,bigint,integer,text)', '{pgqueue_consumer}'),
    ('pgqueue.poison(text,bigint,text)', '{pgqueue_consumer}'),
    ('pgqueue.listen(text)', '{pgqueue_consumer}'),
    ('pgqueue.unlisten(text)', '{pgqueue_consumer}'),
    ('pgqueue.complete_member(text,bigint,text,jsonb)', '{pgqueue_consumer}'),
    ('pgqueue.complete_members(text,bigint[],text[],jsonb[])', '{pgqueue_consumer}'),
    ('pgqueue.barrier_results(text)', '{pgqueue_consumer}'),
    ('pgqueue.guard(text)', '{pgqueue_consumer}'),
    ('pgqueue.claim(text,text,integer)', '{pgqueue_consumer}'),
    ('pgqueue.renew(text,text,integer)', '{pgqueue_consumer}'),
    ('pgqueue.release(text,text)', '{pgqueue_consumer}'),
    ('pgqueue.finish_claim(text,text)', '{pgqueue_consumer}'),
    -- both: a worker checks its queues at startup, sweeps barriers, reports
    ('pgqueue.list_queues()', '{pgqueue_consumer,pgqueue_operator}'),
    ('pgqueue.metrics(text)', '{pgqueue_consumer,pgqueue_operator}'),
    ('pgqueue.metrics_all()', '{pgqueue_consumer,pgqueue_operator}'),
    ('pgqueue.barrier_status(text)', '{pgqueue_consumer,pgqueue_operator}'),
    ('pgqueue.expire_barriers()', '{pgqueue_consumer,pgqueue_operator}'),
    -- operating
    ('pgqueue.create_queue(text,integer)', '{pgqueue_operator}'),
    ('pgqueue.drop_queue(text)', '{pgqueue_operator}'),
    ('pgqueue.purge_queue(text)', '{pgqueue_operator}'),
    ('pgqueue.purge_queue_chunk(text,bigint,integer)', '{pgqueue_operator}'),
    ('pgqueue.peek(text,integer,bigint)', '{pgqueue_operator}'),
    ('pgqueue.poison_list(text,integer)', '{pgqueue_operator}'),
    ('pgqueue.poison_list(text,integer,timestamp with time zone,text)', '{pgqueue_operator}'),
    ('pgqueue.poison_get(text,bigint)', '{pgqueue_operator}'),
    ('pgqueue.poison_count(text,timestamp with time zone,timestamp with time zone,text)', '{pgqueue_operator}'),
    ('pgqueue.poison_ids(text,bigint,integer,timestamp with time zone,timestamp with time zone,text)', '{pgqueue_operator}'),
    ('pgqueue.poison_requeue(text,bigint[])', '{pgqueue_operator}'),
    ('pgqueue.poison_purge(text,bigint[])', '{pgqueue_operator}'),
    ('pgqueue.list_barriers(text,integer)', '{pgqueue_operator}'),
    ('pgqueue.barrier_failures(text,integer)', '{pgqueue_operator}'),
    ('pgqueue.list_claims(integer)', '{pgqueue_operator}'),
    ('pgqueue.purge_claims(integer)', '{pgqueue_operator}'),
    ('pgqueue.purge_guards(integer)', '{pgqueue_operator}'),
    ('pgqueue.purge_archive(integer,integer)', '{pgqueue_operator}');

-- Apply pgqueue.role_grant: create the roles where missing (if this role may),
-- make every listed function SECURITY DEFINER with the fixed search_path,
-- take every right on the schema's functions, tables and sequences from
-- PUBLIC, and grant each role exactly its functions. Idempotent; run by the
-- owner (or a superuser). Returns the roles that hold their grants now.
CREATE FUNCTION pgqueue.grant_roles() RETURNS text[]
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    c_config constant text := 'search_path=pg_catalog, pgqueue, pg_temp';
    v_ready text[] := '{}';
    v_missing text[] := '{}';
    v_owner regrole;
    r text;
    f record;
BEGIN
    FOR r IN SELECT DISTINCT x FROM pgqueue.role_grant g, unnest(g.roles) x ORDER BY x LOOP
        IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = r) THEN
            BEGIN
                EXECUTE format('CREATE ROLE %I NOLOGIN', r);
            EXCEPTION
                WHEN duplicate_object OR unique_violation THEN
                    NULL;  -- created meanwhile by a migration of another database
                WHEN insufficient_privilege THEN
                    v_missing := v_missing || r;
                    CONTINUE;
            END;
        END IF;
        v_ready := v_ready || r;
    END LOOP;

    FOR f IN SELECT p.oid::regprocedure AS fn, p.prosecdef, p.proconfig
               FROM pgqueue.role_grant g JOIN pg_proc p ON p.oid = g.function_signature::regprocedure
    LOOP
        IF NOT f.prosecdef OR NOT coalesce(f.proconfig @> ARRAY[c_config], false) THEN
            EXECUTE format('ALTER FUNCTION %s SECURITY DEFINER SET search_path = pg_catalog, pgqueue, pg_temp',
                           f.fn);
        END IF;
    END LOOP;

    REVOKE ALL ON ALL FUNCTIONS IN SCHEMA pgqueue FROM PUBLIC;
    REVOKE ALL ON ALL TABLES IN SCHEMA pgqueue FROM PUBLIC;
    REVOKE ALL ON ALL SEQUENCES IN SCHEMA pgqueue FROM PUBLIC;

    FOREACH r IN ARRAY v_ready LOOP
        -- exactly the listed functions, also after a row changed its roles
        EXECUTE format('REVOKE ALL ON ALL FUNCTIONS IN SCHEMA pgqueue FROM %I', r);
        EXECUTE format('GRANT USAGE ON SCHEMA pgqueue TO %I', r);
        EXECUTE format('GRANT SELECT ON pgqueue.schema_version TO %I', r);
        FOR f IN SELECT g.function_signature::regprocedure AS fn FROM pgqueue.role_grant g
                  WHERE r = ANY (g.roles) ORDER BY 1
        LOOP
            EXECUTE format('GRANT EXECUTE ON FUNCTION %s TO %I', f.fn, r);
        END LOOP;
    END LOOP;

    -- The late sweep of the claim lanes (0005) reads pg_stat_activity as the
    -- owner: sessions of roles whose details the owner may not see count as
    -- infinitely old, and then no sweep raises the safe floors.
    SELECT n.nspowner::regrole INTO v_owner FROM pg_namespace n WHERE n.nspname = 'pgqueue';
    IF NOT pg_has_role(v_owner, 'pg_read_all_stats', 'USAGE') THEN
        RAISE NOTICE 'pgqueue: role %, the owner of schema pgqueue, cannot see other roles'' sessions in pg_stat_activity',
            v_owner
            USING HINT = format('Have an administrator run GRANT pg_read_all_stats TO %s; without it, reads'
                                ' cannot raise the claim lanes'' safe floors while sessions of other roles'
                                ' are connected (see docs/security.md).', v_owner);
    END IF;

    IF cardinality(v_missing) > 0 THEN
        RAISE NOTICE 'pgqueue: role % may not create roles, so % do not exist and nobody may call pgqueue''s functions but the owner',
            current_user, array_to_string(v_missing, ', ')
            USING HINT = format('Have an administrator run %s then run SELECT pgqueue.grant_roles(); as %s (see docs/security.md).',
                                (SELECT string_agg(format('CREATE ROLE %I NOLOGIN;', m), ' ') FROM unnest(v_missing) m),
                                current_user);
    END IF;
    RETURN v_ready;
END
$$;

SELECT pgqueue.grant_roles();
