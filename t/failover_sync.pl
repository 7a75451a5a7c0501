# Leases, fencing tokens and fenced writes survive the promotion of a
# synchronous standby, and fencing keeps working on the promoted standby.
#
# The primary's session runs with synchronous_commit = off; dlock raises it
# for its grants, so a grant that returned has reached the synchronous
# standby.  A token drawn inside an explicit transaction block is flushed
# and replicated before it is returned, so the promoted standby never issues
# it again even though that transaction never committed.
#
# Fencing across the failover (tables stock and moves, both guarded by
# dlock.fence_guard on key stock:{warehouse_id} with token column fence):
# on the old primary holder A (TTL 5 s) writes under its token both ways
# (an INSERT presenting it in the token column, use_fence + UPDATE); C
# writes on key stock:2 and releases, D is granted stock:2 and writes; E
# holds stock:3 session-bound and a write presents E's token.  All these
# commits are acknowledged (synchronous_commit = on).  The primary is killed
# (immediate) and the standby promoted at once.  On the new primary:
# every acknowledged row is there, stamped with its writer's token; once
# A's lease has run out and B has taken stock:1 over (with a larger token),
# A's writes are refused with LF001 both ways; C, presenting a token older
# than D's, is refused both ways; D, whose lease was granted on the old
# primary, and B write; E's session-bound lease has ended (its connection
# was on the old primary): it shows as expired, cannot be renewed, E's
# token is refused, and another client takes stock:3 with a larger token.

use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(usleep);
use FindBin;
use lib $FindBin::RealBin;
use DlockCluster;

my $primary = dlock_node('primary', streaming => 1, conf => "fsync = on\n");
$primary->safe_psql('postgres', q{
	CREATE EXTENSION dlock;
	CREATE TABLE stock (warehouse_id int PRIMARY KEY, qty int NOT NULL, fence bigint);
	CREATE TRIGGER stock_fence BEFORE INSERT OR UPDATE OR DELETE ON stock
		FOR EACH ROW EXECUTE FUNCTION dlock.fence_guard('stock:{warehouse_id}', 'fence');
	CREATE TABLE moves (warehouse_id int NOT NULL, qty int NOT NULL, fence bigint);
	CREATE TRIGGER moves_fence BEFORE INSERT OR UPDATE OR DELETE ON moves
		FOR EACH ROW EXECUTE FUNCTION dlock.fence_guard('stock:{warehouse_id}', 'fence');
});
my $standby = sync_standby($primary, 'standby', 'the standby is synchronous');

# A fenced UPDATE of stock row $id presenting $fence with use_fence.
sub fenced_update
{
	my ($node, $id, $qty, $fence) = @_;
	return (try_sql($node, 'postgres', qq{
		BEGIN;
		SELECT dlock.use_fence('stock:$id', $fence);
		UPDATE stock SET qty = $qty WHERE warehouse_id = $id;
		COMMIT;}))[0];
}

# A fenced INSERT into moves presenting $fence in the token column.
sub fenced_insert
{
	my ($node, $id, $qty, $fence) = @_;
	return (try_sql($node, 'postgres',
		"INSERT INTO moves VALUES ($id, $qty, $fence)"))[0];
}

# Grant $key on $node for $ttl; return owner, fence and expiry.
sub grant
{
	my ($node, $key, $ttl) = @_;
	return split /\|/, $node->safe_psql('postgres',
		"SELECT owner, fence, expires_at FROM dlock.try_acquire('$key', '$ttl')");
}

# Fenced writes on the old primary, each acknowledged (synchronous_commit
# is on for them, so each commit has reached the synchronous standby).
my ($oA, $fA, $expA) = grant($primary, 'stock:1', '5 s');
is(fenced_insert($primary, 1, 1, $fA), '', 'A: INSERT presenting its token in the token column');
is((try_sql($primary, 'postgres', "INSERT INTO stock VALUES (1, 10, $fA)"))[0], '',
	'A: INSERT into stock presenting its token');
