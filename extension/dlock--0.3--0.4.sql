/* extension/dlock--0.3--0.4.sql */

-- complain if script is sourced in psql, rather than via ALTER EXTENSION
\echo Use "ALTER EXTENSION dlock UPDATE TO '0.4'" to load this file. \quit

-- Refuse to upgrade in a schema the upgrading role does not own (see
-- dlock--0.2.sql).
CREATE FUNCTION dlock.install_check() RETURNS pg_catalog.void
AS 'MODULE_PATHNAME', 'dlock_install_check' LANGUAGE C;
SELECT dlock.install_check();
DROP FUNCTION dlock.install_check();

-- With dlock.storage = memory: a time (microseconds since 2000-01-01, as a
-- timestamptz) that no lease granted in memory outlives.  After a restart,
-- a crash, a failover or a restore, no key is granted before it.
CREATE SEQUENCE dlock.horizon_seq AS pg_catalog.int8 MINVALUE 0 START 0 NO CYCLE;

COMMENT ON SEQUENCE dlock.horizon_seq IS
'with dlock.storage = memory, no lease outlives this time (microseconds since 2000-01-01); never set it back';

SELECT pg_catalog.pg_extension_config_dump('dlock.horizon_seq', '');
REVOKE ALL ON SEQUENCE dlock.horizon_seq FROM PUBLIC;

-- An administrator's way to break a lease, in either storage mode.
CREATE FUNCTION dlock.forget(key pg_catalog.text)
RETURNS pg_catalog.bool
AS 'MODULE_PATHNAME', 'dlock_forget'
LANGUAGE C STRICT VOLATILE PARALLEL UNSAFE;

COMMENT ON FUNCTION dlock.forget(pg_catalog.text) IS
'for administrators: drop the lease of key whoever holds it, as prune() would once it ended; its holder''s fenced writes are refused from then on';

REVOKE ALL ON FUNCTION dlock.forget(pg_catalog.text) FROM PUBLIC;
