# Restores that set counters back, and a database re-created with the same
# OID (issue 18; dlock 0.6: dlock.token_seq and dlock.horizon_mark, which
# pg_dump never saves, and DROP DATABASE forgetting memory-mode entries).
#
# 1. Memory mode: a data-only restore of a dump taken before A's grant sets
#    dlock.horizon_seq back (checked), then the server restarts.  Until the
#    end of A's lease every key is still held (try_acquire of 'job' and of
#    a fresh key return no row, check_fence of A's token is false, use_fence
#    is refused with LF001, A's renew returns NULL); the first grant of
#    'job' comes at or after A's expiry, with a token greater than A's, and
#    so does a fresh key's.
# 2. Table mode: a data-only dump taken at token T0, more than 32 grants
#    up to T1 > T0, then dlock.leases truncated and the old dump restored (it
#    sets dlock.fence_seq back, checked): a grant of a fresh key, and of a
#    key restored from the dump, gets a token greater than T1.
# 3. Table mode: a whole plain dump, taken after more than 32 tokens (one
#    sequence log-ahead batch), restored into a new database with createdb
#    and psql -f: its first grants get tokens greater than every token
#    issued in the source before the dump.
# 4. Upgrade: CREATE EXTENSION dlock VERSION '0.5', grants up to T, ALTER
#    EXTENSION dlock UPDATE: version 0.6, dlock.token_seq exists, and new
#    grants (a fresh key, a key granted under 0.5) get tokens greater than T.
#    A session that used dlock before the update and a new one drawing
#    while the new one waits to move dlock.fence_seq past a new block of
#    dlock.token_seq never get the same token.
# 5. Table mode: a superuser sets dlock.token_seq (and dlock.fence_seq)
#    back to 1 after key 'x' got a token > 1: the next grant of 'x' fails
#    with SQLSTATE 55000 (not XX000) and issues nothing; after setval of
#    dlock.token_seq to the highest token issued it works again with a
#    greater token.  Setting only dlock.token_seq back is caught up from
#    dlock.fence_seq: the grant works with a greater token.
# 6. Memory mode: database app (from template tpl) where A holds 'k' is
#    dropped and created again with the same OID from the same template.
#    In the new app: lease_status shows no lease of 'k' held under A's
#    token, A's renew returns NULL, check_fence('k', tA) is false,
#    use_fence('k', tA) is refused with LF001; 'k' can be granted at once
#    (no barrier inherited either).

use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use FindBin;
use lib $FindBin::RealBin;
use DlockCluster;
use Time::HiRes qw(usleep time);

my $common = q{
shared_preload_libraries = 'dlock'
log_error_verbosity = verbose
autovacuum = off
};

my $tmp = PostgreSQL::Test::Utils::tempdir();

# Run $sql in database $db of $node in a psql of its own that stops at the
# first error; return the SQLSTATE of that error ('' if none) and the output.
sub run_sql
{
	my ($state, $out, $err) = try_sql(@_);
	diag("unexpected error: $err") if $state eq 'XX000';
	return ($state, $out);
}

# Grant $key for $ttl in $db; return (owner, fence, expires_at as text),
# or an empty list when refused.
sub grant
{
	my ($node, $db, $key, $ttl) = @_;
	return split /\|/, $node->safe_psql($db,
		"SELECT owner, fence, expires_at FROM dlock.try_acquire('$key', '$ttl')");
}

# Grant and release $key in $db; return the token.
sub grant_release
{
	my ($node, $db, $key) = @_;
	my ($o, $f) = grant($node, $db, $key, '5 s');
	$node->safe_psql($db, "SELECT dlock.release('$key', '$o')") if defined $o;
	return $f // 0;
}

# The last_value of sequence $seq in $db.
sub last_value
{
	my ($node, $db, $seq) = @_;
	return $node->safe_psql($db, "SELECT last_value FROM $seq");
}

my $mem = dlock_node('mem', conf => $common . q{
dlock.storage = memory
dlock.max_ttl = '2min'
dlock.horizon_margin = '1s'
});

