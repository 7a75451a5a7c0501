-- The fencing trigger, use_fence and check_fence.
-- Tokens appear in refusal details; start the sequence at a known point so
-- the numbers do not depend on the tests before this one.
SELECT setval('dlock.fence_seq', 1000) > 0 AS sequence_moved_forward;

CREATE TABLE stock (
  warehouse_id int,
  sku text,
  qty int NOT NULL,
  fence bigint
);
CREATE TRIGGER stock_fence
  BEFORE INSERT OR UPDATE OR DELETE ON stock
  FOR EACH ROW EXECUTE FUNCTION dlock.fence_guard('stock-sync:warehouse-{warehouse_id}', 'fence');

-- Worker A holds warehouse 42.
SELECT * FROM dlock.try_acquire('stock-sync:warehouse-42', '1 hour', 'worker-a') \gset a_
SELECT :a_fence AS a_fence;

-- No token at all: refused with SQLSTATE LF001, nothing written.
INSERT INTO stock VALUES (42, 'apple', 10);
\echo :LAST_ERROR_SQLSTATE

-- use_fence presents the token for the transaction; the row is stamped with it.
BEGIN;
SELECT dlock.use_fence('stock-sync:warehouse-42', :a_fence);
INSERT INTO stock VALUES (42, 'apple', 10), (42, 'pear', 5);
COMMIT;
SELECT sku, qty, fence = :a_fence AS stamped_with_a FROM stock ORDER BY sku;

-- The token is forgotten at commit: the next transaction must present it again.
UPDATE stock SET qty = qty + 1 WHERE sku = 'apple';
\echo :LAST_ERROR_SQLSTATE

-- One statement in autocommit: use_fence joined into the write runs before
-- the row reaches the trigger.  A stale token in that form is refused.
UPDATE stock SET qty = qty + 1
FROM (SELECT dlock.use_fence('stock-sync:warehouse-42', :a_fence)) AS f
WHERE sku = 'apple';
SELECT qty FROM stock WHERE sku = 'apple';
UPDATE stock SET qty = qty - 1
FROM (SELECT dlock.use_fence('stock-sync:warehouse-42', :a_fence - 1)) AS f
WHERE sku = 'apple';
\echo :LAST_ERROR_SQLSTATE
UPDATE stock SET qty = qty - 1
FROM (SELECT dlock.use_fence('stock-sync:warehouse-42', :a_fence)) AS f
WHERE sku = 'apple';
SELECT qty FROM stock WHERE sku = 'apple';

-- dlock.fenced: use_fence returning true, in the write's WHERE clause.
UPDATE stock SET qty = qty + 1
WHERE sku = 'apple' AND dlock.fenced('stock-sync:warehouse-42', :a_fence);
SELECT qty, fence = :a_fence AS stamped_with_a FROM stock WHERE sku = 'apple';
UPDATE stock SET qty = qty - 1
WHERE sku = 'apple' AND dlock.fenced('stock-sync:warehouse-42', :a_fence - 1);
\echo :LAST_ERROR_SQLSTATE
-- Called for each row that passes the other conditions (here two rows,
-- the second from what the first call verified), for none when no row
-- does: then nothing is written and nothing is checked.
UPDATE stock SET qty = qty + 1
WHERE warehouse_id = 42 AND sku IN ('apple', 'pear')
  AND dlock.fenced('stock-sync:warehouse-42', :a_fence);
