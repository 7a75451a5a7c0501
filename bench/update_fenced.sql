-- dlock: the same UPDATE on a table guarded by dlock.fence_guard, presenting
-- this client's token in the token column.
\set f :base + :client_id
UPDATE stock_fenced SET qty = qty + 1, fence = :f WHERE id = :client_id;
