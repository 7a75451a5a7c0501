# The chaos checker's election workload (issue 20, chaos/README.md) under
# its nemesis, in table mode and in memory mode.
#
# dlock-chaos --workload election: 6 campaigners dlock.campaign for 2
# elections with 100-500 ms leases and, while leader, renew, proclaim
# "w<client>:<grant>:<n>" with n increasing, and write rows WHERE
# dlock.fenced(election, epoch) into a history that records the server's
# clock_timestamp() (more than half of them in a transaction held open a
# while, one in ten across the lease's expiry), some of them and some
# proclaims after a pause past the lease's end; 2 observers follow both
# elections with the long poll of dlock.observe and with dlock.leader.  The nemesis SIGSTOPs
# workers, terminates their backends and crash-restarts the server.  At
# the end the checker verifies, besides what it checks for every workload
# (tokens, exclusion of grants by the server's clock, expiry by both
# clocks, no write after a newer grant, no acknowledged write lost): every
# accepted write of an epoch is its leader's; by the server's clock no
# accepted write of an epoch comes after one of a larger epoch, and no two
# clients' writes overlap; no proclaim was accepted outside its lease; no
# holder was refused while its lease was certainly live; each observer
# never saw an election go backwards, never less than had been
# acknowledged before its call, never a value not proclaimed in that
# epoch, never an ended lease as the leader; and after the run the last
# acknowledged epoch and proclaim are still there.
#
# 1. Table mode (dlock not preloaded), 20 s, a crash every 2.5-7.5 s:
#    exit 0, no violation, and counts showing that it happened (grants,
#    takeovers, accepted writes, refused stale writes and proclaims, leader
#    changes, proclaims, observations that saw changes, crash-restarts, ...)
#    and that the checks had something to check.
# 2. Not vacuous: the same workload without dlock.fenced in the writes
#    (--no-fence, 6 s) must exit 1 with stale and superseded writes,
#    epochs out of order and overlapping writers; and each election check
#    fires when its property is really broken (--sabotage, 3-5 s, the
#    nemesis nearly idle): superseded (an old epoch's write without
#    dlock.fenced after a newer epoch's), usurp (a client writes under
#    another client's epoch through dlock.fenced, which the server accepts:
#    tokens are not secrets, and holds its transaction open until that
#    client wrote too), proclaim-back (a leader proclaims a lower
#    value), stale-proclaim (an old epoch's value proclaimed with a newer
#    lease's owner), steal (dlock.forget of a live lease, then a proclaim
#    under it, and the election granted again at once).
# 3. Memory mode (dlock preloaded, dlock.storage = memory,
#    dlock.horizon_margin = 500ms), 25 s, a crash every 1.5-4.5 s: the same
#    as 1, and consecutive epochs of an election with a crash-restart
#    between them that began while the first lease was certainly live (the
#    horizon's case).
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
use Time::HiRes qw(time usleep);

my $t_start = time();
my $prog = chaos_checker();
# fsync on, restart_after_crash on (see DlockFaults::chaos_node)
my $node = chaos_node('chaos_election');
my $seed = $ENV{DLOCK_CHAOS_SEED} // 42;
my @election = ('--workload' => 'election');

sub chaos { return run_chaos($prog, $node, @election, @_) }

