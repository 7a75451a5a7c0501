# The placeholder lease of the horizon, and tokens across switches of
# dlock.storage (issue 18, items 1 and 4, and lease_status).
#
# Until the horizon every key reads as held by an owner nobody knows.  That
# placeholder carries no token anyone was given, so no presented token may
# match it: not 0, not a negative one, not one above every token issued.
#
# 1. Memory mode, after a clean restart and after a crash restart (a
#    backend killed with SIGKILL, restart_after_crash = on), while the
#    horizon still holds every key (try_acquire returns no row before and
#    after the checks), an ordinary role presenting token 0 is refused:
#    an INSERT into a 'lease' mode fenced table under the key that was held
#    and under a key never granted (LF001), the same into a 'monotonic'
#    table (LF001), use_fence and fenced (LF001), check_fence (false).
#    The old holder's real token, -1 and 9223372036854775807 are refused
#    the same ways.  After the horizon a fresh grant works and its token is
#    accepted.
# 2. Table mode, no horizon at all: a key granted and released, and a key
#    never granted, refuse tokens 0 and -1 (check_fence false, use_fence,
#    fenced and fenced writes LF001).
# 3. Table -> memory -> table on one server.  A gets 'job' in table mode
#    (t1), writes to a 'monotonic' table, releases; in memory mode B gets
#    'job' (t2 > t1), writes, A's write under t1 is refused, B releases.
#    Back in table mode, while the horizon still holds 'job': token 0 and
#    A's t1 are refused, check_fence('job', 0) is false, and
#    dlock.lease_status shows 'job' as a grant would meet it (held), not
#    'released'.  After the horizon: A's write under t1 is still refused
#    (a token below the highest issued for the key, t2, is never accepted,
#    across switches); C gets 'job' with t3 > t2 and its write is accepted.

use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use FindBin;
use lib $FindBin::RealBin;
use DlockCluster;
use DlockFaults;

my $common = q{
shared_preload_libraries = 'dlock'
dlock.max_ttl = '5s'
# room for the refusal checks (some 40 psql calls) before the horizon
# passes, also after a crash restart on a loaded machine (CI runs two TAP
# files at a time; 5 s was not enough once)
dlock.horizon_margin = '12s'
log_error_verbosity = verbose
restart_after_crash = on
autovacuum = off
};

my $max_int8 = '9223372036854775807';

# Run $sql in database postgres of $node in a psql of its own that stops at
# the first error, as role $user (the bootstrap superuser when undef);
# return the SQLSTATE of that error ('' if none) and the output.
sub run_sql
{
	my ($node, $sql, $user) = @_;
	return try_sql($node, 'postgres', $sql,
		defined $user ? (extra_params => [ '-U', $user ]) : ());
}

# The same, as the ordinary role worker.
sub as_worker
{
	my ($node, $sql) = @_;
	return run_sql($node, $sql, 'worker');
}

# The SQLSTATE only.
sub state_of
{
	my ($node, $sql) = @_;
	return (as_worker($node, $sql))[0];
}

# check_fence($key, $token) as worker: 't', 'f', or the SQLSTATE of an error.
sub check_fence
{
	my ($node, $key, $token) = @_;
	my ($st, $out) = as_worker($node, "SELECT dlock.check_fence('$key', $token)");
	return $st eq '' ? $out : $st;
}

# Grant $key for $ttl; return owner and fence (an empty list when refused).
sub grant
{
	my ($node, $key, $ttl) = @_;
	return split /\|/, $node->safe_psql('postgres',
		"SELECT owner, fence FROM dlock.try_acquire('$key', '$ttl')");
}

# How many grants of $key a session gets now (0 or 1).
sub grants
{
	my ($node, $key, $ttl) = @_;
	return $node->safe_psql('postgres',
		"SELECT count(*) FROM dlock.try_acquire('$key', '$ttl')");
}

# Poll until a key never used before is granted: the horizon has passed.
my $probes = 0;
sub await_horizon
{
	my ($node) = @_;
	return $node->poll_query_until('postgres', q{
		SELECT count(*) FROM dlock.try_acquire('tick-' || }
		  . ++$probes . q{, '1 s')}, '1');
}

