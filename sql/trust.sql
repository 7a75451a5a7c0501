-- What a key, a TTL and a call mean must not depend on the calling session:
-- row keys rendered the same under every TimeZone, DateStyle and
-- extra_float_digits; TTLs and waits as exact durations (even with mixed
-- signs); dlock refusing cleanly in parallel mode and in PREPARE
-- TRANSACTION; cross-partition updates; inheritance children; try_acquire's
-- result shape.  Only stable values are printed: refusals are shown by
-- their message (which names the key) and SQLSTATE, never their tokens.
\set VERBOSITY terse

--
-- 1. A timestamptz key column: one key per row in every session.
--
SET TimeZone = 'UTC';
CREATE TABLE ev (day timestamptz PRIMARY KEY, v int NOT NULL, fence bigint);
CREATE TRIGGER ev_fence
  BEFORE INSERT OR UPDATE OR DELETE ON ev
  FOR EACH ROW EXECUTE FUNCTION dlock.fence_guard('ev:{day}', 'fence');
SELECT owner AS ev_owner, fence AS ev_fence
  FROM dlock.try_acquire('ev:2026-01-01 00:00:00+00', '1 hour') \gset
INSERT INTO ev VALUES ('2026-01-01 00:00:00+00', 1, :ev_fence);
\echo :SQLSTATE

SET TimeZone = 'Europe/Berlin';
-- the same instant, shown in Berlin time
SELECT day, v FROM ev;
-- A Berlin session that renders the key with its own settings gets a lease
-- on another key ...
SELECT fence AS berlin_fence
  FROM dlock.try_acquire('ev:2026-01-01 01:00:00+01', '1 hour') \gset
-- ... which does not let it write the row, neither in the token column ...
UPDATE ev SET v = 2, fence = :berlin_fence;
\echo :SQLSTATE
-- ... nor with use_fence.
BEGIN;
SELECT dlock.use_fence('ev:2026-01-01 01:00:00+01', :berlin_fence);
UPDATE ev SET v = 2;
\echo :SQLSTATE
ROLLBACK;
-- The row's key is the UTC one, also in Berlin: held, and needed.
SELECT count(*) AS granted FROM dlock.try_acquire('ev:2026-01-01 00:00:00+00', '1 hour');
UPDATE ev SET v = 2;
\echo :SQLSTATE
BEGIN;
SELECT dlock.use_fence('ev:2026-01-01 00:00:00+00', :ev_fence);
UPDATE ev SET v = 2;
\echo :SQLSTATE
COMMIT;
-- A row written in Berlin time gets a UTC key too.
INSERT INTO ev VALUES ('2026-01-02 01:00:00+01', 1);
\echo :SQLSTATE
-- DateStyle does not change the key either.
SET DateStyle = 'German';
UPDATE ev SET v = 3 WHERE v = 2;
\echo :SQLSTATE
BEGIN;
SELECT dlock.use_fence('ev:2026-01-01 00:00:00+00', :ev_fence);
UPDATE ev SET v = 3 WHERE v = 2;
\echo :SQLSTATE
COMMIT;
SET DateStyle = 'SQL, DMY';
UPDATE ev SET v = 4 WHERE v = 3;
\echo :SQLSTATE
BEGIN;
SELECT dlock.use_fence('ev:2026-01-01 00:00:00+00', :ev_fence);
UPDATE ev SET v = 4 WHERE v = 3;
\echo :SQLSTATE
COMMIT;
RESET DateStyle;
RESET TimeZone;
SELECT v, fence = :ev_fence AS stamped_with_utc_lease FROM ev;

--
-- 2. The key each accepted type produces.  A write without a token is
-- refused with a message that names the row's key.
--
-- fenced_table(name, type): a table name(v type) fenced by 'name:{v}'
CREATE PROCEDURE fenced_table(name text, coltype text)
LANGUAGE plpgsql AS $$
BEGIN
  EXECUTE format('CREATE TABLE %I (v %s)', name, coltype);
  EXECUTE format('CREATE TRIGGER %I BEFORE INSERT OR UPDATE OR DELETE ON %I '
                 'FOR EACH ROW EXECUTE FUNCTION dlock.fence_guard(%L)',
                 name || '_fence', name, name || ':{v}');
