# Hostile input (issue 9, section 5): fuzz/dlock-fuzz calls every SQL
# function of dlock and writes through fence_guard with hostile arguments,
# and attacks as an ordinary role (CREATE on the database and on public)
# every way we know to forge or destroy a lease.  After every call it reads
# a digest of the state over a separate superuser connection (the lease
# rows with their owners, the token sequence, dlock's catalog entries, the
# protected tables) and counts as a violation: a crash (lost connection,
# restarted postmaster, PANIC/TRAP/signal death in the server log), any
# XX000, any SQLSTATE outside its allowlist, any state change from a
# refused call, any attack or stale write that succeeds, a held key granted
# to another, a wrong owner's renew/release that did not fail.
#
# a. Two runs at once on a preloaded server with max_prepared_transactions
#    > 0 (so PREPARE TRANSACTION reaches dlock's own refusal): a fixed seed
#    and a random seed (printed), 20,000 calls in total; both exit 0 with
#    0 crashes and 0 violations, and print the SQLSTATE histogram.
# b. The checks are honest: the same program goes red (exit 1, the
#    violation named) when an attack is let through (a call injected that
#    succeeds), when PUBLIC is granted UPDATE/DELETE on dlock.leases and
#    the sequence (forgeries succeed; a refused call moves the sequence),
#    when a call raises XX000, and when a backend is killed with SIGKILL
#    during the run (the server restarts).
# c. Tokens that were never issued (issue 18): 0, -1, -2^63, the token
#    counter's last value + 1 and 2^63-1, for every key shape, through
#    use_fence, fenced, check_fence and the fencing trigger (lease and
#    'monotonic' tables), must be refused (LF001; check_fence false); and
#    every call of dlock made through a wrapper function whose SET clause
#    changes a setting dlock changes or relies on (synchronous_commit,
#    search_path, lock_timeout, statement_timeout, the read-only settings,
#    dlock.*) must end as the same call made directly (--sweep, and a few
#    percent of the random calls).  In table mode (the random-seed run of
#    a) and in memory mode (a second server with dlock.storage = memory).
# d. Memory mode, right after a restart, while the horizon holds every
#    key (an 8 s lease granted before the restart): no key is granted, and
#    every token presented, the real ones included, is refused with LF001
#    through every surface and every wrapper, until shortly before the
#    horizon passes (--horizon); nor is a permit, a shared lease or a
#    leader granted, nor anything observed (0.7).
# e. The 0.7 API (issue 20) in all of a, c and d: try_acquire/acquire
#    with permits and modes, campaign, proclaim, leader, observe (also
#    while the key changes, which it must report), dlock.notify, with the
#    same hostile arguments; after each such call the invariants of
#    permits and shared leases hold (no token names two leases, no
#    exclusive lease live with, or overlapping in time, a permit or shared
#    lease of its key, no more live permits than the largest permits => N
#    asked, ...), and the sweeps fill a 512-byte key with 1000 shared
#    leases.  The check goes red on a forged state: an exclusive lease
#    over two live permits with one of their tokens.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use FindBin;
use lib $FindBin::RealBin;
use DlockCluster;
use Time::HiRes qw(usleep);

my $fuzz = "$ENV{TESTDIR}/fuzz/dlock-fuzz";
if (!-x $fuzz)
{
	my $pg_config = $ENV{PG_CONFIG} // 'pg_config';
	system_or_bail('make', '-s', '-C', "$ENV{TESTDIR}/fuzz",
		"PG_CONFIG=$pg_config");
}
ok(-x $fuzz, 'dlock-fuzz is built');

my $fixed_seed = 20260901;
my $fixed_calls = 12000;
my $random_calls = 8000;
my $memory_calls = 2000;
my $random_seed = int(rand(1_000_000_000));

my $node = dlock_node('hostile', conf => q{
shared_preload_libraries = 'dlock'
max_prepared_transactions = 2
max_worker_processes = 8
max_parallel_workers = 4
restart_after_crash = on
log_min_messages = warning
log_min_error_statement = panic
});
my $log = $node->logfile;
for my $db (qw(fuzz1 fuzz2 fuzz3 fuzz4 fuzz5 fuzz6 fuzz7))
{
	$node->safe_psql('postgres',
		"CREATE DATABASE $db TEMPLATE template0 ENCODING 'UTF8' LC_COLLATE 'C' LC_CTYPE 'C'");
}

