# What a failover to an ASYNCHRONOUS standby loses, shown and asserted.
#
# Without synchronous standbys, a grant, renewal, release or fenced write
# returns without waiting for any standby.  The test cuts standby
# "cut" off (primary_conninfo set to '' and reloaded: its walreceiver stops
# and it receives no more WAL, as behind a partition or a lagging link),
# then, on the primary, acknowledged every step of the way, in each of two
# databases (demo, mitigated; each has its own dlock.fence_seq):
#   - L is the last token covered by the sequence's WAL that "cut" has
#     (asserted: it is what "cut" replayed, and equals the primary's
#     last_value + log_cnt); grants on keys burn* use up the tokens to L - 1;
#   - C is granted stock:2 for an hour (token L), A stock:1 for 6 s (token
#     L + 1), then three keys extra* (L + 2 .. L + 4);
#   - A and C each write under their tokens to the fenced tables stock and
#     moves (use_fence + UPDATE, and an INSERT presenting the token column);
#   - in demo, a lease granted before the cut is renewed, another released.
# The primary is killed (immediate) and "cut" promoted.  In demo:
#   - lost: every grant made after the cut (burn*, stock:1, stock:2,
#     extra*; A's owner cannot renew), A's and C's fenced writes, the
#     renewal (the lease has its old expiry) and the release (the key is
#     still held);
#   - two holders: D is granted stock:2 while C's acknowledged lease has
#     more than half an hour left; C's writes to the new primary are refused
#     (LF001), because C's token L was not issued again (D's is L + 2);
#   - reissued tokens: the new primary's first token is L + 1: the tokens
#     L + 1 .. L + 4 the old primary handed out are handed out again.  The
#     new primary waits until A's lease would have run out, then B is
#     granted stock:1 and gets A's token, L + 1;
#   - fencing broken: A, as a worker paused past its TTL would, writes to
#     the new primary presenting its token, and both fenced writes are
#     accepted, next to B's under the same token; A's and C's acknowledged
#     writes are gone.
# Mitigations, each shown to work:
#   - in mitigated, the same history, but before any grant the new primary's
#     dlock.fence_seq is advanced by 10^12: B's token is larger than every
#     token of the old primary, A's and C's writes are refused (LF001) both
#     ways, B's and D's accepted.  What was lost stays lost;
#   - synchronous_standby_names = 'ANY 1 (cut)' on the primary while "cut"
#     is cut off: a grant returns no token (its statement_timeout ends the
#     wait: 57014 "fencing token not confirmed") and leaves no lease.
#     t/failover_sync shows that what a synchronous standby confirmed
#     survives promotion.
# Not lost: a second asynchronous standby, "paused", keeps receiving WAL
# with its replay paused (pg_wal_replay_pause).  Promoted after the same
# kill, it has replayed everything it received: A's and C's writes, C's
# lease, and its first token is above every token of the old primary.
# Replay lag loses nothing; only WAL a standby has not received is lost.

use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use FindBin;
use lib $FindBin::RealBin;
use DlockCluster;
use Time::HiRes qw(time usleep);

my @dbs = ('demo', 'mitigated');

my $primary = dlock_node('primary', streaming => 1, conf => "fsync = on\n");
$primary->safe_psql('postgres', 'CREATE EXTENSION dlock');
foreach my $db (@dbs)
{
	$primary->safe_psql('postgres', "CREATE DATABASE $db");
	$primary->safe_psql($db, q{
		CREATE EXTENSION dlock;
		CREATE TABLE stock (warehouse_id int PRIMARY KEY, qty int NOT NULL, fence bigint);
		CREATE TRIGGER stock_fence BEFORE INSERT OR UPDATE OR DELETE ON stock
			FOR EACH ROW EXECUTE FUNCTION dlock.fence_guard('stock:{warehouse_id}', 'fence');
		CREATE TABLE moves (warehouse_id int NOT NULL, who text NOT NULL, fence bigint);
		CREATE TRIGGER moves_fence BEFORE INSERT OR UPDATE OR DELETE ON moves
			FOR EACH ROW EXECUTE FUNCTION dlock.fence_guard('stock:{warehouse_id}', 'fence');
		BEGIN;
		SET LOCAL dlock.fence_bypass = on;
		INSERT INTO stock VALUES (1, 10, NULL), (2, 20, NULL);
		COMMIT;
	});
}
$primary->backup('base');

