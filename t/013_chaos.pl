# The chaos checker (issue 9, chaos/README.md) on a cluster with fsync on.
#
# dlock-chaos runs 8 workers on 4 keys with 100-500 ms leases, fenced
# read-modify-writes presenting the token both ways, renewals and pauses
# past the TTL (before and inside the write transaction), while its nemesis
# SIGSTOPs workers, pg_terminate_backend()s their backends and crash-restarts
# the server (immediate stop, SIGKILL of the postmaster or of a backend).
# At the end it checks from the database and its logs: no lost update, gap
# or fence out of order in any key's history; no write accepted after its
# lease's expiry or after a newer grant was acknowledged; every token unique
# and larger than every token acknowledged before its grant began, across
# the crashes; every acknowledged commit still there; no unexpected error,
# PANIC, TRAP or process killed by a signal the nemesis did not send.
#
# 1. Two runs of 30 s, one with a fixed seed and one with a random seed
#    (printed): exit 0, no violation, and counts showing that the faults
#    really happened (grants, takeovers, accepted writes, refused stale
#    writes, pauses, SIGSTOPs, backend terminations, crash-restarts).
# 2. The checker is not vacuous: a 10 s run with --no-fence (the tables
#    without the fencing trigger) must exit 1 and report lost updates and
#    writes accepted after their lease expired.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use IPC::Run;

my $prog = "$ENV{TESTDIR}/chaos/dlock-chaos";
system_or_bail('make', '-s', '-C', "$ENV{TESTDIR}/chaos") unless -x $prog;

my $node = PostgreSQL::Test::Cluster->new('chaos');
$node->init;
# Cluster.pm turns fsync off; acknowledged commits must survive the crashes.
# It also turns restart_after_crash off; the nemesis's SIGKILL of a backend
# is meant to make the postmaster reset the cluster, as in production.
$node->append_conf('postgresql.conf', "fsync = on\nrestart_after_crash = on\n");
$node->start;
my $bindir = $node->config_data('--bindir');

# Run dlock-chaos with @args; return (exit status, stdout, stderr, counts).
sub chaos
{
	my (@args) = @_;
	my ($out, $err) = ('', '');
	my @cmd = (
		$prog, '-h', $node->host, '-p', $node->port, '-d', 'postgres',
		'--logdir' => PostgreSQL::Test::Utils::tempdir, @args);
	note "running: @cmd";
	IPC::Run::run(\@cmd, '<', \undef, '>', \$out, '2>', \$err,
		IPC::Run::timeout(600));
	my $rc = $? >> 8;
	my %c;
	%c = $1 =~ /(\w+)=(\d+)/g if $out =~ /^dlock-chaos: counts: (.*)$/m;
	note $out;
	# the violations found, if any (at most a few hundred lines)
	note $err if $err ne '';
	return ($rc, $out, $err, \%c);
}

my @crash = (
	'--pgdata' => $node->data_dir,
	'--pg-ctl' => "$bindir/pg_ctl",
	'--server-log' => $node->logfile,
	'--crash-every' => 8);

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
	is($rc, 0, "seed $seed: dlock-chaos exits 0")
	  or diag "seed $seed:\n$out\n$err";
	is($c->{violations}, 0, "seed $seed: no violation");
	foreach my $count (
		qw(grants takeovers accepted_writes stale_writes_refused pauses
		sigstops backend_kills crash_restarts))
	{
		cmp_ok($c->{$count} // 0, '>', 0, "seed $seed: $count > 0");
	}
	cmp_ok($c->{stale_writes_refused} // 0, '<=', $c->{stale_writes} // 0,
		"seed $seed: no more stale writes refused than attempted");
}

# The server is up and answering after the last crash-restart.
$node->_update_pid(1);
is($node->safe_psql('postgres', 'SELECT 1'), '1', 'server up after the runs');

# Without the fencing trigger the same workload must be caught.
my ($rc, $out, $err, $c) = chaos(
	'--duration' => 10,
	'--workers' => 8,
	'--keys' => 2,
	'--seed' => 7,
	'--no-fence');
is($rc, 1, 'without fencing: dlock-chaos exits 1');
cmp_ok($c->{violations} // 0, '>', 0, 'without fencing: violations reported');
like($out, qr/violations: write accepted after its lease expired: [1-9]/,
	'without fencing: writes accepted after their lease expired reported');
like(
	$out,
	qr/violations: (lost update \(duplicate value\)|write accepted under a superseded lease): [1-9]/,
	'without fencing: lost updates or writes under a superseded lease reported');

$node->stop;
done_testing();
