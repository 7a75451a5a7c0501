-- The counters of dlock.stats (needs shared_preload_libraries = 'dlock').
-- Every counter is checked with its exact value; times only as bounds.
-- Output shows only stable values: booleans, counts, SQLSTATEs.

SELECT dlock.stats_reset();

-- Wait on a condition, never a fixed time: until the clock has passed t.
CREATE FUNCTION stats_sleep_past(t timestamptz) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
  WHILE clock_timestamp() <= t LOOP
    PERFORM pg_sleep(0.01);
  END LOOP;
END $$;

-- The counts of one key (NULL: the totals row), without the times.
CREATE FUNCTION stats_counts(k text)
RETURNS TABLE (acquired bigint, contended bigint, timeouts bigint, expired bigint,
               taken_over bigint, renewed bigint, released bigint,
               lost_renewals bigint, stale_writes_refused bigint)
LANGUAGE sql AS $$
  SELECT acquired, contended, timeouts, expired, taken_over, renewed, released,
         lost_renewals, stale_writes_refused
  FROM dlock.stats WHERE key IS NOT DISTINCT FROM k
$$;

-- Right after a reset: only the totals row, all zero.
SELECT key, acquired, contended, timeouts, expired, taken_over, renewed,
       released, lost_renewals, stale_writes_refused,
       hold_time_total = '0' AS no_hold_time, hold_time_max = '0' AS no_hold_max,
       hold_time_mean IS NULL AS no_mean,
       wait_time_total = '0' AS no_wait_time, wait_time_max = '0' AS no_wait_max
FROM dlock.stats;

--
-- 1. Grants, refusals, renewals, releases, lost renewals.
--
SELECT * FROM dlock.try_acquire('st:a', '1 hour') \gset a_
-- a refused try_acquire is contended (it changes nothing, and still counts)
SELECT count(*) AS granted FROM dlock.try_acquire('st:a', '1 hour');
SELECT dlock.renew('st:a', :'a_owner', '1 hour') IS NOT NULL AS renewed;
SELECT dlock.renew('st:a', :'a_owner', '2 hours') IS NOT NULL AS renewed;
-- a stranger's renew is a lost renewal; its release counts nothing
SELECT dlock.renew('st:a', gen_random_uuid(), '1 hour') IS NULL AS lost;
SELECT dlock.release('st:a', gen_random_uuid()) AS stranger_released;
SELECT dlock.release('st:a', :'a_owner') AS released;
-- released twice: false, not counted; renew after release: lost
SELECT dlock.release('st:a', :'a_owner') AS released_again;
SELECT dlock.renew('st:a', :'a_owner', '1 hour') IS NULL AS lost;
-- a grant after a release is not a takeover
SELECT count(*) AS granted FROM dlock.try_acquire('st:a', '1 hour');
SELECT * FROM stats_counts('st:a');
SELECT hold_time_total > '0' AND hold_time_total < '1 minute' AS hold_time,
       hold_time_max = hold_time_total AS one_hold,
       hold_time_mean = hold_time_total AS mean_of_one,
       wait_time_total = '0' AS never_waited
FROM dlock.stats WHERE key = 'st:a';

--
-- 2. Waiting: an acquire that waits for a lease to run out is contended
-- and granted by takeover (the expired lease counted once); one that
-- cannot wait long enough times out.
--
DO $$
BEGIN
  PERFORM FROM dlock.try_acquire('st:wait', '300 milliseconds');
  -- the same transaction may take the key again once its lease ran out
  PERFORM dlock.acquire('st:wait', '1 hour', wait => '5 seconds');
END $$;
\set VERBOSITY terse
SELECT dlock.acquire('st:wait', '1 hour', wait => '10 milliseconds');
\echo :LAST_ERROR_SQLSTATE
\set VERBOSITY default
SELECT * FROM stats_counts('st:wait');
SELECT wait_time_max > '100 milliseconds' AND wait_time_max <= '5 seconds' AS waited_for_expiry,
       -- the timed-out acquire waited its 10 ms (less the time to start)
       wait_time_total >= wait_time_max + interval '5 milliseconds' AS waited_twice,
       wait_time_total < '6 seconds' AS bounded,
       -- the expired lease was held its 300 ms, to the expiry; the new
       -- lease is still held
       hold_time_total = '300 milliseconds' AS expired_hold_counted,
       hold_time_max = '300 milliseconds' AS expired_hold_max
