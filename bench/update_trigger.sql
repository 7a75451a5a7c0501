-- baseline: the same transaction on a table with a built-in C BEFORE ROW
-- trigger (suppress_redundant_updates_trigger, which lets a changed row
-- through): what any BEFORE UPDATE row trigger costs, so that the fenced
-- table's ratio to it is dlock's own cost (the trigger and use_fence).
BEGIN;
UPDATE stock_trigger SET qty = qty + 1 WHERE id = :client_id;
COMMIT;