END $$;
CREATE TYPE trust_mood AS ENUM ('sad', 'happy');
CREATE DOMAIN trust_posint AS integer CHECK (VALUE > 0);
CALL fenced_table('k_date', 'date');
CALL fenced_table('k_timestamp', 'timestamp');
CALL fenced_table('k_timestamptz', 'timestamptz');
CALL fenced_table('k_bool', 'boolean');
CALL fenced_table('k_char', 'char(3)');
CALL fenced_table('k_float8', 'double precision');
CALL fenced_table('k_float4', 'real');
CALL fenced_table('k_numeric', 'numeric');
CALL fenced_table('k_uuid', 'uuid');
CALL fenced_table('k_enum', 'trust_mood');
CALL fenced_table('k_domain', 'trust_posint');

SET DateStyle = 'German';
SET TimeZone = 'Asia/Kolkata';
INSERT INTO k_date VALUES ('2026-01-02');
INSERT INTO k_timestamp VALUES ('2026-01-02 03:04:05.5');
INSERT INTO k_timestamptz VALUES ('2026-01-02 03:04:05.25+00');
SET DateStyle = 'SQL, DMY';
SET TimeZone = 'America/New_York';
INSERT INTO k_date VALUES ('2026-01-02');
INSERT INTO k_timestamp VALUES ('2026-01-02 03:04:05.5');
INSERT INTO k_timestamptz VALUES ('2026-01-02 03:04:05.25+00');
INSERT INTO k_date VALUES ('infinity');
INSERT INTO k_timestamptz VALUES ('-infinity');
RESET DateStyle;
RESET TimeZone;
INSERT INTO k_bool VALUES (true);
INSERT INTO k_bool VALUES ('f');
INSERT INTO k_char VALUES ('ab');
-- the same value under extra_float_digits 0 (which would print 0.3) and 3
SET extra_float_digits = 0;
SELECT 0.1::float8 + 0.2::float8 AS shown_with_extra_float_digits_0;
INSERT INTO k_float8 VALUES (0.1::float8 + 0.2::float8);
INSERT INTO k_float4 VALUES (0.1);
SET extra_float_digits = 3;
INSERT INTO k_float8 VALUES (0.1::float8 + 0.2::float8);
INSERT INTO k_float4 VALUES (0.1);
RESET extra_float_digits;
INSERT INTO k_numeric VALUES (1.50);
INSERT INTO k_uuid VALUES ('A0EEBC99-9C0B-4EF8-BB6D-6BB9BD380A11');
INSERT INTO k_enum VALUES ('happy');
INSERT INTO k_domain VALUES (7);
-- The key as shown is the key to take: a write under its lease is accepted.
SELECT fence AS k_fence FROM dlock.try_acquire('k_float8:0.30000000000000004', '1 hour') \gset
BEGIN;
SELECT dlock.use_fence('k_float8:0.30000000000000004', :k_fence);
SET LOCAL extra_float_digits = 0;
INSERT INTO k_float8 VALUES (0.1::float8 + 0.2::float8);
\echo :SQLSTATE
COMMIT;
SELECT fence AS k_fence FROM dlock.try_acquire('k_char:ab', '1 hour') \gset
INSERT INTO k_char VALUES ('ab ');
BEGIN;
SELECT dlock.use_fence('k_char:ab', :k_fence);
INSERT INTO k_char VALUES ('ab ');
\echo :SQLSTATE
COMMIT;
SELECT (SELECT count(*) FROM k_float8) AS float8_rows, (SELECT count(*) FROM k_char) AS char_rows;

--
-- 3. Types whose text form depends on the session (or that dlock does not
-- know) are refused with 39P01 when the trigger first fires.
--
CREATE DOMAIN trust_span AS interval;
CALL fenced_table('k_interval', 'interval');
CALL fenced_table('k_money', 'money');
CALL fenced_table('k_json', 'json');
CALL fenced_table('k_bytea', 'bytea');
CALL fenced_table('k_intarray', 'int[]');
CALL fenced_table('k_span', 'trust_span');
INSERT INTO k_interval VALUES ('1 day');
\echo :LAST_ERROR_SQLSTATE
INSERT INTO k_money VALUES (1);
\echo :LAST_ERROR_SQLSTATE
INSERT INTO k_json VALUES ('{}');
\echo :LAST_ERROR_SQLSTATE
INSERT INTO k_bytea VALUES ('\x01');
\echo :LAST_ERROR_SQLSTATE
INSERT INTO k_intarray VALUES ('{1}');
\echo :LAST_ERROR_SQLSTATE
-- a domain is judged by its base type
INSERT INTO k_span VALUES ('1 day');
\echo :LAST_ERROR_SQLSTATE
-- refused for an administrator's bypass too: misuse is always reported
SET dlock.fence_bypass = on;
INSERT INTO k_interval VALUES ('1 day');
\echo :LAST_ERROR_SQLSTATE
RESET dlock.fence_bypass;
SELECT count(*) AS rows_written FROM k_interval;

