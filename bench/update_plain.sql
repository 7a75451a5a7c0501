-- baseline: a transaction making a single-row UPDATE on a table without
-- the fencing trigger.
BEGIN;
UPDATE stock_plain SET qty = qty + 1 WHERE id = :client_id;
COMMIT;
