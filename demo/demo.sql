-- demo/demo.sql: what dlock is for, told as a short story.
--
-- Run it with tools/demo, which starts a throwaway server, runs
-- CREATE EXTENSION dlock and then this file with psql.  To run it against
-- a server of your own:  psql -X -q -v ON_ERROR_STOP=1 -f demo/demo.sql
-- in a database where CREATE EXTENSION dlock has been run.
--
-- Numbers that change from run to run (owner uuids, timestamps) are shown
-- as comparisons or booleans instead.

\set ON_ERROR_STOP 1
\pset footer off
\pset null '(null)'
\set job 'stock-sync:warehouse-42'

\echo
\echo '================================================================'
\echo ' dlock demo: leases and fencing tokens'
\echo '================================================================'
\echo
\echo 'Two workers, A and B, both run the job that syncs the stock of'
\echo 'warehouse 42.  If both ran it at once they would overwrite each'
\echo 'other, so each must first get the lease on the key'
\echo '    stock-sync:warehouse-42'
\echo 'A lease is a lock with a time limit (a TTL): if its holder stops'
\echo 'renewing it, it runs out and someone else can take over.'
\echo

\echo '--- 0. The data: warehouse stock, protected by a fencing trigger'
\echo
\echo 'The stock table carries, in its column "fence", the token of the'
\echo 'grant under which each row was written.  The trigger lets a row of'
\echo 'warehouse N be written only under the current, unexpired lease of'
\echo 'the key stock-sync:warehouse-N.'
\echo
CREATE TABLE stock (warehouse_id int NOT NULL, sku text NOT NULL,
                    qty int NOT NULL, fence bigint);
CREATE TRIGGER stock_fence
  BEFORE INSERT OR UPDATE OR DELETE ON stock
  FOR EACH ROW EXECUTE FUNCTION
    dlock.fence_guard('stock-sync:warehouse-{warehouse_id}', 'fence');
\echo 'CREATE TRIGGER stock_fence BEFORE INSERT OR UPDATE OR DELETE ON stock'
\echo '  FOR EACH ROW EXECUTE FUNCTION'
\echo '    dlock.fence_guard(''stock-sync:warehouse-{warehouse_id}'', ''fence'');'
\echo

\echo '--- 1. Worker A asks for the lease, for 2 seconds --------------'
\echo
\echo 'dlock.try_acquire returns the lease: an owner (a random uuid that'
\echo 'only A knows, needed to renew or release) and a fencing token, a'
\echo 'number that is larger for every new grant.'
\echo
SELECT owner AS a_owner, fence AS a_fence
FROM dlock.try_acquire(:'job', '2 seconds', holder => 'worker A') \gset
SELECT :'a_owner' <> '' AS "A got the lease",
       :a_fence AS "A's fencing token";

\echo 'A starts the sync: it writes the stock of warehouse 42, presenting'
\echo 'its token in the fence column.  The trigger checks it: accepted.'
\echo
INSERT INTO stock VALUES (42, 'apple', 10, :a_fence);
SELECT sku, qty, fence AS "written under token" FROM stock;

\echo '--- 2. Worker B asks for the same lease ------------------------'
\echo
\echo 'A holds it, so B is refused: try_acquire returns no row at once.'
\echo '(dlock.acquire would wait for it instead.)'
\echo
SELECT count(*) = 0 AS "B was refused"
FROM dlock.try_acquire(:'job', '2 seconds', holder => 'worker B');

\echo 'Anyone can see who holds which key (but not the owner uuid):'
\echo
SELECT key, holder, fence, expires_at > now() AS unexpired
FROM dlock.leases WHERE key = :'job';

\echo '--- 3. Worker A renews, as a healthy holder does ---------------'
\echo
SELECT dlock.renew(:'job', :'a_owner', '2 seconds') IS NOT NULL
       AS "A renewed its lease";

\echo '--- 4. Worker A stalls -----------------------------------------'
\echo
\echo 'A long garbage-collection pause, a frozen VM, a slow disk: A stops'
\echo 'for 3 seconds without renewing, and its lease runs out...'
SELECT pg_sleep(3) \g /dev/null
\echo
SELECT key, holder, expires_at > now() AS unexpired
FROM dlock.leases WHERE key = :'job';

\echo '--- 5. Worker B tries again and gets the lease -----------------'
\echo
SELECT owner AS b_owner, fence AS b_fence
FROM dlock.try_acquire(:'job', '30 seconds', holder => 'worker B') \gset
SELECT :'b_owner' <> '' AS "B got the lease",
       :b_fence AS "B's fencing token",
       :b_fence > :a_fence AS "greater than A's";

\echo 'B does the sync and writes the stock, with its token:'
\echo
UPDATE stock SET qty = 100, fence = :b_fence WHERE warehouse_id = 42 AND sku = 'apple';
SELECT sku, qty, fence AS "written under token" FROM stock;

\echo '--- 6. Worker A wakes up, still believing it holds the lease ---'
\echo
\echo 'A carries on where it stopped and writes its (now outdated) stock'
\echo 'figure with its old token.  The database refuses it, in the same'
\echo 'transaction as the write, with SQLSTATE LF001:'
\echo
\set ON_ERROR_STOP 0
UPDATE stock SET qty = 10, fence = :a_fence WHERE warehouse_id = 42 AND sku = 'apple';
\set ON_ERROR_STOP 1
\echo
\echo 'Forgetting the token does not help A either: a write that does not'
\echo 'present a token is refused too.'
\echo
\set ON_ERROR_STOP 0
UPDATE stock SET qty = 10 WHERE warehouse_id = 42 AND sku = 'apple';
\set ON_ERROR_STOP 1
\echo
\echo 'A tries to renew: NULL means "you no longer hold this lease".'
\echo
SELECT dlock.renew(:'job', :'a_owner', '2 seconds') IS NULL
       AS "A's renew returned NULL";
\echo 'A tries to release: false, because the lease is not A''s any more.'
\echo 'A stale owner cannot free a lease that now belongs to someone else.'
\echo
SELECT dlock.release(:'job', :'a_owner') AS "A's release succeeded";

\echo '--- 7. B''s lease and B''s data were not touched by any of that ---'
\echo
SELECT sku, qty, fence = :b_fence AS "still B's write" FROM stock;
SELECT holder, fence = :b_fence AS "still B's token", expires_at > now() AS unexpired
FROM dlock.leases WHERE key = :'job';
SELECT dlock.renew(:'job', :'b_owner', '2 seconds') IS NOT NULL
       AS "B renewed its lease";
SELECT dlock.release(:'job', :'b_owner') AS "B released its lease";

\echo '--- What just happened ------------------------------------------'
\echo
\echo 'The lease gave liveness: when A stalled, B could take over after 2'
\echo 'seconds instead of waiting forever.  The fencing token gave safety:'
\echo 'A''s late write carried token' :a_fence 'while the key''s current token was' :b_fence
\echo 'so the database refused it.  Because dlock lives in the database'
\echo 'that holds the stock, the check and the write are one transaction:'
\echo 'a grant of the key waits for any write under the old lease to'
\echo 'finish, so there is no window in between.'
\echo
\echo 'A lock is still not idempotency: a message delivered twice, or a'
\echo 'client retrying after a timeout, must be handled by unique'
\echo 'constraints and idempotency keys on the data itself.'
\echo