my $tab = dlock_node('tab', conf => $common . "dlock.storage = table\n");

#
# Part 1: memory mode, data-only restore of an older dump, then a restart.
#
$mem->safe_psql('postgres', 'CREATE DATABASE m1');
$mem->safe_psql('m1', 'CREATE EXTENSION dlock');
grant_release($mem, 'm1', 'warm');    # sets the horizon once
my $old1 = "$tmp/m1_old.sql";
$mem->command_ok(
	[ 'pg_dump', '-d', $mem->connstr('m1'), '-f', $old1, '--data-only' ],
	'part 1: pg_dump --data-only before the grant');

my ($oA, $tA, $eA) = grant($mem, 'm1', 'job', '10 s');
like($tA // '', qr/^\d+$/, 'part 1: A gets job');
my $h1 = last_value($mem, 'm1', 'dlock.horizon_seq');
$mem->command_ok(
	[ 'psql', '-X', '-q', '-v', 'ON_ERROR_STOP=1', '-d', $mem->connstr('m1'), '-f', $old1 ],
	'part 1: the old data-only dump restores');
is($mem->safe_psql('m1', "SELECT last_value < $h1 FROM dlock.horizon_seq"),
	't', 'part 1: the restore set dlock.horizon_seq back');

$mem->restart;
is($mem->safe_psql('m1', "SELECT now() < '$eA'"), 't',
	'part 1: restarted before the end of A\'s lease');
is($mem->safe_psql('m1', "SELECT count(*) FROM dlock.try_acquire('job', '5 s')"),
	'0', 'part 1: after restore and restart, B gets no job before A\'s expiry');
is($mem->safe_psql('m1', "SELECT count(*) FROM dlock.try_acquire('fresh1', '5 s')"),
	'0', 'part 1: nor a fresh key');
is($mem->safe_psql('m1', "SELECT dlock.check_fence('job', $tA)"),
	'f', 'part 1: check_fence of A\'s token is false before the horizon');
my ($st) = run_sql($mem, 'm1', "SELECT dlock.use_fence('job', $tA)");
is($st, 'LF001', 'part 1: use_fence of A\'s token is refused with LF001');
is($mem->safe_psql('m1', "SELECT dlock.renew('job', '$oA', '5 s') IS NULL"),
	't', 'part 1: A\'s renew returns NULL after the restart');

# The first grant of job, whenever it comes.
my ($tB, $early);
my $deadline = time() + 40;
while (time() < $deadline)
{
	my $row = $mem->safe_psql('m1', qq{
		SELECT fence, now() < '$eA'::timestamptz
		FROM dlock.try_acquire('job', '5 s')});
	if ($row ne '')
	{
		($tB, $early) = split /\|/, $row;
		last;
	}
	usleep(200_000);
}
ok(defined $tB, 'part 1: job is granted again after the horizon');
is($early // '', 'f', 'part 1: not before the end of A\'s lease');
cmp_ok($tB // 0, '>', $tA, 'part 1: the new token of job is greater than A\'s');
my (undef, $tF) = grant($mem, 'm1', 'fresh2', '5 s');
cmp_ok($tF // 0, '>', $tA, 'part 1: a fresh key\'s token is greater than A\'s');

#
# Part 6: memory mode, a database dropped and created again with its OID.
#
$mem->safe_psql('postgres', 'CREATE DATABASE tpl');
$mem->safe_psql('tpl', 'CREATE EXTENSION dlock');
$mem->safe_psql('postgres', 'ALTER DATABASE tpl WITH IS_TEMPLATE true');
$mem->safe_psql('postgres', 'CREATE DATABASE app TEMPLATE tpl');
my ($oK, $tK) = grant($mem, 'app', 'k', '60 s');
like($tK // '', qr/^\d+$/, 'part 6: A gets k in app');
is($mem->safe_psql('app', "SELECT dlock.check_fence('k', $tK)"), 't',
	'part 6: A\'s token is accepted in app before the drop');
my $app_oid = $mem->safe_psql('postgres',
	"SELECT oid FROM pg_database WHERE datname = 'app'");
$mem->safe_psql('postgres', q{
	SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = 'app'});
$mem->safe_psql('postgres', 'DROP DATABASE app WITH (FORCE)');
$mem->safe_psql('postgres', "CREATE DATABASE app OID $app_oid TEMPLATE tpl");
is($mem->safe_psql('postgres',
		"SELECT oid FROM pg_database WHERE datname = 'app'"),
	$app_oid, 'part 6: app re-created with the same OID');
is($mem->safe_psql('app', qq{
		SELECT count(*) FROM dlock.lease_status
		WHERE key = 'k' AND state = 'held' AND fence IS NOT DISTINCT FROM $tK}),
	'0', 'part 6: lease_status shows no lease of k held under A\'s token');
is($mem->safe_psql('app', "SELECT dlock.renew('k', '$oK', '5 s') IS NULL"),
	't', 'part 6: A\'s renew returns NULL in the new app');
is($mem->safe_psql('app', "SELECT dlock.check_fence('k', $tK)"), 'f',
	'part 6: check_fence of A\'s token is false in the new app');
($st) = run_sql($mem, 'app', "SELECT dlock.use_fence('k', $tK)");
is($st, 'LF001', 'part 6: A\'s fenced write is refused with LF001 in the new app');
my ($oK2, $tK2) = grant($mem, 'app', 'k', '5 s');
ok(defined $tK2, 'part 6: k is granted at once in the new app (no inherited barrier)');
diag("part 6: the new app's first token of k equals A's token of the dropped app")
  if defined $tK2 && $tK2 == $tK;

#
# Part 2: table mode, data-only restore of an older dump.
#
$tab->safe_psql('postgres', 'CREATE DATABASE t2');
$tab->safe_psql('t2', 'CREATE EXTENSION dlock');
my $T0 = 0;
$T0 = grant_release($tab, 't2', $_) foreach qw(a b c);
my $old2 = "$tmp/t2_old.sql";
$tab->command_ok(
	[ 'pg_dump', '-d', $tab->connstr('t2'), '-f', $old2, '--data-only' ],
	'part 2: pg_dump --data-only at T0');
# more than 32 tokens (a log-ahead batch), so that fence_seq moves too
$tab->safe_psql('t2', q{
	SELECT dlock.release('churn' || i, l.owner)
	FROM generate_series(1, 40) AS i,
	LATERAL dlock.try_acquire('churn' || i, '5 s') AS l});
my $T1 = 0;
$T1 = grant_release($tab, 't2', $_) foreach qw(a d e);
cmp_ok($T1, '>', $T0, 'part 2: more tokens issued after the dump');
my $fs1 = last_value($tab, 't2', 'dlock.fence_seq');
$tab->safe_psql('t2', 'TRUNCATE dlock.leases');
$tab->command_ok(
	[ 'psql', '-X', '-q', '-v', 'ON_ERROR_STOP=1', '-d', $tab->connstr('t2'), '-f', $old2 ],
	'part 2: the old data-only dump restores');
is($tab->safe_psql('t2', "SELECT last_value < $fs1 FROM dlock.fence_seq"),
	't', 'part 2: the restore set dlock.fence_seq back');
is($tab->safe_psql('t2', q{SELECT count(*) FROM dlock.leases WHERE key IN ('a', 'b', 'c')}),
	'3', 'part 2: the old rows are back');
my (undef, $tf) = grant($tab, 't2', 'f', '5 s');
cmp_ok($tf // 0, '>', $T1, 'part 2: a fresh key\'s token is greater than T1');
my (undef, $ta) = grant($tab, 't2', 'a', '5 s');
cmp_ok($ta // 0, '>', $T1, 'part 2: a restored key\'s token is greater than T1');

#
# Part 3: a whole dump restored into a new database.
#
$tab->safe_psql('postgres', 'CREATE DATABASE t3');
$tab->safe_psql('t3', 'CREATE EXTENSION dlock');
$tab->safe_psql('t3', q{
	SELECT dlock.release('churn' || i, l.owner)
	FROM generate_series(1, 40) AS i,
	LATERAL dlock.try_acquire('churn' || i, '5 s') AS l});
my (undef, $T3) = grant($tab, 't3', 'held', '1 min');
my $max3 = $tab->safe_psql('t3', 'SELECT max(fence) FROM dlock.leases');
cmp_ok($max3, '>', 40, 'part 3: more than 40 tokens issued in the source');
my $whole = "$tmp/t3_whole.sql";
$tab->command_ok([ 'pg_dump', '-d', $tab->connstr('t3'), '-f', $whole ],
	'part 3: pg_dump of the whole database');
$tab->command_ok([ 'createdb', '-h', $tab->host, '-p', $tab->port, 't3copy' ],
	'part 3: createdb');
$tab->command_ok(
	[ 'psql', '-X', '-q', '-v', 'ON_ERROR_STOP=1', '-d', $tab->connstr('t3copy'), '-f', $whole ],
	'part 3: the whole dump restores into the new database');
my (undef, $tn) = grant($tab, 't3copy', 'new', '5 s');
cmp_ok($tn // 0, '>', $max3, 'part 3: a fresh key\'s token in the copy is greater than every token issued');
my (undef, $tc) = grant($tab, 't3copy', 'churn7', '5 s');
cmp_ok($tc // 0, '>', $max3, 'part 3: a released key\'s token in the copy too');
is($tab->safe_psql('t3copy', "SELECT count(*) FROM dlock.try_acquire('held', '5 s')"),
	'0', 'part 3: the held lease is still held in the copy');

#
# Part 4: upgrade from 0.5.
#
$tab->safe_psql('postgres', 'CREATE DATABASE t4');
$tab->safe_psql('t4', "CREATE EXTENSION dlock VERSION '0.5'");
my $T4 = 0;
$T4 = grant_release($tab, 't4', $_) foreach qw(u v u w);
cmp_ok($T4, '>', 0, 'part 4: grants under 0.5');
is($tab->safe_psql('t4', q{SELECT to_regclass('dlock.token_seq') IS NULL}),
	't', 'part 4: no dlock.token_seq in 0.5');
$tab->safe_psql('t4', 'ALTER EXTENSION dlock UPDATE');
is($tab->safe_psql('t4', q{SELECT extversion FROM pg_extension WHERE extname = 'dlock'}),
	'0.7', 'part 4: updated to 0.7');
is($tab->safe_psql('t4', q{SELECT to_regclass('dlock.token_seq') IS NOT NULL}),
	't', 'part 4: dlock.token_seq exists');
my (undef, $t4n) = grant($tab, 't4', 'fresh', '5 s');
cmp_ok($t4n // 0, '>', $T4, 'part 4: a fresh key\'s token after the update is greater than T');
my (undef, $t4u) = grant($tab, 't4', 'u', '5 s');
cmp_ok($t4u // 0, '>', $T4, 'part 4: a 0.5 key\'s token after the update is greater than T');

# A session that used dlock before the update draws once more, while a new
# session has drawn from dlock.token_seq a token that starts a new block
# and waits to move dlock.fence_seq past it (held up by a COMMENT on the
# sequence, which takes the same lock): the two tokens differ.
$tab->safe_psql('postgres', 'CREATE DATABASE t4b');
$tab->safe_psql('t4b', "CREATE EXTENSION dlock VERSION '0.5'");
my $old_session = $tab->background_psql('t4b');
my $t4old1 = $old_session->query_safe(
	q{SELECT fence FROM dlock.try_acquire('old0', '1 min')});
$tab->safe_psql('t4b', 'ALTER EXTENSION dlock UPDATE');
# new sessions draw until dlock.token_seq has no value logged ahead left
$tab->safe_psql('t4b', q{
	DO $$
	BEGIN
		FOR i IN 1 .. 100 LOOP
			PERFORM dlock.try_acquire('new' || i, '1 min');
			EXIT WHEN (SELECT log_cnt = 0 FROM dlock.token_seq);
		END LOOP;
	END $$});
my $holder = $tab->background_psql('t4b');
$holder->query_safe(q{BEGIN; COMMENT ON SEQUENCE dlock.fence_seq IS 'held'});
my $new_session = $tab->background_psql('t4b');
$new_session->query_until(qr/started/, q{
	\echo started
	SELECT fence FROM dlock.try_acquire('newB', '1 min');
	\echo done
});
ok( $tab->poll_query_until('t4b', q{
		SELECT count(*) = 1 FROM pg_stat_activity
		WHERE wait_event_type = 'Lock' AND query LIKE '%newB%'}),
	'part 4: a new session drew from dlock.token_seq and waits to move dlock.fence_seq');
# (Since 0.7 the update also alters dlock.leases, so the old session
# finds the storage again and may wait for the sequence too: run it in the
# background as well.)
$old_session->query_until(qr/started/, q{
	\echo started
	SELECT fence FROM dlock.try_acquire('old1', '1 min');
	\echo done
});
$holder->query_safe('COMMIT');
my ($t4old2, $t4newB) = ('', '');
foreach my $s ($old_session, $new_session)
{
	$s->{run}->pump_nb;
	PostgreSQL::Test::Utils::pump_until($s->{run}, $s->{timeout},
		\$s->{stdout}, qr/done/);
}
($t4old2) = $old_session->{stdout} =~ /^(\d+)$/m;
($t4newB) = $new_session->{stdout} =~ /^(\d+)$/m;
ok(defined $t4old2 && defined $t4newB, 'part 4: both sessions were granted');
isnt($t4old2 // 'none', $t4newB // '',
	'part 4: the session from before the update and the new one never get the same token');
is($tab->safe_psql('t4b', q{SELECT count(*) = count(DISTINCT fence) FROM dlock.leases}),
	't', 'part 4: no token in dlock.leases twice');
$_->quit foreach ($old_session, $holder, $new_session);

#
# Part 5: the token counter set back by hand.
#
$tab->safe_psql('postgres', 'CREATE DATABASE t5');
$tab->safe_psql('t5', 'CREATE EXTENSION dlock');
grant_release($tab, 't5', $_) foreach qw(p q);
my $tx = grant_release($tab, 't5', 'x');
cmp_ok($tx, '>', 1, 'part 5: x got a token above 1');

# token_seq alone set back: fence_seq still knows better
$tab->safe_psql('t5', q{SELECT setval('dlock.token_seq', 1)});
my ($o5, $tx2) = grant($tab, 't5', 'x', '5 s');
cmp_ok($tx2 // 0, '>', $tx, 'part 5: token_seq alone set back: x is granted a greater token');
$tab->safe_psql('t5', "SELECT dlock.release('x', '$o5')") if defined $o5;
$tx = $tx2 // $tx;

# both counters set back
$tab->safe_psql('t5', q{
	SELECT setval('dlock.token_seq', 1), setval('dlock.fence_seq', 1)});
($st) = run_sql($tab, 't5', q{SELECT * FROM dlock.try_acquire('x', '5 s')});
is($st, '55000', 'part 5: both counters set back: the grant of x fails with 55000');
is($tab->safe_psql('t5', "SELECT fence = $tx AND state <> 'held' FROM dlock.lease_status WHERE key = 'x'"),
	't', 'part 5: x keeps its token and is not held');
$tab->safe_psql('t5', q{SELECT setval('dlock.token_seq', max(fence)) FROM dlock.leases});
my (undef, $tx3) = grant($tab, 't5', 'x', '5 s');
cmp_ok($tx3 // 0, '>', $tx, 'part 5: after setval to the highest token x is granted a greater token');

$mem->stop;
$tab->stop;
done_testing();
