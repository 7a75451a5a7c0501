-- Leader election (campaign, proclaim, leader, resign by release) and
-- observe(), in one session.  Output shows only stable values.

-- Nobody leads an election nobody campaigned for.
SELECT count(*) AS leaders FROM dlock.leader('db-primary');

-- A campaign returns a lease: its token is the epoch.
SELECT * FROM dlock.campaign('db-primary', 'node-a:5432', '1 hour') \gset e1_
SELECT :e1_fence > 0 AS has_epoch, :'e1_key' AS key;
SELECT value, fence = :e1_fence AS same_epoch, since <= now() AS since_ok,
       expires_at > now() + interval '59 minutes' AS expires_ok
FROM dlock.leader('db-primary');
-- the value is in dlock.leases for everyone to read, the holder label too
SELECT key, value, holder IS NOT DISTINCT FROM current_setting('application_name') AS holder_default
FROM dlock.leases WHERE key = 'db-primary';

-- A second campaign does not win while the leader's lease lives.
\set VERBOSITY terse
SELECT dlock.campaign('db-primary', 'node-b:5432', '1 hour', wait => '0');
\set VERBOSITY default
\echo :LAST_ERROR_SQLSTATE
SELECT count(*) AS granted FROM dlock.try_acquire('db-primary', '1 hour');

-- Proclaim: only the owner of the live lease; epoch and expiry unchanged.
SELECT expires_at AS e1_expires FROM dlock.leader('db-primary') \gset
SELECT dlock.proclaim('db-primary', gen_random_uuid(), 'intruder') AS stranger_proclaims;
SELECT dlock.proclaim('db-primary', :'e1_owner', 'node-a:6543') AS leader_proclaims;
SELECT value, fence = :e1_fence AS same_epoch, expires_at = :'e1_expires' AS same_expiry
FROM dlock.leader('db-primary');

-- observe: the current lease at once when after_fence is older ...
SELECT fence = :e1_fence AS same_epoch, value, state, holder IS NOT NULL AS has_holder,
       since = (SELECT since FROM dlock.leader('db-primary')) AS since_is_the_grant
FROM dlock.observe('db-primary', 0, '10 seconds');
-- ... nothing new when it is the current one: no row once wait runs out
SELECT count(*) AS changes FROM dlock.observe('db-primary', :e1_fence, '50 ms');
-- ... a value the caller did not know is a change
SELECT value, state FROM dlock.observe('db-primary', :e1_fence, '10 seconds', 'node-a:5432');
SELECT count(*) AS changes FROM dlock.observe('db-primary', :e1_fence, '50 ms', 'node-a:6543');
-- a wait of 0 only looks
SELECT count(*) AS changes FROM dlock.observe('db-primary', :e1_fence, '0');

-- The epoch fences writes like any token.
CREATE TABLE leader_log (epoch bigint, what text);
INSERT INTO leader_log SELECT :e1_fence, 'as leader' WHERE dlock.fenced('db-primary', :e1_fence);
SELECT count(*) AS written FROM leader_log;

-- Resign: release.  Nobody leads; observe reports the end.
SELECT dlock.release('db-primary', :'e1_owner') AS resigned;
SELECT count(*) AS leaders FROM dlock.leader('db-primary');
SELECT dlock.proclaim('db-primary', :'e1_owner', 'too late') AS proclaimed_after_resign;
SELECT fence = :e1_fence AS same_epoch, value, state FROM dlock.observe('db-primary', :e1_fence, '10 seconds');
-- once the end is known, nothing new until the next campaign
SELECT count(*) AS changes FROM dlock.observe('db-primary', :e1_fence, '50 ms', NULL, true);
\set VERBOSITY terse
INSERT INTO leader_log SELECT :e1_fence, 'deposed' WHERE dlock.fenced('db-primary', :e1_fence);
\set VERBOSITY default
\echo :LAST_ERROR_SQLSTATE
SELECT count(*) AS written FROM leader_log;

-- The next leader has a higher epoch; observe reports it.
SELECT * FROM dlock.campaign('db-primary', 'node-b:5432', '1 hour', holder => 'node-b') \gset e2_
SELECT :e2_fence > :e1_fence AS epoch_grew;
SELECT fence = :e2_fence AS new_epoch, holder, value, state
FROM dlock.observe('db-primary', :e1_fence, '10 seconds', NULL, true);

-- An ordinary lease leads too, without a value; proclaim gives it one.
SELECT * FROM dlock.try_acquire('plain', '1 hour') \gset p_
SELECT value IS NULL AS no_value, fence = :p_fence AS same FROM dlock.leader('plain');
SELECT dlock.proclaim('plain', :'p_owner', 'v') AS proclaimed;
SELECT value FROM dlock.leader('plain');
-- a grant after it starts without a value
SELECT dlock.release('plain', :'p_owner');
SELECT count(*) FROM dlock.try_acquire('plain', '1 hour');
SELECT value IS NULL AS no_value FROM dlock.leader('plain');

-- A key without a lease: 'none' at once, until the caller says it knows.
SELECT fence, holder, value, state, expires_at, since FROM dlock.observe('never', 0, '10 seconds');
SELECT fence, holder, value, state, expires_at FROM dlock.observe('never', 5, '10 seconds');
SELECT count(*) AS changes FROM dlock.observe('never', 0, '50 ms', NULL, true);
SELECT count(*) AS changes FROM dlock.observe('never', 5, '50 ms', NULL, true);

-- Bad input: clear errors with SQLSTATEs, nothing changed.
SELECT dlock.campaign(NULL, 'v', '1 hour');
\echo :LAST_ERROR_SQLSTATE
SELECT dlock.campaign('x', NULL, '1 hour');
\echo :LAST_ERROR_SQLSTATE
SELECT dlock.campaign('x', repeat('v', 1025), '1 hour');
\echo :LAST_ERROR_SQLSTATE
SELECT dlock.campaign('x', 'v', '-1 hour');
\echo :LAST_ERROR_SQLSTATE
SELECT dlock.campaign('x', 'v', '1 hour', wait => '-1 s');
\echo :LAST_ERROR_SQLSTATE
SELECT dlock.campaign('', 'v', '1 hour');
\echo :LAST_ERROR_SQLSTATE
SELECT dlock.proclaim('db-primary', :'e2_owner', NULL);
\echo :LAST_ERROR_SQLSTATE
SELECT dlock.proclaim('db-primary', NULL, 'v');
\echo :LAST_ERROR_SQLSTATE
SELECT dlock.proclaim('db-primary', :'e2_owner', repeat('v', 1025));
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM dlock.leader(NULL);
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM dlock.observe(NULL, 0, '1 s');
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM dlock.observe('x', NULL, '1 s');
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM dlock.observe('x', -1, '1 s');
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM dlock.observe('x', 0, '-1 s');
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM dlock.observe('x', 0, '1 s', 'v', NULL);
\echo :LAST_ERROR_SQLSTATE
SELECT value FROM dlock.leader('db-primary');
SELECT count(*) AS no_lease_for_x FROM dlock.leases WHERE key = 'x';

-- dlock.notify is for superusers to set.
CREATE ROLE election_user;
SET ROLE election_user;
SET dlock.notify = on;
\echo :LAST_ERROR_SQLSTATE
RESET ROLE;
DROP ROLE election_user;

DROP TABLE leader_log;
SELECT dlock.forget(k) FROM (VALUES ('db-primary'), ('plain')) AS v(k);
