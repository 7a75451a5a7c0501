# Memory mode (dlock.storage = memory): the shared pool of entries and the
# per-database slots are shared by every database and role of the cluster,
# and nobody's ended entries may deny anybody else (issue 18, items 7-10).
# One server, dlock.memory_max_keys = 200, dlock.horizon_margin = 0.
#
# 1. (item 7) An ordinary role fills the whole pool with released entries
#    in database tenant_a (200 grant-and-release cycles of distinct keys);
#    then in tenant_b the same role is granted a new key, and 20 more,
#    without anybody running dlock.prune().
#    Fair share: dlock.memory_max_keys_per_database = 100 (postgresql.conf,
#    reload) is shown by SHOW; tenant_a holds 100 live leases, its 101st
#    new key fails with 53200, more tries do not get it more than 100, and
#    tenant_b is still granted 50 new keys.
# 2. (item 9) One connection takes 200 session-bound leases of an hour and
#    exits: lease_status shows them 'expired', none 'held'; a new key of the
#    same database is granted.  A second connection takes 50 session-bound
#    leases and exits: dlock.prune('0') frees entries (count > 0), and
#    afterwards no entry of those ended leases is left.
# 3. (item 10) The pool full of live leases, plus entries of keys that
#    transactions in flight had granted at the time of the scan (two keys
#    with released entries, locked by their granting transactions, and one
#    new key reserved by its granting transaction): a new key fails with
#    53200.  Then each of those transactions releases the key it granted
#    and commits (so their entries are droppable, although no live lease
#    was released), and at once, well within the second after the failed
#    scan, a new key is granted.
# 4. (item 8) Slots: 65 databases made from a template that has the
#    extension.  An ordinary role reads dlock.lease_status once in each of
#    64 of them; then a superuser's try_acquire in the 65th is granted.
#    Then a 1 s lease is granted and released in each of the 64, its entry
#    left in memory (nobody prunes); once every one's horizon has passed
#    (a database gives its slot up then, its ended entries with it), a
#    grant in yet another new database works.
#
# And no statement anywhere fails with XX000.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use FindBin;
use lib $FindBin::RealBin;
use DlockCluster;
use Time::HiRes qw(time usleep);
use List::Util qw(max);

my $t_start = time();
my $node = dlock_node('pool', conf => q{
shared_preload_libraries = 'dlock'
dlock.storage = memory
dlock.memory_max_keys = 200
dlock.max_ttl = '30s'
dlock.horizon_margin = 0
autovacuum = off
max_connections = 20
include_if_exists 'dlock_cap.conf'
});
$node->safe_psql('postgres', 'CREATE ROLE tenant LOGIN');

my $all_stderr = '';

# Run $sql in $db (as $user if given) in a psql that stops at the first
# error; return the SQLSTATE of that error ('' if none) and stdout.
sub run_sql
{
	my ($db, $sql, $user) = @_;
	my ($state, $out, $err) = try_sql($node, $db, $sql,
		defined $user ? (extra_params => [ '-U', $user ]) : ());
	$all_stderr .= $err;
	return ($state, $out);
}

# Run a script that may switch databases with \c and goes on after errors;
# return stdout and the SQLSTATEs of its errors.
sub run_script
{
	my ($script) = @_;
	my ($out, $err) = ('', '');
	$node->psql('postgres', "\\set VERBOSITY verbose\n$script",
		stdout => \$out, stderr => \$err, on_error_stop => 0);
	$all_stderr .= $err;
	my @states = $err =~ /ERROR:\s+([0-9A-Z]{5}):/g;
	return ($out, @states);
}

# A PL/pgSQL block granting up to $n new keys $prefix1.. (one
# subtransaction each) until the first 53200.
sub greedy
{
	my ($prefix, $n, $ttl, $extra) = @_;
	$extra //= '';
	return qq{
	DO \$\$
	DECLARE i int := 0;
	BEGIN
		LOOP
			i := i + 1;
			EXIT WHEN i > $n;
			BEGIN
				PERFORM * FROM dlock.try_acquire('$prefix' || i, '$ttl'$extra);
			EXCEPTION WHEN out_of_memory THEN
				EXIT;
			END;
		END LOOP;
	END \$\$;};
}

