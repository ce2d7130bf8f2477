-- pgqueue schema, as it stands now: who may call what.
--
-- Three group roles (NOLOGIN); an administrator grants them to login roles:
--   pgqueue_producer  sends (send, send_batch, fan_out) and nothing else.
--   pgqueue_consumer  what a worker does: read, ack, nack, lease changes,
--                     complete barrier members, poison, wait for sends, the
--                     duplicate guard, claims, the barrier sweep, barrier
--                     status and results, list_queues and metrics, the worker
--                     registry's heartbeats and rate samples; and send.
--   pgqueue_operator  what the `pgqueue` command does: queue administration
--                     (pausing too), the workers and rates a dashboard shows,
--                     peek, metrics, the poison table, barriers, claims, the
--                     periodic purges, and send. Not the migrations.
-- Callers get USAGE on the schema, EXECUTE on their API functions and nothing
-- on tables or sequences (but SELECT on schema_version). The API functions
-- are SECURITY DEFINER with a fixed search_path: they run as their owner,
-- and do exactly what their role is meant to do (the argument is the header
-- of sql/0007_roles.sql, and docs/security.md). Internal helpers (names
-- starting with `_`) get no grants and stay SECURITY INVOKER without SET
-- clauses, so the small SQL ones are inlined into their callers.

