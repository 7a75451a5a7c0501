-- The role prometheus-postgres-exporter connects as, with least privilege
-- for dlock.yaml (docs/operating.md, "Monitoring").  As a superuser:
--   psql -d postgres -f setup.sql                 (the role, once)
--   psql -d <each database with dlock> -f setup.sql
-- It is safe to run again.  Give the role a password or a pg_hba.conf
-- line of your own.

DO $$
BEGIN
	IF NOT EXISTS (SELECT FROM pg_catalog.pg_roles
				   WHERE rolname OPERATOR(pg_catalog.=) 'dlock_exporter') THEN
		CREATE ROLE dlock_exporter LOGIN;
	END IF;
END
$$;

-- dlock_extension_preloaded reads shared_preload_libraries; dlock's views
-- are readable by everyone.  Not pg_monitor: its pg_read_all_stats shows
-- every session's last statement in pg_stat_activity, and an owner written
-- into SQL text (psql's :'owner', a literal) is the capability to renew and
-- release that lease (docs/operating.md, "Prometheus").
GRANT pg_read_all_settings TO dlock_exporter;

-- Nothing on the search path but the catalog (the queries qualify every
-- name anyway).
ALTER ROLE dlock_exporter SET search_path = pg_catalog;

-- A query slower than this fails alone (dlock_leases reads every lease
-- row: about 2 s per million, more under load; anyone who may call
-- try_acquire can make rows): the exporter still answers with the other
-- metrics and counts the error.  Keep it below Prometheus's scrape_timeout
-- (10 s by default), or the whole target is lost with one slow query.
ALTER ROLE dlock_exporter SET statement_timeout = '5s';

-- The dlock_horizon series read memory mode's horizon.  SELECT on a
-- sequence reads it; it cannot move it (that would take UPDATE or USAGE).
-- Each of the two only where the installed version has it (horizon_seq
-- since 0.4, horizon_mark since 0.6): run this again after ALTER EXTENSION
-- dlock UPDATE.
DO $$
BEGIN
	IF EXISTS (SELECT FROM pg_catalog.pg_extension
			   WHERE extname OPERATOR(pg_catalog.=) 'dlock') THEN
		IF pg_catalog.to_regclass('dlock.horizon_seq') IS NOT NULL THEN
			GRANT SELECT ON SEQUENCE dlock.horizon_seq TO dlock_exporter;
		END IF;
		IF pg_catalog.to_regclass('dlock.horizon_mark') IS NOT NULL THEN
			GRANT SELECT ON SEQUENCE dlock.horizon_mark TO dlock_exporter;
		END IF;
	END IF;
END
$$;