my $cut = streaming_standby($primary, 'cut');
my $paused = streaming_standby($primary, 'paused');

# Grant $key in $db on $node for $ttl: owner, fence and expiry (epoch).
sub grant
{
	my ($node, $db, $key, $ttl) = @_;
	return split /\|/, $node->safe_psql($db, qq{
		SELECT owner, fence, extract(epoch FROM expires_at)
		FROM dlock.try_acquire('$key', '$ttl')});
}

# A fenced UPDATE of stock row $id presenting $fence with use_fence, and a
# fenced INSERT into moves presenting it in the token column: the
# SQLSTATEs of both ('' when accepted), joined by a space.
sub fenced_writes
{
	my ($node, $db, $id, $who, $fence) = @_;
	my ($u) = try_sql($node, $db, qq{
		BEGIN;
		SELECT dlock.use_fence('stock:$id', $fence);
		UPDATE stock SET qty = qty + 1 WHERE warehouse_id = $id;
		COMMIT;});
	my ($i) = try_sql($node, $db,
		"INSERT INTO moves VALUES ($id, '$who', $fence)");
	return "$u $i";
}

# stock and moves of $db on $node, as one line each.
sub tables
{
	my ($node, $db) = @_;
	return $node->safe_psql($db, q{
		SELECT string_agg(format('%s %s %s', warehouse_id, qty, fence), ',' ORDER BY warehouse_id) FROM stock;
		SELECT coalesce(string_agg(format('%s %s %s', warehouse_id, who, fence), ',' ORDER BY warehouse_id, who), '') FROM moves;});
}

# The sequence's state on $node in $db: last value and values logged ahead.
sub seq_state
{
	my ($node, $db) = @_;
	return split /\|/, $node->safe_psql($db,
		'SELECT last_value, log_cnt FROM dlock.token_seq');
}

# Two leases the standbys have (granted before the cut): one is renewed
# after the cut, the other released after the cut.
my @R = grant($primary, 'demo', 'renewed', '1 hour');
my @Z = grant($primary, 'demo', 'released', '1 hour');

# Make sure at least two values are left before the sequence writes its
# next WAL record (so that C's token is covered by the record the cut
# standby has, and A's is not); grants on a key of its own.
foreach my $db (@dbs)
{
	my $i = 0;
	while ((seq_state($primary, $db))[1] < 2)
	{
		$primary->safe_psql($db, "SELECT count(*) FROM dlock.try_acquire('prep' || $i, '1 s')");
		$i++;
	}
}
$primary->wait_for_catchup('cut');
$primary->wait_for_catchup('paused');

# Cut "cut" off: its walreceiver stops and it receives nothing more.
$cut->append_conf('postgresql.conf', "primary_conninfo = ''\n");
$cut->reload;
ok($cut->poll_query_until('postgres', 'SELECT count(*) = 0 FROM pg_stat_wal_receiver'),
	'the cut standby\'s walreceiver has stopped');
ok( $primary->poll_query_until('postgres',
		"SELECT count(*) = 0 FROM pg_stat_replication WHERE application_name = 'cut'"),
	'the primary no longer streams to it');
$paused->safe_psql('postgres', 'SELECT pg_wal_replay_pause()');
ok( $paused->poll_query_until('postgres',
		"SELECT pg_get_wal_replay_pause_state() = 'paused'"),
	'the other standby\'s replay is paused');

