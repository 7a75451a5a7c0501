-- Counting semaphores (permits => N) and shared leases (mode => 'shared'),
-- in one session.  Output shows only stable values.

-- Up to N holders, each with its own owner and token.
CREATE TABLE grants (who text PRIMARY KEY, owner uuid, fence bigint);
INSERT INTO grants SELECT 'a', owner, fence FROM dlock.try_acquire('pool', '1 hour', permits => 3);
INSERT INTO grants SELECT 'b', owner, fence FROM dlock.try_acquire('pool', '1 hour', permits => 3);
INSERT INTO grants SELECT 'c', owner, fence FROM dlock.try_acquire('pool', '1 hour', permits => 3);
SELECT count(*) AS holders, count(DISTINCT owner) AS owners, count(DISTINCT fence) AS tokens FROM grants;
-- the fourth is refused at once, and acquire waits, then gives up
SELECT count(*) AS fourth FROM dlock.try_acquire('pool', '1 hour', permits => 3);
\set VERBOSITY terse
SELECT dlock.acquire('pool', '1 hour', wait => '50 ms', permits => 3);
\set VERBOSITY default
\echo :LAST_ERROR_SQLSTATE
-- the returned lease names the key, not the permit
SELECT DISTINCT l.key FROM grants g, dlock.lease_status l WHERE l.fence = g.fence;
SELECT key, permit, state, fence = (SELECT fence FROM grants WHERE who = 'b') AS is_b
FROM dlock.lease_status WHERE key = 'pool' ORDER BY permit;

-- Each permit's token fences writes; a token of the key never issued does not.
CREATE TABLE calls (who text, fence bigint);
INSERT INTO calls SELECT who, fence FROM grants WHERE dlock.fenced('pool', fence);
SELECT count(*) AS written FROM calls;
SELECT dlock.check_fence('pool', (SELECT max(fence) + 1000 FROM grants)) AS foreign_token;
SELECT dlock.check_fence('pool', 0) AS token_zero;

-- An exclusive lease excludes every permit, and permits exclude it.
SELECT count(*) AS exclusive FROM dlock.try_acquire('pool', '1 hour');

-- Renew and release a permit with its owner.
SELECT dlock.renew('pool', owner, '2 hours') > now() + interval '119 minutes' AS renewed
FROM grants WHERE who = 'b';
SELECT dlock.release('pool', owner) AS released FROM grants WHERE who = 'b';
SELECT dlock.release('pool', owner) AS released_twice FROM grants WHERE who = 'b';
SELECT dlock.renew('pool', gen_random_uuid(), '1 hour') IS NULL AS stranger_cannot_renew;
SELECT dlock.check_fence('pool', fence) AS released_token_ok FROM grants WHERE who = 'b';
-- its permit is free again: the next grant takes it, with a new token
INSERT INTO grants SELECT 'd', owner, fence FROM dlock.try_acquire('pool', '1 hour', permits => 3);
SELECT (SELECT fence FROM grants WHERE who = 'd') > (SELECT max(fence) FROM grants WHERE who <> 'd') AS newer_token;
SELECT permit FROM dlock.lease_status l JOIN grants g ON g.fence = l.fence WHERE g.who = 'd';
SELECT dlock.check_fence('pool', fence) AS old_token_ok FROM grants WHERE who = 'b';
\set VERBOSITY terse
BEGIN;
SELECT dlock.use_fence('pool', fence) FROM grants WHERE who = 'b';
ROLLBACK;
\set VERBOSITY default

-- Changing N: a grant asks for one of the first N permits.  Fewer than the
-- holders: refused until enough of them leave; none is taken away.
SELECT count(*) AS with_two FROM dlock.try_acquire('pool', '1 hour', permits => 2);
SELECT count(*) AS with_four FROM dlock.try_acquire('pool', '1 hour', permits => 4);
SELECT count(*) AS holders FROM dlock.lease_status WHERE key = 'pool' AND state = 'held';
SELECT dlock.release('pool', owner) FROM grants WHERE who = 'a';
SELECT count(*) AS with_two_after_a FROM dlock.try_acquire('pool', '1 hour', permits => 2);
SELECT count(*) AS with_two_again FROM dlock.try_acquire('pool', '1 hour', permits => 2);