# The server of c and d: leases in shared memory, a short horizon margin,
# so that a restart's horizon is the 8 s lease of d plus 0.2 s (the
# generator stops when it has made its calls, long before under no load).
my $mem = dlock_node('hostile_mem', conf => q{
shared_preload_libraries = 'dlock'
dlock.storage = memory
dlock.horizon_margin = '200ms'
max_prepared_transactions = 2
max_worker_processes = 8
max_parallel_workers = 4
log_min_messages = warning
log_min_error_statement = panic
});
for my $db (qw(mfuzz mhorizon))
{
	$mem->safe_psql('postgres',
		"CREATE DATABASE $db TEMPLATE template0 ENCODING 'UTF8' LC_COLLATE 'C' LC_CTYPE 'C'");
}

# Start dlock-fuzz on database db of server on as role; returns the harness.
sub start_fuzz_on
{
	my ($on, $db, $role, $seed, $calls, $out, $err, @extra) = @_;
	my @cmd = (
		$fuzz, '--calls', $calls, '--seed', $seed, '--role', $role,
		'--server-log', $on->logfile, '-h', $on->host, '-p', $on->port,
		'-d', $db, @extra);
	return IPC::Run::start(\@cmd, '>', $out, '2>', $err,
		IPC::Run::timeout(900));
}

# The same on the table-mode server.
sub start_fuzz
{
	return start_fuzz_on($node, @_);
}

# ---- a: the runs ----------------------------------------------------------
my ($out1, $err1, $out2, $err2) = ('', '', '', '');
my $t0 = time;
my $h1 = start_fuzz('fuzz1', 'dlock_fuzz1', $fixed_seed, $fixed_calls,
	\$out1, \$err1);
my $h2 = start_fuzz('fuzz2', 'dlock_fuzz2', $random_seed, $random_calls,
	\$out2, \$err2, '--sweep');
# c, in memory mode, at the same time (the random-seed run ends first)
my ($outm, $errm) = ('', '');
my $hm = start_fuzz_on($mem, 'mfuzz', 'dlock_fuzz_m', $fixed_seed,
	$memory_calls, \$outm, \$errm, '--sweep');
