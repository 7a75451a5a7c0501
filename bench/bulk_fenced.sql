-- dlock: one transaction updates this client's 1000 rows of a fenced
-- table, presenting its token once with use_fence.
\set f :base + 64 + :client_id
BEGIN;
SELECT dlock.use_fence('bulk:' || :client_id, :f);
UPDATE bulk_fenced SET qty = qty + 1 WHERE cid = :client_id;
COMMIT;
