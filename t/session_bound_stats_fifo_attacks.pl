# What an attack on dlock 0.3 found, each kept from coming back.
#
# a. Not preloaded: an ordinary role connecting with PGOPTIONS cannot lift
#    the dlock.max_hold that an administrator set with ALTER ROLE ... SET
#    (PostgreSQL 15 replaces the role's placeholder with the refused
#    startup value), not even by making the transaction that loads dlock
#    roll back.
# b. Preloaded (FIFO queue): a transaction that holds its own grant of a
#    key and calls acquire() on it again does not wait behind a competitor
#    that queued meanwhile (which waits for that transaction's lock).
# c. DISCARD ALL and pg_advisory_unlock_all() end the connection's
#    session-bound leases, and wake their waiters at once, not at the TTL.
# d. A session-bound lease with a lock_delay whose connection ended is free
#    at once, also when nobody looked at it before its TTL passed.
# e. acquire()'s wait time in dlock.stats includes its last sleep.
# f. With more expired keys than dlock.stats_max, reading the views again
#    and again does not count the same expiries again, also when other keys
#    keep evicting entries in between.
# g. (a) also when the administrator spelled the setting with capitals.
# h. A transaction that released the key, or writes under it, cannot jump
#    the FIFO queue with acquire(): 55P03 at once, and the waiter gets it.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use FindBin;
use lib $FindBin::RealBin;
use DlockCluster;

# ---- a: not preloaded ----------------------------------------------------
my $plain = dlock_node('plain');
$plain->safe_psql('postgres', q{
	CREATE EXTENSION dlock;
	CREATE ROLE worker LOGIN;
	ALTER ROLE worker SET dlock.max_hold = '2s';
});

# Run sql as worker with a startup option that tries to lift the cap.
sub as_worker_lifting
{
	my ($sql) = @_;
	local $ENV{PGOPTIONS} = '-c dlock.max_hold=0';
	my ($rc, $out, $err) = $plain->psql('postgres', $sql,
		extra_params => [ '-U', 'worker' ], on_error_stop => 0);
	return ($rc, $out, $err);
}

my ($rc, $out, $err) = as_worker_lifting(q{
	SELECT count(*) FROM dlock.try_acquire('a:1', '1 hour');
	SELECT expires_at - granted_at = '2s' FROM dlock.lease_status WHERE key = 'a:1';
	SHOW dlock.max_hold;
});
is($out, "1\nt\n2s", 'PGOPTIONS of an ordinary role does not lift ALTER ROLE SET dlock.max_hold');
like($err, qr/permission denied to set parameter "dlock.max_hold"/,
	'the refused startup value is reported');

$plain->safe_psql('postgres', q{
	CREATE ROLE worker2 LOGIN;
	ALTER ROLE worker2 SET "Dlock.Max_Hold" = '3s';
});
{
	local $ENV{PGOPTIONS} = '-c dlock.max_hold=0';
	($rc, $out, $err) = $plain->psql('postgres', q{
		SELECT count(*) FROM dlock.try_acquire('g:1', '1 hour');
		SELECT expires_at - granted_at = '3s' FROM dlock.lease_status WHERE key = 'g:1';
	}, extra_params => [ '-U', 'worker2' ], on_error_stop => 0);
}
is($out, "1\nt", 'g: a cap set as "Dlock.Max_Hold" is not lifted either');

($rc, $out, $err) = as_worker_lifting(q{
	BEGIN;
	SELECT dlock.try_acquire(NULL, '1 hour');
	ROLLBACK;
	SELECT count(*) FROM dlock.try_acquire('a:2', '1 hour');
	SELECT expires_at - granted_at = '2s' FROM dlock.lease_status WHERE key = 'a:2';
});
is($out, "1\nt", 'the cap holds after the transaction that loaded dlock rolled back');

# ---- b to f: preloaded ---------------------------------------------------
my $node = dlock_node('preloaded', conf => qq{
shared_preload_libraries = 'dlock'
dlock.stats_max = 100
});
$node->safe_psql('postgres', 'CREATE EXTENSION dlock');

sub session { return backend_session($node, 'postgres') }

sub sleeping
{
	my ($pid, $what) = @_;
	ok(sleeps_in_dlock($node, 'postgres', $pid), "$what: asleep on its latch");
}

