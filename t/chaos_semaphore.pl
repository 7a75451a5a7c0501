# The chaos checker's semaphore workload (issue 20, chaos/README.md) under
# its nemesis, in table mode and in memory mode.
#
# dlock-chaos --workload semaphore: 6 clients take one of the 3 permits of
# 2 keys (try_acquire and acquire with permits => 3) with 100-500 ms
# leases, renew, and write rows WHERE dlock.fenced(key, their permit's
# token) into a history that records the server's clock_timestamp() (seven
# writes in ten in a transaction held open a while, one in ten across the
# lease's expiry), some of them after a pause past the lease's end, and
# release; 2 readers take shared leases of a third key, whose exclusive
# lease the 6 others take one turn in four.  The nemesis SIGSTOPs clients,
# terminates their backends and crash-restarts the server.  At the end the
# checker verifies, besides what it checks for every workload (tokens never
# reissued nor out of order, expiry by both clocks, no acknowledged write
# lost, no holder refused while its lease was certainly live): every
# accepted write's token was granted to its writer; by the server's clock,
# never more than 3 permits' writes open at one moment, nor more than 3
# permits live; an exclusive lease's writes never overlap another lease's,
# no write ends after a later grant that excludes its lease, and no
# exclusive grant while another lease of its key was live.
#
# 1. Table mode (dlock not preloaded), 20 s, a crash every 2.5-7.5 s:
#    exit 0, no violation, and counts showing that it happened (grants of
#    each kind, shared after exclusive and back, refused stale writes, 3
#    permits written under at one moment, crash-restarts, ...) and that the
#    checks had something to check.
# 2. Not vacuous: the same workload without dlock.fenced in the writes
#    (--no-fence, 6 s) must exit 1 with stale and superseded writes and
#    writes after a later excluding grant; and each semaphore check fires
#    when its property is really broken (--sabotage, 4-5 s, the nemesis
#    nearly idle): borrow (a write under another client's permit through
#    dlock.fenced, which the server accepts: tokens are not secrets),
#    overcommit (4 permits taken with permits => 4 and written under at
#    once), lost-renewal (a write without dlock.fenced after renew said
#    NULL), stale-reader (a shared holder's write without dlock.fenced
#    across another client's exclusive lease), steal (dlock.forget of a
#    key with a live permit, then 3 grants of it).
# 3. Memory mode (dlock preloaded, dlock.storage = memory,
#    dlock.horizon_margin = 500ms), 20 s, a crash every 1.5-4.5 s: the same
#    as 1, with permits certainly live when a crash-restart began (the
#    horizon's case for the count of live permits).
#
# About 80 s on 2 shared cores.  DLOCK_CHAOS_SEED sets the seed of the
# runs of 1 and 3 (default 42).
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use FindBin;
use lib $FindBin::RealBin;
use DlockFaults;
use Time::HiRes qw(time);

my $t_start = time();
my $prog = chaos_checker();
# fsync on, restart_after_crash on (see DlockFaults::chaos_node)
my $node = chaos_node('chaos_semaphore');
my $seed = $ENV{DLOCK_CHAOS_SEED} // 42;
my @semaphore = ('--workload' => 'semaphore', '--permits' => 3);

sub chaos { return run_chaos($prog, $node, @semaphore, @_) }

