# Blocking acquire(): woken by a release from another connection (not by the
# lease's expiry, one hour away), woken by expiry, interrupted by cancel, and
# one waiter at a time granted when several wait.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use FindBin;
use lib $FindBin::RealBin;
use DlockCluster;

my $node = dlock_node('wakeup');
$node->safe_psql('postgres', q{
	CREATE EXTENSION dlock;
	CREATE TABLE woken (who text, fence bigint, waited interval);
});

# Start a session that waits in dlock.acquire() and records what it got.
sub start_waiter
{
	my ($who, $key, $wait) = @_;
	my $s = $node->background_psql('postgres', on_error_stop => 0);
	$s->query_until(qr/waiting/, qq{
		\\echo waiting
		INSERT INTO woken SELECT '$who', fence, clock_timestamp() - statement_timestamp()
		FROM dlock.acquire('$key', '1 hour', $wait);
	});
	return $s;
}

# Wait until n backends sleep in acquire() (wait event Extension).
sub wait_for_sleepers
{
	my ($n) = @_;
	ok( $node->poll_query_until('postgres', qq{
			SELECT count(*) = $n FROM pg_stat_activity
			WHERE wait_event_type = 'Extension' AND query LIKE '%dlock.acquire%'}),
		"$n waiter(s) asleep in acquire()");
}

# 1. Release wakes the waiter long before the lease would expire.
my ($owner) = split /\|/, $node->safe_psql('postgres',
	"SELECT owner FROM dlock.try_acquire('rel', '1 hour')");
my $w = start_waiter('release', 'rel', "'5 minutes'");
wait_for_sleepers(1);
is($node->safe_psql('postgres', "SELECT dlock.release('rel', '$owner')"),
	't', 'holder released from another connection');
ok($node->poll_query_until('postgres',
		"SELECT count(*) = 1 FROM woken WHERE who = 'release'"),
	'waiter was granted after the release');
is($node->safe_psql('postgres',
		"SELECT waited < interval '20 seconds' FROM woken WHERE who = 'release'"),
	't', 'the waiter did not sleep until the lease (1 hour) or its wait (5 minutes) ran out');
$w->quit;

# 2. Expiry wakes a waiter with no wait limit of its own.
$node->safe_psql('postgres', "SELECT dlock.try_acquire('exp', '2 seconds')");
$w = start_waiter('expiry', 'exp', 'NULL');
ok($node->poll_query_until('postgres',
		"SELECT count(*) = 1 FROM woken WHERE who = 'expiry'"),
	'waiter was granted after the expiry');
is($node->safe_psql('postgres',
		"SELECT waited >= interval '1 second' AND waited < interval '1 minute' FROM woken WHERE who = 'expiry'"),
	't', 'granted once the 2 second lease had expired, not before');
$w->quit;

# 2b. A renewal that shortens the lease wakes the waiter, which then gets
# the key at the new, earlier expiry rather than the old one (1 hour).
my ($sowner) = $node->safe_psql('postgres',
	"SELECT owner FROM dlock.try_acquire('short', '1 hour')");
$w = start_waiter('shortened', 'short', 'NULL');
wait_for_sleepers(1);
is($node->safe_psql('postgres',
		"SELECT dlock.renew('short', '$sowner', '1 second') IS NOT NULL"),
	't', 'holder shortened its lease to 1 second');
ok($node->poll_query_until('postgres',
		"SELECT count(*) = 1 FROM woken WHERE who = 'shortened'"),
	'waiter was granted after the shortened lease expired');
is($node->safe_psql('postgres',
		"SELECT waited < interval '20 seconds' FROM woken WHERE who = 'shortened'"),
	't', 'the waiter did not sleep until the old expiry');
$w->quit;

# 3. Query cancel interrupts a waiter at once.
$node->safe_psql('postgres', "SELECT dlock.try_acquire('cancel', '1 hour')");
$w = start_waiter('cancel', 'cancel', 'NULL');
wait_for_sleepers(1);
$node->safe_psql('postgres', q{
	SELECT pg_cancel_backend(pid) FROM pg_stat_activity
	WHERE wait_event_type = 'Extension' AND query LIKE '%dlock.acquire%'});
ok($node->poll_query_until('postgres', q{
		SELECT count(*) = 0 FROM pg_stat_activity
		WHERE state = 'active' AND query LIKE '%dlock.acquire%' AND pid <> pg_backend_pid()}),
	'cancelled waiter stopped waiting');
is($node->safe_psql('postgres', "SELECT count(*) FROM woken WHERE who = 'cancel'"),
	'0', 'cancelled waiter was not granted');
$w->quit;

# 4. Three waiters on one key: each release grants exactly one of them.
($owner) = $node->safe_psql('postgres',
	"SELECT owner FROM dlock.try_acquire('many', '1 hour')");
my @w = map { start_waiter("many$_", 'many', 'NULL') } 1 .. 3;
wait_for_sleepers(3);
for my $round (1 .. 3)
{
	is($node->safe_psql('postgres', "SELECT dlock.release('many', '$owner')"),
		't', "round $round: holder released");
	ok($node->poll_query_until('postgres',
			"SELECT count(*) = $round FROM woken WHERE who LIKE 'many%'"),
		"round $round: one more waiter granted");
	wait_for_sleepers(3 - $round);
	is($node->safe_psql('postgres',
			"SELECT count(*) FROM woken WHERE who LIKE 'many%'"),
		$round, "round $round: exactly $round granted so far");
	# The new holder's owner is not recorded by the waiter; read it (as superuser).
	$owner = $node->safe_psql('postgres',
		"SELECT owner FROM dlock.leases WHERE key = 'many'");
}
is($node->safe_psql('postgres',
		"SELECT count(DISTINCT fence) FROM woken WHERE who LIKE 'many%'"),
	'3', 'each waiter got its own token');
$_->quit for @w;

$node->stop;
done_testing();
