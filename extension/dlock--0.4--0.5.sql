/* extension/dlock--0.4--0.5.sql */

-- complain if script is sourced in psql, rather than via ALTER EXTENSION
\echo Use "ALTER EXTENSION dlock UPDATE TO '0.5'" to load this file. \quit

-- Refuse to upgrade in a schema the upgrading role does not own (see
-- dlock--0.2.sql).
CREATE FUNCTION dlock.install_check() RETURNS pg_catalog.void
AS 'MODULE_PATHNAME', 'dlock_install_check' LANGUAGE C;
SELECT dlock.install_check();
DROP FUNCTION dlock.install_check();

-- use_fence for a WHERE clause: presents the token and returns true, so
-- that a fenced write is one plain statement.  Its high cost makes the
-- planner test the row's own conditions first.
CREATE FUNCTION dlock.fenced(key pg_catalog.text, fence pg_catalog.int8)
RETURNS pg_catalog.bool
AS 'MODULE_PATHNAME', 'dlock_fenced'
LANGUAGE C VOLATILE PARALLEL UNSAFE COST 1000;

COMMENT ON FUNCTION dlock.fenced(pg_catalog.text, pg_catalog.int8) IS
'use_fence for a WHERE clause: declare that this transaction writes under the lease of key with token fence and return true; raises if the token is not valid';
