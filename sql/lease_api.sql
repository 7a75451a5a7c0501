-- The lease API: grants, refusals, renewals, releases, expiry, prune.
-- Output shows only stable values: booleans, differences, counts.

-- A grant returns a lease with a fresh owner and a token.
SELECT (l).key, (l).owner IS NOT NULL AS has_owner, (l).fence > 0 AS has_fence,
       (l).expires_at > clock_timestamp() AS unexpired
FROM (SELECT dlock.try_acquire('job:1', '1 hour') AS l) s;

-- (call it in FROM: (f()).* would call it once per column)
SELECT * FROM dlock.try_acquire('job:1', '1 hour', 'worker-a');

-- Another owner is refused at once while the lease is held: no row, so that
-- nobody can count a refusal as a lease.
SELECT count(*) AS leases_granted FROM dlock.try_acquire('job:1', '1 hour');
SELECT NOT EXISTS (SELECT FROM dlock.try_acquire('job:1', '1 hour')) AS refused;

-- owner, fence and holder as stored; holder defaults to application_name
SET application_name = 'regress-app';
SELECT (dlock.try_acquire('job:2', '1 hour')).fence IS NOT NULL AS granted;
SELECT key, holder FROM dlock.leases ORDER BY key;
SELECT (dlock.try_acquire('job:3', '1 hour', 'worker-b')).fence IS NOT NULL AS granted;
SELECT holder FROM dlock.leases WHERE key = 'job:3';
RESET application_name;

-- Renew, release, and what a stale owner gets.
SELECT * FROM dlock.try_acquire('k', '1 hour') \gset a_
SELECT dlock.renew('k', :'a_owner', '2 hours') > now() + interval '1 hour 59 minutes' AS renewed;
SELECT expires_at > now() + interval '1 hour 59 minutes' AS stored FROM dlock.leases WHERE key = 'k';
SELECT dlock.renew('k', gen_random_uuid(), '1 hour') IS NULL AS stranger_cannot_renew;
SELECT dlock.release('k', gen_random_uuid()) AS stranger_cannot_release;
SELECT dlock.release('k', :'a_owner') AS released;
SELECT dlock.release('k', :'a_owner') AS released_twice;
SELECT dlock.renew('k', :'a_owner', '1 hour') IS NULL AS released_cannot_renew;
SELECT owner IS NULL AS owner_cleared, expires_at <= clock_timestamp() AS ended
FROM dlock.leases WHERE key = 'k';

-- A renew or release that changes nothing keeps no lock: a caller without
-- the owner cannot hold the key up by leaving its transaction open.
BEGIN;
SELECT dlock.release('job:1', gen_random_uuid()) AS stranger_release,
       dlock.renew('job:1', gen_random_uuid(), '1 hour') IS NULL AS stranger_renew;
SELECT count(*) AS dlock_locks_kept FROM pg_locks
WHERE locktype = 'advisory' AND objsubid NOT IN (1, 2) AND pid = pg_backend_pid();
ROLLBACK;

-- The next grant of the key has a larger token, and the old owner is powerless.
SELECT * FROM dlock.try_acquire('k', '1 hour') \gset b_
SELECT :b_fence > :a_fence AS fence_grew, :'b_owner' <> :'a_owner' AS new_owner;
SELECT dlock.release('k', :'a_owner') AS stale_release;
SELECT dlock.renew('k', :'a_owner', '1 hour') IS NULL AS stale_renew;
SELECT dlock.renew('k', :'b_owner', '1 hour') IS NOT NULL AS holder_renews;

-- Tokens are unique across keys and grow in grant order.
SELECT (dlock.try_acquire('x1', '1 hour')).fence AS f1 \gset
SELECT (dlock.try_acquire('x2', '1 hour')).fence AS f2 \gset
SELECT :f2 > :f1 AS grows_across_keys;

-- Expiry, by the server clock at the moment of the call.
SELECT * FROM dlock.try_acquire('short', '1 second') \gset s_
SELECT NOT EXISTS (SELECT FROM dlock.try_acquire('short', '1 hour')) AS held_before_expiry;
SELECT pg_sleep(1.2);
SELECT dlock.renew('short', :'s_owner', '1 hour') IS NULL AS expired_cannot_renew;
SELECT dlock.release('short', :'s_owner') AS expired_cannot_release;
SELECT (dlock.try_acquire('short', '1 hour')).fence > :s_fence AS taken_after_expiry;

-- An expired lease is gone even inside one long transaction: the clock is
-- read at each call, not at transaction start.
BEGIN;
SELECT (dlock.try_acquire('tx', '200 milliseconds')).owner AS t_owner \gset
SELECT pg_sleep(0.3);
SELECT dlock.renew('tx', :'t_owner', '1 hour') IS NULL AS expired_in_transaction;
SELECT (dlock.try_acquire('tx', '1 hour')).fence IS NOT NULL AS regranted_in_transaction;
COMMIT;

-- Millisecond TTLs work.
SELECT (dlock.try_acquire('ms', '50 milliseconds')).owner AS m_owner \gset
SELECT pg_sleep(0.1);
SELECT dlock.try_acquire('ms', '1 hour') IS NOT NULL AS free_after_50ms;

-- A rolled-back grant leaves the key free and its token is never reused.
BEGIN;
SELECT (dlock.try_acquire('rb', '1 hour')).fence AS rb_fence \gset
ROLLBACK;
SELECT (dlock.try_acquire('rb', '1 hour')).fence > :rb_fence AS token_not_reused;

