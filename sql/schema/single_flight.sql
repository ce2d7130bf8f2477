-- pgqueue schema, as it stands now: single flight ("claims").
--
-- One holder per key at a time, leases for crash recovery, and tombstones so
-- a late duplicate cannot re-run finished work. Each transition is one
-- conditional statement on the key's row.

CREATE TABLE pgqueue.claim (
    key text PRIMARY KEY,
    owner text NOT NULL,
    state text NOT NULL CHECK (state IN ('held', 'finished')),
    lease_until timestamptz,
    claimed_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    finished_at timestamptz
);

CREATE TYPE pgqueue.claim_record AS (
    key text,
    owner text,
    state text,
    lease_until timestamptz,
    claimed_at timestamptz,
    finished_at timestamptz
);

CREATE FUNCTION pgqueue._check_claim_args(key text, owner text, lease_seconds integer) RETURNS void
LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    IF key IS NULL OR key = '' OR owner IS NULL OR owner = '' THEN
        RAISE EXCEPTION 'key and owner must be non-empty' USING ERRCODE = '22023';
    END IF;
    IF length(key) > 1000 OR length(owner) > 200 THEN
        RAISE EXCEPTION 'key (at most 1000 characters) or owner (at most 200) is too long'
            USING ERRCODE = '22023';
    END IF;
    IF lease_seconds IS NOT NULL AND lease_seconds < 1 THEN
        RAISE EXCEPTION 'lease_seconds must be >= 1, got %', lease_seconds USING ERRCODE = '22023';
    END IF;
END
$$;

CREATE FUNCTION pgqueue.claim(key text, owner text, lease_seconds integer) RETURNS boolean
LANGUAGE plpgsql
SECURITY DEFINER SET search_path = pg_catalog, pgqueue, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_now timestamptz := clock_timestamp();
BEGIN
    PERFORM pgqueue._check_claim_args(claim.key, claim.owner, coalesce(claim.lease_seconds, 0));
    -- One statement decides: a new key is taken; a held key is taken over only
    -- when its lease ran out (or we already hold it); a finished key never.
    INSERT INTO pgqueue.claim AS c (key, owner, state, lease_until, claimed_at)
    VALUES (claim.key, claim.owner, 'held', v_now + make_interval(secs => claim.lease_seconds), v_now)
    ON CONFLICT (key) DO UPDATE
       SET owner = EXCLUDED.owner, lease_until = EXCLUDED.lease_until, claimed_at = EXCLUDED.claimed_at
     WHERE c.state = 'held' AND (c.lease_until < v_now OR c.owner = EXCLUDED.owner);
    RETURN FOUND;
END
$$;

CREATE FUNCTION pgqueue.renew(key text, owner text, lease_seconds integer) RETURNS boolean
LANGUAGE plpgsql
SECURITY DEFINER SET search_path = pg_catalog, pgqueue, pg_temp
AS $$
#variable_conflict use_column
BEGIN
    PERFORM pgqueue._check_claim_args(renew.key, renew.owner, coalesce(renew.lease_seconds, 0));
    UPDATE pgqueue.claim
       SET lease_until = clock_timestamp() + make_interval(secs => renew.lease_seconds)
     WHERE key = renew.key AND owner = renew.owner AND state = 'held';
    RETURN FOUND;
END
$$;

CREATE FUNCTION pgqueue.release(key text, owner text) RETURNS boolean
LANGUAGE plpgsql
SECURITY DEFINER SET search_path = pg_catalog, pgqueue, pg_temp
AS $$
#variable_conflict use_column
BEGIN
    DELETE FROM pgqueue.claim WHERE key = release.key AND owner = release.owner AND state = 'held';
    RETURN FOUND;
END
$$;

CREATE FUNCTION pgqueue.finish_claim(key text, owner text) RETURNS boolean
LANGUAGE plpgsql
SECURITY DEFINER SET search_path = pg_catalog, pgqueue, pg_temp
AS $$
#variable_conflict use_column
BEGIN
    UPDATE pgqueue.claim
       SET state = 'finished', finished_at = clock_timestamp(), lease_until = NULL
     WHERE key = finish_claim.key AND owner = finish_claim.owner AND state = 'held';
    IF FOUND THEN
        RETURN true;
    END IF;
    -- Already finished by us: a retry after a lost reply still says so.
    RETURN EXISTS (SELECT 1 FROM pgqueue.claim
                    WHERE key = finish_claim.key AND owner = finish_claim.owner AND state = 'finished');
END
$$;

CREATE FUNCTION pgqueue.list_claims(qty integer DEFAULT 100) RETURNS SETOF pgqueue.claim_record
LANGUAGE sql STABLE
SECURITY DEFINER SET search_path = pg_catalog, pgqueue, pg_temp
AS $$
    SELECT c.key, c.owner, c.state, c.lease_until, c.claimed_at, c.finished_at
      FROM pgqueue.claim c ORDER BY c.claimed_at DESC LIMIT qty;
$$;

CREATE FUNCTION pgqueue.purge_claims(older_than_seconds integer) RETURNS bigint
LANGUAGE plpgsql
SECURITY DEFINER SET search_path = pg_catalog, pgqueue, pg_temp
AS $$
DECLARE
    n bigint;
BEGIN
    PERFORM pgqueue._require_nonnegative('older_than_seconds', older_than_seconds);
    DELETE FROM pgqueue.claim
     WHERE state = 'finished' AND finished_at < clock_timestamp() - make_interval(secs => older_than_seconds);
    GET DIAGNOSTICS n = ROW_COUNT;
    RETURN n;
END
$$;
