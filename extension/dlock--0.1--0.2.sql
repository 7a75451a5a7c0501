/* extension/dlock--0.1--0.2.sql */

-- complain if script is sourced in psql, rather than via ALTER EXTENSION
\echo Use "ALTER EXTENSION dlock UPDATE TO '0.2'" to load this file. \quit

-- Refuse to upgrade in a schema the upgrading role does not own (see
-- dlock--0.2.sql).
CREATE FUNCTION dlock.install_check() RETURNS pg_catalog.void
AS 'MODULE_PATHNAME', 'dlock_install_check' LANGUAGE C;
SELECT dlock.install_check();
DROP FUNCTION dlock.install_check();

-- try_acquire returns no row, instead of one row of NULLs, when the key is
-- held: SELECT count(*) FROM dlock.try_acquire(...) can no longer count a
-- refusal as a grant.
DROP FUNCTION dlock.try_acquire(pg_catalog.text, pg_catalog.interval, pg_catalog.text);

CREATE FUNCTION dlock.try_acquire(key pg_catalog.text, ttl pg_catalog.interval,
								  holder pg_catalog.text DEFAULT NULL)
RETURNS SETOF dlock.lease
AS 'MODULE_PATHNAME', 'dlock_try_acquire'
LANGUAGE C VOLATILE PARALLEL UNSAFE ROWS 1;

COMMENT ON FUNCTION dlock.try_acquire(pg_catalog.text, pg_catalog.interval, pg_catalog.text) IS
'grant a lease on key for ttl if nobody holds it (one row), else return no row at once';
