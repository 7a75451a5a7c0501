-- Tables and leases for the benchmark.  Client i (pgbench's client_id,
-- from 0) updates row i under the lease of key 'stock:i', and its 1000
-- rows of the bulk tables under 'bulk:i'; the leases are granted in order,
-- so client i's tokens are :base + i and :base + 64 + i.
CREATE EXTENSION dlock;
CREATE TABLE sql_leases (key text PRIMARY KEY, owner uuid NOT NULL,
                         expires_at timestamptz NOT NULL);
CREATE TABLE stock_plain (id int PRIMARY KEY, qty bigint NOT NULL, fence bigint);
CREATE TABLE stock_fenced (id int PRIMARY KEY, qty bigint NOT NULL, fence bigint);
CREATE TABLE stock_trigger (id int PRIMARY KEY, qty bigint NOT NULL, fence bigint);
CREATE TRIGGER stock_noop BEFORE UPDATE ON stock_trigger
  FOR EACH ROW EXECUTE FUNCTION suppress_redundant_updates_trigger();
CREATE TRIGGER stock_fence BEFORE INSERT OR UPDATE OR DELETE ON stock_fenced
  FOR EACH ROW EXECUTE FUNCTION dlock.fence_guard('stock:{id}', 'fence');
CREATE TABLE bulk_fenced (cid int NOT NULL, qty bigint NOT NULL, fence bigint);
CREATE TRIGGER bulk_fence BEFORE INSERT OR UPDATE OR DELETE ON bulk_fenced
  FOR EACH ROW EXECUTE FUNCTION dlock.fence_guard('bulk:{cid}', 'fence');
CREATE TABLE bulk_trigger (cid int NOT NULL, qty bigint NOT NULL, fence bigint);
CREATE TRIGGER bulk_noop BEFORE UPDATE ON bulk_trigger
  FOR EACH ROW EXECUTE FUNCTION suppress_redundant_updates_trigger();
-- tokens: stock:i gets :base + i, bulk:i gets :base + 64 + i
SELECT (dlock.try_acquire('stock:' || i, '1 day')).fence FROM generate_series(0, 63) i;
SELECT (dlock.try_acquire('bulk:' || i, '1 day')).fence FROM generate_series(0, 63) i;
SET dlock.fence_bypass = on;
INSERT INTO stock_plain SELECT i, 0, NULL FROM generate_series(0, 63) i;
INSERT INTO stock_fenced SELECT i, 0, NULL FROM generate_series(0, 63) i;
INSERT INTO stock_trigger SELECT i, 0, NULL FROM generate_series(0, 63) i;
INSERT INTO bulk_fenced SELECT c, 0, NULL FROM generate_series(0, 63) c, generate_series(1, 1000);
INSERT INTO bulk_trigger SELECT c, 0, NULL FROM generate_series(0, 63) c, generate_series(1, 1000);
CREATE INDEX ON bulk_fenced (cid);
CREATE INDEX ON bulk_trigger (cid);
