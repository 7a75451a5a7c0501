# Many clients, few keys, leases so short that they expire mid-work: the
# fencing guarantee must hold anyway.  Every client acquires one of three
# keys for 20 ms, pauses 0-60 ms (so most leases expire, and are taken over,
# while their holder sleeps), then writes a row under its token to a fenced
# table and releases.
#
# Grants and writes are recorded on one shared order, the sequence ord:
#
#  * a write draws its number inside the writing transaction, before the
#    fencing trigger judges it (so before it can commit);
#  * a grant draws its number in a statement run after dlock.acquire has
#    returned, so after the grant committed.
#
# So when a grant of token b drew a smaller number than an accepted write of
# token a < b on the same key, that grant had committed before the write was
# even judged, and the write committed after it: a stale write accepted
# after a newer grant existed.  The test asserts there is no such pair.  It
# also asserts that such stale writes were attempted (and refused), that no
# write made after its lease had run out was accepted, that per key the
# accepted writes carry strictly increasing tokens, and that every grant got
# its own token and made exactly one write attempt.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use FindBin;
use lib $FindBin::RealBin;
use DlockCluster;

my $node = dlock_node('concurrency');
$node->safe_psql('postgres', q{
	CREATE EXTENSION dlock;
	CREATE SEQUENCE ord;
	-- seq: position of the write attempt on the shared order (try_write
	-- draws it); pause: how long the client slept after the grant.
	CREATE TABLE ledger (seq bigint PRIMARY KEY, key text NOT NULL,
	  fence bigint, pause int NOT NULL);
	CREATE TRIGGER ledger_fence BEFORE INSERT OR UPDATE OR DELETE ON ledger
	  FOR EACH ROW EXECUTE FUNCTION dlock.fence_guard('{key}', 'fence');
	CREATE TABLE refusals (seq bigint PRIMARY KEY, key text NOT NULL,
	  fence bigint, pause int NOT NULL);
	-- seq: position on the shared order, drawn after the grant committed.
	CREATE TABLE grants (seq bigint PRIMARY KEY DEFAULT nextval('ord'),
	  key text NOT NULL, fence bigint NOT NULL);
	-- Write under token f: true if accepted, false if refused (LF001).
	-- The write's number is drawn here, in the writing transaction and
	-- before the fencing trigger runs, and is kept for a refused write too.
	CREATE FUNCTION try_write(k text, f bigint, p int) RETURNS boolean
	LANGUAGE plpgsql AS $$
	DECLARE
	  s bigint := nextval('ord');
	BEGIN
	  INSERT INTO ledger (seq, key, fence, pause) VALUES (s, k, f, p);
	  RETURN true;
	EXCEPTION WHEN SQLSTATE 'LF001' THEN
	  INSERT INTO refusals VALUES (s, k, f, p);
	  RETURN false;
	END $$;
});

# The INSERT INTO grants is its own transaction, sent only after acquire's
# transaction has committed and returned.  A pause of 25 ms or more is past
# the 20 ms lease (with 5 ms to spare for the client's clock against the
# server's), so more than half of the writes come after their lease has
# expired: refusals are certain, takeovers by the waiting clients frequent.
$node->pgbench(
	'-n -M prepared -c 8 -j 2 -T 8',
	0,
	[qr{processed: [1-9]}],
	[qr{^$}],
	'8 clients acquire, pause, write under their token and release',
	{
		'fencing_concurrency' => q{
\set k random(1, 3)
SELECT owner, fence FROM dlock.acquire('chaos:' || :k, '20 milliseconds') \gset
INSERT INTO grants (key, fence) VALUES ('chaos:' || :k, :fence);
\set pause random(0, 60)
\sleep :pause ms
SELECT try_write('chaos:' || :k, :fence, :pause);
SELECT dlock.release('chaos:' || :k, :owner::uuid);
}
	});

my ($accepted, $refused, $grants) = split /\|/, $node->safe_psql('postgres',
	'SELECT (SELECT count(*) FROM ledger), (SELECT count(*) FROM refusals), (SELECT count(*) FROM grants)');
note "grants: $grants, accepted writes: $accepted, refused writes: $refused";
cmp_ok($accepted, '>', 0, 'some writes were accepted');
cmp_ok($refused, '>', 0, 'some writes came too late and were refused');
is($accepted + $refused, $grants, 'every grant made exactly one write attempt');

is( $node->safe_psql(
		'postgres', q{
	SELECT count(*) FROM ledger w JOIN grants g
	  ON g.key = w.key AND g.fence > w.fence AND g.seq < w.seq}),
	'0',
	'no write under a token was accepted after a grant of a larger token of its key');

# The assertion above is not vacuous: writes under an old token were
# attempted after a newer grant had committed, and were refused.
my $stale_refused = $node->safe_psql(
	'postgres', q{
	SELECT count(*) FROM refusals r
	WHERE EXISTS (SELECT FROM grants g
	  WHERE g.key = r.key AND g.fence > r.fence AND g.seq < r.seq)});
note "refused writes attempted after a newer grant: $stale_refused";
cmp_ok($stale_refused, '>', 0,
	'stale writes were attempted after a newer grant, and refused');

is( $node->safe_psql(
		'postgres', 'SELECT count(*) FROM ledger WHERE pause >= 25'),
	'0',
	'no write made 25 ms or more after its 20 ms grant was accepted');
cmp_ok(
	$node->safe_psql(
		'postgres', 'SELECT count(*) FROM refusals WHERE pause >= 25'),
	'>', 0,
	'writes were made after their lease had expired');

is( $node->safe_psql(
		'postgres', q{
	SELECT count(*) FROM (
	  SELECT fence, lag(fence) OVER (PARTITION BY key ORDER BY seq) AS prev
	  FROM ledger) s
	WHERE fence <= prev}),
	'0',
	'per key, accepted writes carry strictly increasing tokens in write order');

is($node->safe_psql('postgres',
		'SELECT count(*) - count(DISTINCT fence) FROM grants'),
	'0', 'every grant got its own token');

$node->stop;
done_testing();