# The role and the fenced tables.
sub setup
{
	my ($node) = @_;
	$node->safe_psql('postgres', q{
		CREATE EXTENSION dlock;
		CREATE ROLE worker LOGIN;
		GRANT USAGE ON SCHEMA dlock TO worker;
		-- lease mode (the default), one key per warehouse
		CREATE TABLE stock (id int NOT NULL, qty int, fence bigint);
		CREATE TRIGGER stock_fence BEFORE INSERT OR UPDATE OR DELETE ON stock
			FOR EACH ROW EXECUTE FUNCTION dlock.fence_guard('wh-{id}', 'fence');
		-- monotonic mode, the same keys
		CREATE TABLE moves (id int NOT NULL, qty int, fence bigint);
		CREATE TRIGGER moves_fence BEFORE INSERT OR UPDATE OR DELETE ON moves
			FOR EACH ROW EXECUTE FUNCTION dlock.fence_guard('wh-{id}', 'fence', 'monotonic');
		-- part 3: the key is the row's name
		CREATE TABLE job_state (name text NOT NULL, v int, fence bigint);
		CREATE TRIGGER job_state_fence BEFORE INSERT OR UPDATE OR DELETE ON job_state
			FOR EACH ROW EXECUTE FUNCTION dlock.fence_guard('{name}', 'fence');
		CREATE TABLE job_log (name text NOT NULL, step int, fence bigint);
		CREATE TRIGGER job_log_fence BEFORE INSERT OR UPDATE OR DELETE ON job_log
			FOR EACH ROW EXECUTE FUNCTION dlock.fence_guard('{name}', 'fence', 'monotonic');
		GRANT SELECT, INSERT, UPDATE ON stock, moves, job_state, job_log TO worker;
	});
	return;
}

# Every way of presenting $token under warehouse $id is refused: fenced
# INSERTs into both tables, use_fence, fenced (alone and in an UPDATE's
# WHERE clause), and check_fence is false.
sub refused_everywhere
{
	my ($node, $label, $id, $token, $tname) = @_;
	my $key = "wh-$id";
	$tname //= $token;
	is(state_of($node, "INSERT INTO stock VALUES ($id, 1, $token)"), 'LF001',
		"$label: INSERT into the lease-mode table under $key with $tname: LF001");
	is(state_of($node, "INSERT INTO moves VALUES ($id, 1, $token)"), 'LF001',
		"$label: INSERT into the monotonic table under $key with $tname: LF001");
	is(state_of($node, "SELECT dlock.use_fence('$key', $token)"), 'LF001',
		"$label: use_fence('$key', $tname): LF001");
	is(state_of($node, "SELECT dlock.fenced('$key', $token)"), 'LF001',
		"$label: fenced('$key', $tname): LF001");
	is(state_of($node,
			"UPDATE stock SET qty = qty + 1 WHERE id = $id AND dlock.fenced('$key', $token)"),
		$id == 42 ? 'LF001' : '',
		$id == 42
		? "$label: UPDATE ... WHERE dlock.fenced('$key', $tname): LF001"
		: "$label: UPDATE ... WHERE dlock.fenced('$key', $tname) of no row: nothing to refuse");
	is(check_fence($node, $key, $token), 'f',
		"$label: check_fence('$key', $tname) is false");
	return;
}

#
# Part 1: memory mode, a clean restart and a crash restart.
#
my $mem = dlock_node('mem', conf => $common . "dlock.storage = memory\n");
setup($mem);

# During the horizon of round $label, with $old the token of the lease on
# wh-42 before the restart.
sub during_horizon
{
	my ($node, $label, $old) = @_;
	my $contents = q{
		SELECT (SELECT count(*) || ':' || coalesce(md5(string_agg(t::text, ',' ORDER BY t::text)), '')
				FROM stock t)
			|| '/' ||
			   (SELECT count(*) || ':' || coalesce(md5(string_agg(t::text, ',' ORDER BY t::text)), '')
				FROM moves t)};
	my $before = $node->safe_psql('postgres', $contents);
	is(grants($node, "probe-$label-1", '1 s'), '0',
		"$label: before the checks, a key never used is refused (the horizon holds)");
	is(grants($node, 'wh-42', '1 s'), '0',
		"$label: wh-42 is refused too");

	# token 0, under the key that was held and a key never granted
	refused_everywhere($node, $label, 42, 0);
	refused_everywhere($node, $label, 7, 0);
	# the old real token and impossible tokens (0.5 refuses these already)
	refused_everywhere($node, $label, 42, $old, 'the old token');
	refused_everywhere($node, $label, 42, -1);
	refused_everywhere($node, $label, 42, $max_int8);

	is(grants($node, "probe-$label-2", '1 s'), '0',
		"$label: after the checks the horizon still holds");
	is($node->safe_psql('postgres', $contents), $before,
		"$label: the refused writes changed neither table");
	return;
}

