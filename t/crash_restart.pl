# Leases and fencing tokens survive a crash.
#
# A session with synchronous_commit = off gets leases and the server is
# stopped in immediate mode right afterwards, with the session still
# connected, so nothing but dlock itself can have made the grants durable.
# After the restart every recorded lease must still be held by its owner,
# and no fencing token may be handed out twice: a new grant's token must be
# greater than every token any client saw before the crash, including the
# tokens of grants whose transaction rolled back, and of grants whose
# transaction was still open when the server went down (part 3: more than
# the 32 values a sequence logs ahead, so the token sequence has to write a
# new WAL record inside a transaction that never commits).
#
# Part 4 is the other side: a release that is all its transaction wrote
# commits asynchronously, so a crash can undo it (the key then stays held by
# its owner, never free for anyone else), while a release in a transaction
# that also wrote a table keeps that transaction synchronous.

use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use FindBin;
use lib $FindBin::RealBin;
use DlockCluster;
use DlockFaults;

# Cluster.pm turns fsync off; this test is about durability.  The WAL
# writer is kept from writing WAL in the background for up to 10 s, and
# autovacuum from committing anything, so that what a crash keeps is what
# the test's backends flushed themselves.  Part 4 crashes the server by
# killing one of its processes, after which the postmaster restarts it.
my $node = dlock_node('crash',
	conf => "fsync = on\nwal_writer_delay = 10s\nautovacuum = off\nrestart_after_crash = on\n");
$node->safe_psql('postgres', 'CREATE EXTENSION dlock');

# Highest fencing token seen by any client so far.
my $max_seen = 0;

sub note_fence
{
	my ($fence) = @_;
	$max_seen = $fence if $fence > $max_seen;
	return;
}

# Grant key for an hour in session $s; return (owner, fence).
sub grant
{
	my ($s, $key) = @_;
	my $row = $s->query_safe(
		"SELECT owner, fence FROM dlock.try_acquire('$key', '1 hour')");
	my ($owner, $fence) = split /\|/, $row;
	return ($owner, $fence);
}

# Does $node still hold every lease in %$owners (key => owner)?  Returns
# the keys that were lost.
sub lost_leases
{
	my ($owners) = @_;
	my $values = join(', ',
		map { "('$_', '$owners->{$_}'::uuid)" } sort keys %$owners);
	my $lost = $node->safe_psql(
		'postgres', qq{
		SELECT string_agg(k, ' ' ORDER BY k)
		FROM (VALUES $values) AS v(k, o)
		WHERE dlock.renew(k, o, '1 hour') IS NULL});
	return $lost;
}

#
# Part 1: a few leases, some tokens drawn in a rolled-back transaction.
#
my $s = $node->background_psql('postgres');
$s->query_safe('SET synchronous_commit = off');

