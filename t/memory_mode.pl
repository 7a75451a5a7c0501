# Memory mode (dlock.storage = memory, issue 10): what it promises.
#
# 1. The leases live in shared memory: try_acquire, renew and release work,
#    lease_status shows the leases, dlock.leases stays empty, and a renewal
#    that ends before the horizon and a release write no WAL at all.
# 2. Transactions, exactly as in table mode (the same checks run on a
#    table-mode server as the reference): a rolled-back grant, renewal or
#    release is undone, by ROLLBACK and by ROLLBACK TO SAVEPOINT; an
#    uncommitted change is seen by its own transaction only, and while it
#    is open another session's try_acquire of the key returns no row (the
#    key lock is busy).
# 3. A crash (a backend killed with SIGKILL, the postmaster restarts the
#    server): the leases are gone, so until the horizon (dlock.horizon_seq,
#    at least the end of every lease granted) every key is held by an
#    unknown owner: the key that was held and a key never used are both
#    refused, acquire times out with 55P03, and a fenced write presenting
#    the old token is refused with LF001 at once.  Then grants come back,
#    with tokens greater than every token issued before, including the
#    tokens of a transaction that was still open at the crash.  The same
#    after an immediate shutdown and a start (round 2).  The horizon also
#    covers a lease's lock delay.
# 4. pg_dump and restore into a fresh database of a memory-mode server: the
#    horizon comes along, grants are refused until it, tokens stay greater.
# 5. Promotion of a synchronous standby: the horizon and the tokens reached
#    the standby before the grants returned; on the promoted node grants are
#    refused until the horizon, and its tokens are greater.
# 6. Switching table -> memory: until the end of the latest lease of the
#    table (its lock delay included) every key is refused.  Switching memory -> table: grants are
#    refused in table mode too until the horizon.
# 7. Extension 0.3 on a memory-mode server: a clear error (not XX000);
#    ALTER EXTENSION dlock UPDATE to 0.4 creates dlock.horizon_seq, and
#    memory mode then works.
#
# The waits of parts 3 to 6 run side by side on four servers, in two
# rounds, with TTLs of 3 s, so that the test takes about a minute.

use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use FindBin;
use lib $FindBin::RealBin;
use DlockCluster;
use DlockFaults;
use Time::HiRes qw(usleep time);
use List::Util qw(min max);

my $common = q{
shared_preload_libraries = 'dlock'
dlock.max_ttl = '30s'
autovacuum = off
restart_after_crash = on
};

# Grant $key for $ttl; return owner, fence, expiry (epoch seconds) and the
# expiry as text; an empty list when refused.
sub grant
{
	my ($node, $db, $key, $ttl) = @_;
	return split /\|/, $node->safe_psql($db, qq{
		SELECT owner, fence, extract(epoch FROM expires_at), expires_at
		FROM dlock.try_acquire('$key', '$ttl')});
}

# How many grants another session gets for $key (0 or 1).
sub grants
{
	my ($node, $db, $key, $ttl) = @_;
	return $node->safe_psql($db,
		"SELECT count(*) FROM dlock.try_acquire('$key', '$ttl')");
}

# The horizon of database $db (epoch seconds), or undef if unreadable.
sub horizon
{
	my ($node, $db) = @_;
	my ($state, $out, $err) = try_sql($node, $db, q{
		SELECT extract(epoch FROM timestamptz '2000-01-01 00:00:00+00')
			   + last_value / 1000000.0
		FROM dlock.horizon_seq});
	diag("horizon_seq unreadable: $err") if $state ne '';
	return $state eq '' ? $out : undef;
}

#
# The servers.
#
my $mem = dlock_node('mem', conf => $common . "dlock.storage = memory\n");
$mem->safe_psql('postgres', 'CREATE EXTENSION dlock');

# table mode first (part 2's reference, then the switches of part 6)
my $sw = dlock_node('switch', conf => $common . "dlock.storage = table\n");
$sw->safe_psql('postgres', 'CREATE EXTENSION dlock');

my $primary = dlock_node('primary', streaming => 1,
	conf => $common . "dlock.storage = memory\n");
$primary->safe_psql('postgres', 'CREATE EXTENSION dlock');
my $standby = sync_standby($primary, 'standby', 'the standby is synchronous');

