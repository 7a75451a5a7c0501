/* extension/dlock--0.6--0.7.sql */

-- complain if script is sourced in psql, rather than via ALTER EXTENSION
\echo Use "ALTER EXTENSION dlock UPDATE TO '0.7'" to load this file. \quit

-- Refuse to upgrade in a schema the upgrading role does not own (see
-- dlock--0.2.sql).
CREATE FUNCTION dlock.install_check() RETURNS pg_catalog.void
AS 'MODULE_PATHNAME', 'dlock_install_check' LANGUAGE C;
SELECT dlock.install_check();
DROP FUNCTION dlock.install_check();

-- An election's value, and how many slot keys (permits, shared leases) a
-- key has used.  No default: no table rewrite, existing rows read NULL (no
-- value, no slots).
ALTER TABLE dlock.leases
	ADD COLUMN value pg_catalog.text,
	ADD COLUMN slots pg_catalog.int4;

COMMENT ON COLUMN dlock.leases.value IS
'the value the leader published (dlock.campaign, dlock.proclaim); NULL for other leases';
COMMENT ON COLUMN dlock.leases.slots IS
'for a key with permits or shared leases: how many it has used, each stored under key || U&''\001F'' || number';

GRANT SELECT (value, slots) ON dlock.leases TO PUBLIC;

--
-- Counting semaphores and shared leases: new optional arguments (named,
-- after the existing ones).  Dropped and created again: a second function
-- with defaults would make calls ambiguous.
--
-- Their privileges (a REVOKE from PUBLIC, a GRANT to a role, made since
-- the install) are kept across the update: saved here, applied again below.
SELECT pg_catalog.set_config('dlock_update.' || s.name, coalesce(s.acl, ''), true)
FROM (SELECT 'try_acquire', p.proacl::pg_catalog.text FROM pg_catalog.pg_proc p
	  WHERE p.oid = 'dlock.try_acquire(pg_catalog.text, pg_catalog.interval, pg_catalog.text, pg_catalog.interval, pg_catalog.bool)'::pg_catalog.regprocedure
	  UNION ALL
	  SELECT 'acquire', p.proacl::pg_catalog.text FROM pg_catalog.pg_proc p
	  WHERE p.oid = 'dlock.acquire(pg_catalog.text, pg_catalog.interval, pg_catalog.interval, pg_catalog.text, pg_catalog.interval, pg_catalog.bool)'::pg_catalog.regprocedure
	  UNION ALL
	  SELECT 'lease_status_fn', p.proacl::pg_catalog.text FROM pg_catalog.pg_proc p
	  WHERE p.oid = 'dlock.lease_status()'::pg_catalog.regprocedure
	  UNION ALL
	  SELECT 'lease_status', c.relacl::pg_catalog.text FROM pg_catalog.pg_class c
	  WHERE c.oid = 'dlock.lease_status'::pg_catalog.regclass) AS s(name, acl);

DROP FUNCTION dlock.try_acquire(pg_catalog.text, pg_catalog.interval, pg_catalog.text, pg_catalog.interval, pg_catalog.bool);
DROP FUNCTION dlock.acquire(pg_catalog.text, pg_catalog.interval, pg_catalog.interval, pg_catalog.text, pg_catalog.interval, pg_catalog.bool);

CREATE FUNCTION dlock.try_acquire(key pg_catalog.text, ttl pg_catalog.interval,
								  holder pg_catalog.text DEFAULT NULL,
								  lock_delay pg_catalog.interval DEFAULT NULL,
								  session_bound pg_catalog.bool DEFAULT false,
								  permits pg_catalog.int4 DEFAULT 1,
								  mode pg_catalog.text DEFAULT 'exclusive')
RETURNS SETOF dlock.lease
AS 'MODULE_PATHNAME', 'dlock_try_acquire'
LANGUAGE C VOLATILE PARALLEL UNSAFE ROWS 1;

COMMENT ON FUNCTION dlock.try_acquire(pg_catalog.text, pg_catalog.interval, pg_catalog.text, pg_catalog.interval, pg_catalog.bool, pg_catalog.int4, pg_catalog.text) IS
'grant a lease on key for ttl (one of permits, or shared with mode => ''shared'') if one is free (one row), else return no row at once';

CREATE FUNCTION dlock.acquire(key pg_catalog.text, ttl pg_catalog.interval,
							  wait pg_catalog.interval DEFAULT NULL,
							  holder pg_catalog.text DEFAULT NULL,
							  lock_delay pg_catalog.interval DEFAULT NULL,
							  session_bound pg_catalog.bool DEFAULT false,
							  permits pg_catalog.int4 DEFAULT 1,
							  mode pg_catalog.text DEFAULT 'exclusive')
