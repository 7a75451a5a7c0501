# Failover under Patroni with etcd (issue 22, 1): the chaos checker
# (chaos/dlock-chaos) runs against whichever node Patroni made the leader
# while a nemesis fails the leader over again and again, and every check
# of the checker holds across every failover.
#
# One etcd (v3 API, loopback ports of its own) and, at the same time, two
# Patroni clusters of three PostgreSQL 15 nodes (t/DlockPatroni.pm):
#  * table: dlock.storage = table, synchronous_mode: true;
#  * memory: dlock.storage = memory (dlock.horizon_margin = 1s,
#    dlock.max_ttl = 5s), synchronous_mode: true and
#    synchronous_mode_strict: true.
# Patroni's ttl is 10 s (loop_wait 1 s, retry_timeout 4 s, so that
# loop_wait + 2 * retry_timeout <= ttl: Patroni 3.0.2 checks no minimum;
# later releases may refuse a ttl below 20 s, which DLOCK_PATRONI_TTL=20
# runs), use_pg_rewind, each Patroni talking to etcd through a proxy of
# ours that can be blackholed.
#
# The checker's workers connect with a multi-host connection string
# (target_session_attrs=read-write) and reconnect after every error; its
# own nemesis SIGSTOPs them and terminates their backends, its
# crash-restarts are off.  The nemesis here, in turn: crashes the leader's
# node (SIGKILL of its Patroni, postmaster and backends; its Patroni is
# started again once another node granted a fresh key, and rejoins),
# restarts the synchronous standby's postgres (POST /restart), partitions
# the leader's Patroni from etcd (healed once its postgres runs as a
# standby), kills the leader's postmaster alone (Patroni starts it again:
# no failover), and asks for a switchover (POST /switchover); after each,
# it waits until the cluster is healthy again (a leader, a synchronous
# standby, both replicas streaming).  After each fault a probe grants
# fresh keys through the same connection string until a node other than
# the old leader grants one (any node, for the postmaster's kill): the
# time dlock could not grant; during the replica's restart, the longest
# time without a grant.  DLOCK_PATRONI_KINDS=zombie (not in CI) kills the
# leader's Patroni alone, leaving its postgres a primary, as without a
# watchdog; the probe then leaves that node out of its connection string
# (libpq would keep choosing it), and once another node grants, the old
# one is asked for a fresh key too, then killed, as a watchdog would.
#
# Checked, per cluster: the checker exits 0 with no violation (no two
# holders' writes accepted under one key at one moment, no token
# reissued or going backwards, no acknowledged grant, renewal or fenced
# write lost, no key granted while an acknowledged lease of it was live,
# by the server's clock, across every failover), and its counts show
# grants, takeovers, accepted writes and refused stale writes; the REST
# API showed at least as many leader changes as failovers planned; each
# planned failover ended with a fresh key granted by another node; no
# PANIC or TRAP in any server log.
#
# Settings (tools/patroni-chaos sets them): DLOCK_PATRONI_FAILOVERS
# planned failovers per cluster (default 3: one crash, one partition, one
# switchover), DLOCK_PATRONI_CLUSTERS (default "table:on,memory:strict":
# mode:sync, sync one of strict, on, off; with off, the asynchronous run,
# the checker's violations are measured, not asserted to be none),
# DLOCK_PATRONI_TTL, DLOCK_PATRONI_WORKERS (default 4),
# DLOCK_PATRONI_SEED (the checker's seed).  DLOCK_PATRONI_REPORT names a
# file the figures are appended to (JSON lines).
#
# About 95 s on 2 cores (30 assertions).
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use FindBin;
use lib $FindBin::RealBin;
use DlockFaults;
use DlockPatroni;
use JSON::PP;
use POSIX ();
use Time::HiRes qw(time);
use List::Util qw(max min sum);

