-- baseline: the hand-written SQL lease people write (upsert with a TTL,
-- compare-and-delete), without fencing tokens or a fresh-snapshot read.
INSERT INTO sql_leases AS l (key, owner, expires_at)
VALUES ('bench:' || :client_id, gen_random_uuid(), clock_timestamp() + interval '10 seconds')
ON CONFLICT (key) DO UPDATE SET owner = excluded.owner, expires_at = excluded.expires_at
WHERE l.expires_at < clock_timestamp()
RETURNING owner \gset
DELETE FROM sql_leases WHERE key = 'bench:' || :client_id AND owner = :owner::uuid;