#
# Part 1: leases in shared memory.
#
is($mem->safe_psql('postgres', 'SHOW dlock.storage'), 'memory', 'SHOW dlock.storage: memory');
is($sw->safe_psql('postgres', 'SHOW dlock.storage'), 'table', 'SHOW dlock.storage: table');
is($standby->safe_psql('postgres', 'SHOW dlock.storage'), 'memory',
	'the standby runs in memory mode too');
is($mem->safe_psql('postgres', q{SELECT extversion FROM pg_extension WHERE extname = 'dlock'}),
	'0.7', 'a fresh install is version 0.7');

my ($oa, $fa, $ea, $ta) = grant($mem, 'postgres', 'm:a', '3 s');
like($fa // '', qr/^\d+$/, 'memory: try_acquire grants');
is(grants($mem, 'postgres', 'm:a', '3 s'), '0', 'memory: another session is refused');
is($mem->safe_psql('postgres', q{
		SELECT count(*) FROM generate_series(1, 20) AS i,
		LATERAL dlock.try_acquire('m:many' || i, '3 s')}),
	'20', 'memory: 20 more keys granted');
is($mem->safe_psql('postgres', 'SELECT count(*) FROM dlock.leases'), '0',
	'memory: dlock.leases is empty while 21 leases are held');
is($mem->safe_psql('postgres', q{
		SELECT count(*) FROM dlock.lease_status WHERE state = 'held' AND key LIKE 'm:%'}),
	'21', 'memory: lease_status shows the 21 leases held');
is($mem->safe_psql('postgres',
		"SELECT state, fence, expires_at = '$ta'::timestamptz FROM dlock.lease_status WHERE key = 'm:a'"),
	"held|$fa|t", 'memory: lease_status shows the lease with its token and expiry');
is($mem->safe_psql('postgres',
		"SELECT extract(epoch FROM dlock.renew('m:a', '$oa', '3 s')) >= $ea"),
	't', 'memory: the owner renews');
is($mem->safe_psql('postgres',
		"SELECT dlock.renew('m:a', gen_random_uuid(), '3 s') IS NULL"),
	't', 'memory: a stranger cannot renew');
is($mem->safe_psql('postgres', "SELECT dlock.release('m:a', gen_random_uuid())"),
	'f', 'memory: a stranger cannot release');

# No WAL: the lease just granted pushed the horizon past its end, so a
# renewal ending earlier has nothing durable to do, nor has a release.
my $lsn0 = $mem->safe_psql('postgres', 'SELECT pg_current_wal_insert_lsn()');
is($mem->safe_psql('postgres', "SELECT dlock.renew('m:a', '$oa', '2 s') IS NOT NULL"),
	't', 'memory: the owner renews for less');
is($mem->safe_psql('postgres', "SELECT dlock.release('m:a', '$oa')"), 't',
	'memory: the owner releases');
is($mem->safe_psql('postgres', 'SELECT pg_current_wal_insert_lsn()'), $lsn0,
	'memory: that renewal and the release wrote no WAL');
is($mem->safe_psql('postgres', "SELECT dlock.release('m:a', '$oa')"), 'f',
	'memory: a second release is refused');
is($mem->safe_psql('postgres', "SELECT dlock.renew('m:a', '$oa', '3 s') IS NULL"),
	't', 'memory: a released lease cannot be renewed');
is($mem->safe_psql('postgres',
		q{SELECT count(*) FROM dlock.lease_status WHERE key = 'm:a' AND state = 'held'}),
	'0', 'memory: lease_status no longer shows it held');
my (undef, $fa2) = grant($mem, 'postgres', 'm:a', '3 s');
cmp_ok($fa2 // 0, '>', $fa, 'memory: the key is granted again, with a greater token');
is($mem->safe_psql('postgres', 'SELECT count(*) FROM dlock.leases'), '0',
	'memory: dlock.leases is still empty');

#
# Part 2: transactions, in both modes.
#
sub tx_semantics
{
	my ($node, $mode) = @_;
	my $s1 = $node->background_psql('postgres');
	my $held = sub {
		my ($key) = @_;
		return $node->safe_psql('postgres',
			"SELECT count(*) FROM dlock.lease_status WHERE key = '$key' AND state = 'held'");
	};
	my $held_s1 = sub {
		my ($key) = @_;
		return $s1->query_safe(
			"SELECT count(*) FROM dlock.lease_status WHERE key = '$key' AND state = 'held'");
	};

	# a rolled-back grant
	$s1->query_safe('BEGIN');
	my (undef, $f) = split /\|/,
	  $s1->query_safe("SELECT owner, fence FROM dlock.try_acquire('rb', '5 s')");
	like($f // '', qr/^\d+$/, "$mode: granted in an open transaction");
	is($s1->query_safe("SELECT state, fence FROM dlock.lease_status WHERE key = 'rb'"),
		"held|$f", "$mode: the open transaction sees its own grant in lease_status");
	is($held->('rb'), '0',
		"$mode: another session does not see the uncommitted grant as held");
	is(grants($node, 'postgres', 'rb', '5 s'), '0',
		"$mode: but its try_acquire returns no row while the grant is uncommitted");
	$s1->query_safe('ROLLBACK');
	is($held_s1->('rb'), '0', "$mode: after ROLLBACK the grant is gone for its session too");
	my (undef, $f2) = grant($node, 'postgres', 'rb', '5 s');
	cmp_ok($f2 // 0, '>', $f,
		"$mode: after ROLLBACK another session takes the key at once, with a greater token");

	# a grant rolled back to a savepoint; one kept by RELEASE SAVEPOINT
	$s1->query_safe('BEGIN');
	my (undef, $fk) = split /\|/,
	  $s1->query_safe("SELECT owner, fence FROM dlock.try_acquire('keep', '5 s')");
	$s1->query_safe('SAVEPOINT a');
	my ($ou) = $s1->query_safe("SELECT owner FROM dlock.try_acquire('undo', '5 s')");
	like($ou, qr/^[0-9a-f-]{36}$/, "$mode: granted in a savepoint");
	$s1->query_safe('ROLLBACK TO SAVEPOINT a');
	is($held_s1->('undo'), '0', "$mode: ROLLBACK TO SAVEPOINT undoes the grant for its session");
	is($held_s1->('keep'), '1', "$mode: ... but not the grant made before the savepoint");
	is(grants($node, 'postgres', 'undo', '5 s'), '1',
		"$mode: another session takes the undone key while the transaction is still open");
	$s1->query_safe('SAVEPOINT b');
	$s1->query_safe("SELECT owner FROM dlock.try_acquire('sub', '5 s')");
	$s1->query_safe('RELEASE SAVEPOINT b');
	$s1->query_safe('COMMIT');
	like($node->safe_psql('postgres', q{
			SELECT string_agg(key || ':' || fence, ' ' ORDER BY key) FROM dlock.lease_status
			WHERE key IN ('keep', 'sub') AND state = 'held'}),
		qr/^keep:$fk sub:\d+$/,
		"$mode: the grants before the savepoint and in a released savepoint committed");
	is(grants($node, 'postgres', 'keep', '5 s') . grants($node, 'postgres', 'sub', '5 s'),
		'00', "$mode: and nobody else gets those keys");

	# a rolled-back release
	my ($o) = grant($node, 'postgres', 'rel', '5 s');
	$s1->query_safe('BEGIN');
	is($s1->query_safe("SELECT dlock.release('rel', '$o')"), 't',
		"$mode: released in an open transaction");
	is($held_s1->('rel'), '0', "$mode: its session sees the key released");
	is($held->('rel'), '1', "$mode: another session still sees it held");
	is(grants($node, 'postgres', 'rel', '5 s'), '0',
		"$mode: and its try_acquire returns no row while the release is uncommitted");
	$s1->query_safe('ROLLBACK');
	is($node->safe_psql('postgres', "SELECT dlock.renew('rel', '$o', '5 s') IS NOT NULL"),
		't', "$mode: after ROLLBACK of the release the owner still holds the lease");
	is(grants($node, 'postgres', 'rel', '5 s'), '0', "$mode: and nobody else gets the key");
	$s1->query_safe('BEGIN');
	$s1->query_safe('SAVEPOINT a');
	$s1->query_safe("SELECT dlock.release('rel', '$o')");
	$s1->query_safe('ROLLBACK TO SAVEPOINT a');
	$s1->query_safe('COMMIT');
	is($node->safe_psql('postgres', "SELECT dlock.renew('rel', '$o', '5 s') IS NOT NULL"),
		't', "$mode: a release rolled back to a savepoint is undone too");
	$s1->query_safe('BEGIN');
	$s1->query_safe("SELECT dlock.release('rel', '$o')");
	$s1->query_safe('COMMIT');
	is(grants($node, 'postgres', 'rel', '5 s'), '1',
		"$mode: a committed release frees the key");

	# a rolled-back renewal
	my ($or, undef, undef, $er) = grant($node, 'postgres', 'rn', '5 s');
	my $same = "SELECT expires_at = '$er'::timestamptz FROM dlock.lease_status WHERE key = 'rn'";
	$s1->query_safe('BEGIN');
	my $later = $s1->query_safe("SELECT dlock.renew('rn', '$or', '8 s')");
	is($s1->query_safe("SELECT '$later'::timestamptz > '$er'::timestamptz"), 't',
		"$mode: renewed for longer in an open transaction");
	is($s1->query_safe(
			"SELECT expires_at = '$later'::timestamptz FROM dlock.lease_status WHERE key = 'rn'"),
		't', "$mode: its session sees the new expiry");
	is($node->safe_psql('postgres', $same), 't', "$mode: another session sees the old expiry");
	$s1->query_safe('ROLLBACK');
	is($node->safe_psql('postgres', $same), 't',
		"$mode: after ROLLBACK the lease has its old expiry");
	$s1->query_safe('BEGIN');
	$s1->query_safe('SAVEPOINT a');
	$s1->query_safe("SELECT dlock.renew('rn', '$or', '8 s')");
	$s1->query_safe('ROLLBACK TO SAVEPOINT a');
	$s1->query_safe('COMMIT');
	is($node->safe_psql('postgres', $same), 't',
		"$mode: a renewal rolled back to a savepoint leaves the old expiry");
	$later = $node->safe_psql('postgres', "SELECT dlock.renew('rn', '$or', '6 s')");
	is($node->safe_psql('postgres',
			"SELECT expires_at = '$later'::timestamptz FROM dlock.lease_status WHERE key = 'rn'"),
		't', "$mode: a committed renewal sets the expiry it returned");

	$s1->quit;
	return;
}

tx_semantics($sw, 'table');
tx_semantics($mem, 'memory');
is($mem->safe_psql('postgres', 'SELECT count(*) FROM dlock.leases'), '0',
	'memory: dlock.leases is still empty after the transactions');

#
# Part 7: an extension still at 0.3.
#
$mem->safe_psql('postgres', 'CREATE DATABASE v03');
$mem->safe_psql('v03', "CREATE EXTENSION dlock VERSION '0.3'");
my ($st, $out, $err) =
  try_sql($mem, 'v03', "SELECT count(*) FROM dlock.try_acquire('old', '3 s')");
isnt($st, '', '0.3 in memory mode: try_acquire fails');
isnt($st, 'XX000', '0.3 in memory mode: not with an internal error');
like($err, qr/0\.4|ALTER EXTENSION|update/i, '0.3 in memory mode: the error says to update');
note "0.3 in memory mode: $err";
($st, $out, $err) = try_sql($mem, 'v03', 'ALTER EXTENSION dlock UPDATE');
is($st, '', 'ALTER EXTENSION dlock UPDATE from 0.3');
is($mem->safe_psql('v03', q{SELECT extversion FROM pg_extension WHERE extname = 'dlock'}),
	'0.7', 'updated to 0.7 (through 0.4)');
is($mem->safe_psql('v03', q{
		SELECT count(*) FROM pg_depend
		WHERE objid = to_regclass('dlock.horizon_seq') AND deptype = 'e'
		  AND refobjid = (SELECT oid FROM pg_extension WHERE extname = 'dlock')}),
	'1', 'the update created dlock.horizon_seq as a member of the extension');
is(grants($mem, 'v03', 'old', '3 s'), '1', 'after the update memory mode grants');
is($mem->safe_psql('v03', 'SELECT count(*) FROM dlock.leases'), '0',
	'... without writing dlock.leases');
ok(defined horizon($mem, 'v03'), 'the horizon is readable');

#
# The waits.  A watcher polls try_acquire of its keys (one held before the
# event, one never used) on its node until each is granted, and records
# when (the grant time is the lease's expiry minus its 2 s).
#
sub watcher
{
	my (%w) = @_;
	$w{granted} = {};
	$w{polls} = 0;
	return \%w;
}

sub await_all
{
	my @w = @_;
	my $deadline = max(map { ($_->{horizon} // $_->{ends} + 10) + 10 } @w);
	while (time() < $deadline)
	{
		my $pending = 0;
		foreach my $w (@w)
		{
			next if $w->{error};
			my @keys = grep { !$w->{granted}{$_} } @{ $w->{keys} };
			next unless @keys;
			$pending++;
			my $list = join(',', map { "'$_'" } @keys);
			my ($state, $out, $err) = try_sql($w->{node}, $w->{db}, qq{
				SELECT u.k, l.fence, extract(epoch FROM l.expires_at - interval '2 s')
				FROM unnest(ARRAY[$list]::text[]) WITH ORDINALITY AS u(k, i)
				LEFT JOIN LATERAL dlock.try_acquire(u.k, '2 s') AS l ON true
				ORDER BY u.i});
			if ($state ne '')
			{
				$w->{error} = $err;
				next;
			}
			my $refused = 0;
			foreach my $row (split /\n/, $out)
			{
				my ($k, $fence, $at) = split /\|/, $row;
				if (defined $fence && $fence ne '')
				{
					$w->{granted}{$k} = { fence => $fence, at => $at };
				}
				else
				{
					$refused++;
				}
			}
			$w->{first_all_refused} = ($refused == @keys) if $w->{polls} == 0;
			$w->{polls}++;
		}
		last unless $pending;
		usleep(200_000);
	}
	return;
}

sub check_watcher
{
	my ($w) = @_;
	my $n = $w->{name};
	is($w->{error}, undef, "$n: no error while polling");
	ok($w->{first_all_refused}, "$n: at first the keys held and a key never used are all refused");
	my @got = map { $w->{granted}{$_} } grep { $w->{granted}{$_} } @{ $w->{keys} };
	is(scalar(@got), scalar(@{ $w->{keys} }), "$n: all of them are granted again later");
	return unless @got;
	my $first = min(map { $_->{at} } @got);
	my $last = max(map { $_->{at} } @got);
	cmp_ok($first, '>=', $w->{ends},
		"$n: no key was granted before the end of the leases held before");
	if (exists $w->{horizon})
	{
		ok(defined $w->{horizon}, "$n: the horizon was readable") or return;
		cmp_ok($w->{horizon}, '>=', $w->{ends}, "$n: the horizon is at or after that lease's end");
		cmp_ok($first, '>=', $w->{horizon}, "$n: no key was granted before the horizon");
	}
	cmp_ok($last, '<=', ($w->{horizon} // $w->{ends} + 10) + 5,
		"$n: grants resumed soon after the horizon");
	cmp_ok(min(map { $_->{fence} } @got), '>', $w->{max_token},
		"$n: the new tokens are greater than every token issued before");
	note sprintf("%s: %d polls, first grant %.1f s after the old lease's end, horizon %s",
		$n, $w->{polls}, $first - $w->{ends},
		defined $w->{horizon} ? sprintf('%.1f s after it', $w->{horizon} - $w->{ends}) : 'n/a');
	return;
}

#
# Round 1: table -> memory (6a), promotion (5), crash (3), side by side.
#

# 6a: a 20 s lease in table mode, then a restart in memory mode.
my (undef, $fsw, $esw) = grant($sw, 'postgres', 'sw:t', '20 s');
like($fsw // '', qr/^\d+$/, 'table mode: a 20 s lease granted');
# and one whose lock delay outlasts it: the key stays unavailable after
# its expiry, in memory mode as in table mode
my $esw_ld = $sw->safe_psql('postgres', q{
	SELECT extract(epoch FROM expires_at) + 20
	FROM dlock.try_acquire('sw:ld', '3 s', lock_delay => '20 s')});
like($esw_ld, qr/^[\d.]+$/, 'table mode: a 3 s lease with a lock delay of 20 s granted');
my $sw_max = $sw->safe_psql('postgres', 'SELECT last_value FROM dlock.token_seq');
$sw->append_conf('postgresql.conf', "dlock.storage = memory\n");
$sw->restart;
is($sw->safe_psql('postgres', 'SHOW dlock.storage'), 'memory', 'switched to memory mode');

# 5: leases on the primary, some in a transaction left open, then failover.
my $ps = $primary->background_psql('postgres');
$ps->query_safe('SET synchronous_commit = off');
my ($p_end, $p_max) = (0, 0);
foreach my $key (qw(p1 p2 p3))
{
	my (undef, $fence, $end) = split /\|/, $ps->query_safe(
		"SELECT owner, fence, extract(epoch FROM expires_at) FROM dlock.try_acquire('$key', '3 s')");
	$p_end = max($p_end, $end);
	$p_max = max($p_max, $fence);
}
$ps->query_safe('BEGIN');
my ($open_max, $open_end) = split /\|/, $ps->query_safe(q{
	SELECT max(l.fence), max(extract(epoch FROM l.expires_at))
	FROM generate_series(1, 40) AS i, LATERAL dlock.try_acquire('open' || i, '3 s') AS l});
cmp_ok($open_max, '>=', $p_max + 40, 'primary: 40 more tokens drawn in an open transaction');
$p_max = max($p_max, $open_max);
$p_end = max($p_end, $open_end);
$primary->stop('immediate');
$ps->quit;
$standby->promote;
my $h_standby = horizon($standby, 'postgres');

# 3: a lease and a fenced write, then a transaction left open, then a
# backend killed with SIGKILL.
$mem->safe_psql('postgres', q{
	CREATE TABLE stock (id int PRIMARY KEY, qty int NOT NULL, fence bigint);
	CREATE TRIGGER stock_fence BEFORE INSERT OR UPDATE OR DELETE ON stock
		FOR EACH ROW EXECUTE FUNCTION dlock.fence_guard('stock:{id}', 'fence');
});
my $ms = $mem->background_psql('postgres');
$ms->query_safe('SET synchronous_commit = off');
my ($t_owner, $t_fence, $t_end) = split /\|/, $ms->query_safe(
	q{SELECT owner, fence, extract(epoch FROM expires_at) FROM dlock.try_acquire('stock:1', '3 s')});
like($t_fence // '', qr/^\d+$/, 'memory: stock:1 granted for 3 s before the crash');
is((try_sql($mem, 'postgres', "INSERT INTO stock VALUES (1, 10, $t_fence)"))[0], '',
	'memory: a fenced write under that token is accepted before the crash');
# a lease with a lock delay: the horizon covers its end plus the delay
my ($ld_fence, $ld_end) = split /\|/, $ms->query_safe(q{
	SELECT fence, extract(epoch FROM expires_at) + 12
	FROM dlock.try_acquire('ld:1', '3 s', lock_delay => '12 s')});
like($ld_fence // '', qr/^\d+$/, 'memory: ld:1 granted for 3 s with a lock delay of 12 s');
$ms->query_safe('BEGIN');
my ($m_open_max) = $ms->query_safe(q{
	SELECT max(l.fence) FROM generate_series(1, 40) AS i,
	LATERAL dlock.try_acquire('copen' || i, '3 s') AS l});
cmp_ok($m_open_max, '>=', $ld_fence + 40, 'memory: 40 more tokens drawn in an open transaction');
my $victim = $ms->query_safe('SELECT pg_backend_pid()');
crash_and_wait($mem, $victim)
  or die 'the server did not come back after the crash';
$ms->quit;

($st) = try_sql($mem, 'postgres', "INSERT INTO stock VALUES (2, 1, $t_fence)");
is($st, 'LF001', 'after the crash: a write presenting the old token is refused (token column)');
($st) = try_sql($mem, 'postgres', qq{
	BEGIN;
	SELECT dlock.use_fence('stock:1', $t_fence);
	UPDATE stock SET qty = 11 WHERE id = 1;
	COMMIT;});
is($st, 'LF001', 'after the crash: a write presenting the old token is refused (use_fence)');
note sprintf('those refusals came %.1f s before the old lease would have ended',
	$t_end - time());
($st) = try_sql($mem, 'postgres', "SELECT dlock.acquire('stock:9', '2 s', wait => '300 ms')");
is($st, '55P03', 'after the crash: acquire of a key never used times out (55P03)');
note 'lease_status after the crash: '
  . join(' ', try_sql($mem, 'postgres', "SELECT * FROM dlock.lease_status WHERE key IN ('stock:1', 'stock:9')"));
my $h_mem = horizon($mem, 'postgres');

my @round1 = (
	watcher(
		name => 'crash', node => $mem, db => 'postgres',
		keys => [ 'stock:1', 'ld:1', 'never:1' ], ends => max($t_end, $ld_end),
		horizon => $h_mem, max_token => $m_open_max),
	watcher(
		name => 'promotion', node => $standby, db => 'postgres',
		keys => [ 'p1', 'never:2' ], ends => $p_end,
		horizon => $h_standby, max_token => $p_max),
	watcher(
		name => 'table -> memory', node => $sw, db => 'postgres',
		keys => [ 'sw:t', 'sw:ld', 'never:3' ], ends => max($esw, $esw_ld),
		max_token => $sw_max));
await_all(@round1);
check_watcher($_) foreach @round1;

($st) = try_sql($mem, 'postgres', qq{
	BEGIN;
	SELECT dlock.use_fence('stock:1', $t_fence);
	UPDATE stock SET qty = 12 WHERE id = 1;
	COMMIT;});
is($st, 'LF001', 'after the horizon: the old token is still refused');
my (undef, $f_stock) = grant($mem, 'postgres', 'stock:2', '3 s');
($st) = try_sql($mem, 'postgres', "INSERT INTO stock VALUES (2, 2, $f_stock)");
is($st, '', 'after the horizon: a write under a new lease is accepted');

#
# Round 2: memory -> table (6b), dump and restore (4), immediate shutdown.
#

# 6b: a lease in memory mode, then a restart in table mode.
my (undef, $f6b, $e6b) = grant($sw, 'postgres', 'sw:m', '3 s');
like($f6b // '', qr/^\d+$/, 'memory mode after the switch: a 3 s lease granted');
$sw->append_conf('postgresql.conf', "dlock.storage = table\n");
$sw->restart;
is($sw->safe_psql('postgres', 'SHOW dlock.storage'), 'table', 'switched back to table mode');
my $h_sw = horizon($sw, 'postgres');
# observe() sees a key without a row as a grant does: held by the horizon's
# unknown owner, not free (with wait 0 it then returns nothing)
is($sw->safe_psql('postgres', q{SELECT count(*) FROM dlock.observe('never:obs', 0, '0')}),
	'0', 'switched back, before the horizon: observe() does not call a key without a row free');

# 4: dump a database with a live lease, restore into the promoted standby.
$mem->safe_psql('postgres', 'CREATE DATABASE src');
$mem->safe_psql('src', 'CREATE EXTENSION dlock');
my $d_max = 0;
foreach my $i (1 .. 3)
{
	my ($o, $fence) = grant($mem, 'src', 'churn', '3 s');
	$mem->safe_psql('src', "SELECT dlock.release('churn', '$o')");
	$d_max = $fence;
}
my (undef, $fd, $ed) = grant($mem, 'src', 'd1', '3 s');
$d_max = max($d_max, $fd);
my $dump = PostgreSQL::Test::Utils::tempdir() . '/src.dump';
$mem->command_ok([ 'pg_dump', '-Fc', '-f', $dump, '-d', 'src' ], 'pg_dump -Fc of a memory-mode database');

# and an immediate shutdown of the same server, with a lease held
my (undef, $fr, $er) = grant($mem, 'postgres', 'r:1', '3 s');
my $r_max = $mem->safe_psql('postgres', 'SELECT last_value FROM dlock.token_seq');
$mem->stop('immediate');
$mem->start;
my $h_restart = horizon($mem, 'postgres');

$standby->command_ok([ 'createdb', 'restored' ], 'createdb on the promoted standby');
$standby->command_ok([ 'pg_restore', '-d', 'restored', $dump ],
	'pg_restore into a fresh database of a memory-mode server');
my $h_restored = horizon($standby, 'restored');

my @round2 = (
	watcher(
		name => 'memory -> table', node => $sw, db => 'postgres',
		keys => [ 'sw:m', 'never:4' ], ends => $e6b,
		horizon => $h_sw, max_token => $f6b),
	watcher(
		name => 'dump and restore', node => $standby, db => 'restored',
		keys => [ 'd1', 'never:5' ], ends => $ed,
		horizon => $h_restored, max_token => $d_max),
	watcher(
		name => 'immediate shutdown', node => $mem, db => 'postgres',
		keys => [ 'r:1', 'never:6' ], ends => $er,
		horizon => $h_restart, max_token => $r_max));
await_all(@round2);
check_watcher($_) foreach @round2;
is($sw->safe_psql('postgres', q{SELECT state FROM dlock.observe('never:obs', 0, '0')}),
	'none', 'switched back, after the horizon: observe() reports a key without a row free');

$sw->stop;
$standby->stop;
$mem->stop;
done_testing();