--
-- 4. TTLs are durations: a day is 24 hours, a month 30 days, in any zone.
--
SET TimeZone = 'America/Los_Angeles';
SET dlock.max_ttl = '24h';
SELECT owner AS day_owner FROM dlock.try_acquire('trust:day', '1 day') \gset
SELECT expires_at - granted_at = interval '24 hours' AS one_day_is_24_hours,
       extract(epoch FROM expires_at - granted_at) AS seconds
  FROM dlock.leases WHERE key = 'trust:day';
SELECT dlock.renew('trust:day', :'day_owner', '1 day') IS NOT NULL AS renewed_for_a_day;
-- Also where the clocks change within that day.  A zone made up from the
-- current date, so that its daylight saving time ends 12 hours from now:
-- a calendar day from now is 25 hours long there.
SELECT format('XST0XDT,%s/0,%s/%s',
              (extract(doy FROM e)::int + 165) % 365,
              extract(doy FROM e)::int - 1,
              extract(hour FROM e)::int) AS dst_zone
  FROM (SELECT (now() AT TIME ZONE 'UTC') + interval '13 hours' AS e) s \gset
SET TimeZone = :'dst_zone';
SELECT (now() + interval '1 day') - now() = interval '25 hours' AS calendar_day_is_25_hours;
SELECT owner AS dst_owner FROM dlock.try_acquire('trust:dst-day', '1 day') \gset
SELECT expires_at - granted_at = interval '24 hours' AS one_day_is_24_hours
  FROM dlock.leases WHERE key = 'trust:dst-day';
SELECT dlock.renew('trust:dst-day', :'dst_owner', '1 day') - clock_timestamp()
       BETWEEN interval '23 hours 59 minutes' AND interval '24 hours' AS renewed_for_24_hours;
SET TimeZone = 'America/Los_Angeles';
-- dlock.max_ttl can be at most INT_MAX ms (about 24.86 days): a month is
-- more than that, a month less 6 days (24 days) is not.
SET dlock.max_ttl = 2147483647;
SELECT count(*) FROM dlock.try_acquire('trust:month', '1 mon');
\echo :LAST_ERROR_SQLSTATE
SELECT count(*) FROM dlock.try_acquire('trust:month', '1 mon -6 days');
SELECT expires_at - granted_at = interval '24 days' AS month_less_6_days_is_24_days
  FROM dlock.leases WHERE key = 'trust:month';
-- exactly: with max_ttl 24 days, 1 month less 6 days fits, 1 ms more does not
SET dlock.max_ttl = '24d';
SELECT count(*) FROM dlock.try_acquire('trust:month2', '1 mon -6 days 00:00:00.001');
\echo :LAST_ERROR_SQLSTATE
SELECT count(*) FROM dlock.try_acquire('trust:month2', '1 mon -6 days');
RESET dlock.max_ttl;
RESET TimeZone;

--
-- 5. Mixed-sign intervals are measured exactly; never 22008 or XX000.
--
-- -100000000 days + 2400000000 hours + 1 second is exactly one second
SELECT count(*) FROM dlock.try_acquire('trust:mixed', '-100000000 days 2400000000:00:01');
SELECT expires_at - granted_at = interval '1 second' AS lease_of_one_second
  FROM dlock.leases WHERE key = 'trust:mixed';
-- make_interval() goes through double precision (8640000000001 seconds
-- become 8640000000001.000448): a lease of just over one second, exactly
-- as long as that interval
SELECT count(*)
  FROM dlock.try_acquire('trust:mixed2', make_interval(days => -100000000, secs => 8640000000001));
SELECT expires_at - granted_at = make_interval(days => -100000000, secs => 8640000000001) AS exact,
       expires_at - granted_at BETWEEN interval '1 second' AND interval '2 seconds' AS about_one_second
  FROM dlock.leases WHERE key = 'trust:mixed2';