is(fenced_update($primary, 1, 11, $fA), '', 'A: use_fence + UPDATE');
my ($oC, $fC) = grant($primary, 'stock:2', '1 hour');
is((try_sql($primary, 'postgres', "INSERT INTO stock VALUES (2, 20, $fC)"))[0], '',
	'C: INSERT presenting its token');
is($primary->safe_psql('postgres', "SELECT dlock.release('stock:2', '$oC')"), 't',
	'C releases stock:2');
my ($oD, $fD) = grant($primary, 'stock:2', '1 hour');
cmp_ok($fD, '>', $fC, 'D is granted stock:2 with a larger token than C');
is(fenced_update($primary, 2, 21, $fD), '', 'D: use_fence + UPDATE');
is(fenced_insert($primary, 2, 1, $fD), '', 'D: INSERT presenting its token');
my $e = $primary->background_psql('postgres');
my ($oE, $fE) = split /\|/, $e->query_safe(
	"SELECT owner, fence FROM dlock.try_acquire('stock:3', '1 hour', session_bound => true)");
is((try_sql($primary, 'postgres', "INSERT INTO stock VALUES (3, 30, $fE)"))[0], '',
	'a write presenting the session-bound lease\'s token, its connection up');

my $s = $primary->background_psql('postgres');
$s->query_safe('SET synchronous_commit = off');

my (%owner, $max_seen);
foreach my $key (map { "p$_" } 1 .. 20)
{
	my ($owner, $fence) = split /\|/,
	  $s->query_safe("SELECT owner, fence FROM dlock.try_acquire('$key', '1 hour')");
	$owner{$key} = $owner;
	$max_seen = $fence;
}

# Tokens seen inside a transaction that never commits: 40 of them, more
# than the sequence logs ahead at a time (32), so the last ones are covered
# only by WAL this transaction wrote.
$s->query_safe('BEGIN');
my $uncommitted = $s->query_safe(
	q{SELECT max(l.fence) FROM generate_series(1, 40) AS i,
	  LATERAL dlock.try_acquire('open' || i, '1 hour') AS l});
cmp_ok($uncommitted, '>', $max_seen + 39, '40 tokens drawn in an open transaction');
$max_seen = $uncommitted;

# Fail over at once: no waiting for the standby to catch up.
$primary->stop('immediate');
$s->quit;
$e->quit;
$standby->promote;

is( $standby->safe_psql('postgres', q{
		SELECT string_agg(format('%s %s %s', warehouse_id, qty, fence), ',' ORDER BY warehouse_id)
		FROM stock}),
	"1 11 $fA,2 21 $fD,3 30 $fE",
	'every fenced write acknowledged on the old primary is on the new one, stamped with its token');
is( $standby->safe_psql('postgres', q{
		SELECT string_agg(format('%s %s %s', warehouse_id, qty, fence), ',' ORDER BY warehouse_id)
		FROM moves}),
	"1 1 $fA,2 1 $fD",
	'so are the INSERTs that presented their tokens in the token column');

# Older token: C's (D was granted stock:2 after C, on the old primary).
is(fenced_update($standby, 2, 666, $fC), 'LF001',
	'C, presenting a token older than D\'s, is refused (use_fence + UPDATE)');
is(fenced_insert($standby, 2, 666, $fC), 'LF001',
	'C is refused (token column)');
is(fenced_update($standby, 2, 22, $fD), '',
	'D, whose lease was granted on the old primary, writes (use_fence + UPDATE)');
is(fenced_insert($standby, 2, 2, $fD), '', 'D writes (token column)');