# The checks of a clean election run, named "$label: ...", besides
# DlockFaults::check_clean_run's.
sub check_election_run
{
	my ($label, $out, $c) = @_;
	local $Test::Builder::Level = $Test::Builder::Level + 1;
	foreach my $count (
		qw(epochs_written leader_changes proclaims stale_proclaims_refused
		writes_refused observations observed_changes))
	{
		cmp_ok($c->{$count} // 0, '>', 0, "$label: $count > 0");
	}
	like($out, qr/checked for exclusion by the server's clock: [1-9]/,
		"$label: consecutive grants checked for exclusion");
	like($out, qr/writes checked for overlap with another client's [1-9]/,
		"$label: writes checked for overlap with other clients'");
	like($out, qr/holders' refusals checked against a certainly live lease [1-9]/,
		"$label: holders' refusals checked against their lease");
	like($out, qr/made while an acknowledged lease was certainly live [1-9]/,
		"$label: observations made while a leader was certainly live");
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
	check_election_run("table mode, seed $seed", $out, $c);
}

# The server is up and answering after the last crash-restart.
$node->_update_pid(1);
is($node->safe_psql('postgres', 'SELECT 1'), '1', 'server up after the run');

#
# 2. Not vacuous.
#
{
	my $out = check_no_fence_run($prog, $node, 'without dlock.fenced', @election);
	foreach my $v (
		'epochs of accepted writes out of order (server clock)',
		"two clients' writes accepted at overlapping moments (server clock)")
	{
		like($out, qr/^dlock-chaos: violations: \Q$v\E: [1-9]/m,
			"without dlock.fenced: \"$v\" reported");
	}
}

# One election, the nemesis nearly idle (at most one SIGSTOP or
# termination), so that it cannot cut the sabotage off.
my @quiet = (@election, '--keys' => 1, '--nemesis-every' => 60000);
my @sabotages = (
	[
		'superseded', [ '--duration' => 3, @quiet ],
		'write accepted under a superseded lease',
		'epochs of accepted writes out of order (server clock)'
	],
	[
		'usurp', [ '--duration' => 5, '--workers' => 3, @quiet ],
		'write accepted under an epoch its client was not granted',
		"two clients' writes accepted at overlapping moments (server clock)"
	],
	[
		'proclaim-back', [ '--duration' => 4, @quiet ],
		'observer saw the election go backwards'
	],
	[
		'stale-proclaim', [ '--duration' => 4, @quiet ],
		'proclaim accepted outside its lease',
		'observer saw a value not proclaimed in that epoch'
	],
	[
		'steal', [ '--duration' => 3, @quiet ],
		'key granted while an acknowledged lease of it was live (server clock)',
		'acknowledged lease lost (its holder refused while it was certainly live)'
	]);
# Each sabotage is seen only if it strikes, or an observer looks, at the
# right moment, which a loaded machine can make it miss (proclaim-back,
# stale-proclaim and usurp have each been missed in full CI runs): up to
# three runs of each, until one reports every expected violation (a run
# that does not is noted); the assertions are made on the last run.
my %tries = map { $_->[0] => 3 } @sabotages;
foreach my $s (@sabotages)
{
	my ($kind, $args, @expect) = @$s;
	my $tries = $tries{$kind} // 1;
	my ($rc, $out, $err);
	foreach my $try (1 .. $tries)
	{
		($rc, $out, $err) = run_chaos($prog, $node, '--workers' => 2, '--keys' => 4,
			'--sabotage' => $kind, @$args);
		last if $rc == 1
		  && !grep { $out !~ /^dlock-chaos: violations: \Q$_\E: [1-9]/m } @expect;
		note "sabotage $kind: run $try did not report every expected violation"
		  if $try < $tries;
	}
	is($rc, 1, "sabotage $kind: dlock-chaos exits 1")
	  or diag "sabotage $kind:\n$out\n$err";
	foreach my $v (@expect)
	{
		like($out, qr/^dlock-chaos: violations: \Q$v\E: [1-9]/m,
			"sabotage $kind: \"$v\" reported");
	}
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
		'--duration' => 25,
		'--workers' => 8,
		'--keys' => 2,
		'--seed' => $seed,
		crash_options($node, 3));
	note sprintf('memory mode run: %.1f s', time() - $t0);
	check_clean_run("memory mode, seed $seed", $rc, $out, $err, $c);
	check_election_run("memory mode, seed $seed", $out, $c);
	# (The exclusion line's own count of such pairs takes only grants
	# invoked after the nemesis saw the server back; a campaign waits, so
	# it often began before.  The election line counts grants acknowledged
	# after it.)
	my ($across) = $out =~ /a crash-restart in memory mode between them, the first lease live at it: (\d+)/;
	cmp_ok($across // 0, '>', 0,
		"memory mode, seed $seed: consecutive epochs across a crash-restart, the first lease live at it");
}
$node->_update_pid(1);
is($node->safe_psql('postgres', 'SHOW dlock.storage'), 'memory',
	'server up after the run, in memory mode');

$node->stop;
note sprintf('total %.1f s', time() - $t_start);
done_testing();