-- the mirror image is minus one second: not positive
SELECT count(*) FROM dlock.try_acquire('trust:mixed3', make_interval(days => 100000000, secs => -8640000000001));
\echo :LAST_ERROR_SQLSTATE
SELECT count(*) FROM dlock.try_acquire('trust:mixed3', '100000000 days -2400000000:00:01');
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM dlock.acquire('trust:mixed3', make_interval(days => 100000000, secs => -8640000000001));
\echo :LAST_ERROR_SQLSTATE
-- renew: two hours with mixed signs, then minus one second
SELECT owner AS renew_owner FROM dlock.try_acquire('trust:mixed-renew', '1 hour') \gset
SELECT dlock.renew('trust:mixed-renew', :'renew_owner', '-100000000 days 2400000002:00:00') IS NOT NULL AS renewed;
SELECT expires_at - clock_timestamp() BETWEEN interval '1 hour 50 minutes' AND interval '2 hours'
       AS renewed_for_two_hours
  FROM dlock.leases WHERE key = 'trust:mixed-renew';
SELECT dlock.renew('trust:mixed-renew', :'renew_owner', make_interval(days => 100000000, secs => -8640000000001));
\echo :LAST_ERROR_SQLSTATE
-- acquire: a mixed-sign ttl on a free key; on a held key, a mixed-sign
-- wait of one second times out, a negative one is refused
SELECT key, fence > 0 AS granted
  FROM dlock.acquire('trust:mixed-acquire', '-100000000 days 2400000000:00:01', wait => '0');
SELECT * FROM dlock.acquire('trust:mixed-renew', '1 hour', wait => '-100000000 days 2400000000:00:01');
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM dlock.acquire('trust:mixed-renew', '1 hour', wait => '100000000 days -2400000000:00:01');
\echo :LAST_ERROR_SQLSTATE
-- prune: about 100 years (nothing is that old), minus one second
SELECT dlock.prune('-99963500 days 2400000000:00:00') AS pruned;
SELECT dlock.prune(make_interval(days => -99963500, secs => 8640000000000)) AS pruned;
SELECT dlock.prune(make_interval(days => 100000000, secs => -8640000000001));
\echo :LAST_ERROR_SQLSTATE

--
-- 6. Reached in parallel mode through a wrapper wrongly marked PARALLEL
-- SAFE or RESTRICTED, dlock refuses with 25000 (not XX000).
--
CREATE FUNCTION grab(k text) RETURNS bigint LANGUAGE sql PARALLEL SAFE
AS $$ SELECT count(*) FROM dlock.try_acquire(k, '1 minute') $$;
CREATE FUNCTION peek(k text, f bigint) RETURNS boolean LANGUAGE sql PARALLEL SAFE
AS $$ SELECT dlock.check_fence(k, f) $$;
SET force_parallel_mode = on;
SET parallel_setup_cost = 0;
SET parallel_tuple_cost = 0;
-- the queries do run under a Gather
EXPLAIN (COSTS OFF) SELECT grab('trust:parallel');
EXPLAIN (COSTS OFF) SELECT peek('trust:parallel', 1);
SELECT grab('trust:parallel');
\echo :LAST_ERROR_SQLSTATE
SELECT peek('trust:parallel', 1);
\echo :LAST_ERROR_SQLSTATE
-- also when no worker can be started and the leader runs the plan
SET max_parallel_workers = 0;
SELECT grab('trust:parallel');
\echo :LAST_ERROR_SQLSTATE
RESET max_parallel_workers;
-- PARALLEL RESTRICTED: it runs in the leader, but force_parallel_mode puts
-- the whole query in parallel mode even where it cannot add a Gather
CREATE FUNCTION grab_restricted(k text) RETURNS bigint LANGUAGE sql PARALLEL RESTRICTED
AS $$ SELECT count(*) FROM dlock.try_acquire(k, '1 minute') $$;
SELECT grab_restricted('trust:parallel');
\echo :LAST_ERROR_SQLSTATE
RESET force_parallel_mode;
RESET parallel_setup_cost;
RESET parallel_tuple_cost;
-- nothing was granted
SELECT count(*) AS parallel_grants FROM dlock.leases WHERE key = 'trust:parallel';

--
-- 7. An UPDATE that moves a row to another partition and presents its
-- token in the SET list is accepted (the DELETE half inherits it).
--
CREATE TABLE parted (id int NOT NULL, part int NOT NULL, v int, fence bigint)
  PARTITION BY LIST (part);
