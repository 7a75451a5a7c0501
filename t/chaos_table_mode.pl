# The chaos checker (issue 9, chaos/README.md) on a cluster with fsync on.
#
# dlock-chaos runs 8 workers on 4 keys with 100-500 ms leases, fenced
# read-modify-writes presenting the token both ways, renewals and pauses
# past the TTL (before and inside the write transaction), while its nemesis
# SIGSTOPs workers, pg_terminate_backend()s their backends and crash-restarts
# the server (immediate stop, SIGKILL of the postmaster or of a backend).
# At the end it checks from the database and its logs: no lost update, gap
# or fence out of order in any key's history; no write accepted after its
# lease's expiry (by the client's monotonic bound and by the server's own
# expires_at against the row's written_at) or after a newer grant was
# acknowledged; every token unique and larger than every token acknowledged
# before its grant began, across the crashes; no key granted while an
# acknowledged lease of it was live (by the server's clock: each grant
# against the end of the key's previous lease, or its release); every
# acknowledged commit still there; no row nobody wrote; no unexpected
# error, PANIC, TRAP or process killed by a signal the nemesis did not send.
#
# 1. Two runs of 30 s, one with a fixed seed and one with a random seed
#    (printed): exit 0, no violation, and counts showing that the faults
#    really happened (grants, takeovers, accepted writes, refused stale
#    writes, pauses, SIGSTOPs, backend terminations, crash-restarts), and
#    that accepted writes were checked against the server's expires_at and
#    consecutive grants of a key against each other (exclusion).
# 2. The checker is not vacuous: a 6 s run with --no-fence (the tables
#    without the fencing trigger) must exit 1 and report lost updates and
#    writes accepted after their lease expired.
# 3. Each check fires: short runs with --sabotage, each breaking one
#    property for real, must exit 1 with that check's violation:
#    setval (dlock.fence_seq set back mid-run to its value at the start:
#    token reissued, token not larger), delete-history + forge-history + server-log (after the run:
#    an acknowledged write's row deleted, a row nobody wrote inserted, a
#    segmentation fault appended to the server log: acknowledged write
#    lost, write in the database that was not accepted, server log),
#    superseded (a write under an expired lease, fencing bypassed, after
#    the key was granted again), expired (the same without the new grant:
#    both the client-side and the server-clock expiry checks), async-commit
#    (workers with synchronous_commit = off, the server stopped at once
#    right after an acknowledged commit: acknowledged write lost), steal
#    (a live lease dropped with dlock.forget and its key granted again at
#    once: key granted while an acknowledged lease of it was live).
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use FindBin;
use lib $FindBin::RealBin;
use DlockFaults;

my $prog = chaos_checker();
# fsync on, restart_after_crash on (see DlockFaults::chaos_node)
my $node = chaos_node('chaos');

# Run dlock-chaos with @args; return (exit status, stdout, stderr, counts).
sub chaos { return run_chaos($prog, $node, @_) }

my @crash = crash_options($node, 8);

my $random_seed = int(rand(2**31));
foreach my $seed (42, $random_seed)
{
	diag "dlock-chaos seed $seed" if $seed == $random_seed;
	my ($rc, $out, $err, $c) = chaos(
		'--duration' => 30,
		'--workers' => 8,
		'--keys' => 4,
		'--seed' => $seed,
		@crash);
	check_clean_run("seed $seed", $rc, $out, $err, $c);
	like($out, qr/checked for exclusion by the server's clock: [1-9]/,
		"seed $seed: consecutive grants checked for exclusion");
}

# The server is up and answering after the last crash-restart.
$node->_update_pid(1);
is($node->safe_psql('postgres', 'SELECT 1'), '1', 'server up after the runs');

# Without the fencing trigger the same workload must be caught.
check_no_fence_run($prog, $node, 'without fencing');

# Each check fires when its property is really broken (--sabotage).
# Worker 0's sabotaged write must not be cut off by the nemesis: at most
# one SIGSTOP or termination in the run.
my @quiet = ('--nemesis-every' => 60000);
# (No 'setval' sabotage since dlock 0.6: it set dlock.fence_seq back, which
# no longer moves the tokens, drawn from dlock.token_seq; setting both back
# makes the next grant of each key fail with 55000 instead of reissuing a
# token, which t/restore_recreate checks.  The checker's own "token
# reissued" check has no sabotage that can reach it any more.)
my @sabotages = (
	[
		'delete-history,forge-history,server-log',
		[ '--duration' => 3, '--server-log' => $node->logfile ],
		'acknowledged write lost',
		'write in the database that was not accepted',
		'server log'
	],
	[
		'superseded', [ '--duration' => 3, @quiet ],
		'write accepted under a superseded lease'
	],
	[
		'expired', [ '--duration' => 3, @quiet ],
		'write accepted after its lease expired',
		'write accepted after its lease expired (server clock)'
	],
	[
		'async-commit', [ '--duration' => 8, @crash ],
		'acknowledged write lost'
	],
	[
		'steal', [ '--duration' => 3, @quiet ],
		'key granted while an acknowledged lease of it was live (server clock)'
	]);
foreach my $s (@sabotages)
{
	my ($kind, $args, @expect) = @$s;
	check_sabotage_run($prog, $node, "sabotage $kind", $kind, $args, @expect);
}

$node->stop;
done_testing();