# Wait until backend $pid is gone and holds no lock any more.
sub wait_gone
{
	my ($pid) = @_;
	return $node->poll_query_until('postgres', qq{
		SELECT NOT EXISTS (SELECT 1 FROM pg_stat_activity WHERE pid = $pid)
		   AND NOT EXISTS (SELECT 1 FROM pg_locks WHERE pid = $pid)});
}

# SHOW dlock.memory_max_keys_per_database, after a reload has had time to
# reach new backends (at most about 3 s); '' when it fails.
sub show_cap
{
	my ($want) = @_;
	my ($st, $out);
	for (1 .. 15)
	{
		($st, $out) = run_sql('postgres', 'SHOW dlock.memory_max_keys_per_database');
		chomp $out;
		last if ($st eq '' && $out eq $want) || $st eq '42704';
		usleep(200_000);
	}
	return $st eq '' ? $out : "error $st";
}

#
# 1. (item 7) Released entries of one database, and a per-database cap.
#
foreach my $db (qw(tenant_a tenant_b))
{
	$node->safe_psql('postgres', "CREATE DATABASE $db");
	$node->safe_psql($db, 'CREATE EXTENSION dlock');
}
my ($st, $out) = run_sql('tenant_a', join('', map {
	"SELECT dlock.release(key, owner) FROM dlock.try_acquire('a:$_', '5 s');\n" } 1 .. 200),
	'tenant');
is($st, '', 'item 7: an ordinary role grants and releases 200 distinct keys in tenant_a');
is(scalar(() = $out =~ /^t$/mg), 200, 'item 7: ... each released');
is($node->safe_psql('tenant_a', q{
		SELECT count(*) FROM dlock.lease_status WHERE state = 'released'}),
	'200', 'item 7: the pool (200 entries) is full of released entries of tenant_a');
($st, $out) = run_sql('tenant_b',
	q{SELECT count(*) FROM dlock.try_acquire('b:1', '5 s')}, 'tenant');
is($st, '', 'item 7: in tenant_b a new key is granted without a prune (no 53200)');
is($out, "1", 'item 7: ... one grant');
($st, $out) = run_sql('tenant_b', q{
	SELECT count(*) FROM generate_series(1, 20) i,
		LATERAL dlock.try_acquire('b:more' || i, '5 s')}, 'tenant');
is("$st/$out", "/20", 'item 7: ... and 20 more keys in tenant_b');

# the per-database cap, in a file of its own (on 0.5 the reload fails)
$node->safe_psql('tenant_a', q{SELECT dlock.prune('0')});
PostgreSQL::Test::Utils::append_to_file($node->data_dir . '/dlock_cap.conf',
	"dlock.memory_max_keys_per_database = 100\n");
$node->reload;
is(show_cap('100'), '100', 'item 7: SHOW dlock.memory_max_keys_per_database is 100 after the reload');
($st, $out) = run_sql('tenant_a', q{
	SELECT count(*) FROM generate_series(1, 100) i,
		LATERAL dlock.try_acquire('a:live' || i, '10 s')}, 'tenant');
is("$st/$out", "/100", 'item 7: tenant_a holds 100 live leases');
($st) = run_sql('tenant_a', q{SELECT * FROM dlock.try_acquire('a:live101', '10 s')}, 'tenant');
is($st, '53200', 'item 7: the 101st new key of tenant_a fails with 53200');
run_sql('tenant_a', greedy('a:greedy', 300, '10 s'), 'tenant');
is($node->safe_psql('tenant_a', q{
		SELECT count(*) FROM dlock.lease_status WHERE state = 'held'}),
	'100', 'item 7: trying for more keys, tenant_a still holds only 100');
($st, $out) = run_sql('tenant_b', q{
	SELECT count(*) FROM generate_series(1, 50) i,
		LATERAL dlock.try_acquire('b:cap' || i, '10 s')}, 'tenant');
is("$st/$out", "/50", 'item 7: tenant_b is still granted 50 new keys');

