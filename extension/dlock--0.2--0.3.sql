/* extension/dlock--0.2--0.3.sql */

-- complain if script is sourced in psql, rather than via ALTER EXTENSION
\echo Use "ALTER EXTENSION dlock UPDATE TO '0.3'" to load this file. \quit

-- Refuse to upgrade in a schema the upgrading role does not own (see
-- dlock--0.2.sql).
CREATE FUNCTION dlock.install_check() RETURNS pg_catalog.void
AS 'MODULE_PATHNAME', 'dlock_install_check' LANGUAGE C;
SELECT dlock.install_check();
DROP FUNCTION dlock.install_check();

-- Who took each grant, connection-bound leases, lock delays and the cap on
-- holding.  Columns without a default: no table rewrite, existing rows
-- read NULL (unknown pid, not session-bound, no delay, no cap).
ALTER TABLE dlock.leases
	ADD COLUMN pid pg_catalog.int4,
	ADD COLUMN application_name pg_catalog.text,
	ADD COLUMN session_id pg_catalog.int8,
	ADD COLUMN lock_delay pg_catalog.interval,
	ADD COLUMN hold_limit pg_catalog.timestamptz;

COMMENT ON COLUMN dlock.leases.pid IS
'process ID of the session that took the latest grant';
COMMENT ON COLUMN dlock.leases.application_name IS
'application_name of the session that took the latest grant';
COMMENT ON COLUMN dlock.leases.session_id IS
'for a session-bound lease, the mark of the granting connection; NULL otherwise';
COMMENT ON COLUMN dlock.leases.lock_delay IS
'how long the key stays ungrantable after the latest lease expires unreleased';
COMMENT ON COLUMN dlock.leases.hold_limit IS
'latest expiry any renewal may set (granted_at + dlock.max_hold at the grant); NULL: no limit';

GRANT SELECT (pid, application_name, lock_delay, hold_limit) ON dlock.leases TO PUBLIC;

-- New optional arguments (named, after the existing ones).  Dropped and
-- created again: a second function with defaults would make calls
-- ambiguous.
DROP FUNCTION dlock.try_acquire(pg_catalog.text, pg_catalog.interval, pg_catalog.text);
DROP FUNCTION dlock.acquire(pg_catalog.text, pg_catalog.interval, pg_catalog.interval, pg_catalog.text);

CREATE FUNCTION dlock.try_acquire(key pg_catalog.text, ttl pg_catalog.interval,
								  holder pg_catalog.text DEFAULT NULL,
								  lock_delay pg_catalog.interval DEFAULT NULL,
								  session_bound pg_catalog.bool DEFAULT false)
RETURNS SETOF dlock.lease
AS 'MODULE_PATHNAME', 'dlock_try_acquire'
LANGUAGE C VOLATILE PARALLEL UNSAFE ROWS 1;

COMMENT ON FUNCTION dlock.try_acquire(pg_catalog.text, pg_catalog.interval, pg_catalog.text, pg_catalog.interval, pg_catalog.bool) IS
'grant a lease on key for ttl if nobody holds it (one row), else return no row at once';

CREATE FUNCTION dlock.acquire(key pg_catalog.text, ttl pg_catalog.interval,
							  wait pg_catalog.interval DEFAULT NULL,
							  holder pg_catalog.text DEFAULT NULL,
							  lock_delay pg_catalog.interval DEFAULT NULL,
							  session_bound pg_catalog.bool DEFAULT false)
RETURNS dlock.lease
AS 'MODULE_PATHNAME', 'dlock_acquire'
LANGUAGE C VOLATILE PARALLEL UNSAFE;

COMMENT ON FUNCTION dlock.acquire(pg_catalog.text, pg_catalog.interval, pg_catalog.interval, pg_catalog.text, pg_catalog.interval, pg_catalog.bool) IS
'grant a lease on key for ttl, waiting up to wait (NULL: no limit) for it to be released or to expire';

--
-- Operating it: what is held, and counters.  Both views are rows computed
-- by C functions from dlock.leases (never its owners) and, when the module
-- is preloaded, from the counters in shared memory; reading either view
-- also notices leases that ran out unreleased (dlock.stats counts each
-- such lease once).
--
CREATE FUNCTION dlock.lease_status(
	OUT key pg_catalog.text,
	OUT holder pg_catalog.text,
	OUT fence pg_catalog.int8,
	OUT granted_at pg_catalog.timestamptz,
	OUT expires_at pg_catalog.timestamptz,
	OUT remaining pg_catalog.interval,
	OUT state pg_catalog.text,
	OUT pid pg_catalog.int4,
	OUT application_name pg_catalog.text,
	OUT session_bound pg_catalog.bool)
RETURNS SETOF record
AS 'MODULE_PATHNAME', 'dlock_lease_status'
LANGUAGE C VOLATILE PARALLEL UNSAFE;

CREATE VIEW dlock.lease_status AS
	SELECT * FROM dlock.lease_status();

COMMENT ON VIEW dlock.lease_status IS
'one row per key with a lease row: who holds it, until when, and whether it is held, expired or released';

CREATE FUNCTION dlock.stats(
	OUT key pg_catalog.text,
	OUT acquired pg_catalog.int8,
	OUT contended pg_catalog.int8,
	OUT timeouts pg_catalog.int8,
	OUT expired pg_catalog.int8,
	OUT taken_over pg_catalog.int8,
	OUT renewed pg_catalog.int8,
	OUT released pg_catalog.int8,
	OUT lost_renewals pg_catalog.int8,
	OUT stale_writes_refused pg_catalog.int8,
	OUT hold_time_total pg_catalog.interval,
	OUT hold_time_max pg_catalog.interval,
	OUT hold_time_mean pg_catalog.interval,
	OUT wait_time_total pg_catalog.interval,
	OUT wait_time_max pg_catalog.interval)
RETURNS SETOF record
AS 'MODULE_PATHNAME', 'dlock_stats'
LANGUAGE C VOLATILE PARALLEL UNSAFE;

CREATE VIEW dlock.stats AS
	SELECT * FROM dlock.stats();

COMMENT ON VIEW dlock.stats IS
'counters per key since the last dlock.stats_reset(), and their totals (key IS NULL); needs shared_preload_libraries = ''dlock''';

CREATE FUNCTION dlock.stats_reset()
RETURNS pg_catalog.void
AS 'MODULE_PATHNAME', 'dlock_stats_reset'
LANGUAGE C VOLATILE PARALLEL UNSAFE;

COMMENT ON FUNCTION dlock.stats_reset() IS
'zero the counters of dlock.stats in this database';

REVOKE ALL ON FUNCTION dlock.stats_reset() FROM PUBLIC;
GRANT SELECT ON dlock.lease_status, dlock.stats TO PUBLIC;