SELECT sku, qty FROM stock WHERE sku IN ('apple', 'pear') ORDER BY sku;
UPDATE stock SET qty = 0
WHERE sku = 'no such sku' AND dlock.fenced('stock-sync:warehouse-42', :a_fence - 1);
-- Its cost puts it after the row's own conditions, wherever it is written.
EXPLAIN (COSTS OFF) UPDATE stock SET qty = 0
WHERE dlock.fenced('stock-sync:warehouse-42', :a_fence) AND sku = 'apple';
-- A second call with another token is checked again: refused.
BEGIN;
UPDATE stock SET qty = qty - 1
WHERE sku = 'apple' AND dlock.fenced('stock-sync:warehouse-42', :a_fence);
UPDATE stock SET qty = qty - 1
WHERE sku = 'apple' AND dlock.fenced('stock-sync:warehouse-42', :a_fence + 1);
\echo :LAST_ERROR_SQLSTATE
ROLLBACK;
SELECT dlock.fenced('stock-sync:warehouse-42', NULL);
\echo :LAST_ERROR_SQLSTATE
SELECT dlock.fenced(NULL, :a_fence);
\echo :LAST_ERROR_SQLSTATE
-- (back to the quantities the next part expects)
UPDATE stock SET qty = CASE sku WHEN 'apple' THEN 10 ELSE 5 END
WHERE sku IN ('apple', 'pear') AND dlock.fenced('stock-sync:warehouse-42', :a_fence);

-- An INSERT that supplies the token column presents it.
INSERT INTO stock VALUES (42, 'plum', 7, :a_fence);
-- An UPDATE presents it only when its SET list assigns the column a token
-- the row does not carry already: a value carried over from the row ...
UPDATE stock SET qty = qty + 1 WHERE sku = 'apple';
\echo :LAST_ERROR_SQLSTATE
-- ... or written back (anyone who reads the row knows its token) is not
-- presented: a stale holder saving the whole row back is refused.
UPDATE stock SET qty = qty + 1, fence = fence WHERE sku = 'apple';
\echo :LAST_ERROR_SQLSTATE
UPDATE stock SET qty = qty + 1, fence = :a_fence WHERE sku = 'apple';
\echo :LAST_ERROR_SQLSTATE
-- use_fence presents it for such rows.
BEGIN;
SELECT dlock.use_fence('stock-sync:warehouse-42', :a_fence);
UPDATE stock SET qty = qty + 1 WHERE sku = 'apple';
COMMIT;
-- DELETE presents its token only with use_fence.
DELETE FROM stock WHERE sku = 'plum';
\echo :LAST_ERROR_SQLSTATE
BEGIN;
SELECT dlock.use_fence('stock-sync:warehouse-42', :a_fence);
DELETE FROM stock WHERE sku = 'plum';
COMMIT;
SELECT sku, qty FROM stock ORDER BY sku;

-- check_fence answers without writing.
SELECT dlock.check_fence('stock-sync:warehouse-42', :a_fence) AS a_valid,
       dlock.check_fence('stock-sync:warehouse-42', :a_fence - 1) AS lower_valid,
       dlock.check_fence('stock-sync:warehouse-42', :a_fence + 1) AS higher_valid,
       dlock.check_fence('stock-sync:warehouse-7', :a_fence) AS other_key_valid;

-- A's lease expires while A is paused; B takes over with a larger token.
SELECT dlock.renew('stock-sync:warehouse-42', :'a_owner', '100 milliseconds') IS NOT NULL AS shortened;
SELECT pg_sleep(0.2);
-- expired, not yet taken: refused
SELECT dlock.check_fence('stock-sync:warehouse-42', :a_fence) AS a_valid_after_expiry;
SELECT dlock.use_fence('stock-sync:warehouse-42', :a_fence);
\echo :LAST_ERROR_SQLSTATE
INSERT INTO stock VALUES (42, 'quince', 1, :a_fence);
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM dlock.try_acquire('stock-sync:warehouse-42', '1 hour', 'worker-b') \gset b_
SELECT :b_fence - :a_fence AS b_minus_a;
-- B writes with its token in the column: a token the row does not carry.
UPDATE stock SET qty = 100, fence = :b_fence WHERE sku = 'apple';

-- A wakes up and writes with its old token: refused, B's data stands.
UPDATE stock SET qty = 0, fence = :a_fence WHERE sku = 'apple';
\echo :LAST_ERROR_SQLSTATE
SELECT dlock.use_fence('stock-sync:warehouse-42', :a_fence);
\echo :LAST_ERROR_SQLSTATE
SELECT sku, qty, fence = :b_fence AS written_by_b FROM stock ORDER BY sku;

