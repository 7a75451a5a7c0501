-- dlock: one try_acquire + release round trip on a key of this client's own.
SELECT owner FROM dlock.try_acquire('bench:' || :client_id, '10 seconds') \gset
SELECT dlock.release('bench:' || :client_id, :owner::uuid);