-- The one role model: who may call or read what, in schema pgqueue and in
-- the pgmq facade's schema alike, one row per object (docs/security.md, "The
-- one role model"). A function's row names it by signature (as regprocedure
-- spells it), or by schema and name for every overload of that name (the
-- facade's rows, which its installer writes: sql/pgmq/); a relation's by
-- schema and name, `*` standing for any characters (the facade's per-queue
-- views). A function whose name starts with `_` is internal and granted to
-- no one; every other function of either schema has a row, roles '{}' for
-- one granted to no one (tests/sql/test_roles.py fails on one without). A
-- relation without a row is granted to no one.
CREATE TABLE pgqueue.role_grant (
    object text PRIMARY KEY,
    roles text[] NOT NULL,
    kind text NOT NULL DEFAULT 'function' CHECK (kind IN ('function', 'relation'))
);

INSERT INTO pgqueue.role_grant (object, roles) VALUES
    ('pgqueue.send(text,jsonb,jsonb,integer,text,uuid,text,text,text)', '{pgqueue_producer,pgqueue_consumer,pgqueue_operator}'),
    ('pgqueue.send_keyed(text,jsonb,text,jsonb,integer,uuid,text,text)', '{pgqueue_producer,pgqueue_consumer,pgqueue_operator}'),
    ('pgqueue.send_batch(text,jsonb[],jsonb[],integer,text,text,text[])', '{pgqueue_producer,pgqueue_consumer,pgqueue_operator}'),
    ('pgqueue.fan_out(text,jsonb[],text,jsonb,text,jsonb,integer,text,text,text,integer,double precision)', '{pgqueue_producer,pgqueue_consumer}'),
    ('pgqueue.open_barrier(text,text,jsonb,text,jsonb,integer,text,integer,double precision,jsonb[],text,text)', '{pgqueue_producer,pgqueue_consumer}'),
    ('pgqueue.add_members(text,jsonb[],uuid)', '{pgqueue_producer,pgqueue_consumer}'),
    ('pgqueue.seal(text)', '{pgqueue_producer,pgqueue_consumer}'),
    ('pgqueue.start_workflow(text,jsonb,text,jsonb,jsonb,boolean,uuid)', '{pgqueue_producer,pgqueue_consumer}'),
    ('pgqueue.add_steps(text,jsonb)', '{pgqueue_producer,pgqueue_consumer}'),
    ('pgqueue.seal_workflow(text)', '{pgqueue_producer,pgqueue_consumer}'),
    ('pgqueue.workflow_status(text)', '{pgqueue_producer,pgqueue_consumer,pgqueue_operator}'),
    ('pgqueue.workflow_steps(text)', '{pgqueue_consumer,pgqueue_operator}'),
    ('pgqueue.step_results(text,text)', '{pgqueue_consumer}'),
    ('pgqueue.list_workflows(text,integer)', '{pgqueue_consumer,pgqueue_operator}'),
    ('pgqueue.cancel_workflow(text)', '{pgqueue_consumer,pgqueue_operator}'),
    ('pgqueue.archive(text,bigint)', '{pgqueue_consumer}'),
    ('pgqueue.archive(text,bigint[])', '{pgqueue_consumer}'),
    ('pgqueue.archive(text,bigint[],timestamp with time zone[])', '{pgqueue_consumer}'),
    ('pgqueue.barrier_results(text)', '{pgqueue_consumer}'),
    ('pgqueue.barrier_links(text,integer)', '{pgqueue_consumer}'),
    ('pgqueue.claim(text,text,integer)', '{pgqueue_consumer}'),
    ('pgqueue.complete_member(text,bigint,text,jsonb,integer)', '{pgqueue_consumer}'),
    ('pgqueue.complete_members(text,bigint[],text[],jsonb[],integer[],text[],timestamp with time zone[])', '{pgqueue_consumer}'),
    ('pgqueue.delete(text,bigint)', '{pgqueue_consumer}'),
    ('pgqueue.delete(text,bigint[])', '{pgqueue_consumer}'),
    ('pgqueue.delete(text,bigint[],timestamp with time zone[])', '{pgqueue_consumer}'),
    ('pgqueue.finish_claim(text,text)', '{pgqueue_consumer}'),
    ('pgqueue.guard(text)', '{pgqueue_consumer}'),
    ('pgqueue.hold_leases(text,bigint[],integer[])', '{pgqueue_consumer}'),
    ('pgqueue.listen(text)', '{pgqueue_consumer}'),
    ('pgqueue.nack(text,bigint,integer,integer,text)', '{pgqueue_consumer}'),
    ('pgqueue.poison(text,bigint,text)', '{pgqueue_consumer}'),
    ('pgqueue.poison(text,bigint,text,integer)', '{pgqueue_consumer}'),
    ('pgqueue.pop(text,integer)', '{pgqueue_consumer}'),
    ('pgqueue.read(text,integer,integer)', '{pgqueue_consumer}'),
    ('pgqueue.read_with_poll(text,integer,integer,integer,integer)', '{pgqueue_consumer}'),
    ('pgqueue.release(text,text)', '{pgqueue_consumer}'),
    ('pgqueue.renew(text,text,integer)', '{pgqueue_consumer}'),
    ('pgqueue.set_vt(text,bigint,integer)', '{pgqueue_consumer}'),
    ('pgqueue.set_vt(text,bigint,integer,text)', '{pgqueue_consumer}'),
    ('pgqueue.set_vt(text,bigint,integer,text,integer)', '{pgqueue_consumer}'),
    ('pgqueue.set_vt(text,bigint[],integer,integer[])', '{pgqueue_consumer}'),
    ('pgqueue.extend_leases(text,bigint[],integer[],integer)', '{pgqueue_consumer}'),
    ('pgqueue.unlisten(text)', '{pgqueue_consumer}'),
    ('pgqueue.barrier_status(text)', '{pgqueue_consumer,pgqueue_operator}'),
    ('pgqueue.expire_barriers()', '{pgqueue_consumer,pgqueue_operator}'),
    ('pgqueue.list_queues()', '{pgqueue_consumer,pgqueue_operator}'),
    ('pgqueue.metrics(text)', '{pgqueue_consumer,pgqueue_operator}'),
    ('pgqueue.metrics_all()', '{pgqueue_consumer,pgqueue_operator}'),
    ('pgqueue.sample_rates()', '{pgqueue_consumer,pgqueue_operator}'),
    ('pgqueue.worker_heartbeat(uuid,text,integer,text[],integer,integer,timestamp with time zone,boolean,text[],bigint[],bigint[],bigint[])', '{pgqueue_consumer}'),
    ('pgqueue.worker_deregister(uuid)', '{pgqueue_consumer}'),
    ('pgqueue.barrier_failures(text,integer)', '{pgqueue_operator}'),
    ('pgqueue.create_queue(text,integer)', '{pgqueue_operator}'),
    ('pgqueue.drop_queue(text)', '{pgqueue_operator}'),
    ('pgqueue.pause_queue(text,text)', '{pgqueue_operator}'),
    ('pgqueue.resume_queue(text)', '{pgqueue_operator}'),
    ('pgqueue.list_workers()', '{pgqueue_operator}'),
    ('pgqueue.queue_rates(text[],integer)', '{pgqueue_operator}'),
    ('pgqueue.exporter_metrics()', '{pgqueue_operator}'),
    ('pgqueue.list_barriers(text,integer)', '{pgqueue_operator}'),
    ('pgqueue.list_barriers(text,integer,timestamp with time zone,text)', '{pgqueue_operator}'),
    ('pgqueue.barrier_outcomes(text)', '{pgqueue_operator}'),
    ('pgqueue.barrier_pending(text,integer,integer)', '{pgqueue_operator}'),
    ('pgqueue.barrier_steps(text[])', '{pgqueue_operator}'),
    ('pgqueue.poison_page(text,integer,timestamp with time zone,timestamp with time zone,text,timestamp with time zone,integer,bigint,integer,integer)', '{pgqueue_operator}'),
    ('pgqueue.list_claims(integer)', '{pgqueue_operator}'),
    ('pgqueue.peek(text,integer,bigint)', '{pgqueue_operator}'),
    ('pgqueue.poison_count(text,timestamp with time zone,timestamp with time zone,text)', '{pgqueue_operator}'),
    ('pgqueue.poison_get(text,bigint)', '{pgqueue_operator}'),
    ('pgqueue.poison_ids(text,bigint,integer,timestamp with time zone,timestamp with time zone,text)', '{pgqueue_operator}'),
    ('pgqueue.poison_list(text,integer)', '{pgqueue_operator}'),
    ('pgqueue.poison_list(text,integer,timestamp with time zone,text)', '{pgqueue_operator}'),
    ('pgqueue.poison_purge(text,bigint[])', '{pgqueue_operator}'),
    ('pgqueue.poison_requeue(text,bigint[])', '{pgqueue_operator}'),
    ('pgqueue.purge_archive(integer,integer)', '{pgqueue_operator}'),
    ('pgqueue.purge_claims(integer)', '{pgqueue_operator}'),
    ('pgqueue.purge_guards(integer)', '{pgqueue_operator}'),
    ('pgqueue.purge_queue(text)', '{pgqueue_operator}'),
    ('pgqueue.purge_queue_chunk(text,bigint,integer)', '{pgqueue_operator}');
INSERT INTO pgqueue.role_grant (object, roles, kind) VALUES
    ('pgqueue.grant_roles()', '{}', 'function'),
    ('pgqueue.schema_version', '{pgqueue_producer,pgqueue_consumer,pgqueue_operator}', 'relation');

-- Grants SELECT on one relation of either schema to the roles its row names
-- (where they exist). Run by grant_roles for every relation, and by the
-- facade for each view it makes.
CREATE FUNCTION pgqueue._grant_relation(p_rel regclass) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    v_name text;
    r text;
BEGIN
    SELECT n.nspname || '.' || c.relname INTO v_name
      FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
     WHERE c.oid = p_rel;
    FOR r IN SELECT DISTINCT x FROM pgqueue.role_grant g, unnest(g.roles) x
              WHERE g.kind = 'relation'
                AND v_name LIKE replace(replace(g.object, '_', '\_'), '*', '%')
                AND EXISTS (SELECT 1 FROM pg_catalog.pg_roles o WHERE o.rolname = x)
              ORDER BY 1
    LOOP
        EXECUTE format('GRANT SELECT ON %s TO %I', p_rel, r);
    END LOOP;
END
$$;

-- Applies pgqueue.role_grant to both schemas: creates the roles where
-- missing (if this role may), makes every pgqueue API function SECURITY
-- DEFINER with the fixed search_path (the facade's declare their own), takes
-- every right on the schemas' functions, tables and sequences from PUBLIC
-- and from the three roles, and grants each role exactly its rows.
-- Idempotent; run by the owner (or a superuser). Returns the roles that hold
-- their grants now.
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
    s text;
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
               FROM pgqueue.role_grant g
               JOIN pg_proc p ON p.oid = CASE WHEN strpos(g.object, '(') > 0 THEN to_regprocedure(g.object) END
              WHERE g.kind = 'function' AND cardinality(g.roles) > 0
                AND p.pronamespace = 'pgqueue'::regnamespace
    LOOP
        IF NOT f.prosecdef OR NOT coalesce(f.proconfig @> ARRAY[c_config], false) THEN
            EXECUTE format('ALTER FUNCTION %s SECURITY DEFINER SET search_path = pg_catalog, pgqueue, pg_temp',
                           f.fn);
        END IF;
    END LOOP;

    FOR s IN SELECT n.nspname FROM pg_namespace n WHERE n.nspname IN ('pgqueue', 'pgmq') ORDER BY 1 LOOP
        EXECUTE format('REVOKE ALL ON ALL FUNCTIONS IN SCHEMA %I FROM PUBLIC', s);
        EXECUTE format('REVOKE ALL ON ALL TABLES IN SCHEMA %I FROM PUBLIC', s);
        EXECUTE format('REVOKE ALL ON ALL SEQUENCES IN SCHEMA %I FROM PUBLIC', s);
        FOREACH r IN ARRAY v_ready LOOP
            -- exactly the listed objects, also after a row changed its roles
            EXECUTE format('REVOKE ALL ON ALL FUNCTIONS IN SCHEMA %I FROM %I', s, r);
            EXECUTE format('REVOKE ALL ON ALL TABLES IN SCHEMA %I FROM %I', s, r);
            EXECUTE format('GRANT USAGE ON SCHEMA %I TO %I', s, r);
        END LOOP;
    END LOOP;

    FOR f IN WITH fns AS MATERIALIZED (
                 SELECT g.object, g.roles,
                        CASE WHEN strpos(g.object, '(') > 0 THEN to_regprocedure(g.object) END AS fn
                   FROM pgqueue.role_grant g WHERE g.kind = 'function'
             )
             SELECT DISTINCT p.oid::regprocedure AS fn, x AS role
               FROM fns, unnest(fns.roles) x, pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
              WHERE n.nspname IN ('pgqueue', 'pgmq') AND x = ANY (v_ready)
                AND (p.oid = fns.fn OR (fns.fn IS NULL AND strpos(fns.object, '(') = 0
                                        AND n.nspname || '.' || p.proname = fns.object))
              ORDER BY 1, 2
    LOOP
        EXECUTE format('GRANT EXECUTE ON FUNCTION %s TO %I', f.fn, f.role);
    END LOOP;
    PERFORM pgqueue._grant_relation(c.oid::regclass)
       FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
      WHERE n.nspname IN ('pgqueue', 'pgmq') AND c.relkind IN ('r', 'p', 'v', 'm', 'f', 'S');

    -- The late sweep of the read lanes (0005) reads pg_stat_activity as the
    -- owner: sessions of roles whose details the owner may not see count as
    -- infinitely old, and then no sweep raises the safe floors.
    SELECT n.nspowner::regrole INTO v_owner FROM pg_namespace n WHERE n.nspname = 'pgqueue';
    IF NOT pg_has_role(v_owner, 'pg_read_all_stats', 'USAGE') THEN
        RAISE NOTICE 'pgqueue: role %, the owner of schema pgqueue, cannot see other roles'' sessions in pg_stat_activity',
            v_owner
            USING HINT = format('Have an administrator run GRANT pg_read_all_stats TO %s; without it, reads'
                                ' cannot raise the read lanes'' safe floors while sessions of other roles'
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
