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

-- One row per API function (overloads apart), and the roles that may call it.
CREATE TABLE pgqueue.role_grant (
    function_signature text PRIMARY KEY,  -- as regprocedure spells it, schema-qualified
    roles text[] NOT NULL
);

INSERT INTO pgqueue.role_grant (function_signature, roles) VALUES
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

-- Applies pgqueue.role_grant: creates the roles where missing (if this role
-- may), makes every listed function SECURITY DEFINER with the fixed
-- search_path, takes every right on the schema's functions, tables and
-- sequences from PUBLIC, and grants each role exactly its functions.
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
