-- baseline: the same UPDATE on a table with a built-in C BEFORE ROW trigger
-- (suppress_redundant_updates_trigger, which lets a changed row through):
-- what any BEFORE UPDATE row trigger costs, so that the fenced table's
-- ratio to it is dlock's own cost.
\set f :base + :client_id
UPDATE stock_trigger SET qty = qty + 1, fence = :f WHERE id = :client_id;