-- acquire() grants at once when the key is free ...
SELECT (dlock.acquire('w', '1 hour', '1 second')).owner AS w_owner \gset
-- ... waits for expiry ...
SELECT (dlock.try_acquire('we', '300 milliseconds')).fence AS we_fence \gset
SELECT (dlock.acquire('we', '1 hour', '5 seconds')).fence > :we_fence AS granted_after_expiry;
-- ... and times out with SQLSTATE 55P03 when the lease outlives the wait.
\set VERBOSITY sqlstate
SELECT dlock.acquire('w', '1 hour', '100 milliseconds');
SELECT dlock.acquire('w', '1 hour', '0');
\set VERBOSITY default
-- A NULL wait with lock_timeout-free statement_timeout is interrupted promptly.
SET statement_timeout = '200ms';
SELECT dlock.acquire('w', '1 hour');
RESET statement_timeout;

-- Storage: PUBLIC reads leases without owners and cannot change them.
CREATE ROLE dlock_regress_user;
SET ROLE dlock_regress_user;
SELECT count(*) > 0 AS can_read FROM (SELECT key, fence, expires_at, holder FROM dlock.leases) s;
SELECT owner FROM dlock.leases;
UPDATE dlock.leases SET expires_at = now();
DELETE FROM dlock.leases;
INSERT INTO dlock.leases (key, fence, expires_at, granted_at) VALUES ('evil', 1, now(), now());
SELECT setval('dlock.fence_seq', 1);
SELECT nextval('dlock.fence_seq');
SELECT dlock.prune('0');
-- but it can use the API
SELECT * FROM dlock.try_acquire('role-key', '1 hour') \gset r_
SELECT dlock.release('role-key', :'r_owner') AS role_released;
RESET ROLE;
DROP ROLE dlock_regress_user;

-- Our key locks never collide with the application's advisory locks.
BEGIN;
SELECT pg_advisory_xact_lock(hashtext('job:9'));
SELECT (dlock.try_acquire('job:9', '1 hour')).fence IS NOT NULL AS granted_beside_advisory;
SELECT count(*) AS dlock_locks FROM pg_locks
WHERE locktype = 'advisory' AND objsubid NOT IN (1, 2) AND pid = pg_backend_pid();
COMMIT;

-- Reusing a key updates its row in place (HOT), no new row versions pile up in the index.
SELECT pg_stat_force_next_flush();
SELECT n_tup_hot_upd AS hot_before FROM pg_stat_user_tables WHERE relid = 'dlock.leases'::regclass \gset
DO $$
DECLARE l dlock.lease;
BEGIN
  FOR i IN 1..50 LOOP
    l := dlock.try_acquire('churn', '1 hour');
    PERFORM dlock.release('churn', l.owner);
  END LOOP;
END $$;
SELECT pg_stat_force_next_flush();
SELECT n_tup_hot_upd - :hot_before >= 90 AS hot_updates
FROM pg_stat_user_tables WHERE relid = 'dlock.leases'::regclass;

-- prune() deletes rows of keys free for longer than older_than, only those.
SELECT count(*) AS rows_before FROM dlock.leases \gset
SELECT dlock.prune('1 hour') AS pruned_nothing_recent;
SELECT dlock.prune('0') > 0 AS pruned_free_keys;
SELECT count(*) AS held_rows_kept FROM dlock.leases WHERE owner IS NOT NULL AND expires_at > clock_timestamp();
SELECT count(*) = 0 AS no_free_rows_left FROM dlock.leases WHERE owner IS NULL OR expires_at <= clock_timestamp();
-- a pruned key is granted again with a larger token
SELECT (dlock.try_acquire('churn', '1 hour')).fence > :b_fence AS regranted_after_prune;

-- Grants and renewals force a synchronous commit even when the session lowered it.
SET synchronous_commit = off;
BEGIN;
SELECT (dlock.try_acquire('durable', '1 hour')).fence IS NOT NULL AS granted;
SHOW synchronous_commit;
COMMIT;
SHOW synchronous_commit;
RESET synchronous_commit;

-- A key's lock is named by the first 8 bytes of its SHA-256 (keylock.c;
-- sha256.c computes it): pg_locks shows them, in this little-endian
-- machine's byte order, as objid and classid of the grant's lock.  Keys of
-- every length around the block boundaries (55, 56, 64, 119, 120 bytes),
-- the longest, and multibyte characters.
BEGIN;
CREATE TEMP TABLE hashed_keys AS
  SELECT repeat('x', n) AS key FROM generate_series(1, 130) n
  UNION ALL SELECT repeat('y', 512) UNION ALL SELECT 'clé-€-' || repeat('z', 50);
SELECT count(*) AS granted FROM hashed_keys, LATERAL dlock.try_acquire(key, '1 minute');
SELECT count(*) AS named_by_sha256 FROM hashed_keys k,
  LATERAL (SELECT sha256(convert_to(k.key, getdatabaseencoding())) AS d) s
WHERE EXISTS (SELECT FROM pg_locks l
  WHERE l.locktype = 'advisory' AND l.pid = pg_backend_pid()
    AND l.objsubid = 17484 AND l.mode = 'ExclusiveLock'
    AND l.objid::bigint = get_byte(s.d, 0) + get_byte(s.d, 1) * 256 +
        get_byte(s.d, 2) * 65536 + get_byte(s.d, 3) * 16777216::bigint
    AND l.classid::bigint = get_byte(s.d, 4) + get_byte(s.d, 5) * 256 +
        get_byte(s.d, 6) * 65536 + get_byte(s.d, 7) * 16777216::bigint);
ROLLBACK;
