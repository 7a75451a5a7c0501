/* extension/dlock--0.4.sql */

-- complain if script is sourced in psql, rather than via CREATE EXTENSION
\echo Use "CREATE EXTENSION dlock" to load this file. \quit

--
-- CREATE EXTENSION uses an existing schema named dlock as it is, whoever
-- created it; its owner could rename it and replace what is in it.  Refuse
-- a schema the installing role does not own (one that CREATE EXTENSION
-- has just created is owned by the installing role).
--
CREATE FUNCTION dlock.install_check() RETURNS pg_catalog.void
AS 'MODULE_PATHNAME', 'dlock_install_check' LANGUAGE C;
SELECT dlock.install_check();
DROP FUNCTION dlock.install_check();

--
-- Storage.  One row per key ever granted: a released or expired lease keeps
-- its row (owner NULL once released) so that reuse of the key is a HOT
-- update and the highest token issued for the key stays known.
-- dlock.prune() deletes rows of keys nobody holds.  Keys are checked (at
-- most 512 bytes) by the C functions, the only writers; a CHECK constraint
-- would be re-parsed by every write.
--
CREATE SEQUENCE dlock.fence_seq AS pg_catalog.int8 MINVALUE 1 NO CYCLE;

COMMENT ON SEQUENCE dlock.fence_seq IS
'source of fencing tokens; never set it back';

-- With dlock.storage = memory: a time (microseconds since 2000-01-01, as a
-- timestamptz) that no lease granted in memory outlives.  After a restart,
-- a crash, a failover or a restore, no key is granted before it.
CREATE SEQUENCE dlock.horizon_seq AS pg_catalog.int8 MINVALUE 0 START 0 NO CYCLE;

COMMENT ON SEQUENCE dlock.horizon_seq IS
'with dlock.storage = memory, no lease outlives this time (microseconds since 2000-01-01); never set it back';

CREATE TABLE dlock.leases (
	key			pg_catalog.text PRIMARY KEY,
	fence		pg_catalog.int8 NOT NULL,
	owner		pg_catalog.uuid,
	expires_at	pg_catalog.timestamptz NOT NULL,
	holder		pg_catalog.text,
	granted_at	pg_catalog.timestamptz NOT NULL,
	pid			pg_catalog.int4,
	application_name pg_catalog.text,
	session_id	pg_catalog.int8,
	lock_delay	pg_catalog.interval,
	hold_limit	pg_catalog.timestamptz
) WITH (fillfactor = 70);

COMMENT ON TABLE dlock.leases IS
'dlock lease state, one row per key; change it only through the dlock functions';
COMMENT ON COLUMN dlock.leases.fence IS
'token of the latest grant of this key (the highest ever issued for it)';
COMMENT ON COLUMN dlock.leases.owner IS
'capability of the latest grant; NULL once released';
COMMENT ON COLUMN dlock.leases.expires_at IS
'end of the latest grant by the server clock: its expiry, or the time it was released';
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

-- Keep the leases and the token counter across pg_dump and restore.
SELECT pg_catalog.pg_extension_config_dump('dlock.leases', '');
SELECT pg_catalog.pg_extension_config_dump('dlock.fence_seq', '');
SELECT pg_catalog.pg_extension_config_dump('dlock.horizon_seq', '');

-- Owners are capabilities: PUBLIC may read everything but them.
GRANT USAGE ON SCHEMA dlock TO PUBLIC;
REVOKE ALL ON dlock.leases FROM PUBLIC;
REVOKE ALL ON SEQUENCE dlock.fence_seq FROM PUBLIC;
REVOKE ALL ON SEQUENCE dlock.horizon_seq FROM PUBLIC;
GRANT SELECT (key, fence, expires_at, holder, granted_at, pid, application_name,
			  lock_delay, hold_limit) ON dlock.leases TO PUBLIC;