# The checks of a clean semaphore run, named "$label: ...", besides
# DlockFaults::check_clean_run's.
sub check_semaphore_run
{
	my ($label, $out, $c) = @_;
	local $Test::Builder::Level = $Test::Builder::Level + 1;
	foreach my $count (
		qw(permit_grants shared_grants exclusive_grants writes_refused
		permit_writers_at_n permits_live_at_n exclusive_after_shared
		shared_after_exclusive))
	{
		cmp_ok($c->{$count} // 0, '>', 0, "$label: $count > 0");
	}
	is($c->{max_permit_writers}, 3, "$label: 3 permits written under at one moment, never more");
	is($c->{max_permits_live}, 3, "$label: 3 permits live at one moment, never more");
	like($out, qr/checked for exclusion by the server's clock: [1-9]/,
		"$label: exclusive grants checked against the other leases of their key");
	like($out, qr/shared\/exclusive writes checked for overlap [1-9]/,
		"$label: shared/exclusive writes checked for overlap");
	like($out, qr/checked against the later grants that exclude them [1-9]/,
		"$label: writes checked against later excluding grants");
	like($out, qr/holders' refusals checked against a certainly live lease [1-9]/,
		"$label: holders' refusals checked against their lease");
	return;
}

#
# 1. Table mode.
#
{
	my $t0 = time();
	my ($rc, $out, $err, $c) = chaos(
		'--duration' => 20,
		'--workers' => 8,
		'--keys' => 2,
		'--seed' => $seed,
		crash_options($node, 5));
	note sprintf('table mode run: %.1f s', time() - $t0);
	check_clean_run("table mode, seed $seed", $rc, $out, $err, $c);
	check_semaphore_run("table mode, seed $seed", $out, $c);
}

# The server is up and answering after the last crash-restart.
$node->_update_pid(1);
is($node->safe_psql('postgres', 'SELECT 1'), '1', 'server up after the run');

#
# 2. Not vacuous.
#
# (Overlapping writes of an exclusive lease and more than N permits'
# writes at once are often reported too, not always: 4 and 2 runs in 5.)
{
	my $out = check_no_fence_run($prog, $node, 'without dlock.fenced', @semaphore);
	my $v = 'write accepted after a later grant that excludes its lease (server clock)';
	like($out, qr/^dlock-chaos: violations: \Q$v\E: [1-9]/m,
		"without dlock.fenced: \"$v\" reported");
}

# One semaphore key and one shared/exclusive key, the nemesis nearly idle
# (one SIGSTOP or termination, half a second in), so that it cannot cut
# the sabotage off; a SIGSTOP may delay it by up to 1.5 s.  2 clients (one
# of them a reader) unless said otherwise.
my @quiet = (@semaphore, '--keys' => 1, '--nemesis-every' => 60000);
my @sabotages = (
	[
		'borrow', [ '--duration' => 5, '--workers' => 3, @quiet ],
		'write accepted under a token its client was not granted'
	],
	[
		'overcommit', [ '--duration' => 4, @quiet ],
		'writes under more than N permits accepted at one moment (server clock)',
		'more than N permits of a key live at one moment (server clock)'
	],
	[
		'lost-renewal', [ '--duration' => 4, @quiet ],
		'write accepted after its lease expired',
		'write accepted after its lease expired (server clock)'
	],
	[
		'stale-reader', [ '--duration' => 5, '--workers' => 3, @quiet ],
		'write accepted under a superseded lease',
		'write accepted after a later grant that excludes its lease (server clock)',
		"an exclusive lease's write and another lease's accepted at overlapping moments (server clock)"
	],
	[
		'steal', [ '--duration' => 4, @quiet ],
		'more than N permits of a key live at one moment (server clock)',
		'acknowledged lease lost (its holder refused while it was certainly live)'
	]);
foreach my $s (@sabotages)
{
	my ($kind, $args, @expect) = @$s;
	check_sabotage_run($prog, $node, "sabotage $kind", $kind, $args, @expect);
}

#
# 3. Memory mode.
#
$node->_update_pid(1);
$node->append_conf('postgresql.conf', q{
shared_preload_libraries = 'dlock'
dlock.storage = memory
dlock.horizon_margin = '500ms'
});
$node->restart;
is($node->safe_psql('postgres', 'SHOW dlock.storage'), 'memory', 'memory mode');
{
	my $t0 = time();
	my ($rc, $out, $err, $c) = chaos(
		'--duration' => 20,
		'--workers' => 8,
		'--keys' => 2,
		'--seed' => $seed,
		crash_options($node, 3));
	note sprintf('memory mode run: %.1f s', time() - $t0);
	check_clean_run("memory mode, seed $seed", $rc, $out, $err, $c);
	check_semaphore_run("memory mode, seed $seed", $out, $c);
	like($out, qr/permits certainly live when a crash-restart in memory mode began: [1-9]/,
		"memory mode, seed $seed: permits live across a crash-restart counted against the grants after it");
}
$node->_update_pid(1);
is($node->safe_psql('postgres', 'SHOW dlock.storage'), 'memory',
	'server up after the run, in memory mode');

$node->stop;
note sprintf('total %.1f s', time() - $t_start);
done_testing();
