-- Tables and leases for the benchmark.  Client i (pgbench's client_id,
-- from 0) updates row i under the lease of key 'stock:i'; the leases are
-- granted in order, so client i's token is :base + i.
CREATE EXTENSION dlock;
CREATE TABLE sql_leases (key text PRIMARY KEY, owner uuid NOT NULL,
                         expires_at timestamptz NOT NULL);
CREATE TABLE stock_plain (id int PRIMARY KEY, qty bigint NOT NULL, fence bigint);
CREATE TABLE stock_fenced (id int PRIMARY KEY, qty bigint NOT NULL, fence bigint);
CREATE TRIGGER stock_fence BEFORE INSERT OR UPDATE OR DELETE ON stock_fenced
  FOR EACH ROW EXECUTE FUNCTION dlock.fence_guard('stock:{id}', 'fence');
SELECT (dlock.try_acquire('stock:' || i, '1 day')).fence FROM generate_series(0, 63) i;
SET dlock.fence_bypass = on;
INSERT INTO stock_plain SELECT i, 0, NULL FROM generate_series(0, 63) i;
INSERT INTO stock_fenced SELECT i, 0, NULL FROM generate_series(0, 63) i;
