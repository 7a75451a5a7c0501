-- baseline: the same 1000-row UPDATE on a table with a do-nothing C BEFORE
-- ROW trigger (suppress_redundant_updates_trigger).
BEGIN;
UPDATE bulk_trigger SET qty = qty + 1 WHERE cid = :client_id;
COMMIT;