# no cap in the rest of the test
unlink($node->data_dir . '/dlock_cap.conf');
$node->reload;
note 'cap after removing it: ' . show_cap('0');
$node->safe_psql('postgres', 'DROP DATABASE tenant_a');
$node->safe_psql('postgres', 'DROP DATABASE tenant_b');
note sprintf('part 1 done after %.1f s', time() - $t_start);

#
# 2. (item 9) Session-bound leases whose connection ended.
#
$node->safe_psql('postgres', 'CREATE DATABASE sb');
$node->safe_psql('sb', 'CREATE EXTENSION dlock');
my $c1 = $node->background_psql('sb', on_error_stop => 0);
$c1->query_safe(q{SET dlock.max_ttl = '2h'});
my $pid1 = $c1->query_safe('SELECT pg_backend_pid()');
is($c1->query(q{
		SELECT count(*) FROM generate_series(1, 200) i,
			LATERAL dlock.try_acquire('sb1:' || i, '1 hour', session_bound => true)}),
	'200', 'item 9: one connection takes 200 session-bound leases of an hour');
$all_stderr .= $c1->{stderr};
$c1->quit;
ok(wait_gone($pid1), 'item 9: that connection has ended');
is($node->safe_psql('sb', q{
		SELECT count(*) FILTER (WHERE state = 'held') || '/'
			   || count(*) FILTER (WHERE state = 'expired')
		FROM dlock.lease_status WHERE key LIKE 'sb1:%'}),
	'0/200', "item 9: lease_status shows none of them 'held', all 200 'expired'");
($st, $out) = run_sql('sb', q{SELECT count(*) FROM dlock.try_acquire('sb:new', '5 s')}, 'tenant');
is("$st/$out", "/1", 'item 9: a new key of the same database is granted (no 53200)');

my $c2 = $node->background_psql('sb', on_error_stop => 0);
$c2->query_safe(q{SET dlock.max_ttl = '2h'});
my $pid2 = $c2->query_safe('SELECT pg_backend_pid()');
$c2->query(greedy('sb2:', 50, '1 hour', ', session_bound => true'));
is($c2->query(q{SELECT count(*) FROM dlock.lease_status WHERE key LIKE 'sb2:%'}),
	'50', 'item 9: a second connection takes 50 session-bound leases');
$all_stderr .= $c2->{stderr};
$c2->quit;
ok(wait_gone($pid2), 'item 9: that connection has ended too');
($st, $out) = run_sql('sb', q{SELECT dlock.prune('0')});
chomp $out;
ok($st eq '' && $out =~ /^\d+$/ && $out > 0,
	"item 9: dlock.prune('0') frees the entries of the ended session-bound leases (count > 0)");
note "prune('0') returned: $st/$out";
is($node->safe_psql('sb', q{
		SELECT count(*) FROM dlock.lease_status WHERE key LIKE 'sb1:%' OR key LIKE 'sb2:%'}),
	'0', 'item 9: ... and none of their entries is left');
$node->safe_psql('postgres', 'DROP DATABASE sb');
note sprintf('part 2 done after %.1f s', time() - $t_start);

#
# 3. (item 10) Releases in the transactions that granted the same keys.
#
$node->safe_psql('postgres', 'CREATE DATABASE r10');
$node->safe_psql('r10', 'CREATE EXTENSION dlock');
is($node->safe_psql('r10', q{
		SELECT count(*) FROM unnest(ARRAY['rel1', 'rel2']) k,
			LATERAL dlock.try_acquire(k, '20 s') l, LATERAL dlock.release(l.key, l.owner) r
		WHERE r}),
	'2', 'item 10: keys rel1 and rel2 granted and released: they have released entries');
# one transaction per key, each granting it and keeping it locked
my %tx;
foreach my $k (qw(rel1 rel2 fresh))
{
	$tx{$k} = $node->background_psql('r10', on_error_stop => 0);
	$tx{$k}->query_safe('BEGIN');
	$tx{$k}{owner} = $tx{$k}->query_safe(
		"SELECT owner FROM dlock.try_acquire('$k', '20 s')");
}
like(join(',', map { $tx{$_}{owner} } qw(rel1 rel2 fresh)),
	qr/^[0-9a-f-]{36},[0-9a-f-]{36},[0-9a-f-]{36}$/,
	'item 10: three open transactions granted rel1, rel2 and the new key fresh');