-- MERGE: an action that does not assign the token column presents nothing,
-- even when another action of the same MERGE assigns it.
MERGE INTO stock s USING (VALUES ('apple')) v(sku) ON s.sku = v.sku
WHEN MATCHED AND s.qty < 0 THEN UPDATE SET fence = -1
WHEN MATCHED THEN UPDATE SET qty = 777;
\echo :LAST_ERROR_SQLSTATE

-- A statement that is refused on any row changes nothing.
SELECT * FROM dlock.try_acquire('stock-sync:warehouse-7', '1 hour') \gset c_
BEGIN;
SELECT dlock.use_fence('stock-sync:warehouse-7', :c_fence);
INSERT INTO stock VALUES (7, 'fig', 3);
COMMIT;
BEGIN;
SELECT dlock.use_fence('stock-sync:warehouse-7', :c_fence);
UPDATE stock SET qty = qty + 1000;   -- warehouse 42 rows have no token
\echo :LAST_ERROR_SQLSTATE
ROLLBACK;
SELECT sku, qty FROM stock ORDER BY sku;

-- Moving a row to another key needs the lease of both keys.
BEGIN;
SELECT dlock.use_fence('stock-sync:warehouse-7', :c_fence);
UPDATE stock SET warehouse_id = 42 WHERE sku = 'fig';
\echo :LAST_ERROR_SQLSTATE
ROLLBACK;
BEGIN;
SELECT dlock.use_fence('stock-sync:warehouse-7', :c_fence);
SELECT dlock.use_fence('stock-sync:warehouse-42', :b_fence);
UPDATE stock SET warehouse_id = 42 WHERE sku = 'fig';
COMMIT;
SELECT sku, warehouse_id, fence = :b_fence AS stamped_with_new_key_token FROM stock WHERE sku = 'fig';

-- Released and never-granted keys, and a token of another key.
SELECT dlock.release('stock-sync:warehouse-7', :'c_owner') AS released;
SELECT dlock.use_fence('stock-sync:warehouse-7', :c_fence);
\echo :LAST_ERROR_SQLSTATE
SELECT dlock.use_fence('stock-sync:warehouse-99', :c_fence);
\echo :LAST_ERROR_SQLSTATE
SELECT dlock.use_fence('stock-sync:warehouse-42', :c_fence);
\echo :LAST_ERROR_SQLSTATE

-- Bad arguments of use_fence and check_fence.
SELECT dlock.use_fence(NULL, 1);
\echo :LAST_ERROR_SQLSTATE
SELECT dlock.use_fence('k', NULL);
\echo :LAST_ERROR_SQLSTATE
SELECT dlock.check_fence('', 1);
\echo :LAST_ERROR_SQLSTATE
SELECT dlock.check_fence(NULL, 1);
\echo :LAST_ERROR_SQLSTATE

-- Templates with several placeholders; NULL key columns.
CREATE TABLE inventory (warehouse_id int, sku text, qty int);
CREATE TRIGGER inventory_fence
  BEFORE INSERT OR UPDATE OR DELETE ON inventory
  FOR EACH ROW EXECUTE FUNCTION dlock.fence_guard('inv:{warehouse_id}/{sku}');
SELECT * FROM dlock.try_acquire('inv:5/bolt', '1 hour') \gset i_
BEGIN;
SELECT dlock.use_fence('inv:5/bolt', :i_fence);
INSERT INTO inventory VALUES (5, 'bolt', 1);
INSERT INTO inventory VALUES (5, 'nut', 1);
\echo :LAST_ERROR_SQLSTATE
ROLLBACK;
-- A NULL in a key column leaves the row without a key: the write is refused.
BEGIN;
SELECT dlock.use_fence('inv:5/bolt', :i_fence);
INSERT INTO inventory VALUES (5, NULL, 1);
\echo :LAST_ERROR_SQLSTATE
ROLLBACK;

-- A template without placeholders protects the whole table with one key.
CREATE TABLE ledger (id int, amount int);
CREATE TRIGGER ledger_fence BEFORE INSERT OR UPDATE OR DELETE ON ledger
  FOR EACH ROW EXECUTE FUNCTION dlock.fence_guard('ledger');