CREATE TABLE parted_1 PARTITION OF parted FOR VALUES IN (1);
CREATE TABLE parted_2 PARTITION OF parted FOR VALUES IN (2);
CREATE TRIGGER parted_fence
  BEFORE INSERT OR UPDATE OR DELETE ON parted
  FOR EACH ROW EXECUTE FUNCTION dlock.fence_guard('parted:{id}', 'fence');
SELECT owner AS pa_owner, fence AS pa_fence FROM dlock.try_acquire('parted:1', '1 hour') \gset
INSERT INTO parted VALUES (1, 1, 0, :pa_fence);
SELECT dlock.release('parted:1', :'pa_owner');
SELECT owner AS pb_owner, fence AS pb_fence FROM dlock.try_acquire('parted:1', '1 hour') \gset
-- no token: refused
UPDATE parted SET part = 2, v = 1 WHERE id = 1;
\echo :SQLSTATE
-- the new holder's token in the SET list: accepted, the row moved
UPDATE parted SET part = 2, v = 1, fence = :pb_fence WHERE id = 1;
\echo :SQLSTATE
SELECT tableoid::regclass AS partition, v, fence = :pb_fence AS stamped_with_b FROM parted;
-- the old holder's token (not the row's): refused as stale
UPDATE parted SET part = 1, v = 2, fence = :pa_fence WHERE id = 1;
\echo :SQLSTATE
-- use_fence moves it back
BEGIN;
SELECT dlock.use_fence('parted:1', :pb_fence);
UPDATE parted SET part = 1, v = 3 WHERE id = 1;
\echo :SQLSTATE
COMMIT;
SELECT tableoid::regclass AS partition, v, fence = :pb_fence AS stamped_with_b FROM parted;

--
-- 8. A trigger on an inheritance parent does not fire for the rows of its
-- children (PostgreSQL's rule for row triggers): they are not protected.
--
CREATE TABLE inh_parent (id int NOT NULL, v int, fence bigint);
CREATE TABLE inh_child () INHERITS (inh_parent);
CREATE TRIGGER inh_fence
  BEFORE INSERT OR UPDATE OR DELETE ON inh_parent
  FOR EACH ROW EXECUTE FUNCTION dlock.fence_guard('inh:{id}', 'fence');
INSERT INTO inh_parent VALUES (1, 0);
\echo :SQLSTATE
-- not protected: all accepted without a token
INSERT INTO inh_child VALUES (1, 0);
\echo :SQLSTATE
UPDATE inh_parent SET v = 1;
\echo :SQLSTATE
DELETE FROM inh_parent;
\echo :SQLSTATE

--
-- 9. PREPARE TRANSACTION is refused once the transaction used dlock (its
-- key locks' release by COMMIT PREPARED would wake no waiter).  dlock's
-- check comes before the server's own, so this is 0A000 whatever
-- max_prepared_transactions is.
--
SELECT owner AS prep_owner, fence AS prep_fence FROM dlock.try_acquire('trust:prepare', '1 hour') \gset
BEGIN;
SELECT dlock.use_fence('trust:prepare', :prep_fence);
PREPARE TRANSACTION 'dlock_trust';
\echo :SQLSTATE
SELECT count(*) > 0 AS leaked FROM pg_prepared_xacts WHERE gid = 'dlock_trust' \gset
\if :leaked
ROLLBACK PREPARED 'dlock_trust';
\endif
-- the refused transaction's key lock is gone: release (which waits for
-- writers under the lease) goes through
SELECT dlock.release('trust:prepare', :'prep_owner') AS released;

--
-- 10. try_acquire returns no row for a held key; holder by name.
--
SELECT count(*) FROM dlock.try_acquire('trust:held', '1 hour', holder => 'x');
SELECT * FROM dlock.try_acquire('trust:held', '1 hour');
SELECT count(*) FROM dlock.try_acquire('trust:held', '1 hour');
SELECT NOT EXISTS (SELECT FROM dlock.try_acquire('trust:held', '1 hour')) AS refused;
SELECT key, fence > 0 AS granted
  FROM dlock.acquire('trust:held2', '1 hour', holder => 'y', wait => '1s');
SELECT key, holder FROM dlock.leases WHERE key IN ('trust:held', 'trust:held2') ORDER BY key;