RETURNS dlock.lease
AS 'MODULE_PATHNAME', 'dlock_acquire'
LANGUAGE C VOLATILE PARALLEL UNSAFE;

COMMENT ON FUNCTION dlock.acquire(pg_catalog.text, pg_catalog.interval, pg_catalog.interval, pg_catalog.text, pg_catalog.interval, pg_catalog.bool, pg_catalog.int4, pg_catalog.text) IS
'grant a lease on key for ttl (one of permits, or shared with mode => ''shared''), waiting up to wait (NULL: no limit) for one to be free';

-- lease_status gains the permit (slot) of each lease: a row per holder.
DROP VIEW dlock.lease_status;
DROP FUNCTION dlock.lease_status();

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
	OUT session_bound pg_catalog.bool,
	OUT permit pg_catalog.int4)
RETURNS SETOF record
AS 'MODULE_PATHNAME', 'dlock_lease_status'
LANGUAGE C VOLATILE PARALLEL UNSAFE;

CREATE VIEW dlock.lease_status AS
	SELECT * FROM dlock.lease_status();

COMMENT ON VIEW dlock.lease_status IS
'one row per lease: a key''s exclusive lease (permit NULL), or one of its permits or shared leases (permit 1, 2, ...): who holds it, until when, and whether it is held, expired or released';

GRANT SELECT ON dlock.lease_status TO PUBLIC;

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
							  OUT expires_at pg_catalog.timestamptz,
							  OUT since pg_catalog.timestamptz)
RETURNS SETOF record
AS 'MODULE_PATHNAME', 'dlock_observe'
LANGUAGE C VOLATILE PARALLEL UNSAFE ROWS 1;

COMMENT ON FUNCTION dlock.observe(pg_catalog.text, pg_catalog.int8, pg_catalog.interval, pg_catalog.text, pg_catalog.bool) IS
'wait up to wait for key to change after token after_fence (a new lease, its end, a new value); one row, or none at the deadline';

-- The privileges saved above, on the objects created again (none saved:
-- the defaults they were created with stand).
DO $$
DECLARE
	o record;
	a record;
BEGIN
	FOR o IN SELECT * FROM (VALUES
		('try_acquire', 'FUNCTION', 'dlock.try_acquire(pg_catalog.text, pg_catalog.interval, pg_catalog.text, pg_catalog.interval, pg_catalog.bool, pg_catalog.int4, pg_catalog.text)'),
		('acquire', 'FUNCTION', 'dlock.acquire(pg_catalog.text, pg_catalog.interval, pg_catalog.interval, pg_catalog.text, pg_catalog.interval, pg_catalog.bool, pg_catalog.int4, pg_catalog.text)'),
		('lease_status_fn', 'FUNCTION', 'dlock.lease_status()'),
		('lease_status', 'TABLE', 'dlock.lease_status')) AS v(name, kind, obj)
	LOOP
		CONTINUE WHEN pg_catalog.current_setting('dlock_update.' || o.name) = '';
		EXECUTE pg_catalog.format('REVOKE ALL ON %s %s FROM PUBLIC', o.kind, o.obj);
		FOR a IN SELECT * FROM pg_catalog.aclexplode(
				pg_catalog.current_setting('dlock_update.' || o.name)::pg_catalog.aclitem[])
		LOOP
			EXECUTE pg_catalog.format('GRANT %s ON %s %s TO %s%s', a.privilege_type,
				o.kind, o.obj,
				CASE WHEN a.grantee = 0 THEN 'PUBLIC'
					 ELSE pg_catalog.quote_ident(pg_catalog.pg_get_userbyid(a.grantee)) END,
				CASE WHEN a.is_grantable THEN ' WITH GRANT OPTION' ELSE '' END);
		END LOOP;
	END LOOP;
END
$$;

-- Who waits for which key, and for what kind of lease (preloaded only).
CREATE FUNCTION dlock.waiters(
	OUT pid pg_catalog.int4,
	OUT key pg_catalog.text,
	OUT mode pg_catalog.text,
	OUT permits pg_catalog.int4,
	OUT waiting_since pg_catalog.timestamptz,
	OUT "position" pg_catalog.int4)
RETURNS SETOF record
AS 'MODULE_PATHNAME', 'dlock_waiters'
LANGUAGE C VOLATILE PARALLEL UNSAFE;

CREATE VIEW dlock.waiters AS
	SELECT * FROM dlock.waiters();

COMMENT ON VIEW dlock.waiters IS
'acquirers queued for keys of this database: pid, key, the lease they ask for (exclusive, permit of permits, shared), since when, and their place in the key''s line; needs shared_preload_libraries = ''dlock''';

GRANT SELECT ON dlock.waiters TO PUBLIC;