$h1->finish;
my $rc1 = $? >> 8;
$h2->finish;
my $rc2 = $? >> 8;
$hm->finish;
my $rcm = $? >> 8;
diag("fixed seed $fixed_seed, $fixed_calls calls:\n$out1$err1");
diag("random seed $random_seed, --sweep and $random_calls calls (rerun with --seed $random_seed):\n$out2$err2");
diag("memory mode, seed $fixed_seed, --sweep and $memory_calls calls:\n$outm$errm");
diag(sprintf("the three runs took %d s", time - $t0));
is($rc1, 0, "fixed seed $fixed_seed: dlock-fuzz exits 0");
like($out1, qr/^crashes: 0, violations: 0$/m, 'fixed seed: 0 crashes, 0 violations');
# A generator step may make more than one call (and which steps run
# depends on timing: a wait that times out under load), so a run ends with
# at least the calls asked for, sometimes a few more.
sub calls_made
{
	my ($out) = @_;
	return $out =~ /^SQLSTATE histogram \((\d+) calls/m ? $1 : 0;
}
cmp_ok(calls_made($out1), '>=', $fixed_calls, 'fixed seed: all calls made');
unlike($out1 . $err1, qr/XX000/, 'fixed seed: no XX000');
is($rc2, 0, "random seed $random_seed: dlock-fuzz exits 0");
like($out2, qr/^crashes: 0, violations: 0$/m, 'random seed: 0 crashes, 0 violations');
cmp_ok(calls_made($out2), '>=', $random_calls, 'random seed: all calls made');
ok($out1 =~ /attacks refused: (\d+), stale writes refused: (\d+), writes under the current token accepted: (\d+)/
	  && $1 > 1000 && $2 > 1000 && $3 > 100,
	'fixed seed: many attacks and stale writes refused, many good writes accepted');
is($node->safe_psql('postgres',
		"SELECT count(*) FROM pg_prepared_xacts"), '0', 'no prepared transaction left');

# ---- e: the 0.7 API ran, and its checks with it ----------------------------
# (violations failed the runs above; here: that there were enough calls)
sub kinds_counts
{
	my ($out) = @_;
	return $out =~ /^permits, shared leases and elections: (\d+) calls, (\d+) leases granted to known owners, (\d+) observe races checked, (\d+) invariant checks, (\d+) notifications$/m
	  ? ($1, $2, $3, $4, $5) : (0, 0, 0, 0, 0);
}
for my $run ([ 'fixed seed', $out1, 1000, 60, 40, 1000 ],
	[ 'random seed', $out2, 700, 40, 25, 700 ])
{
	my ($what, $out, $calls, $leases, $races, $checks) = @$run;
	my ($c, $l, $r, $i, $n) = kinds_counts($out);
	ok($c > $calls && $l > $leases && $r > $races && $i > $checks,
		"$what: the 0.7 API called ($c calls, $l leases to known owners, $r observe races, $i invariant checks)");
}
ok((kinds_counts($out1))[4] > 0, 'fixed seed: NOTIFYs of dlock received and checked');

# ---- c: never-issued tokens and wrappers, in both storage modes -----------
# (their violations, if any, failed the runs above; here: that they ran)
sub sweep_counts
{
	my ($out) = @_;
	return $out =~ /^never-issued tokens \(and tokens during the horizon\) refused: (\d+), wrapped calls compared with direct ones: (\d+)$/m
	  ? ($1, $2) : (0, 0);
}
my ($refused, $wrapped) = sweep_counts($out2);
cmp_ok($refused, '>', 1500, 'table mode: never-issued tokens presented and refused');
cmp_ok($wrapped, '>', 200, 'table mode: wrapped calls compared with direct calls');
is($rcm, 0, 'memory mode: dlock-fuzz exits 0');
like($outm, qr/^crashes: 0, violations: 0$/m, 'memory mode: 0 crashes, 0 violations');
cmp_ok(calls_made($outm), '>=', $memory_calls, 'memory mode: all calls made');
($refused, $wrapped) = sweep_counts($outm);
cmp_ok($refused, '>', 1500, 'memory mode: never-issued tokens presented and refused');
cmp_ok($wrapped, '>', 200, 'memory mode: wrapped calls compared with direct calls');
{
	my ($c, $l, $r, $i) = kinds_counts($outm);
	ok($c > 300 && $l > 15 && $r > 3 && $i > 300,
		"memory mode: the 0.7 API called ($c calls, $l leases to known owners, $r observe races, $i invariant checks)");
}

# ---- d: every token refused during the horizon after a restart ------------
my $last = $mem->safe_psql('mhorizon', q{
	CREATE EXTENSION dlock;
	SELECT fence FROM dlock.try_acquire('fz:k0', '8 s');
});
like($last, qr/^\d+$/, 'memory mode: an 8 s lease granted before the restart');
$mem->restart;
my ($outh, $errh) = ('', '');
my $hh = start_fuzz_on($mem, 'mhorizon', 'dlock_fuzz_h', $fixed_seed, 1,
	\$outh, \$errh, '--horizon');
$hh->finish;
my $rch = $? >> 8;
diag("memory mode, right after a restart, --horizon:\n$outh$errh");
is($rch, 0, 'horizon: dlock-fuzz exits 0');
like($outh, qr/^crashes: 0, violations: 0$/m, 'horizon: 0 crashes, 0 violations');
ok($outh =~ /^horizon: (\d+) calls made before it/m && $1 >= 200,
	'horizon: at least 200 calls made before the horizon passed');

# ---- b: the checks go red ---------------------------------------------------
my ($o, $e);

# an attack that succeeds
($o, $e) = ('', '');
my $h = start_fuzz('fuzz3', 'dlock_fuzz3', 1, 400, \$o, \$e,
	'--inject', 'SELECT 1');
$h->finish;
isnt($? >> 8, 0, 'red: an injected attack that succeeds fails the run');
like($e, qr/VIOLATION: attack succeeded.*\n.*SELECT 1/,
	'red: the succeeding call is named');

# XX000
($o, $e) = ('', '');
$h = start_fuzz('fuzz4', 'dlock_fuzz4', 1, 400, \$o, \$e,
	'--inject', q{DO $$BEGIN RAISE EXCEPTION 'boom' USING ERRCODE = 'XX000'; END$$});
$h->finish;
isnt($? >> 8, 0, 'red: an XX000 fails the run');
like($e, qr/VIOLATION: internal error XX000/, 'red: the XX000 is named');

# storage and sequence writable by PUBLIC: forgeries succeed, and a refused
# call (nextval then a division by zero) moves the sequence
$node->safe_psql('fuzz5', q{
	CREATE EXTENSION dlock;
	GRANT INSERT, UPDATE, DELETE ON dlock.leases TO PUBLIC;
	GRANT USAGE, UPDATE ON SEQUENCE dlock.fence_seq TO PUBLIC;
});
($o, $e) = ('', '');
$h = start_fuzz('fuzz5', 'dlock_fuzz5', 3, 800, \$o, \$e,
	'--inject', q{SELECT pg_catalog.nextval('dlock.fence_seq') / 0});
$h->finish;
isnt($? >> 8, 0, 'red: writable storage fails the run');
like($e, qr/VIOLATION: attack succeeded.*\n.*dlock\.(leases|fence_seq)/,
	'red: a forgery of the storage or the sequence is named');
like($e, qr/VIOLATION: dlock\.fence_seq moved from \d+ to \d+\n.*nextval.*\/ 0/,
	'red: a refused call that moved the sequence is named');

# the invariants of permits: an exclusive lease forged over two live
# permits of its key, with the first permit's token
$node->safe_psql('fuzz7', q{
	CREATE EXTENSION dlock;
	SELECT count(*) FROM dlock.try_acquire('fz:p0', '1 hour', permits => 2);
	SELECT count(*) FROM dlock.try_acquire('fz:p0', '1 hour', permits => 2);
	UPDATE dlock.leases h SET owner = gen_random_uuid(), fence = s.fence,
		granted_at = now(), expires_at = now() + interval '1 hour'
	FROM dlock.leases s WHERE h.key = 'fz:p0' AND s.key = E'fz:p0\x1f1';
});
($o, $e) = ('', '');
$h = start_fuzz('fuzz7', 'dlock_fuzz7', 5, 50, \$o, \$e);
$h->finish;
isnt($? >> 8, 0, 'red: a forged exclusive lease over live permits fails the run');
like($e, qr/VIOLATION: invariant: a token names two leases.*\n(?:.*\n)*VIOLATION: invariant: an exclusive lease is live together with a permit.*'fz:p0'\n(?:.*\n)*VIOLATION: invariant: an exclusive lease and a permit .* overlapped in time: 'fz:p0':.*\n(?:.*\n)*VIOLATION: invariant: more live permits than the largest permits => N asked: 'fz:p0': 2 live/,
	'red: the broken invariants are named');

# a backend killed during the run: the server restarts (the digest
# connection's backend: it is never reconnected, so its pid stays ours).
# Once the run is past its setup, which ends with the ordinary role's
# connection: a kill during the setup (slow under load) would only make it
# give up (exit 2), not name the crash.
($o, $e) = ('', '');
$h = start_fuzz('fuzz6', 'dlock_fuzz6', 3, 20000, \$o, \$e);
my $pid = '';
foreach my $i (1 .. 600)
{
	$pid = $node->safe_psql('postgres', q{
		SELECT pid FROM pg_stat_activity
		WHERE application_name = 'dlock-fuzz-digest' AND datname = 'fuzz6'
		  AND EXISTS (SELECT FROM pg_stat_activity
					  WHERE application_name = 'dlock-fuzz-usr' AND datname = 'fuzz6')});
	last if $pid =~ /^\d+$/;
	usleep(100_000);
}
like($pid, qr/^\d+$/, 'the fuzzer of the crash check is running');
sleep 2;
my $cmdline = eval { slurp_file("/proc/$pid/cmdline") } // '';
like($cmdline, qr/^postgres: /, 'the pid is still a backend');
kill 'KILL', $pid if $cmdline =~ /^postgres: /;
$h->finish;
isnt($? >> 8, 0, 'red: a backend killed by a signal fails the run');
like($e, qr/VIOLATION: (connection lost|the server restarted|cannot read the state|server log)/,
	'red: the crash is named');
$node->poll_query_until('postgres', 'SELECT true')
  or die 'the server did not come back';

$node->stop;
$mem->stop;
done_testing();