FROM dlock.stats WHERE key = 'st:wait';
-- an acquire granted at once has not waited
SELECT count(*) AS granted FROM dlock.acquire('st:at-once', '1 hour', wait => '1 second');
SELECT * FROM stats_counts('st:at-once');
SELECT wait_time_total = '0' AS no_wait FROM dlock.stats WHERE key = 'st:at-once';

--
-- 3. Expiry is counted once per lease, when dlock first notices it: reading
-- the views again and again, a lost renewal and the takeover do not count
-- it again.
--
SELECT * FROM dlock.try_acquire('st:exp', '50 milliseconds') \gset exp_
SELECT stats_sleep_past(:'exp_expires_at');
SELECT expired FROM dlock.stats WHERE key = 'st:exp';
SELECT state FROM dlock.lease_status WHERE key = 'st:exp';
SELECT state FROM dlock.lease_status WHERE key = 'st:exp';
SELECT expired FROM dlock.stats WHERE key = 'st:exp';
SELECT expired FROM dlock.stats WHERE key = 'st:exp';
SELECT dlock.renew('st:exp', :'exp_owner', '1 hour') IS NULL AS lost;
SELECT dlock.release('st:exp', :'exp_owner') AS released;
SELECT count(*) AS granted FROM dlock.try_acquire('st:exp', '1 hour');
SELECT * FROM stats_counts('st:exp');
-- held until its expiry, not until it was noticed
SELECT hold_time_total = '50 milliseconds' AS held_to_expiry,
       hold_time_mean = '50 milliseconds' AS mean_of_one
FROM dlock.stats WHERE key = 'st:exp';