SELECT * FROM dlock.try_acquire('ledger', '1 hour') \gset l_
BEGIN;
SELECT dlock.use_fence('ledger', :l_fence);
INSERT INTO ledger VALUES (1, 10), (2, 20);
COMMIT;
INSERT INTO ledger VALUES (3, 30);
\echo :LAST_ERROR_SQLSTATE
SELECT count(*) AS ledger_rows FROM ledger;

-- Monotonic mode: the highest token ever issued for the key is accepted even
-- after its lease expired; anything lower is refused, and so is a write whose
-- token is lower than the one stamped on the row.
CREATE TABLE docs (id int, body text, fence bigint);
CREATE TRIGGER docs_fence BEFORE INSERT OR UPDATE OR DELETE ON docs
  FOR EACH ROW EXECUTE FUNCTION dlock.fence_guard('doc:1', 'fence', 'monotonic');
SELECT * FROM dlock.try_acquire('doc:1', '100 milliseconds') \gset m_
INSERT INTO docs VALUES (1, 'first', :m_fence);
SELECT pg_sleep(0.2);
INSERT INTO docs VALUES (2, 'late but still newest', :m_fence);
SELECT * FROM dlock.try_acquire('doc:1', '1 hour') \gset n_
UPDATE docs SET body = 'by the new holder', fence = :n_fence WHERE id = 1;
UPDATE docs SET body = 'stale', fence = :m_fence WHERE id = 1;
\echo :LAST_ERROR_SQLSTATE
SELECT id, body, fence = :n_fence AS newest FROM docs ORDER BY id;
-- the row's stamp is checked too: a write to a row stamped by a newer grant
-- of this key is refused (here the row was stamped by hand by an admin).
SET dlock.fence_bypass = on;
UPDATE docs SET fence = :n_fence + 1000 WHERE id = 1;
RESET dlock.fence_bypass;
BEGIN;
SELECT dlock.use_fence('doc:1', :n_fence);
UPDATE docs SET body = 'older than the row' WHERE id = 1;
\echo :LAST_ERROR_SQLSTATE
ROLLBACK;
\echo :LAST_ERROR_SQLSTATE

-- Misuse of the trigger: SQLSTATE 39P01 and what is wrong.
CREATE TABLE misuse (id int, tok int, fence bigint);
INSERT INTO misuse VALUES (1, 1, 1);
CREATE TRIGGER m AFTER INSERT ON misuse
  FOR EACH ROW EXECUTE FUNCTION dlock.fence_guard('m');
INSERT INTO misuse VALUES (2, 1, 1);
\echo :LAST_ERROR_SQLSTATE
DROP TRIGGER m ON misuse;
CREATE TRIGGER m BEFORE INSERT ON misuse
  FOR EACH STATEMENT EXECUTE FUNCTION dlock.fence_guard('m');
INSERT INTO misuse VALUES (2, 1, 1);
\echo :LAST_ERROR_SQLSTATE
DROP TRIGGER m ON misuse;
CREATE TRIGGER m BEFORE TRUNCATE ON misuse
  FOR EACH STATEMENT EXECUTE FUNCTION dlock.fence_guard('m');
TRUNCATE misuse;
\echo :LAST_ERROR_SQLSTATE
DROP TRIGGER m ON misuse;
CREATE TRIGGER m BEFORE INSERT ON misuse
  FOR EACH ROW EXECUTE FUNCTION dlock.fence_guard('m-{nosuch}');
INSERT INTO misuse VALUES (2, 1, 1);
\echo :LAST_ERROR_SQLSTATE
DROP TRIGGER m ON misuse;
CREATE TRIGGER m BEFORE INSERT ON misuse
  FOR EACH ROW EXECUTE FUNCTION dlock.fence_guard('m-{id');
INSERT INTO misuse VALUES (2, 1, 1);
\echo :LAST_ERROR_SQLSTATE
DROP TRIGGER m ON misuse;
CREATE TRIGGER m BEFORE INSERT ON misuse
  FOR EACH ROW EXECUTE FUNCTION dlock.fence_guard('m-{id}', 'nosuch');