CREATE TYPE dlock.lease AS (
	key			pg_catalog.text,
	owner		pg_catalog.uuid,
	fence		pg_catalog.int8,
	expires_at	pg_catalog.timestamptz
);

COMMENT ON TYPE dlock.lease IS
'a granted lease: owner is the capability to renew and release, fence the fencing token';

--
-- Lease API.  Not STRICT: a NULL argument is an error, never a silent NULL.
-- try_acquire returns no row when the key is held, so that nobody can count
-- a refusal as a lease; holder is best passed by name (holder => ...).
--
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

CREATE FUNCTION dlock.renew(key pg_catalog.text, owner pg_catalog.uuid,
							ttl pg_catalog.interval)
RETURNS pg_catalog.timestamptz
AS 'MODULE_PATHNAME', 'dlock_renew'
LANGUAGE C VOLATILE PARALLEL UNSAFE;

COMMENT ON FUNCTION dlock.renew(pg_catalog.text, pg_catalog.uuid, pg_catalog.interval) IS
'extend owner''s unexpired lease on key to now + ttl; NULL when the lease is lost';

CREATE FUNCTION dlock.release(key pg_catalog.text, owner pg_catalog.uuid)
RETURNS pg_catalog.bool
AS 'MODULE_PATHNAME', 'dlock_release'
LANGUAGE C VOLATILE PARALLEL UNSAFE;

COMMENT ON FUNCTION dlock.release(pg_catalog.text, pg_catalog.uuid) IS
'release owner''s unexpired lease on key; false when it was not held by owner';

CREATE FUNCTION dlock.prune(older_than pg_catalog.interval DEFAULT '1 day')
RETURNS pg_catalog.int8
AS 'MODULE_PATHNAME', 'dlock_prune'
LANGUAGE C VOLATILE PARALLEL UNSAFE;

COMMENT ON FUNCTION dlock.prune(pg_catalog.interval) IS
'delete the rows of keys released or expired more than older_than ago; returns how many';

REVOKE ALL ON FUNCTION dlock.prune(pg_catalog.interval) FROM PUBLIC;

CREATE FUNCTION dlock.forget(key pg_catalog.text)
RETURNS pg_catalog.bool
AS 'MODULE_PATHNAME', 'dlock_forget'
LANGUAGE C STRICT VOLATILE PARALLEL UNSAFE;

COMMENT ON FUNCTION dlock.forget(pg_catalog.text) IS
'for administrators: drop the lease of key whoever holds it, as prune() would once it ended; its holder''s fenced writes are refused from then on';

REVOKE ALL ON FUNCTION dlock.forget(pg_catalog.text) FROM PUBLIC;

--
-- Fencing.
--
CREATE FUNCTION dlock.use_fence(key pg_catalog.text, fence pg_catalog.int8)
RETURNS pg_catalog.void
AS 'MODULE_PATHNAME', 'dlock_use_fence'
LANGUAGE C VOLATILE PARALLEL UNSAFE;

COMMENT ON FUNCTION dlock.use_fence(pg_catalog.text, pg_catalog.int8) IS
'declare that this transaction writes under the lease of key with token fence; raises if the token is not valid';

CREATE FUNCTION dlock.check_fence(key pg_catalog.text, fence pg_catalog.int8)
RETURNS pg_catalog.bool
AS 'MODULE_PATHNAME', 'dlock_check_fence'
LANGUAGE C VOLATILE PARALLEL UNSAFE;

COMMENT ON FUNCTION dlock.check_fence(pg_catalog.text, pg_catalog.int8) IS
'true when a write under key with token fence would be accepted now';

CREATE FUNCTION dlock.fence_guard()
RETURNS trigger
AS 'MODULE_PATHNAME', 'dlock_fence_guard'
LANGUAGE C VOLATILE PARALLEL UNSAFE;

COMMENT ON FUNCTION dlock.fence_guard() IS
'BEFORE ROW trigger: refuse writes not made under the current lease of the row''s key; arguments: key template, [token column, [''lease''|''monotonic'']]';

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