-- A session-bound lease whose connection's session locks end
-- (pg_advisory_unlock_all(), as a pooler's DISCARD ALL): expired once, and
-- the next grant is a takeover.
SELECT count(*) AS granted FROM dlock.try_acquire('st:bound', '1 hour', session_bound => true);
SELECT pg_advisory_unlock_all();
SELECT state FROM dlock.lease_status WHERE key = 'st:bound';
SELECT count(*) AS granted FROM dlock.try_acquire('st:bound', '1 hour');
SELECT * FROM stats_counts('st:bound');

--
-- 4. Stale writes: use_fence and fenced writes refused with LF001 count,
-- also when their transaction rolls back.  check_fence is no write.
--
SELECT * FROM dlock.try_acquire('st:fence', '1 hour') \gset f1_
SELECT dlock.release('st:fence', :'f1_owner') AS released;
SELECT * FROM dlock.try_acquire('st:fence', '1 hour') \gset f2_
CREATE TABLE st_fenced (id int, fence bigint);
CREATE TRIGGER st_fenced_guard BEFORE INSERT OR UPDATE OR DELETE ON st_fenced
  FOR EACH ROW EXECUTE FUNCTION dlock.fence_guard('st:fence', 'fence');
\set VERBOSITY terse
SELECT dlock.use_fence('st:fence', :f1_fence);
\echo :LAST_ERROR_SQLSTATE
BEGIN;
INSERT INTO st_fenced VALUES (1, :f1_fence);
\echo :LAST_ERROR_SQLSTATE
ROLLBACK;
BEGIN;
SELECT dlock.use_fence('st:fence', :f1_fence);
\echo :LAST_ERROR_SQLSTATE
ROLLBACK;
\set VERBOSITY default
SELECT dlock.check_fence('st:fence', :f1_fence) AS old_token_valid;
-- accepted writes count nothing
INSERT INTO st_fenced VALUES (1, :f2_fence);
SELECT dlock.check_fence('st:fence', :f2_fence) AS new_token_valid;
SELECT * FROM stats_counts('st:fence');

--
-- 5. The totals row is the sum over the keys (the max of the maxima).
--
SELECT key FROM dlock.stats ORDER BY key;
SELECT t.acquired = s.acquired AND t.contended = s.contended
       AND t.timeouts = s.timeouts AND t.expired = s.expired
       AND t.taken_over = s.taken_over AND t.renewed = s.renewed
       AND t.released = s.released AND t.lost_renewals = s.lost_renewals
       AND t.stale_writes_refused = s.stale_writes_refused AS counts_add_up,
       t.hold_time_total = s.hold_time_total AND t.hold_time_max = s.hold_time_max
       AND t.wait_time_total = s.wait_time_total AND t.wait_time_max = s.wait_time_max
       AS times_add_up,
       t.hold_time_mean > '0' AND t.hold_time_mean <= t.hold_time_max AS mean_ok
FROM (SELECT * FROM dlock.stats WHERE key IS NULL) t,
     (SELECT sum(acquired) AS acquired, sum(contended) AS contended,
             sum(timeouts) AS timeouts, sum(expired) AS expired,
             sum(taken_over) AS taken_over, sum(renewed) AS renewed,
             sum(released) AS released, sum(lost_renewals) AS lost_renewals,
             sum(stale_writes_refused) AS stale_writes_refused,
             sum(hold_time_total) AS hold_time_total, max(hold_time_max) AS hold_time_max,
             sum(wait_time_total) AS wait_time_total, max(wait_time_max) AS wait_time_max
      FROM dlock.stats WHERE key IS NOT NULL) s;
SELECT * FROM stats_counts(NULL);

--
-- 6. Per database: another database's activity and reset stay there.
--
SELECT current_database() AS home_db \gset
CREATE DATABASE regress_dlock_stats_other;
\c regress_dlock_stats_other
CREATE EXTENSION dlock;
SELECT count(*) AS granted FROM dlock.try_acquire('st:other', '1 hour');
SELECT count(*) AS granted FROM dlock.try_acquire('st:other', '1 hour');
SELECT key, acquired, contended FROM dlock.stats ORDER BY key;
\c :home_db
SELECT count(*) AS other_keys FROM dlock.stats WHERE key = 'st:other';
SELECT * FROM stats_counts(NULL);

--
-- 7. stats_reset() zeroes this database's counters only; a role needs
-- EXECUTE on it.
--
CREATE ROLE dlock_stats_user;
SET ROLE dlock_stats_user;
SELECT dlock.stats_reset();
\echo :LAST_ERROR_SQLSTATE
SELECT count(*) > 1 AS still_counted FROM dlock.stats;
RESET ROLE;
GRANT EXECUTE ON FUNCTION dlock.stats_reset() TO dlock_stats_user;
SET ROLE dlock_stats_user;
SELECT dlock.stats_reset();
RESET ROLE;
REVOKE EXECUTE ON FUNCTION dlock.stats_reset() FROM dlock_stats_user;
DROP ROLE dlock_stats_user;
SELECT key, acquired, contended, timeouts, expired, taken_over, renewed,
       released, lost_renewals, stale_writes_refused,
       hold_time_total = '0' AS no_hold_time, hold_time_mean IS NULL AS no_mean,
       wait_time_total = '0' AS no_wait_time
FROM dlock.stats;
-- after a reset, a lease noticed expired before it is not counted again
SELECT * FROM dlock.try_acquire('st:exp2', '50 milliseconds') \gset exp2_
SELECT stats_sleep_past(:'exp2_expires_at');
SELECT state FROM dlock.lease_status WHERE key = 'st:exp2';
SELECT dlock.stats_reset();
SELECT count(*) AS granted FROM dlock.try_acquire('st:exp2', '1 hour');
SELECT * FROM stats_counts('st:exp2');
\c regress_dlock_stats_other
SELECT key, acquired, contended FROM dlock.stats ORDER BY key;
\c :home_db
DROP DATABASE regress_dlock_stats_other;
DROP TABLE st_fenced;
DROP FUNCTION stats_counts(text), stats_sleep_past(timestamptz);