INSERT INTO misuse VALUES (2, 1, 1);
\echo :LAST_ERROR_SQLSTATE
DROP TRIGGER m ON misuse;
CREATE TRIGGER m BEFORE INSERT ON misuse
  FOR EACH ROW EXECUTE FUNCTION dlock.fence_guard('m-{id}', 'tok');
INSERT INTO misuse VALUES (2, 1, 1);
\echo :LAST_ERROR_SQLSTATE
DROP TRIGGER m ON misuse;
CREATE TRIGGER m BEFORE INSERT ON misuse
  FOR EACH ROW EXECUTE FUNCTION dlock.fence_guard();
INSERT INTO misuse VALUES (2, 1, 1);
\echo :LAST_ERROR_SQLSTATE
DROP TRIGGER m ON misuse;
CREATE TRIGGER m BEFORE INSERT ON misuse
  FOR EACH ROW EXECUTE FUNCTION dlock.fence_guard('m', 'fence', 'monotonic', 'extra');
INSERT INTO misuse VALUES (2, 1, 1);
\echo :LAST_ERROR_SQLSTATE
DROP TRIGGER m ON misuse;
CREATE TRIGGER m BEFORE INSERT ON misuse
  FOR EACH ROW EXECUTE FUNCTION dlock.fence_guard('m', 'fence', 'strict');
INSERT INTO misuse VALUES (2, 1, 1);
\echo :LAST_ERROR_SQLSTATE
DROP TRIGGER m ON misuse;
CREATE TRIGGER m BEFORE INSERT ON misuse
  FOR EACH ROW EXECUTE FUNCTION dlock.fence_guard('');
INSERT INTO misuse VALUES (2, 1, 1);
\echo :LAST_ERROR_SQLSTATE
DROP TRIGGER m ON misuse;
SELECT dlock.fence_guard();
\echo :LAST_ERROR_SQLSTATE
CREATE TABLE gen (region int, rkey text GENERATED ALWAYS AS ('reg-' || region) STORED,
                  fence bigint, gtok bigint GENERATED ALWAYS AS (fence + 0) STORED);
CREATE TRIGGER m BEFORE INSERT ON gen
  FOR EACH ROW EXECUTE FUNCTION dlock.fence_guard('{rkey}', 'fence');
INSERT INTO gen (region, fence) VALUES (1, 1);
\echo :LAST_ERROR_SQLSTATE
DROP TRIGGER m ON gen;
CREATE TRIGGER m BEFORE INSERT ON gen
  FOR EACH ROW EXECUTE FUNCTION dlock.fence_guard('reg-{region}', 'gtok');
INSERT INTO gen (region, fence) VALUES (1, 1);
\echo :LAST_ERROR_SQLSTATE
DROP TABLE gen;
SELECT count(*) AS misuse_rows FROM misuse;