# Mitigation by synchronous replication: with 'ANY 1 (cut)' a grant cannot
# return a token while "cut" is cut off.
# (A CHECKPOINT after each reload: the checkpointer, which tells the
# backends whether to wait for standbys, has read the new setting by the
# time it has done the checkpoint.)
$primary->append_conf('postgresql.conf', "synchronous_standby_names = 'ANY 1 (cut)'\n");
$primary->reload;
$primary->safe_psql('postgres', 'CHECKPOINT');
my ($st) = try_sql($primary, 'postgres', q{
	SET statement_timeout = '1s';
	SELECT fence FROM dlock.try_acquire('sync', '1 hour');});
is($st, '57014', 'ANY 1 (cut): the grant is not confirmed, no token returned');
is($primary->safe_psql('postgres', "SELECT count(*) FROM dlock.leases WHERE key = 'sync'"),
	'0', 'ANY 1 (cut): and it left no lease');
$primary->append_conf('postgresql.conf', "synchronous_standby_names = ''\n");
$primary->reload;
$primary->safe_psql('postgres', 'CHECKPOINT');

# The history, on the primary, acknowledged every step of the way.
is( $primary->safe_psql('demo', qq{
		SELECT dlock.renew('renewed', '$R[0]', '20 hours') > now() + interval '19 hours';
		SELECT dlock.release('released', '$Z[0]');}),
	"t\nt", 'demo: a renewal (to 20 hours) and a release are acknowledged on the old primary');
my (%L, %A, %C, %max);
foreach my $db (@dbs)
{
	my ($last, $ahead) = seq_state($primary, $db);
	my ($cut_last) = seq_state($cut, $db);
	$L{$db} = $last + $ahead;
	is($cut_last, $L{$db},
		"$db: the cut standby has the sequence logged up to L = the primary's last value + log_cnt");
	$primary->safe_psql($db, qq{
		SELECT count(*) FROM generate_series(1, $ahead - 1) AS i,
		LATERAL dlock.try_acquire('burn' || i, '1 hour')});
	$C{$db} = [ grant($primary, $db, 'stock:2', '1 hour') ];
	$A{$db} = [ grant($primary, $db, 'stock:1', '6 s') ];
	is(fenced_writes($primary, $db, 1, 'A', $A{$db}[1]), ' ',
		"$db: A's fenced writes are acknowledged on the old primary");
	is($C{$db}[1], $L{$db}, "$db: C's token is L, the last the cut standby's WAL covers");
	is($A{$db}[1], $L{$db} + 1, "$db: A's token is L + 1");
	foreach my $i (1 .. 3)
	{
		$max{$db} = (grant($primary, $db, "extra$i", '1 hour'))[1];
	}
	is(fenced_writes($primary, $db, 2, 'C', $C{$db}[1]), ' ',
		"$db: C's fenced writes are acknowledged on the old primary");
	is(tables($primary, $db), "1 11 $A{$db}[1],2 21 $C{$db}[1]\n1 A $A{$db}[1],2 C $C{$db}[1]",
		"$db: the old primary has them");
}
$primary->wait_for_catchup('paused', 'flush');
is($primary->safe_psql('postgres',
		"SELECT count(*) FROM pg_stat_replication WHERE application_name = 'cut'"),
	'0', 'the cut standby received none of it');

$primary->stop('immediate');
$cut->promote;
$paused->promote;

#
# What was lost, in demo.
#
my $db = 'demo';
is( $cut->safe_psql($db, q{
		SELECT count(*) FROM dlock.leases
		WHERE key ~ '^(burn|extra|stock:)'}),
	'0', 'demo: every lease granted after the cut is missing on the new primary');
is(tables($cut, $db), "1 10 ,2 20 \n", 'demo: so are the acknowledged fenced writes');
is($cut->safe_psql($db, "SELECT dlock.renew('stock:1', '$A{$db}[0]', '1 hour') IS NULL"),
	't', 'demo: A\'s owner cannot renew');