# After the horizon: a fresh grant of wh-42 works and its token is
# accepted; return it.
sub after_horizon
{
	my ($node, $label, $old) = @_;
	ok(await_horizon($node), "$label: grants come back after the horizon");
	my (undef, $f) = grant($node, 'wh-42', '4 s');
	cmp_ok($f // 0, '>', $old, "$label: wh-42 granted again with a greater token");
	is(state_of($node, "INSERT INTO stock VALUES (42, 2, $f)"), '',
		"$label: the new token is accepted by the lease-mode table");
	is(state_of($node, "INSERT INTO moves VALUES (42, 2, $f)"), '',
		"$label: and by the monotonic table");
	is(state_of($node, "BEGIN; SELECT dlock.use_fence('wh-42', $f); UPDATE stock SET qty = 3 WHERE id = 42; COMMIT"),
		'', "$label: and by use_fence");
	is(check_fence($node, 'wh-42', $f), 't', "$label: check_fence of the new token is true");
	is(state_of($node, "INSERT INTO stock VALUES (42, 2, $old)"), 'LF001',
		"$label: the token from before the restart is still refused");
	return $f;
}

# Round 1: a clean restart.
my (undef, $f1) = grant($mem, 'wh-42', '4 s');
like($f1 // '', qr/^\d+$/, 'memory: wh-42 granted for 4 s');
is(state_of($mem, "INSERT INTO stock VALUES (42, 1, $f1)"), '',
	'memory: a write under its token is accepted (lease mode)');
is(state_of($mem, "INSERT INTO moves VALUES (42, 1, $f1)"), '',
	'memory: and in monotonic mode');
$mem->restart;
during_horizon($mem, 'restart', $f1);
my $f2 = after_horizon($mem, 'restart', $f1);

# Round 2: a crash restart, with the lease just granted (4 s) held.
my $bg = $mem->background_psql('postgres');
my $victim = $bg->query_safe('SELECT pg_backend_pid()');
crash_and_wait($mem, $victim)
  or die 'the server did not come back after the crash';
$bg->quit;
during_horizon($mem, 'crash', $f2);
after_horizon($mem, 'crash', $f2);
$mem->stop;

#
# Part 2: table mode, no horizon.
#
my $sw = dlock_node('switch', conf => $common . "dlock.storage = table\n");
setup($sw);

my ($o5, $f5) = grant($sw, 'wh-5', '4 s');
is(state_of($sw, "INSERT INTO moves VALUES (5, 1, $f5)"), '',
	'table: a write under wh-5 is accepted');
is($sw->safe_psql('postgres', "SELECT dlock.release('wh-5', '$o5')"), 't',
	'table: wh-5 released');
refused_everywhere($sw, 'table, released', 5, 0);
refused_everywhere($sw, 'table, released', 5, -1);
refused_everywhere($sw, 'table, never granted', 6, 0);
refused_everywhere($sw, 'table, never granted', 6, -1);
is(check_fence($sw, 'wh-5', $f5), 'f', 'table: check_fence of the released token is false');

#
# Part 3: table -> memory -> table.
#
my ($oa, $t1) = grant($sw, 'job', '4 s');
like($t1 // '', qr/^\d+$/, 'table: A gets job (t1)');
is(state_of($sw, "INSERT INTO job_log VALUES ('job', 1, $t1)"), '',
	'table: A writes under t1 (monotonic)');
is($sw->safe_psql('postgres', "SELECT dlock.release('job', '$oa')"), 't',
	'table: A releases job');

$sw->append_conf('postgresql.conf', "dlock.storage = memory\n");
$sw->restart;
is($sw->safe_psql('postgres', 'SHOW dlock.storage'), 'memory', 'switched to memory mode');
ok(await_horizon($sw), 'memory: grants work');
my ($ob, $t2) = grant($sw, 'job', '4 s');
cmp_ok($t2 // 0, '>', $t1, 'memory: B gets job with t2 > t1');
is(state_of($sw, "INSERT INTO job_log VALUES ('job', 2, $t2)"), '',
	'memory: B writes under t2 (monotonic)');
is(state_of($sw, "INSERT INTO job_log VALUES ('job', 3, $t1)"), 'LF001',
	'memory: A\'s write under t1 is refused');
is($sw->safe_psql('postgres', "SELECT dlock.release('job', '$ob')"), 't',
	'memory: B releases job');

$sw->append_conf('postgresql.conf', "dlock.storage = table\n");
$sw->restart;
is($sw->safe_psql('postgres', 'SHOW dlock.storage'), 'table', 'switched back to table mode');
is(grants($sw, 'job', '1 s'), '0',
	'table after memory: job is refused while the horizon holds');
is(state_of($sw, "INSERT INTO job_state VALUES ('job', 1, 0)"), 'LF001',
	'table after memory, horizon: token 0 under job refused (lease mode)');
is(state_of($sw, "INSERT INTO job_log VALUES ('job', 4, 0)"), 'LF001',
	'table after memory, horizon: token 0 under job refused (monotonic)');
is(state_of($sw, "SELECT dlock.use_fence('job', 0)"), 'LF001',
	'table after memory, horizon: use_fence(job, 0) refused');
is(check_fence($sw, 'job', 0), 'f',
	'table after memory, horizon: check_fence(job, 0) is false');
is(state_of($sw, "INSERT INTO job_log VALUES ('job', 5, $t1)"), 'LF001',
	'table after memory, horizon: A\'s t1 refused (monotonic)');
is(state_of($sw, "INSERT INTO job_log VALUES ('job', 6, $t2)"), 'LF001',
	'table after memory, horizon: B\'s t2 refused (monotonic)');
my $status = $sw->safe_psql('postgres',
	q{SELECT coalesce(string_agg(state, ','), 'none') FROM dlock.lease_status WHERE key = 'job'});
isnt($status, 'released',
	'table after memory, horizon: lease_status does not show job released');
is($status, 'held',
	'table after memory, horizon: lease_status shows job held, as a grant meets it');
is(grants($sw, 'job', '1 s'), '0',
	'table after memory: after those checks the horizon still holds job');

ok(await_horizon($sw), 'table after memory: grants come back after the horizon');
is(state_of($sw, "INSERT INTO job_log VALUES ('job', 7, $t1)"), 'LF001',
	'table after memory, after the horizon: A\'s t1 (below t2) refused (monotonic)');
is(state_of($sw, "INSERT INTO job_log VALUES ('job', 8, 0)"), 'LF001',
	'table after memory, after the horizon: token 0 refused (monotonic)');
is($sw->safe_psql('postgres', q{SELECT count(*) FROM job_log WHERE step > 2}), '0',
	'table after memory: job_log holds only the writes of A (t1) and B (t2)');
my (undef, $t3) = grant($sw, 'job', '4 s');
cmp_ok($t3 // 0, '>', $t2, 'table after memory: C gets job with t3 > t2');
is(state_of($sw, "INSERT INTO job_log VALUES ('job', 9, $t3)"), '',
	'table after memory: C writes under t3 (monotonic)');
is(state_of($sw, "INSERT INTO job_state VALUES ('job', 9, $t3)"), '',
	'table after memory: C writes under t3 (lease mode)');
is(state_of($sw, "INSERT INTO job_log VALUES ('job', 10, $t2)"), 'LF001',
	'table after memory: B\'s t2 is refused after C\'s grant');

foreach my $node ($mem, $sw)
{
	unlike(slurp_file($node->logfile), qr/\bXX000\b/,
		$node->name . ': no internal error (XX000) in the server log');
}

$sw->stop;
done_testing();
