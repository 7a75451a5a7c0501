/* extension/dlock--0.6--0.7.sql */

-- complain if script is sourced in psql, rather than via ALTER EXTENSION
\echo Use "ALTER EXTENSION dlock UPDATE TO '0.7'" to load this file. \quit

-- Refuse to upgrade in a schema the upgrading role does not own (see
-- dlock--0.2.sql).
CREATE FUNCTION dlock.install_check() RETURNS pg_catalog.void
AS 'MODULE_PATHNAME', 'dlock_install_check' LANGUAGE C;
SELECT dlock.install_check();
DROP FUNCTION dlock.install_check();

-- An election's value.  No default: no table rewrite, existing rows read
-- NULL (no value).
ALTER TABLE dlock.leases ADD COLUMN value pg_catalog.text;

COMMENT ON COLUMN dlock.leases.value IS
'the value the leader published (dlock.campaign, dlock.proclaim); NULL for other leases';

GRANT SELECT (value) ON dlock.leases TO PUBLIC;

--
-- Leader election: an exclusive lease with a value.  The lease's token is
-- the leader's epoch; resigning is dlock.release, staying leader
-- dlock.renew.
--
CREATE FUNCTION dlock.campaign(election pg_catalog.text, value pg_catalog.text,
							   ttl pg_catalog.interval,
							   wait pg_catalog.interval DEFAULT NULL,
							   holder pg_catalog.text DEFAULT NULL,
							   lock_delay pg_catalog.interval DEFAULT NULL,
							   session_bound pg_catalog.bool DEFAULT false)
RETURNS dlock.lease
AS 'MODULE_PATHNAME', 'dlock_campaign'
LANGUAGE C VOLATILE PARALLEL UNSAFE;

COMMENT ON FUNCTION dlock.campaign(pg_catalog.text, pg_catalog.text, pg_catalog.interval, pg_catalog.interval, pg_catalog.text, pg_catalog.interval, pg_catalog.bool) IS
'become the leader of election with value, waiting up to wait (NULL: no limit); fence is the epoch';

CREATE FUNCTION dlock.proclaim(election pg_catalog.text, owner pg_catalog.uuid,
							   value pg_catalog.text)
RETURNS pg_catalog.bool
AS 'MODULE_PATHNAME', 'dlock_proclaim'
LANGUAGE C VOLATILE PARALLEL UNSAFE;

COMMENT ON FUNCTION dlock.proclaim(pg_catalog.text, pg_catalog.uuid, pg_catalog.text) IS
'as the leader (owner of the live lease), publish a new value; false when the lease is lost';

CREATE FUNCTION dlock.leader(election pg_catalog.text,
							 OUT value pg_catalog.text,
							 OUT fence pg_catalog.int8,
							 OUT since pg_catalog.timestamptz,
							 OUT expires_at pg_catalog.timestamptz)
RETURNS SETOF record
AS 'MODULE_PATHNAME', 'dlock_leader'
LANGUAGE C VOLATILE PARALLEL UNSAFE ROWS 1;

COMMENT ON FUNCTION dlock.leader(pg_catalog.text) IS
'who leads election: its value, epoch, since when and until when; no row when nobody does';

CREATE FUNCTION dlock.observe(key pg_catalog.text, after_fence pg_catalog.int8,
							  wait pg_catalog.interval,
							  seen_value pg_catalog.text DEFAULT NULL,
							  seen_end pg_catalog.bool DEFAULT false,
							  OUT fence pg_catalog.int8,
							  OUT holder pg_catalog.text,
							  OUT value pg_catalog.text,
							  OUT state pg_catalog.text,
							  OUT expires_at pg_catalog.timestamptz)
RETURNS SETOF record
AS 'MODULE_PATHNAME', 'dlock_observe'
LANGUAGE C VOLATILE PARALLEL UNSAFE ROWS 1;

COMMENT ON FUNCTION dlock.observe(pg_catalog.text, pg_catalog.int8, pg_catalog.interval, pg_catalog.text, pg_catalog.bool) IS
'wait up to wait for key to change after token after_fence (a new lease, its end, a new value); one row, or none at the deadline';