# Expired and taken over on the new primary: A's lease ran 5 s.
my ($oB, $fB);
foreach (1 .. 300)
{
	($oB, $fB) = split /\|/, $standby->safe_psql('postgres',
		"SELECT owner, fence FROM dlock.try_acquire('stock:1', '1 hour')");
	last if defined $fB;
	usleep(100_000);
}
cmp_ok($fB // 0, '>', $fA, 'B takes stock:1 over once A\'s lease has run out, with a larger token');
is($standby->safe_psql('postgres',
		"SELECT granted_at >= '$expA' FROM dlock.leases WHERE key = 'stock:1'"),
	't', 'A\'s lease, granted on the old primary, kept B out until it expired');
is(fenced_update($standby, 1, 666, $fA), 'LF001',
	'A, whose lease expired and was taken over, is refused (use_fence + UPDATE)');
is(fenced_insert($standby, 1, 666, $fA), 'LF001', 'A is refused (token column)');
is(fenced_update($standby, 1, 12, $fB), '', 'B writes (use_fence + UPDATE)');
is(fenced_insert($standby, 1, 2, $fB), '', 'B writes (token column)');

# The session-bound lease ended with the old primary.
is($standby->safe_psql('postgres',
		"SELECT state FROM dlock.lease_status WHERE key = 'stock:3'"),
	'expired', 'the session-bound lease shows as expired on the new primary');
is($standby->safe_psql('postgres',
		"SELECT dlock.renew('stock:3', '$oE', '1 hour') IS NULL"),
	't', 'its owner cannot renew it');
my ($state, $out) = try_sql($standby, 'postgres', "BEGIN; SELECT dlock.use_fence('stock:3', $fE); COMMIT;");
is($state, 'LF001', 'its token is refused');
my ($oF, $fF) = grant($standby, 'stock:3', '1 hour');
cmp_ok($fF // 0, '>', $fE, 'another client takes stock:3, with a larger token');
is(fenced_update($standby, 3, 31, $fF), '', 'and writes under it');

is( $standby->safe_psql('postgres', q{
		SELECT string_agg(format('%s %s %s', warehouse_id, qty, fence), ',' ORDER BY warehouse_id)
		FROM stock}),
	"1 12 $fB,2 22 $fD,3 31 $fF",
	'stock holds exactly the accepted writes');

my $values = join(', ', map { "('$_', '$owner{$_}'::uuid)" } sort keys %owner);
is( $standby->safe_psql(
		'postgres', qq{
	SELECT count(*) FROM (VALUES $values) AS v(k, o)
	WHERE dlock.renew(k, o, '1 hour') IS NOT NULL}),
	'20',
	'every lease granted on the old primary is held on the promoted standby');
is($standby->safe_psql('postgres',
		"SELECT NOT EXISTS (SELECT FROM dlock.try_acquire('p1', '1 hour'))"),
	't', 'nobody else can acquire a key held before the failover');

my $new = $standby->safe_psql('postgres',
	"SELECT fence FROM dlock.try_acquire('after', '1 hour')");
cmp_ok($new, '>', $max_seen,
	'a new token on the promoted standby is greater than every token seen before, committed or not');

# With a synchronous standby that is not there, a token cannot be
# confirmed: a grant whose wait is cancelled fails instead of returning an
# unconfirmed token, and leaves no lease behind.
$standby->append_conf('postgresql.conf',
	"synchronous_standby_names = 'nobody'\n");
$standby->reload;
my ($ret, $stdout, $stderr) = $standby->psql('postgres', q{
	SET statement_timeout = '1s';
	BEGIN;
	SELECT fence FROM dlock.try_acquire('unconfirmed', '1 hour');
	COMMIT;});
isnt($ret, 0, 'a grant whose standby wait is cancelled fails');
like($stderr, qr/fencing token not confirmed by the synchronous standbys/,
	'the error says the token was not confirmed');
unlike($stdout, qr/^\d+$/m, 'no token was returned');
$standby->append_conf('postgresql.conf', "synchronous_standby_names = ''\n");
$standby->reload;
is($standby->safe_psql('postgres',
		"SELECT count(*) FROM dlock.leases WHERE key = 'unconfirmed'"),
	'0', 'the failed grant left no lease');

$standby->stop;
done_testing();
