-- baseline: a single-row UPDATE on a table without the fencing trigger.
\set f :base + :client_id
UPDATE stock_plain SET qty = qty + 1, fence = :f WHERE id = :client_id;