-- Shared leases coexist; an exclusive lease waits for all of them.
INSERT INTO grants SELECT 's1', owner, fence FROM dlock.try_acquire('doc', '1 hour', mode => 'shared');
INSERT INTO grants SELECT 's2', owner, fence FROM dlock.try_acquire('doc', '1 hour', mode => 'shared');
SELECT count(*) AS shared_holders FROM dlock.lease_status WHERE key = 'doc' AND state = 'held';
SELECT count(*) AS exclusive FROM dlock.try_acquire('doc', '1 hour');
SELECT bool_and(dlock.check_fence('doc', fence)) AS both_write FROM grants WHERE who LIKE 's%';
SELECT dlock.release('doc', owner) FROM grants WHERE who LIKE 's%' ORDER BY who;
INSERT INTO grants SELECT 'x', owner, fence FROM dlock.try_acquire('doc', '1 hour');
SELECT count(*) AS exclusive_granted FROM grants WHERE who = 'x';
SELECT count(*) AS shared_refused FROM dlock.try_acquire('doc', '1 hour', mode => 'shared');
SELECT count(*) AS permit_refused FROM dlock.try_acquire('doc', '1 hour', permits => 5);
SELECT who, dlock.check_fence('doc', fence) AS accepted FROM grants WHERE who IN ('s1', 's2', 'x') ORDER BY who;
SELECT dlock.release('doc', owner) FROM grants WHERE who = 'x';
SELECT count(*) AS shared_again FROM dlock.try_acquire('doc', '1 hour', mode => 'shared');

-- A plain key used as one before: its exclusive history stays its own.
SELECT count(*) FROM dlock.try_acquire('mixed', '1 hour');
SELECT dlock.release('mixed', owner) FROM dlock.leases WHERE key = 'mixed';
SELECT count(*) AS first_permit FROM dlock.try_acquire('mixed', '1 hour', permits => 2);
SELECT key, permit, state FROM dlock.lease_status WHERE key = 'mixed' ORDER BY permit NULLS FIRST;

-- The monotonic mode of the fencing trigger accepts a permit's token once
-- its lease ended (as for any lease), but not once the key's exclusive
-- lease was granted after it.
CREATE TABLE mono (id int PRIMARY KEY, tok bigint);
CREATE TRIGGER mono_fence BEFORE INSERT OR UPDATE OR DELETE ON mono
  FOR EACH ROW EXECUTE FUNCTION dlock.fence_guard('mk', 'tok', 'monotonic');
SELECT owner AS m_owner, fence AS m_fence FROM dlock.try_acquire('mk', '1 hour', permits => 2) \gset
SELECT dlock.release('mk', :'m_owner');
INSERT INTO mono VALUES (1, :m_fence);
SELECT fence AS x_fence FROM dlock.try_acquire('mk', '1 hour') \gset
\set VERBOSITY terse
INSERT INTO mono VALUES (2, :m_fence);
\set VERBOSITY default
\echo :LAST_ERROR_SQLSTATE
INSERT INTO mono VALUES (3, :x_fence);
SELECT id, tok = :x_fence AS under_exclusive FROM mono ORDER BY id;
DROP TABLE mono;
SELECT dlock.forget('mk');

-- Bad arguments.
SELECT dlock.try_acquire('e', '1 hour', permits => 0);
\echo :LAST_ERROR_SQLSTATE
SELECT dlock.try_acquire('e', '1 hour', permits => 1001);
\echo :LAST_ERROR_SQLSTATE
SELECT dlock.try_acquire('e', '1 hour', permits => NULL);
\echo :LAST_ERROR_SQLSTATE
SELECT dlock.try_acquire('e', '1 hour', mode => NULL);
\echo :LAST_ERROR_SQLSTATE
SELECT dlock.try_acquire('e', '1 hour', mode => 'Shared');
\echo :LAST_ERROR_SQLSTATE
SELECT dlock.acquire('e', '1 hour', mode => 'shared', permits => 3);
\echo :LAST_ERROR_SQLSTATE
SELECT dlock.try_acquire(E'e\x1f1', '1 hour');
\echo :LAST_ERROR_SQLSTATE
SELECT dlock.use_fence(E'pool\x1f1', 1);
\echo :LAST_ERROR_SQLSTATE
SELECT count(*) AS nothing_for_e FROM dlock.leases WHERE split_part(key, E'\x1f', 1) = 'e';

-- forget() drops a key with its permits.
SELECT dlock.forget('pool') AS forgot, dlock.forget('doc'), dlock.forget('mixed');
SELECT count(*) AS rows_left FROM dlock.leases WHERE split_part(key, E'\x1f', 1) IN ('pool', 'doc', 'mixed');
DROP TABLE grants, calls;