is( $cut->safe_psql($db, q{
		SELECT expires_at < now() + interval '2 hours' FROM dlock.leases WHERE key = 'renewed';
		SELECT count(*) FROM dlock.try_acquire('released', '1 hour');}),
	"t\n0", 'demo: the renewal is undone (an hour left, not 20), and so is the release (the key is still held)');

# A's lease would have run out by now: the new primary waited for it.
my $wait = $A{$db}[2] - time();
usleep(int(($wait + 0.1) * 1e6)) if $wait > -0.1;

my @B = grant($cut, $db, 'stock:1', '1 hour');
is($B[1], $L{$db} + 1, 'demo: the first token on the new primary is L + 1');
is($B[1], $A{$db}[1], 'demo: B is granted stock:1 with A\'s token (reissued)');
cmp_ok($B[1], '<=', $max{$db}, 'demo: tokens up to the old primary\'s last are issued again');
my @D = grant($cut, $db, 'stock:2', '1 hour');
cmp_ok($C{$db}[2], '>', time() + 1800,
	'demo: C\'s acknowledged lease still had half an hour left ...');
ok(defined $D[1], '... when D is granted stock:2 on the new primary: two holders');
is(fenced_writes($cut, $db, 2, 'C', $C{$db}[1]), 'LF001 LF001',
	'demo: C\'s writes to the new primary are refused (its token L was not reissued)');
is(fenced_writes($cut, $db, 1, 'A', $A{$db}[1]), ' ',
	'demo: A, whose lease ran out, writes under its reissued token and is accepted, both ways');
is(fenced_writes($cut, $db, 1, 'B', $B[1]), ' ', 'demo: B writes under the same token');
is(tables($cut, $db), "1 12 $B[1],2 20 \n1 A $B[1],1 B $B[1]",
	'demo: the new primary has A\'s late writes and B\'s, under one token; A\'s and C\'s acknowledged writes are gone');

#
# The mitigation: advance the sequence before serving.
#
$db = 'mitigated';
is( $cut->safe_psql($db, q{
		SELECT setval('dlock.fence_seq', last_value + 1000000000000) > 1000000000000
		FROM dlock.fence_seq}),
	't', 'mitigated: dlock.fence_seq advanced by 10^12 before any grant');
@B = grant($cut, $db, 'stock:1', '1 hour');
cmp_ok($B[1], '>', $max{$db}, 'mitigated: B\'s token is larger than every token of the old primary');
is(fenced_writes($cut, $db, 1, 'A', $A{$db}[1]), 'LF001 LF001',
	'mitigated: A\'s writes are refused, both ways');
@D = grant($cut, $db, 'stock:2', '1 hour');
is(fenced_writes($cut, $db, 2, 'C', $C{$db}[1]), 'LF001 LF001',
	'mitigated: C\'s writes are refused, both ways');
is(fenced_writes($cut, $db, 1, 'B', $B[1]), ' ', 'mitigated: B writes');
is(fenced_writes($cut, $db, 2, 'D', $D[1]), ' ', 'mitigated: D writes');
is(tables($cut, $db), "1 11 $B[1],2 21 $D[1]\n1 B $B[1],2 D $D[1]",
	'mitigated: only B\'s and D\'s writes; A\'s and C\'s acknowledged writes are still lost');

#
# Replay paused: nothing received is lost.
#
$db = 'demo';
is(tables($paused, $db), "1 11 $A{$db}[1],2 21 $C{$db}[1]\n1 A $A{$db}[1],2 C $C{$db}[1]",
	'paused: the promoted standby has every acknowledged write it had received');
is($paused->safe_psql($db, "SELECT dlock.renew('stock:2', '$C{$db}[0]', '1 hour') IS NOT NULL"),
	't', 'paused: and C\'s lease');
cmp_ok((grant($paused, $db, 'new', '1 hour'))[1], '>', $max{$db},
	'paused: its first token is larger than every token of the old primary');

$cut->stop;
$paused->stop;
done_testing();