my $t_start = time();
my $failovers = $ENV{DLOCK_PATRONI_FAILOVERS} // 3;
my $ttl = $ENV{DLOCK_PATRONI_TTL} // 10;
my $workers = $ENV{DLOCK_PATRONI_WORKERS} // 4;
my @clusters = map { [ split /:/ ] } split /,/, ($ENV{DLOCK_PATRONI_CLUSTERS} // 'table:on,memory:strict');
foreach (@clusters)
{
	die "bad DLOCK_PATRONI_CLUSTERS entry @$_"
	  unless @$_ == 2 && $_->[0] =~ /^(table|memory)$/ && $_->[1] =~ /^(strict|on|off)$/;
}
note "failovers per cluster: $failovers, ttl $ttl s, $workers workers, clusters: "
  . join(', ', map { "$_->[0] mode, synchronous_mode $_->[1]" } @clusters);

# a signal ends the test through its END blocks, which stop everything
# it started (DlockPatroni's registry)
$SIG{$_} = sub { die "killed by SIG$_[0]\n" } foreach qw(HUP INT TERM);

my $prog = chaos_checker();
# a short path: it holds the sockets of every node
my $dir = PostgreSQL::Test::Utils::tempdir_short;
my $etcd = start_etcd($dir);

my %pids;
foreach my $i (0 .. $#clusters)
{
	my ($mode, $sync) = @{ $clusters[$i] };
	my $scope = "$mode$sync";
	my $cdir = "$dir/$scope";
	mkdir $cdir or die "cannot create $cdir: $!";
	my $pid = fork();
	die "fork: $!" unless defined $pid;
	if ($pid == 0)
	{
		# no TAP output and no END blocks here
		$SIG{$_} = sub { POSIX::_exit(1) } foreach qw(HUP INT TERM);
		srand(time() + $i);
		my $ok = eval {
			DlockPatroni::run_cluster(
				scope => $scope, mode => $mode, sync => $sync, ttl => $ttl,
				max_ttl => '5s', dir => $cdir, etcd => $etcd, prog => $prog,
				workers => $workers, failovers => $failovers,
				seed => $ENV{DLOCK_PATRONI_SEED},
				$ENV{DLOCK_PATRONI_KINDS} ? (kinds => [ split /,/, $ENV{DLOCK_PATRONI_KINDS} ]) : ());
			1;
		};
		unless ($ok)
		{
			if (open(my $f, '>', "$cdir/died"))
			{
				print $f $@;
				close($f);
			}
		}
		POSIX::_exit($ok ? 0 : 1);
	}
	DlockPatroni::register($pid);
	$pids{$scope} = $pid;
}

foreach my $cl (@clusters)
{
	my ($mode, $sync) = @$cl;
	my $scope = "$mode$sync";
	my $cdir = "$dir/$scope";
	waitpid($pids{$scope}, 0);
	my $label = "$mode mode, synchronous_mode $sync";
	# the whole status: a run killed by a signal (the OOM killer) has exit
	# code 0, and no result
	my $status = $?;
	unless (ok($status == 0 && -f "$cdir/result", "$label: the run ended"))
	{
		diag $status & 127 ? 'killed by signal ' . ($status & 127)
		  : $status ? 'exit code ' . ($status >> 8) : "no $cdir/result";
		diag slurp_file("$cdir/died") if -f "$cdir/died";
		foreach my $log (glob("$cdir/*.patroni.log"))
		{
			diag "$log (last lines):\n" . join("\n", (split /\n/, slurp_file($log))[-15 .. -1]);
		}
		next;
	}
	my $r = decode_json(slurp_file("$cdir/result"));
	my @f = @{ $r->{faults} };
	my @planned = grep { $_->{kind} =~ /^(crash|partition|switchover|zombie)$/ } @f;
	my %c = %{ $r->{counts} };

	note sprintf('%s: set up in %.1f s, ran %.1f s; %d faults, %d leader changes',
		$label, $r->{setup_s}, $r->{total_s}, scalar(@f), $r->{leader_changes});
	foreach my $f (@f)
	{
		note sprintf('%s: %6.1f s %-15s of %s: %s%s%s%s%s', $label, $f->{at_s} // 0, $f->{kind}, $f->{node} // '?',
			defined $f->{gap_s} ? sprintf('fresh key granted by %s %.2f s after the fault', $f->{new}, $f->{gap_s}) : 'no grant',
			defined $f->{old_granted_s} ? sprintf(', the old leader granted one %.2f s after it', $f->{old_granted_s}) : '',
			defined $f->{healed_s} ? sprintf(', healed at %.1f s', $f->{healed_s}) : '',
			defined $f->{old_after} ? ", a fresh key on the old leader then: $f->{old_after}" : '',
			$f->{error} ne '' ? ", ERROR: $f->{error}" : '');
	}
	note "$label: $_" foreach grep { /^dlock-chaos: / } split /\n/, $r->{chaos_out};
	note "$label: checker's stderr:\n" . $r->{chaos_err} if $r->{chaos_err} ne '';

	# the figures: the grant gap per kind of fault
	my %gaps;
	push @{ $gaps{ $_->{kind} } }, $_->{gap_s} foreach grep { defined $_->{gap_s} } @f;
	my %fig = (scope => $scope, mode => $mode, sync => $sync, ttl => $ttl,
		leader_changes => $r->{leader_changes}, counts => \%c, chaos_rc => $r->{chaos_rc},
		faults => scalar(@f), planned_failovers => scalar(@planned));
	foreach my $k (sort keys %gaps)
	{
		my @g = sort { $a <=> $b } @{ $gaps{$k} };
		$fig{gaps}{$k} = { n => scalar(@g), min => $g[0], median => $g[ int($#g / 2) ], max => $g[-1],
			mean => sum(@g) / @g };
		note sprintf('%s: %s: %d, time to a fresh grant min %.2f s, median %.2f s, max %.2f s',
			$label, $k, scalar(@g), $g[0], $g[ int($#g / 2) ], $g[-1]);
	}
	if (my $rep = $ENV{DLOCK_PATRONI_REPORT})
	{
		open(my $fh, '>>', $rep) or die "cannot write $rep: $!";
		print $fh JSON::PP->new->canonical->encode(\%fig), "\n";
		close($fh);
	}

	is(join('', map { $_->{error} } @f), '', "$label: every fault done, the cluster healthy after each");
	cmp_ok(scalar(@planned), '>=', $failovers, "$label: $failovers planned failovers done");
	cmp_ok($r->{leader_changes}, '>=', scalar(@planned),
		"$label: the REST API showed a leader change per planned failover");
	is(scalar(grep { defined $_->{gap_s} && $_->{new} ne $_->{node} } @planned), scalar(@planned),
		"$label: after each planned failover, another node granted a fresh key");
	if ($sync eq 'off')
	{
		# the asynchronous run measures what it loses
		note "$label: violations the checker reported: " . ($c{violations} // '?');
		ok(defined $c{violations}, "$label: the checker checked the run");
	}
	else
	{
		is($r->{chaos_rc}, 0, "$label: dlock-chaos exits 0");
		is($c{violations}, 0, "$label: no violation");
	}
	foreach my $count (qw(grants takeovers accepted_writes stale_writes_refused sigstops backend_kills))
	{
		cmp_ok($c{$count} // 0, '>', 0, "$label: $count > 0");
	}
	like($r->{chaos_out}, qr/checked against the server's expires_at: [1-9]/,
		"$label: accepted writes checked by the server's clock");
	is(scalar(@{ $r->{panics} }), 0, "$label: no PANIC or TRAP in the server logs")
	  or diag join("\n", @{ $r->{panics} }[ 0 .. min(9, $#{ $r->{panics} }) ]);
}

note sprintf('total %.1f s', time() - $t_start);
done_testing();
