-- dlock: the same transaction on a table guarded by dlock.fence_guard,
-- presenting this client's token with use_fence (the row already carries
-- it from the last round, so the token column cannot present it).
\set f :base + :client_id
BEGIN;
SELECT dlock.use_fence('stock:' || :client_id, :f);
UPDATE stock_fenced SET qty = qty + 1 WHERE id = :client_id;
COMMIT;