my (%owner, @fences);
foreach my $key (qw(k1 k2 k3 k4 k5))
{
	my ($owner, $fence) = grant($s, $key);
	like($fence // '', qr/^\d+$/, "$key granted before the crash");
	$owner{$key} = $owner;
	push @fences, $fence;
	note_fence($fence);
}
my @sorted = sort { $a <=> $b } @fences;
is_deeply(\@fences, \@sorted, 'tokens grow with every grant');

$s->query_safe('BEGIN');
foreach my $i (1 .. 3)
{
	my ($owner, $fence) = grant($s, "rb$i");
	like($fence // '', qr/^\d+$/,
		"rb$i granted in a transaction that will roll back");
	note_fence($fence);
}
$s->query_safe('ROLLBACK');

$node->stop('immediate');
$s->quit;
$node->start;

is(lost_leases(\%owner), '',
	'every lease granted before the crash is still held by its owner');

is( $node->safe_psql(
		'postgres',
		q{SELECT count(*) FROM unnest(ARRAY['k1','k2','k3','k4','k5']) AS k,
		  LATERAL dlock.try_acquire(k, '1 hour') AS l}),
	'0',
	'nobody else can acquire a key held before the crash');

my $new = $node->safe_psql('postgres',
	q{SELECT fence FROM dlock.try_acquire('after1', '1 hour')});
cmp_ok($new, '>', $max_seen,
	'a new token is greater than every token seen before the crash');
note_fence($new);

is( $node->safe_psql(
		'postgres', "SELECT dlock.release('k1', '$owner{k1}')"),
	't',
	'the owner can release a lease granted before the crash');
is( $node->safe_psql(
		'postgres', "SELECT dlock.release('k1', '$owner{k1}')"),
	'f',
	'a second release of that lease is refused');
my $again = $node->safe_psql('postgres',
	q{SELECT fence FROM dlock.try_acquire('k1', '1 hour')});
cmp_ok($again // 0, '>', $max_seen,
	'the released key is granted again with a greater token');
note_fence($again);

#
# Part 2: many grants, each its own asynchronously committed transaction,
# then 50 more in a single transaction, then a crash.
#
$s = $node->background_psql('postgres');
$s->query_safe('SET synchronous_commit = off');

my %many;
foreach my $i (1 .. 100)
{
	my ($owner, $fence) = grant($s, "m$i");
	$many{"m$i"} = $owner;
	note_fence($fence) if defined $fence && $fence =~ /^\d+$/;
}
is(scalar(grep { defined $_ && $_ ne '' } values %many),
	100, '100 leases granted one statement at a time');

my $batch_max = $s->query_safe(
	q{SELECT max(l.fence) FROM generate_series(1, 50) AS i,
	  LATERAL dlock.try_acquire('b' || i, '1 hour') AS l});
like($batch_max, qr/^\d+$/, '50 leases granted in one statement');
note_fence($batch_max) if $batch_max =~ /^\d+$/;

$node->stop('immediate');
$s->quit;
$node->start;

is(lost_leases(\%many), '', 'the 100 leases survived the second crash');
is( $node->safe_psql(
		'postgres',
		q{SELECT count(*) FROM generate_series(1, 50) AS i
		  WHERE NOT EXISTS (SELECT FROM dlock.try_acquire('b' || i, '1 hour'))}),
	'50',
	'the 50 leases granted in one statement survived the second crash');

$new = $node->safe_psql('postgres',
	q{SELECT fence FROM dlock.try_acquire('after2', '1 hour')});
cmp_ok($new, '>', $max_seen,
	'after the second crash, a new token is greater than every token seen');
note_fence($new);

#
# Part 3: 40 grants of distinct keys in one transaction that is still open,
# uncommitted, when the server crashes.  The token sequence logs 32 values
# ahead, so 40 tokens make it write at least one WAL record inside this
# transaction; nothing commits it, so only dlock's own flush before it
# returns a token can keep the sequence from going back below the tokens
# this client saw.
#
$s = $node->background_psql('postgres');
$s->query_safe('SET synchronous_commit = off');
$s->query_safe('BEGIN');

my @lost;
foreach my $i (1 .. 40)
{
	my ($owner, $fence) = grant($s, "lost$i");
	push @lost, $fence if defined $fence && $fence =~ /^\d+$/;
}
is(scalar(@lost), 40, '40 leases granted in a transaction left open');
note_fence($_) foreach @lost;
is_deeply(\@lost, [ sort { $a <=> $b } @lost ],
	'tokens grow with every grant in the open transaction');
cmp_ok($lost[-1] - $lost[0], '>=', 39,
	'the open transaction drew 40 distinct tokens, more than the 32 a sequence logs ahead'
);

$node->stop('immediate');
$s->quit;
$node->start;

is( $node->safe_psql(
		'postgres',
		qq{SELECT count(*), min(l.fence) > $max_seen
		   FROM generate_series(1, 40) AS i,
		   LATERAL dlock.try_acquire('lost' || i, '1 hour') AS l}),
	'40|t',
	'the keys granted in the lost transaction are free, and each is granted again with a token greater than every token seen'
);

$new = $node->safe_psql('postgres',
	q{SELECT fence FROM dlock.try_acquire('after3', '1 hour')});
cmp_ok($new, '>', $max_seen,
	'after the third crash, a new token is greater than every token seen');

is(lost_leases(\%many), '', 'the 100 leases survived the third crash');

#
# Part 4: releases, with synchronous_commit = on in the session.  The WAL
# writer and the background writer are stopped (SIGSTOP): the first would
# flush an asynchronous commit behind the test's back, the second may write
# WAL of its own (a running-transactions record) that makes a flushed
# commit look unflushed.  Then both are killed with SIGKILL, which makes the
# postmaster crash-restart the whole server.
#
$node->safe_psql('postgres', 'CREATE TABLE audit (k text)');
my %rel;
foreach my $key (qw(rel_alone rel_then_write write_then_rel rel_guc))
{
	($rel{$key}) = split /\|/,
	  $node->safe_psql('postgres',
		"SELECT owner, fence FROM dlock.try_acquire('$key', '1 hour')");
}
my @writers = split /\n/,
  $node->safe_psql('postgres',
	q{SELECT pid FROM pg_stat_activity
	  WHERE backend_type IN ('walwriter', 'background writer')});
is(scalar(grep { /^\d+$/ } @writers), 2, 'found the WAL writer and the background writer');
kill 'STOP', @writers;

# a release followed by a write, and a write followed by a release: both
# transactions commit synchronously, as the session asks.  The check runs
# in the same session, once before (so that its catalog lookups are
# cached: a new session's lookups may prune a catalog page, which writes
# WAL that nobody flushes while the WAL writer is stopped) and once after.
my @synced = split /\n/, $node->safe_psql(
	'postgres', qq{
	SELECT pg_current_wal_flush_lsn() >= pg_current_wal_insert_lsn();
	BEGIN;
	SELECT dlock.release('rel_then_write', '$rel{rel_then_write}');
	INSERT INTO audit VALUES ('rel_then_write');
	COMMIT;
	BEGIN;
	INSERT INTO audit VALUES ('write_then_rel');
	SELECT dlock.release('write_then_rel', '$rel{write_then_rel}');
	COMMIT;
	SELECT pg_current_wal_flush_lsn() >= pg_current_wal_insert_lsn()});
is($synced[-1], 't',
	'a release in a transaction that also wrote a table committed synchronously'
);

# dlock.async_release = off: a release alone commits as the session says
is( $node->safe_psql(
		'postgres', qq{
		SET dlock.async_release = off;
		SELECT dlock.release('rel_guc', '$rel{rel_guc}');
		SELECT pg_current_wal_flush_lsn() >= pg_current_wal_insert_lsn()}),
	"t\nt",
	'with dlock.async_release off, a release alone committed synchronously');

# a release alone: its commit is not flushed
is( $node->safe_psql(
		'postgres', qq{
		SELECT dlock.release('rel_alone', '$rel{rel_alone}');
		SELECT pg_current_wal_flush_lsn() < pg_current_wal_insert_lsn()}),
	"t\nt",
	'a release that is all its transaction wrote committed asynchronously');
# a session reading it sees it released: the key is free for a grant, which
# would flush the release along with itself (not done here)
is( $node->safe_psql(
		'postgres', q{SELECT owner IS NULL FROM dlock.leases WHERE key = 'rel_alone'}),
	't',
	'the asynchronous release is visible before the crash');

crash_and_wait($node, @writers)
  or die 'the server did not come back after its writers were killed';

is( $node->safe_psql(
		'postgres', "SELECT dlock.renew('rel_alone', '$rel{rel_alone}', '1 hour') IS NOT NULL"),
	't',
	'the crash undid the asynchronous release: its owner still holds the lease'
);
is( $node->safe_psql(
		'postgres', q{SELECT count(*) FROM dlock.try_acquire('rel_alone', '1 hour')}),
	'0',
	'and nobody else can acquire the key');
is( $node->safe_psql(
		'postgres', q{SELECT string_agg(k, ' ' ORDER BY k) FROM audit}),
	'rel_then_write write_then_rel',
	'the writes committed with a release survived the crash');
is( $node->safe_psql(
		'postgres',
		q{SELECT count(*) FROM unnest(ARRAY['rel_then_write', 'write_then_rel']) AS k,
		  LATERAL dlock.try_acquire(k, '1 hour') AS l}),
	'2',
	'and so did their releases: both keys are free');
is( $node->safe_psql(
		'postgres', q{SELECT count(*) FROM dlock.try_acquire('rel_guc', '1 hour')}),
	'1',
	'the release made with dlock.async_release off survived the crash');

$node->stop;
done_testing();
