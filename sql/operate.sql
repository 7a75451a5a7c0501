-- Operating dlock without preloading: the view dlock.lease_status,
-- dlock.max_hold, lock_delay, session_bound, and what dlock.stats and
-- dlock.stats_reset() do when the module is not preloaded.
-- Output shows only stable values: booleans, differences, counts, SQLSTATEs.

-- Wait on a condition, never a fixed time: until the clock has passed t.
CREATE FUNCTION pg_temp.sleep_past(t timestamptz) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
  WHILE clock_timestamp() <= t LOOP
    PERFORM pg_sleep(0.01);
  END LOOP;
END $$;

--
-- 1. dlock.lease_status: its columns (no owner), one row per key.
--
SELECT attname, format_type(atttypid, atttypmod) AS type
FROM pg_attribute
WHERE attrelid = 'dlock.lease_status'::regclass AND attnum > 0
ORDER BY attnum;

SET application_name = 'regress-operate';
SELECT count(*) AS granted FROM dlock.try_acquire('op:held', '1 hour', holder => 'worker-a');
SELECT * FROM dlock.try_acquire('op:released', '1 hour') \gset rel_
SELECT dlock.release('op:released', :'rel_owner') AS released;
SELECT * FROM dlock.try_acquire('op:expired', '50 milliseconds') \gset exp_
SELECT pg_temp.sleep_past(:'exp_expires_at');
SELECT count(*) AS granted FROM dlock.try_acquire('op:bound', '1 hour', session_bound => true);
RESET application_name;

SELECT key, holder, state, remaining IS NULL AS remaining_null,
       remaining > '0' AND remaining <= '1 hour' AS remaining_ok,
       pid = pg_backend_pid() AS my_pid, application_name, session_bound,
       expires_at > granted_at AS ends_after_grant
FROM dlock.lease_status WHERE key LIKE 'op:%' ORDER BY key;

-- the same fence as dlock.leases, one row per row of it
SELECT count(*) = (SELECT count(*) FROM dlock.leases) AS one_row_per_key,
       bool_and(s.fence = l.fence AND s.expires_at = l.expires_at
                AND s.granted_at = l.granted_at) AS same_as_storage
FROM dlock.lease_status s JOIN dlock.leases l USING (key);

-- An ordinary role reads it (owners never appear: not a column of it),
-- and cannot read owners from the storage either.
CREATE ROLE dlock_operate_user;
SET ROLE dlock_operate_user;
SELECT key, state FROM dlock.lease_status WHERE key LIKE 'op:%' ORDER BY key;
SELECT owner FROM dlock.lease_status;
\echo :LAST_ERROR_SQLSTATE
SELECT owner FROM dlock.leases;
\echo :LAST_ERROR_SQLSTATE
RESET ROLE;

