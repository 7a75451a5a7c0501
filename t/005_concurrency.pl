# Many clients, few keys, leases so short that they expire mid-work: the
# fencing guarantee must hold anyway.  Every client acquires one of three
# keys for 20 ms, pauses 0-30 ms (so many leases expire and are taken over
# while their holder sleeps), then writes a row under its token to a fenced
# table and releases.  Afterwards, for each key, the accepted rows in
# insertion order must carry strictly increasing tokens (each grant writes
# once): no write under an old token ever landed after a write under a
# newer one, and no two holders' writes interleaved.  Refused writes must
# have happened (the test really exercised takeovers), and every grant got
# its own token.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $node = PostgreSQL::Test::Cluster->new('concurrency');
$node->init;
$node->start;
$node->safe_psql('postgres', q{
	CREATE EXTENSION dlock;
	CREATE TABLE ledger (seq bigserial PRIMARY KEY, key text NOT NULL, fence bigint);
	CREATE TRIGGER ledger_fence BEFORE INSERT OR UPDATE OR DELETE ON ledger
	  FOR EACH ROW EXECUTE FUNCTION dlock.fence_guard('{key}', 'fence');
	CREATE TABLE refusals (key text, fence bigint);
	CREATE TABLE grants (key text, fence bigint);
	CREATE FUNCTION try_write(k text, f bigint) RETURNS boolean LANGUAGE plpgsql AS $$
	BEGIN
	  INSERT INTO ledger (key, fence) VALUES (k, f);
	  RETURN true;
	EXCEPTION WHEN SQLSTATE 'LF001' THEN
	  INSERT INTO refusals VALUES (k, f);
	  RETURN false;
	END $$;
});

$node->pgbench(
	'-n -M prepared -c 8 -j 2 -T 8',
	0,
	[qr{processed: [1-9]}],
	[qr{^$}],
	'8 clients acquire, pause, write under their token and release',
	{
		'005_chaos' => q{
\set k random(1, 3)
SELECT owner, fence FROM dlock.acquire('chaos:' || :k, '20 milliseconds') \gset
INSERT INTO grants VALUES ('chaos:' || :k, :fence);
\set pause random(0, 30)
\sleep :pause ms
SELECT try_write('chaos:' || :k, :fence);
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
	SELECT count(*) FROM (
	  SELECT fence, lag(fence) OVER (PARTITION BY key ORDER BY seq) AS prev
	  FROM ledger) s
	WHERE fence <= prev}),
	'0',
	'per key, accepted writes carry strictly increasing tokens in insertion order');

is($node->safe_psql('postgres',
		'SELECT count(*) - count(DISTINCT fence) FROM grants'),
	'0', 'every grant got its own token');

$node->stop;
done_testing();
