-- baseline: a session advisory lock taken and released (no TTL, no token,
-- nothing durable: the lock dies with the connection).
SELECT pg_advisory_lock(:client_id);
SELECT pg_advisory_unlock(:client_id);
