-- Bad input: every argument error has a proper SQLSTATE and changes nothing.
-- Each failing call is followed by its SQLSTATE.
SELECT count(*) AS rows_before FROM dlock.leases \gset
SELECT last_value AS seq_before FROM dlock.token_seq \gset

-- NULL arguments: 22004, never a silent NULL
SELECT dlock.try_acquire(NULL, '1 hour');
\echo :LAST_ERROR_SQLSTATE
SELECT dlock.try_acquire('e', NULL);
\echo :LAST_ERROR_SQLSTATE
SELECT dlock.acquire(NULL, '1 hour');
\echo :LAST_ERROR_SQLSTATE
SELECT dlock.acquire('e', NULL, '1 second');
\echo :LAST_ERROR_SQLSTATE
SELECT dlock.renew(NULL, gen_random_uuid(), '1 hour');
\echo :LAST_ERROR_SQLSTATE
SELECT dlock.renew('e', NULL, '1 hour');
\echo :LAST_ERROR_SQLSTATE
SELECT dlock.renew('e', gen_random_uuid(), NULL);
\echo :LAST_ERROR_SQLSTATE
SELECT dlock.release(NULL, gen_random_uuid());
\echo :LAST_ERROR_SQLSTATE
SELECT dlock.release('e', NULL);
\echo :LAST_ERROR_SQLSTATE
SELECT dlock.prune(NULL);
\echo :LAST_ERROR_SQLSTATE

-- Keys: empty, too long (the limit is 512 bytes; 512 is fine)
SELECT dlock.try_acquire('', '1 hour');
\echo :LAST_ERROR_SQLSTATE
SELECT dlock.try_acquire(repeat('x', 513), '1 hour');
\echo :LAST_ERROR_SQLSTATE
SELECT dlock.try_acquire(repeat('é', 257), '1 hour');
\echo :LAST_ERROR_SQLSTATE
SELECT dlock.renew('', gen_random_uuid(), '1 hour');
\echo :LAST_ERROR_SQLSTATE
SELECT dlock.release(repeat('x', 513), gen_random_uuid());
\echo :LAST_ERROR_SQLSTATE
SELECT (dlock.try_acquire(repeat('x', 512), '1 hour')).fence IS NOT NULL AS max_key_ok;

-- TTLs: not positive, over dlock.max_ttl
SELECT dlock.try_acquire('e', '0');
\echo :LAST_ERROR_SQLSTATE
SELECT dlock.try_acquire('e', '-1 second');
\echo :LAST_ERROR_SQLSTATE
SELECT dlock.try_acquire('e', '1 day 1 second');
\echo :LAST_ERROR_SQLSTATE
SELECT dlock.acquire('e', '1 month');
\echo :LAST_ERROR_SQLSTATE
SELECT dlock.renew('e', gen_random_uuid(), '0');
\echo :LAST_ERROR_SQLSTATE
SELECT dlock.renew('e', gen_random_uuid(), '2 days');
\echo :LAST_ERROR_SQLSTATE
SELECT (dlock.try_acquire('e-day', '1 day')).fence IS NOT NULL AS one_day_ok;

-- Absurd lengths get the same errors, not a bare "timestamp out of range"
SELECT dlock.try_acquire('e', '1000000 years');
\echo :LAST_ERROR_SQLSTATE
SELECT dlock.renew('e', gen_random_uuid(), '-178000000 years');
\echo :LAST_ERROR_SQLSTATE

-- Waits: negative
SELECT dlock.acquire('e', '1 hour', '-1 second');
\echo :LAST_ERROR_SQLSTATE
SELECT dlock.acquire('e', '1 hour', '-178000000 years');
\echo :LAST_ERROR_SQLSTATE
-- a wait of decades means no limit of its own (the key is free: granted)
SELECT (dlock.acquire('e-wait', '1 hour', '1000000 years')).fence IS NOT NULL AS granted;

-- prune: negative age; an age of decades prunes nothing
SELECT dlock.prune('-1 hour');
\echo :LAST_ERROR_SQLSTATE
SELECT dlock.prune('-178000000 years');
\echo :LAST_ERROR_SQLSTATE
SELECT dlock.prune('178000000 years') AS pruned;

-- Holder label too long
SELECT dlock.try_acquire('e', '1 hour', repeat('h', 1025));
\echo :LAST_ERROR_SQLSTATE

-- dlock.max_ttl is a superuser setting with a lower default than "forever"
SHOW dlock.max_ttl;
SET dlock.max_ttl = '1s';
\echo :LAST_ERROR_SQLSTATE
SELECT dlock.try_acquire('e', '2 seconds');
\echo :LAST_ERROR_SQLSTATE
RESET dlock.max_ttl;
CREATE ROLE dlock_errors_user;
SET ROLE dlock_errors_user;
SET dlock.max_ttl = '10 days';
\echo :LAST_ERROR_SQLSTATE
SET dlock.fence_bypass = on;
\echo :LAST_ERROR_SQLSTATE
RESET ROLE;
DROP ROLE dlock_errors_user;
SET dlock.no_such_setting = 1;
\echo :LAST_ERROR_SQLSTATE

-- Nothing changed: three rows added by the valid calls above, and only
-- those three calls drew tokens.
SELECT count(*) - :rows_before AS rows_added FROM dlock.leases;
SELECT last_value - :seq_before AS tokens_drawn FROM dlock.token_seq;
