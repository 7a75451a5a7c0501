# t/DlockFaults.pm: what the fault tests share: running the chaos checker
# (t/chaos_table_mode in table mode, t/memory_mode_faults in memory mode),
# and the process handling of the kill -9 loops (t/kill9_loop,
# t/memory_mode_faults), whose postmaster runs as a child of the test
# script, found and killed through /proc.
package DlockFaults;

use strict;
use warnings;
use Cwd ();
use Exporter 'import';
use IPC::Run;
use POSIX ();
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time usleep);

our @EXPORT = qw(run_chaos children_of server_processes gone wait_gone spawn
  start_postmaster wait_ready kill_random);

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