run_sql('r10', greedy('live', 300, '20 s'));
my $nlive = $node->safe_psql('r10', q{
	SELECT count(*) FROM dlock.lease_status WHERE key LIKE 'live%' AND state = 'held'});
is($nlive, '197', 'item 10: 197 live leases fill the rest of the pool');
my $t_full = time();
($st) = run_sql('r10', q{SELECT * FROM dlock.try_acquire('newkey', '20 s')});
is($st, '53200', 'item 10: full, nothing droppable: a new key fails with 53200');
foreach my $k (qw(rel1 rel2 fresh))
{
	$tx{$k}->query_safe("SELECT dlock.release('$k', '$tx{$k}{owner}')");
	$tx{$k}->query_safe('COMMIT');
}
($st, $out) = run_sql('r10', q{SELECT count(*) FROM dlock.try_acquire('newkey', '20 s')});
my $gap = time() - $t_full;
is("$st/$out", "/1",
	'item 10: right after those transactions released the keys they granted, a new key is granted');
note sprintf('item 10: %.2f s from the 53200 to that grant (the recheck delay is 1 s)', $gap);
$tx{$_}->quit foreach keys %tx;
$node->safe_psql('postgres', 'DROP DATABASE r10');
note sprintf('part 3 done after %.1f s', time() - $t_start);

#
# 4. (item 8) 64 databases read, the 65th grants; slots given back.
#
$node->safe_psql('postgres', 'CREATE DATABASE tmpl');
$node->safe_psql('tmpl', 'CREATE EXTENSION dlock');
my $t_create = time();
run_script(join('', map { "CREATE DATABASE d$_ TEMPLATE tmpl;\n" } 1 .. 65));
is($node->safe_psql('postgres', q{SELECT count(*) FROM pg_database WHERE datname ~ '^d[0-9]+$'}),
	'65', 'item 8: 65 databases created from a template with the extension');
note sprintf('item 8: creating them took %.1f s', time() - $t_create);
my @states;
($out, @states) = run_script(join('', map {
	"\\c d$_ tenant\nSELECT 'd$_', count(*) FROM dlock.lease_status;\n" } 1 .. 64));
is(scalar(() = $out =~ /^d\d+\|0$/mg), 64,
	'item 8: an ordinary role reads dlock.lease_status once in each of 64 databases');
note 'errors of those reads: ' . join(',', @states) if @states;
($st, $out) = run_sql('d65', q{
	SELECT dlock.release(key, owner) FROM dlock.try_acquire('k', '1 s')});
is("$st/$out", "/t", "item 8: then in the 65th a superuser's try_acquire works (no 53400)");
$node->safe_psql('postgres', 'DROP DATABASE d65');

($out, @states) = run_script(join('', map { qq{\\c d$_
SELECT dlock.release(key, owner) FROM dlock.try_acquire('k', '1 s');
SELECT 'h', extract(epoch FROM timestamptz '2000-01-01 00:00:00+00') + last_value / 1000000.0
FROM dlock.horizon_seq;
} } 1 .. 64));
is(scalar(() = $out =~ /^t$/mg), 64,
	'item 8: a 1 s lease granted and released in each of the 64 databases');
note 'errors of those grants: ' . join(',', @states) if @states;
my $h = max(0, $out =~ /^h\|([\d.]+)$/mg);
ok($node->poll_query_until('postgres',
		"SELECT extract(epoch FROM clock_timestamp()) > $h + 0.2"),
	'item 8: every horizon of the 64 has passed');
$node->safe_psql('postgres', 'CREATE DATABASE late TEMPLATE tmpl');
($st, $out) = run_sql('late', q{SELECT count(*) FROM dlock.try_acquire('k', '1 s')});
is("$st/$out", "/1",
	'item 8: after the horizons passed, a grant in another new database works (no 53400)');
note sprintf('part 4 done after %.1f s', time() - $t_start);

unlike($all_stderr, qr/XX000/, 'no statement failed with XX000');
$node->stop;
done_testing();