# b. T1 holds its own uncommitted grant and acquires the key again after a
#    competitor queued: T1 is granted again once its 1 s lease expires,
#    within its 10 s wait, instead of timing out behind the competitor.
my ($t1, $t1pid) = session();
$t1->query_safe(q{BEGIN; SELECT fence FROM dlock.try_acquire('b:1', '1s')});
my ($t2, $t2pid) = session();
$t2->query_until(qr/waiting/, q{
	\echo waiting
	SELECT fence > 0 AS t2_granted FROM dlock.acquire('b:1', '1s');
});
sleeping($t2pid, 'the competitor queued behind the uncommitted grant');
my $again = $t1->query(q{
	SELECT count(*) FROM dlock.acquire('b:1', '1s', wait => '10s')});
is($again, '1', 'a transaction acquiring its own key again does not wait behind the queue');
$t1->query_safe('COMMIT');
$t1->quit;
ok( $node->poll_query_until('postgres', q{
		SELECT state = 'held' FROM dlock.lease_status WHERE key = 'b:1'
		AND pid <> } . $t1pid),
	'the competitor is granted after that');
$t2->quit;

# c. DISCARD ALL and pg_advisory_unlock_all() wake the waiters of the
#    connection's session-bound leases.
for my $reset ('DISCARD ALL', 'SELECT pg_advisory_unlock_all()')
{
	my ($h, $hpid) = session();
	$h->query_safe(q{SELECT fence FROM dlock.try_acquire('c:1', '1 hour', session_bound => true)});
	my ($w, $wpid) = session();
	$w->query_until(qr/waiting/, q{
		\echo waiting
		SELECT clock_timestamp() - statement_timestamp() < '30s' AS woken_early
		FROM dlock.acquire('c:1', '1s', wait => '60s');
	});
	sleeping($wpid, "a waiter for a session-bound lease ($reset)");
	$h->query_safe($reset);
	ok( $node->poll_query_until('postgres',
			"SELECT count(*) = 0 FROM pg_stat_activity WHERE pid = $wpid AND wait_event_type = 'Extension'"),
		"$reset: the waiter is woken");
	is( $node->safe_psql('postgres',
			"SELECT pid = $wpid FROM dlock.lease_status WHERE key = 'c:1'"),
		't', "$reset: the waiter was granted the key");
	$w->quit;
	$h->quit;
	$node->safe_psql('postgres', q{
		SELECT dlock.release('c:1', owner) FROM dlock.leases WHERE key = 'c:1'});
}

# d. The lease of a connection that ended carries no lock delay, even once
#    its TTL has passed before anybody looked.
$node->safe_psql('postgres', q{
	SELECT fence FROM dlock.try_acquire('d:1', '200ms', lock_delay => '1 hour', session_bound => true)});
$node->poll_query_until('postgres', q{
	SELECT expires_at < clock_timestamp() FROM dlock.leases WHERE key = 'd:1'});
is( $node->safe_psql('postgres', q{SELECT count(*) FROM dlock.try_acquire('d:1', '1s')}),
	'1', 'no lock delay after the connection of a session-bound lease ended');
# ... while a lease whose connection is up and that ran out keeps its delay
my ($k, $kpid) = session();
$k->query_safe(q{
	SELECT fence FROM dlock.try_acquire('d:2', '200ms', lock_delay => '1 hour', session_bound => true)});
$node->poll_query_until('postgres', q{
	SELECT expires_at < clock_timestamp() FROM dlock.leases WHERE key = 'd:2'});
is( $node->safe_psql('postgres', q{SELECT count(*) FROM dlock.try_acquire('d:2', '1s')}),
	'0', 'the lock delay holds while the connection is up');
$k->quit;

# e. wait time includes the last sleep
$node->safe_psql('postgres', q{
	SELECT dlock.stats_reset();
	SELECT fence FROM dlock.try_acquire('e:1', '3s')});
$node->safe_psql('postgres', q{SELECT fence FROM dlock.acquire('e:1', '1s')});
my $waits = $node->safe_psql('postgres', q{
		SELECT contended, wait_time_max > '1s', wait_time_total = wait_time_max
		FROM dlock.stats WHERE key = 'e:1'});
is($waits, '1|t|t', "acquire's wait time counts its last sleep");

