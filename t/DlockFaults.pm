# t/DlockFaults.pm: what the fault tests share, so that no fault loop is
# written twice:
#
#  * the chaos checker (chaos/dlock-chaos): building it, its server, its
#    crash options, running it, and the checks of a clean run, of a run
#    without fencing and of a sabotaged run (t/chaos_table_mode,
#    t/memory_mode_faults, t/chaos_mode_switch);
#  * the process handling of the kill -9 loops (t/kill9_loop,
#    t/memory_mode_faults), whose postmaster runs as a child of the test
#    script, found and killed through /proc.
package DlockFaults;

use strict;
use warnings;
use Cwd ();
use Exporter 'import';
use IPC::Run;
use POSIX ();
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time usleep);

our @EXPORT = qw(chaos_checker chaos_node crash_options run_chaos
  check_clean_run check_no_fence_run check_sabotage_run
  children_of server_processes gone wait_gone spawn start_postmaster
  wait_ready kill_random);

#
# The chaos checker.
#

# The checker's program, built first if it is not there yet.
sub chaos_checker
{
	my $prog = "$ENV{TESTDIR}/chaos/dlock-chaos";
	system_or_bail('make', '-s', '-C', "$ENV{TESTDIR}/chaos") unless -x $prog;
	return $prog;
}

