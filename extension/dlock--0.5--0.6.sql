/* extension/dlock--0.5--0.6.sql */

-- complain if script is sourced in psql, rather than via ALTER EXTENSION
\echo Use "ALTER EXTENSION dlock UPDATE TO '0.6'" to load this file. \quit

-- Refuse to upgrade in a schema the upgrading role does not own (see
-- dlock--0.2.sql).
CREATE FUNCTION dlock.install_check() RETURNS pg_catalog.void
AS 'MODULE_PATHNAME', 'dlock_install_check' LANGUAGE C;
SELECT dlock.install_check();
DROP FUNCTION dlock.install_check();

-- The token counter, from now on.  Not registered with
-- pg_extension_config_dump: pg_dump never saves it, so a data-only restore
-- of an older dump cannot set it back.  dlock.fence_seq, which pg_dump
-- saves, is kept at or above every token it may have returned, so that a
-- whole dump restored into a new database never reissues a token (the
-- module moves token_seq past it before drawing).
CREATE SEQUENCE dlock.token_seq AS pg_catalog.int8 MINVALUE 1 NO CYCLE;
COMMENT ON SEQUENCE dlock.token_seq IS
'the fencing token counter (never dumped; dlock.fence_seq is its dumped copy)';
REVOKE ALL ON SEQUENCE dlock.token_seq FROM PUBLIC;
SELECT pg_catalog.setval('dlock.token_seq'::pg_catalog.regclass, s.last_value, s.is_called)
FROM dlock.fence_seq AS s;

-- The horizon's copy that pg_dump never saves: the horizon is the later of
-- the two, so a data-only restore of an older dump cannot set it back.
CREATE SEQUENCE dlock.horizon_mark AS pg_catalog.int8 MINVALUE 0 START 0 NO CYCLE;
COMMENT ON SEQUENCE dlock.horizon_mark IS
'memory mode: the lease horizon, kept where no restore can set it back';
REVOKE ALL ON SEQUENCE dlock.horizon_mark FROM PUBLIC;
SELECT pg_catalog.setval('dlock.horizon_mark'::pg_catalog.regclass, s.last_value, s.is_called)
FROM dlock.horizon_seq AS s;

COMMENT ON SEQUENCE dlock.fence_seq IS
'the dumped copy of dlock.token_seq: at or above every fencing token issued';