# f. 300 leases expire with room for 100 keys: views read again and again
#    count each expiry at most once.
$node->safe_psql('postgres', q{
	CREATE DATABASE many;
});
$node->safe_psql('many', q{
	CREATE EXTENSION dlock;
	SELECT count(*) FROM generate_series(1, 300) i, dlock.try_acquire('f:' || i, '10ms');
});
$node->poll_query_until('many', q{
	SELECT bool_and(expires_at < clock_timestamp()) FROM dlock.leases});
my @expired;
for (1 .. 4)
{
	$node->safe_psql('many', 'SELECT count(*) FROM dlock.lease_status');
	push @expired, $node->safe_psql('many',
		'SELECT expired FROM dlock.stats WHERE key IS NULL');
}
ok($expired[-1] <= 300, "expiries counted at most once per lease (@expired)");
is($expired[0], $expired[-1], 'repeated reads of the views count nothing new');
cmp_ok( $node->safe_psql('many', 'SELECT count(*) FROM dlock.stats WHERE key IS NOT NULL'),
	'<=', 100, 'at most dlock.stats_max keys have rows');

# f, again: other keys' activity evicts entries between the reads
for (1 .. 3)
{
	$node->safe_psql('many', q{
		SELECT count(dlock.release(key, owner))
		FROM generate_series(301, 450) i, dlock.try_acquire('fx:' || i, '1 hour')});
	$node->safe_psql('many', 'SELECT count(*) FROM dlock.lease_status');
	push @expired, $node->safe_psql('many',
		'SELECT expired FROM dlock.stats WHERE key IS NULL');
}
is($expired[-1], $expired[3], "evictions in between: still nothing counted again (@expired)");

# h. No jumping the queue from a transaction holding the key's lock.
$node->safe_psql('postgres', q{
	CREATE TABLE h_owner AS SELECT owner, fence FROM dlock.try_acquire('h:1', '1 hour')});
my ($hw, $hwpid) = session();
$hw->query_until(qr/waiting/, q{
	\echo waiting
	SELECT count(*) AS hw_granted FROM dlock.acquire('h:1', '1 hour', wait => '60s');
});
sleeping($hwpid, 'h: a waiter queued for a held key');
($rc, $out, $err) = $node->psql('postgres', q{
	BEGIN;
	SELECT dlock.release('h:1', owner) FROM h_owner;
	SELECT count(*) FROM dlock.acquire('h:1', '1 hour');
	COMMIT;
});
like($err, qr/cannot wait for the lease on "h:1" in a transaction that holds the key/,
	'h: release + acquire in one transaction does not jump the queue');
$node->safe_psql('postgres', q{SELECT dlock.release('h:1', owner) FROM h_owner});
ok( $node->poll_query_until('postgres',
		"SELECT pid = $hwpid FROM dlock.lease_status WHERE key = 'h:1' AND state = 'held'"),
	'h: the waiter gets the key');
$hw->quit;
# a stranger presenting the (public) current token cannot jump it either
$node->safe_psql('postgres', q{
	SELECT dlock.release(key, owner) FROM dlock.leases WHERE key = 'h:1';
	SELECT fence FROM dlock.try_acquire('h:1', '1 hour')});
($hw, $hwpid) = session();
$hw->query_until(qr/waiting/, q{
	\echo waiting
	SELECT count(*) AS hw_granted FROM dlock.acquire('h:1', '1 hour', wait => '60s');
});
sleeping($hwpid, 'h: another waiter queued');
($rc, $out, $err) = $node->psql('postgres', q{
	BEGIN;
	SELECT dlock.use_fence('h:1', fence) FROM dlock.lease_status WHERE key = 'h:1';
	SELECT count(*) FROM dlock.acquire('h:1', '1 hour');
	COMMIT;
});
like($err, qr/cannot wait for the lease on "h:1" in a transaction that holds the key/,
	'h: use_fence + acquire does not jump the queue');
$node->safe_psql('postgres', "SELECT pg_cancel_backend($hwpid)");
$hw->quit;

# no backend crashed or failed an assertion on the way
my $log = slurp_file($node->logfile);
unlike($log, qr/TRAP:|PANIC:|terminated by signal/, 'no crash in the server log');

done_testing();