-- Within one transaction a key is read once, then only the clock is
-- compared with the expiry read; the answers must stay exact when the
-- transaction itself renews, shortens, releases or re-grants the lease.
SELECT * FROM dlock.try_acquire('stock-sync:warehouse-5', '1 second') \gset t_
BEGIN;
SELECT dlock.use_fence('stock-sync:warehouse-5', :t_fence);
INSERT INTO stock VALUES (5, 'kiwi', 1);
SELECT dlock.renew('stock-sync:warehouse-5', :'t_owner', '1 hour') IS NOT NULL AS renewed;
SELECT pg_sleep(1.2);
UPDATE stock SET qty = 2 WHERE sku = 'kiwi';   -- past the first expiry, but renewed
SELECT dlock.renew('stock-sync:warehouse-5', :'t_owner', '100 milliseconds') IS NOT NULL AS shortened;
SELECT pg_sleep(0.2);
UPDATE stock SET qty = 3 WHERE sku = 'kiwi';   -- expired now
\echo :LAST_ERROR_SQLSTATE
ROLLBACK;
SELECT * FROM dlock.try_acquire('stock-sync:warehouse-5', '1 hour') \gset t_
BEGIN;
SELECT dlock.use_fence('stock-sync:warehouse-5', :t_fence);
INSERT INTO stock VALUES (5, 'kiwi', 1);
SELECT dlock.release('stock-sync:warehouse-5', :'t_owner') AS released;
INSERT INTO stock VALUES (5, 'lime', 1);
\echo :LAST_ERROR_SQLSTATE
ROLLBACK;
SELECT * FROM dlock.try_acquire('stock-sync:warehouse-6', '1 second') \gset t_
BEGIN;
SELECT dlock.use_fence('stock-sync:warehouse-6', :t_fence);
INSERT INTO stock VALUES (6, 'kiwi', 1);
SELECT pg_sleep(1.2);
SELECT (dlock.try_acquire('stock-sync:warehouse-6', '1 hour')).fence > :t_fence AS regranted;
INSERT INTO stock VALUES (6, 'lime', 1);       -- still presents the old token
\echo :LAST_ERROR_SQLSTATE
ROLLBACK;
SELECT count(*) AS rolled_back_rows FROM stock WHERE warehouse_id IN (5, 6);

-- The escape hatch: superusers, and roles granted SET on dlock.fence_bypass,
-- may write without a token for a transaction; each such write is logged.
BEGIN;
SET LOCAL dlock.fence_bypass = on;
UPDATE stock SET qty = 1 WHERE sku = 'pear';
COMMIT;
SHOW dlock.fence_bypass;
SELECT qty FROM stock WHERE sku = 'pear';
CREATE ROLE fence_clerk;
CREATE ROLE fence_admin;
GRANT USAGE ON SCHEMA public TO fence_clerk, fence_admin;
GRANT ALL ON stock TO fence_clerk, fence_admin;
GRANT SET ON PARAMETER dlock.fence_bypass TO fence_admin;
SET ROLE fence_clerk;
SET dlock.fence_bypass = on;
\echo :LAST_ERROR_SQLSTATE
UPDATE stock SET qty = 2 WHERE sku = 'pear';
\echo :LAST_ERROR_SQLSTATE
RESET ROLE;
-- set by a superuser, then used by an ordinary role: still refused
BEGIN;
SET LOCAL dlock.fence_bypass = on;
SET LOCAL ROLE fence_clerk;
UPDATE stock SET qty = 2 WHERE sku = 'pear';
\echo :LAST_ERROR_SQLSTATE
ROLLBACK;
SET ROLE fence_admin;
BEGIN;
SET LOCAL dlock.fence_bypass = on;
UPDATE stock SET qty = 3 WHERE sku = 'pear';
COMMIT;
RESET ROLE;
SELECT qty FROM stock WHERE sku = 'pear';
REVOKE SET ON PARAMETER dlock.fence_bypass FROM fence_admin;
REVOKE ALL ON stock FROM fence_clerk, fence_admin;
REVOKE USAGE ON SCHEMA public FROM fence_clerk, fence_admin;
DROP ROLE fence_clerk;
DROP ROLE fence_admin;

-- Tokens that were never issued match nothing, whatever a lease row says:
-- below 1, or above every token the counter reached (a row written by hand,
-- or restored from elsewhere).
SELECT fence > 0 AS granted FROM dlock.try_acquire('never-issued', '1 hour') \gset ni_
SELECT dlock.check_fence('never-issued', 0) AS token_0,
       dlock.check_fence('never-issued', -1) AS token_minus_1;
UPDATE dlock.leases SET fence = 9000000000000000000 WHERE key = 'never-issued';
SELECT dlock.check_fence('never-issued', 9000000000000000000) AS forged_row_token;
\set VERBOSITY terse
SELECT dlock.use_fence('never-issued', 9000000000000000000);
SELECT dlock.use_fence('never-issued', 0);
\set VERBOSITY default
DELETE FROM dlock.leases WHERE key = 'never-issued';

DROP TABLE stock, inventory, ledger, docs, misuse;