--
-- 2. A session-bound lease ends with its connection's session-level
-- advisory locks (pg_advisory_unlock_all(), as a pooler's DISCARD ALL):
-- shown expired at once, and taken over without waiting for its TTL.
--
SELECT * FROM dlock.try_acquire('op:unbound', '1 hour', session_bound => true,
                                lock_delay => '1 hour') \gset ub_
SELECT state, session_bound FROM dlock.lease_status WHERE key = 'op:unbound';
SELECT pg_advisory_unlock_all();
SELECT state, remaining IS NULL AS remaining_null, session_bound
FROM dlock.lease_status WHERE key = 'op:unbound';
SELECT dlock.renew('op:unbound', :'ub_owner', '1 hour') IS NULL AS renew_lost;
-- its lock_delay does not apply: that connection has no work in flight
SELECT fence > :ub_fence AS taken_over
FROM dlock.try_acquire('op:unbound', '1 hour');
-- One that ran out unreleased is under its lock_delay while its connection
-- lasts, and free at once when the connection's session locks end.
SELECT * FROM dlock.try_acquire('op:unbound2', '50 milliseconds', session_bound => true,
                                lock_delay => '1 hour') \gset ub2_
SELECT pg_temp.sleep_past(:'ub2_expires_at');
SELECT count(*) AS granted_during_delay FROM dlock.try_acquire('op:unbound2', '1 hour');
SELECT pg_advisory_unlock_all();
SELECT fence > :ub2_fence AS taken_over
FROM dlock.try_acquire('op:unbound2', '1 hour');
-- a new session-bound grant in this connection takes a new mark
SELECT * FROM dlock.try_acquire('op:rebound', '1 hour', session_bound => true) \gset rb_
SELECT state FROM dlock.lease_status WHERE key = 'op:rebound';
SELECT dlock.renew('op:rebound', :'rb_owner', '2 hours') IS NOT NULL AS renewed;
SELECT dlock.release('op:rebound', :'rb_owner') AS released;

-- session_bound must not be NULL
SELECT dlock.try_acquire('op:null', '1 hour', session_bound => NULL);
\echo :LAST_ERROR_SQLSTATE
SELECT dlock.acquire('op:null', '1 hour', session_bound => NULL);
\echo :LAST_ERROR_SQLSTATE

--
-- 3. dlock.max_hold: superuser-only; a longer ttl is granted for max_hold;
-- renew never goes past the limit fixed at the grant.
--
SHOW dlock.max_hold;
SET ROLE dlock_operate_user;
SET dlock.max_hold = '1h';
\echo :LAST_ERROR_SQLSTATE
SET dlock.max_hold = 0;
\echo :LAST_ERROR_SQLSTATE
SET dlock.log_events = on;
\echo :LAST_ERROR_SQLSTATE
SHOW dlock.max_hold;
SHOW dlock.log_events;
RESET ROLE;

SET dlock.max_hold = '1h';
SHOW dlock.max_hold;
SELECT * FROM dlock.try_acquire('op:cap', '2 hours') \gset cap_
SELECT expires_at - granted_at AS granted_for,
       expires_at - granted_at = interval '1 hour' AS exactly_max_hold, state
FROM dlock.lease_status WHERE key = 'op:cap';
SELECT hold_limit - granted_at AS hold_limit, hold_limit = expires_at AS limit_is_expiry
FROM dlock.leases WHERE key = 'op:cap';
SELECT :'cap_expires_at'::timestamptz = expires_at AS returned_expiry
FROM dlock.leases WHERE key = 'op:cap';
-- within the limit, renew sets what it is asked for; beyond, the limit
SELECT dlock.renew('op:cap', :'cap_owner', '10 minutes') < hold_limit AS renew_as_asked
FROM dlock.leases WHERE key = 'op:cap';
SELECT expires_at < hold_limit AS stored_as_asked
FROM dlock.leases WHERE key = 'op:cap';
SELECT dlock.renew('op:cap', :'cap_owner', '2 hours') = hold_limit AS renew_capped
FROM dlock.leases WHERE key = 'op:cap';
-- the cap stays with the lease when this session drops its own
RESET dlock.max_hold;
SHOW dlock.max_hold;
SELECT dlock.renew('op:cap', :'cap_owner', '10 minutes') < hold_limit AS renew_as_asked
FROM dlock.leases WHERE key = 'op:cap';
SELECT dlock.renew('op:cap', :'cap_owner', '2 hours') = hold_limit AS still_capped
FROM dlock.leases WHERE key = 'op:cap';
SELECT expires_at = hold_limit AS stored_capped
FROM dlock.leases WHERE key = 'op:cap';

-- Once the limit is reached, renew returns NULL; the key is free again,
-- and a grant without max_hold has no limit.
SET dlock.max_hold = '300ms';
SELECT * FROM dlock.try_acquire('op:cap-short', '1 hour') \gset cs_
RESET dlock.max_hold;
SELECT expires_at - granted_at AS granted_for, hold_limit = expires_at AS limit_is_expiry
FROM dlock.leases WHERE key = 'op:cap-short';
SELECT pg_temp.sleep_past(:'cs_expires_at');
SELECT dlock.renew('op:cap-short', :'cs_owner', '1 hour') IS NULL AS renew_null_at_limit;
SELECT state FROM dlock.lease_status WHERE key = 'op:cap-short';
SELECT count(*) AS granted FROM dlock.try_acquire('op:cap-short', '1 hour');
SELECT hold_limit IS NULL AS no_limit_without_max_hold
FROM dlock.leases WHERE key = 'op:cap-short';

-- A lease granted without a limit: a renewing session's own max_hold
-- applies, counted from the grant.
SELECT * FROM dlock.try_acquire('op:uncapped', '1 hour') \gset unc_
SET dlock.max_hold = '1h';
SELECT dlock.renew('op:uncapped', :'unc_owner', '2 hours') = granted_at + interval '1 hour'
       AS renewer_cap
FROM dlock.leases WHERE key = 'op:uncapped';
-- a ttl within max_hold is granted as asked
SELECT count(*) AS granted FROM dlock.try_acquire('op:within', '10 minutes');
SELECT expires_at - granted_at AS granted_for, hold_limit - granted_at AS hold_limit
FROM dlock.leases WHERE key = 'op:within';
RESET dlock.max_hold;

--
-- 4. lock_delay: bad values; a lease that expires unreleased keeps the key
-- ungrantable for the delay; a release frees it at once.
--
SELECT dlock.try_acquire('op:bad', '1 hour', lock_delay => '-1 second');
\echo :LAST_ERROR_SQLSTATE
SELECT dlock.try_acquire('op:bad', '1 hour', lock_delay => '1 day 1 second');
\echo :LAST_ERROR_SQLSTATE
SELECT dlock.acquire('op:bad', '1 hour', lock_delay => '-1 millisecond');
\echo :LAST_ERROR_SQLSTATE
SET dlock.max_ttl = '10s';
SELECT dlock.acquire('op:bad', '1 second', lock_delay => '11 seconds');
\echo :LAST_ERROR_SQLSTATE
RESET dlock.max_ttl;
SELECT count(*) AS leases_of_bad_calls FROM dlock.leases WHERE key = 'op:bad';
-- NULL and zero mean no delay
SELECT count(*) AS granted FROM dlock.try_acquire('op:nodelay', '1 hour', lock_delay => NULL);
SELECT count(*) AS granted FROM dlock.try_acquire('op:zerodelay', '1 hour', lock_delay => '0');

-- Two leases with a delay of one second run out unreleased.
SELECT * FROM dlock.try_acquire('op:delay', '50 milliseconds', lock_delay => '1 second') \gset d1_
SELECT * FROM dlock.try_acquire('op:delay2', '50 milliseconds', lock_delay => '1 second') \gset d2_
SELECT lock_delay FROM dlock.leases WHERE key = 'op:delay';
SELECT pg_temp.sleep_past(:'d2_expires_at');
SELECT key, state, remaining IS NULL AS remaining_null
FROM dlock.lease_status WHERE key LIKE 'op:delay%' ORDER BY key;
-- during the delay: no row, and an acquire that cannot wait it out times out
SELECT count(*) AS granted_during_delay FROM dlock.try_acquire('op:delay', '1 hour');
\set VERBOSITY terse
SELECT dlock.acquire('op:delay', '1 hour', wait => '10 milliseconds');
\echo :LAST_ERROR_SQLSTATE
\set VERBOSITY default
SELECT fence = :d1_fence AS same_lease FROM dlock.leases WHERE key = 'op:delay';
-- acquire waits through the delay and is granted only after it
SELECT fence > :d2_fence AS granted,
       expires_at - interval '1 hour' >= :'d2_expires_at'::timestamptz + interval '1 second'
       AS granted_after_delay
FROM dlock.acquire('op:delay2', '1 hour', wait => '5 seconds');
-- after the delay (op:delay ran out before op:delay2) try_acquire grants
SELECT clock_timestamp() > :'d1_expires_at'::timestamptz + interval '1 second' AS delay_over;
SELECT fence > :d1_fence AS granted_after_delay
FROM dlock.try_acquire('op:delay', '1 hour');

-- A released lease with a delay is free at once.
SELECT * FROM dlock.try_acquire('op:delay-released', '1 hour', lock_delay => '1 hour') \gset dr_
SELECT dlock.release('op:delay-released', :'dr_owner') AS released;
SELECT fence > :dr_fence AS granted_at_once
FROM dlock.try_acquire('op:delay-released', '1 hour');

--
-- 5. Without preloading: dlock.stats has one row per key and the totals
-- row, every counter NULL; stats_reset() needs preloading (55000) and is
-- refused to ordinary roles (42501).
--
SELECT count(*) = (SELECT count(*) FROM dlock.leases) + 1 AS rows_per_key_plus_totals,
       count(*) FILTER (WHERE key IS NULL) AS totals_rows,
       count(*) FILTER (WHERE key LIKE 'op:%') = (SELECT count(*) FROM dlock.leases WHERE key LIKE 'op:%')
       AS our_keys,
       bool_and(acquired IS NULL AND contended IS NULL AND timeouts IS NULL
                AND expired IS NULL AND taken_over IS NULL AND renewed IS NULL
                AND released IS NULL AND lost_renewals IS NULL
                AND stale_writes_refused IS NULL AND hold_time_total IS NULL
                AND hold_time_max IS NULL AND hold_time_mean IS NULL
                AND wait_time_total IS NULL AND wait_time_max IS NULL) AS counters_null
FROM dlock.stats;
SELECT dlock.stats_reset();
\echo :LAST_ERROR_SQLSTATE
SET ROLE dlock_operate_user;
SELECT count(*) > 0 AS stats_readable FROM dlock.stats;
SELECT dlock.stats_reset();
\echo :LAST_ERROR_SQLSTATE
RESET ROLE;
DROP ROLE dlock_operate_user;