# A server for the checker, named $name, with $conf added, started.
# Cluster.pm turns fsync off; acknowledged commits must survive the
# crashes.  It also turns restart_after_crash off; the nemesis's SIGKILL of
# a backend is meant to make the postmaster reset the cluster, as in
# production.
sub chaos_node
{
	my ($name, $conf) = @_;
	my $node = PostgreSQL::Test::Cluster->new($name);
	$node->init;
	$node->append_conf('postgresql.conf',
		"fsync = on\nrestart_after_crash = on\n" . ($conf // ''));
	$node->start;
	return $node;
}

# The checker's options for crash-restarting $node every $every seconds
# on average.
sub crash_options
{
	my ($node, $every) = @_;
	my $bindir = $node->config_data('--bindir');
	return (
		'--pgdata' => $node->data_dir,
		'--pg-ctl' => "$bindir/pg_ctl",
		'--server-log' => $node->logfile,
		'--crash-every' => $every);
}

# Run the chaos checker $prog against $node's database postgres with
# @args; return (exit status, stdout, stderr, counts).
sub run_chaos
{
	my ($prog, $node, @args) = @_;
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

# The checks of a run that must be clean, named "$label: ...": exit 0, no
# violation, counts showing that the faults really happened, and accepted
# writes checked against the server's expires_at.  12 assertions.
sub check_clean_run
{
	my ($label, $rc, $out, $err, $c) = @_;
	local $Test::Builder::Level = $Test::Builder::Level + 1;
	is($rc, 0, "$label: dlock-chaos exits 0")
	  or diag "$label:\n$out\n$err";
	is($c->{violations}, 0, "$label: no violation");
	foreach my $count (
		qw(grants takeovers accepted_writes stale_writes_refused pauses
		sigstops backend_kills crash_restarts))
	{
		cmp_ok($c->{$count} // 0, '>', 0, "$label: $count > 0");
	}
	cmp_ok($c->{stale_writes_refused} // 0, '<=', $c->{stale_writes} // 0,
		"$label: no more stale writes refused than attempted");
	like($out, qr/checked against the server's expires_at: [1-9]/,
		"$label: accepted writes checked by the server's clock");
	return;
}

# The checker is not vacuous: without the fencing trigger the same
# workload (6 s, seed 7) must be caught, with writes accepted after their
# lease expired and lost updates or writes under a superseded lease.
# 4 assertions, named "$label: ...".
sub check_no_fence_run
{
	my ($prog, $node, $label) = @_;
	local $Test::Builder::Level = $Test::Builder::Level + 1;
	my ($rc, $out, $err, $c) = run_chaos(
		$prog, $node,
		'--duration' => 6,
		'--workers' => 8,
		'--keys' => 2,
		'--seed' => 7,
		'--no-fence');
	is($rc, 1, "$label: dlock-chaos exits 1");
	cmp_ok($c->{violations} // 0, '>', 0, "$label: violations reported");
	like($out, qr/violations: write accepted after its lease expired: [1-9]/,
		"$label: writes accepted after their lease expired reported");
	like(
		$out,
		qr/violations: (lost update \(duplicate value\)|write accepted under a superseded lease): [1-9]/,
		"$label: lost updates or writes under a superseded lease reported");
	return;
}

# A check fires when its property is really broken: a run with
# --sabotage=$kind (2 workers, 4 keys, and @args) must exit 1 and report
# each violation of @expect (a violation's text, or [ its text, the name
# to show for it ]).  1 + @expect assertions, named "$label: ...".
sub check_sabotage_run
{
	my ($prog, $node, $label, $kind, $args, @expect) = @_;
	local $Test::Builder::Level = $Test::Builder::Level + 1;
	my ($rc, $out, $err, $c) = run_chaos(
		$prog, $node,
		'--workers' => 2,
		'--keys' => 4,
		'--sabotage' => $kind,
		@$args);
	is($rc, 1, "$label: dlock-chaos exits 1")
	  or diag "$label:\n$out\n$err";
	foreach my $e (@expect)
	{
		my ($v, $shown) = ref $e ? @$e : ($e, $e);
		like($out, qr/^dlock-chaos: violations: \Q$v\E: [1-9]/m,
			"$label: \"$shown\" reported");
	}
	return;
}

#
# Processes.
#

# Children of process $ppid, from /proc: pid => command line (the
# postgres process title).
sub children_of
{
	my ($ppid) = @_;
	my %kids;
	opendir(my $d, '/proc') or die "cannot read /proc: $!";
	foreach my $pid (grep { /^\d+$/ } readdir($d))
	{
		open(my $f, '<', "/proc/$pid/stat") or next;
		my $stat = <$f>;
		close($f);
		next unless defined $stat && $stat =~ /\) (\S) (\d+) /;
		next unless $2 == $ppid && $1 ne 'Z';
		my $cmd = '';
		if (open(my $c, '<', "/proc/$pid/cmdline"))
		{
			local $/;
			$cmd = <$c> // '';
			close($c);
		}
		$kids{$pid} = $cmd;
	}
	closedir($d);
	return \%kids;
}

# Processes (not zombies) whose working directory is $node's data
# directory: the postmaster and all its children, also orphaned ones.
sub server_processes
{
	my ($node) = @_;
	my $pgdata = Cwd::realpath($node->data_dir);
	my @pids;
	opendir(my $d, '/proc') or die "cannot read /proc: $!";
	foreach my $pid (grep { /^\d+$/ } readdir($d))
	{
		my $cwd = readlink("/proc/$pid/cwd");
		push @pids, $pid if defined $cwd && $cwd eq $pgdata && !gone($pid);
	}
	closedir($d);
	return @pids;
}

# Is process $pid gone (or a zombie)?
sub gone
{
	my ($pid) = @_;
	open(my $f, '<', "/proc/$pid/stat") or return 1;
	my $stat = <$f>;
	close($f);
	return !defined $stat || $stat =~ /\) Z /;
}

# Wait until every process in @pids is gone; after $limit seconds kill -9
# the ones left.  Returns how many had to be killed.
sub wait_gone
{
	my ($limit, @pids) = @_;
	my $deadline = time() + $limit;
	while (grep { !gone($_) } @pids)
	{
		if (time() > $deadline)
		{
			my @left = grep { !gone($_) } @pids;
			kill 'KILL', @left;
			usleep(10_000) while grep { !gone($_) } @left;
			return scalar @left;
		}
		usleep(2_000);
	}
	return 0;
}

# Start @cmd with stdout and stderr going to files; return its pid.
# (IPC::Run::start takes tens of milliseconds per process on a busy
# machine; the loops start thousands.)
sub spawn
{
	my ($out, $err, @cmd) = @_;
	my $pid = fork();
	die "fork: $!" unless defined $pid;
	if ($pid == 0)
	{
		open(STDIN, '<', '/dev/null') or POSIX::_exit(126);
		open(STDOUT, '>>', $out) or POSIX::_exit(126);
		open(STDERR, '>>', $err) or POSIX::_exit(126);
		exec(@cmd) or POSIX::_exit(127);
	}
	return $pid;
}

# Start $node's postmaster, named $name, as a child of this script (not
# through pg_ctl), so that after a kill -9 it is reaped at once and a new
# one can start (a postmaster refuses to start while the PID in
# postmaster.pid exists, even as a zombie), and wait until it accepts
# connections.
sub start_postmaster
{
	my ($node, $name) = @_;
	my $bindir = $node->config_data('--bindir');
	my $pid = spawn($node->logfile, $node->logfile,
		"$bindir/postgres", '-D', $node->data_dir, "--cluster-name=$name");
	$node->{_pid} = $pid;
	wait_ready($node);
	return $pid;
}

# Wait until $node's postmaster.pid says that the server accepts
# connections.
sub wait_ready
{
	my ($node) = @_;
	my $pid = $node->{_pid};
	my $deadline = time() + 180;
	while (1)
	{
		# postmaster.pid: line 1 the PID, line 8 the status
		if (open(my $f, '<', $node->data_dir . '/postmaster.pid'))
		{
			my @l = <$f>;
			close($f);
			return if @l >= 8 && $l[0] == $pid && $l[7] =~ /^ready/;
		}
		die "the server did not start, see " . $node->logfile
		  if time() > $deadline || waitpid($pid, POSIX::WNOHANG()) == $pid;
		usleep(2_000);
	}
}

# kill -9 $node's postmaster (half the time) or one of its children (a
# client backend three times in four, once $nclients clients are
# connected), count it in $kills->{postmaster, backend, other}, and wait
# until every process of the old server is gone.  Returns how many of them
# had to be killed after the wait (orphans).
sub kill_random
{
	my ($node, $nclients, $kills) = @_;
	my $pm = $node->{_pid};
	if (rand() < 0.5)
	{
		$kills->{postmaster}++;
		kill 'KILL', $pm;
		waitpid($pm, 0);
		$node->{_pid} = undef;
		# Its children exit when they notice (in their next wait).  A new
		# postmaster would refuse to start while one of them is still
		# attached to the old shared memory.
		return wait_gone(10, server_processes($node));
	}

	# Let every client connect first, so that none connects to the server
	# after it reset itself.
	my $kids = children_of($pm);
	my $deadline = time() + 5;
	while (time() < $deadline)
	{
		my $conns = grep { /\[local\]/ } values %$kids;
		last if $conns >= $nclients;
		usleep(5_000);
		$kids = children_of($pm);
	}
	my @all = keys %$kids;
	my @clients = grep { $kids->{$_} =~ /\[local\]/ } @all;
	my $victim;
	if (@clients && rand() < 0.75)
	{
		$victim = $clients[ int(rand(@clients)) ];
		$kills->{backend}++;
	}
	else
	{
		$victim = $all[ int(rand(@all)) ];
		$kills->{other}++;
	}
	kill 'KILL', $victim;
	# The postmaster ends all the others, then starts again.
	return wait_gone(30, @all);
}

1;
