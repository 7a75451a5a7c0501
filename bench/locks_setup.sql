-- bench/locks_setup.sql: what bench/lockbench's one-statement workloads
-- need, for clients 0 .. :nclients - 1 (bench/locks runs it once, before
-- the runs, with psql -v nclients=N).  Client i updates row i of the
-- stock tables and its 1000 rows (cid = i) of the bulk tables; the fenced
-- tables are guarded by dlock.fence_guard, and client i holds the leases
-- of 'stock:i' and 'bulk:i' (granted here, for a day; their tokens go to
-- lease_tokens, where lockbench reads them: in memory mode, dlock.storage
-- = memory, the leases are not in dlock.leases).  The plain tables are the
-- same without the trigger.
CREATE TABLE sql_leases (key text PRIMARY KEY, owner uuid NOT NULL,
                         expires_at timestamptz NOT NULL);
CREATE TABLE stock_plain (id int PRIMARY KEY, qty bigint NOT NULL);
CREATE TABLE stock_fenced (id int PRIMARY KEY, qty bigint NOT NULL);
CREATE TRIGGER stock_fence BEFORE INSERT OR UPDATE OR DELETE ON stock_fenced
  FOR EACH ROW EXECUTE FUNCTION dlock.fence_guard('stock:{id}');
CREATE TABLE bulk_plain (cid int NOT NULL, qty bigint NOT NULL);
CREATE TABLE bulk_fenced (cid int NOT NULL, qty bigint NOT NULL);
CREATE TRIGGER bulk_fence BEFORE INSERT OR UPDATE OR DELETE ON bulk_fenced
  FOR EACH ROW EXECUTE FUNCTION dlock.fence_guard('bulk:{cid}');
CREATE TABLE lease_tokens (key text PRIMARY KEY, fence bigint NOT NULL);
-- one grant per statement would be as good; one statement is quicker
INSERT INTO lease_tokens SELECT l.key, l.fence FROM generate_series(0, :nclients - 1) i,
  LATERAL dlock.try_acquire('stock:' || i, '1 day') l;
INSERT INTO lease_tokens SELECT l.key, l.fence FROM generate_series(0, :nclients - 1) i,
  LATERAL dlock.try_acquire('bulk:' || i, '1 day') l;
-- the rows are written before the leases are used: bypass the guard once
SET dlock.fence_bypass = on;
INSERT INTO stock_plain SELECT i, 0 FROM generate_series(0, :nclients - 1) i;
INSERT INTO stock_fenced SELECT i, 0 FROM generate_series(0, :nclients - 1) i;
INSERT INTO bulk_plain SELECT c, 0 FROM generate_series(0, :nclients - 1) c, generate_series(1, 1000);
INSERT INTO bulk_fenced SELECT c, 0 FROM generate_series(0, :nclients - 1) c, generate_series(1, 1000);
RESET dlock.fence_bypass;
CREATE INDEX ON bulk_plain (cid);
CREATE INDEX ON bulk_fenced (cid);
VACUUM ANALYZE stock_plain, stock_fenced, bulk_plain, bulk_fenced;
