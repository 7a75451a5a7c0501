# t/DlockFaults.pm: what the fault tests share, so that no fault loop is
# written twice:
#
#  * the chaos checker (chaos/dlock-chaos): building it, its server, its
#    crash options, running it, and the checks of a clean run, of a run
#    without fencing and of a sabotaged run (t/chaos_table_mode,
#    t/memory_mode_faults, t/chaos_mode_switch);
#  * the process handling of the kill -9 loops, whose postmaster runs as a
#    child of the test script, found and killed through /proc, and the
#    loop itself, DlockFaults::Kill9Loop: its server, its four kinds of
#    psql clients, the kill, the probe after the restart, the token check
#    and the checks every run ends with (t/kill9_loop, t/memory_mode_faults);
#  * psql workers started without IPC::Run, reaped, and the SQLSTATEs of
#    their errors (also t/chaos_sync_standby);
#  * crashing a server by killing a backend and waiting until the
#    postmaster has reset it (t/session_bound_stats_fifo, t/memory_mode,
#    t/horizon_tokens, t/crash_restart).
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
  children_of server_processes processes_in_dir gone wait_gone spawn start_postmaster
  wait_ready kill_random reap count_sqlstates crash_and_wait);

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
# workload (6 s, seed 7; @extra options added, e.g. the election
# workload's, whose writes then go without dlock.fenced) must be caught,
# with writes accepted after their lease expired and lost updates or
# writes under a superseded lease.  4 assertions, named "$label: ...";
# returns the run's stdout.
sub check_no_fence_run
{
	my ($prog, $node, $label, @extra) = @_;
	local $Test::Builder::Level = $Test::Builder::Level + 1;
	my ($rc, $out, $err, $c) = run_chaos(
		$prog, $node,
		'--duration' => 6,
		'--workers' => 8,
		'--keys' => 2,
		'--seed' => 7,
		'--no-fence',
		@extra);
	is($rc, 1, "$label: dlock-chaos exits 1");
	cmp_ok($c->{violations} // 0, '>', 0, "$label: violations reported");
	like($out, qr/violations: write accepted after its lease expired: [1-9]/,
		"$label: writes accepted after their lease expired reported");
	like(
		$out,
		qr/violations: (lost update \(duplicate value\)|write accepted under a superseded lease): [1-9]/,
		"$label: lost updates or writes under a superseded lease reported");
	return $out;
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
	return processes_in_dir($node->data_dir);
}

# Processes (not zombies) whose working directory is $dir (none if $dir
# does not exist).
sub processes_in_dir
{
	my ($dir) = @_;
	my $real = Cwd::realpath($dir) // return ();
	my @pids;
	opendir(my $d, '/proc') or die "cannot read /proc: $!";
	foreach my $pid (grep { /^\d+$/ } readdir($d))
	{
		my $cwd = readlink("/proc/$pid/cwd");
		push @pids, $pid if defined $cwd && $cwd eq $real && !gone($pid);
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

# Wait for each of our children @pids to exit; after $limit seconds kill
# -9 the ones left.
sub reap
{
	my ($limit, @pids) = @_;
	my $deadline = time() + $limit;
	foreach my $pid (@pids)
	{
		while (waitpid($pid, POSIX::WNOHANG()) == 0)
		{
			if (time() > $deadline)
			{
				kill 'KILL', $pid;
				waitpid($pid, 0);
				last;
			}
			usleep(10_000);
		}
	}
	return;
}

# Count in %$errors (SQLSTATE => how many) the errors that a psql run
# with VERBOSITY sqlstate wrote to the file $file.
sub count_sqlstates
{
	my ($file, $errors) = @_;
	foreach (split /\n/, slurp_file($file))
	{
		$errors->{$1}++ if /(?:ERROR|FATAL|PANIC):  ([0-9A-Z]{5})$/;
	}
	return;
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

# Crash $node (started by pg_ctl, restart_after_crash = on) by killing
# @pids, backends or other children of its postmaster, with SIGKILL, and
# wait until the postmaster has reset the cluster and accepts connections
# again.  Returns whether it does.
sub crash_and_wait
{
	my ($node, @pids) = @_;
	my $log_offset = -s $node->logfile;
	kill 'KILL', @pids;
	$node->wait_for_log(qr/all server processes terminated; reinitializing/,
		$log_offset);
	return $node->poll_query_until('postgres', 'SELECT 1', '1');
}

#
# The kill -9 loop.
#
package DlockFaults::Kill9Loop;

use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time usleep);

# The number of cycles to run: DLOCK_KILL9_CYCLES, or $default; and the
# random choices seeded with DLOCK_KILL9_SEED, or a seed of its own that it
# notes, to replay them.  Call it first.
sub seeded_cycles
{
	my ($default) = @_;
	my $cycles = $ENV{DLOCK_KILL9_CYCLES} // $default;
	my $seed = $ENV{DLOCK_KILL9_SEED} // (time() * 1000 + $$) % 1000000;
	srand($seed);
	note "cycles: $cycles, seed: $seed (DLOCK_KILL9_SEED=$seed reproduces the choices)";
	return $cycles;
}

# A kill -9 loop: its server, named $a{name} (with $a{conf} added to the
# settings below), started as a child of the test script with dlock
# installed, and $a{clients} psql clients per cycle, each running a script
# of one of four kinds (see client_script) that $a{statement} writes:
# $a{statement}->('shared') a statement on the shared keys,
# $a{statement}->('own', $n) a grant of the client's own key number $n,
# $a{statement}->('open', $j) a grant in the transaction that never
# commits.
#
# The server runs with fsync = on and wal_writer_delay = 10s, so that what
# survives is what dlock (and commits) made durable, not what the WAL
# writer wrote in the background; Cluster.pm turns fsync off.  A small
# server restarts quickly.
sub new
{
	my ($class, %a) = @_;
	my $node = PostgreSQL::Test::Cluster->new($a{name});
	$node->init;
	$node->append_conf('postgresql.conf', q{
fsync = on
wal_writer_delay = 10s
restart_after_crash = on
shared_buffers = 8MB
wal_buffers = 4MB
max_connections = 20
autovacuum = off
log_min_messages = warning
log_statement = none
recovery_init_sync_method = syncfs
log_connections = off
log_disconnections = off
} . ($a{conf} // ''));
	DlockFaults::start_postmaster($node, $a{name});
	$node->safe_psql('postgres', 'CREATE EXTENSION dlock');
	my $bindir = $node->config_data('--bindir');
	my $self = bless {
		name => $a{name},
		node => $node,
		nclients => $a{clients},
		statement => $a{statement},
		dir => PostgreSQL::Test::Utils::tempdir,
		psql => [ "$bindir/psql", '-X', '-A', '-t', '-q', '-d', $node->connstr('postgres') ],
		kills => { postmaster => 0, backend => 0, other => 0 },
		orphans_killed => 0,
		grants => 0,
		grants_by_kind => {},
		errors => {},    # SQLSTATE => how many times clients got it
		max_received => 0,    # the largest token any client received so far
		checked => 0,
		token_violations => 0,
		examples => [],
		restart_time => 0,    # from the kills until the probes were done
	}, $class;
	return $self;
}

# The script of a client of kind $kind, 3000 lines:
#  A  autocommit, synchronous_commit = on: statements on the shared keys,
#     and one in twenty a grant of a key of its own;
#  B  the same with synchronous_commit = off;
#  O  synchronous_commit = off, one transaction block that never commits:
#     grants of 40 keys of its own, again and again, until the crash ends
#     it;
#  X  synchronous_commit = off, short transaction blocks of one to four
#     statements on the shared keys, ending in COMMIT or ROLLBACK.
# psql variables make it the script of client :c in cycle :cycle.
sub client_script
{
	my ($self, $kind) = @_;
	my $statement = $self->{statement};
	my @s;
	my $n = 0;
	push @s, '\\set VERBOSITY sqlstate';
	push @s, 'SET synchronous_commit = ' . ($kind eq 'A' ? 'on' : 'off') . ';';
	if ($kind eq 'A' || $kind eq 'B')
	{
		while (@s < 3000)
		{
			if (rand() < 0.05)
			{
				$n++;
				push @s, $statement->('own', $n);
			}
			else
			{
				push @s, $statement->('shared');
			}
		}
	}
	elsif ($kind eq 'O')
	{
		push @s, 'BEGIN;';
		while (@s < 3000)
		{
			push @s, $statement->('open', int(rand(40)));
		}
	}
	else
	{
		while (@s < 3000)
		{
			push @s, 'BEGIN;';
			push @s, $statement->('shared') foreach 1 .. 1 + int(rand(4));
			push @s, rand() < 0.7 ? 'COMMIT;' : 'ROLLBACK;';
		}
	}
	return join("\n", @s) . "\n";
}

# Write four scripts of each kind.
sub write_scripts
{
	my ($self) = @_;
	foreach my $kind (qw(A B O X))
	{
		foreach my $i (1 .. 4)
		{
			my $file = "$self->{dir}/$kind$i.sql";
			open(my $f, '>', $file) or die "cannot write $file: $!";
			print $f $self->client_script($kind);
			close($f);
			push @{ $self->{scripts}{$kind} }, $file;
		}
	}
	return;
}

# Cycle $cycle up to the kill: start the clients, each of a kind drawn at
# random running one of its scripts, kill -9 the postmaster or one of its
# children 10-150 ms later (see kill_random), and wait for the clients,
# which exit when they lose their connection.  Every line a client
# printed is a result it had received before the kill.  Returns the
# clients, as { kind, out }, and counts the SQLSTATEs they got.  Sets
# $self->{t0} to the moment of the kill and $self->{t_gone} to the moment
# every process of the old server was gone.
sub clients_until_kill
{
	my ($self, $cycle) = @_;
	my $dir = $self->{dir};
	my (@h, @kinds);
	for my $c (0 .. $self->{nclients} - 1)
	{
		my $kind = (qw(A B O X))[ int(rand(4)) ];
		push @kinds, $kind;
		my $script = $self->{scripts}{$kind}[ int(rand(@{ $self->{scripts}{$kind} })) ];
		unlink "$dir/c$c.out", "$dir/c$c.err";
		push @h,
		  DlockFaults::spawn("$dir/c$c.out", "$dir/c$c.err", @{ $self->{psql} },
			'-v', "c=c$c", '-v', "cycle=$cycle-", '-f', $script);
	}

	usleep(10_000 + int(rand(140_000)));

	$self->{t0} = time();
	$self->{orphans_killed} +=
	  DlockFaults::kill_random($self->{node}, $self->{nclients}, $self->{kills});
	$self->{t_gone} = time();

	waitpid($_, 0) foreach @h;
	my @clients;
	for my $c (0 .. $self->{nclients} - 1)
	{
		push @clients, { kind => $kinds[$c], out => slurp_file("$dir/c$c.out") };
		DlockFaults::count_sqlstates("$dir/c$c.err", $self->{errors});
	}
	return @clients;
}

# Count $n tokens received by a client of kind $kind.
sub count_grants
{
	my ($self, $kind, $n) = @_;
	$self->{grants} += $n;
	$self->{grants_by_kind}{$kind} += $n;
	return;
}

# Restart the server if the kill took the postmaster, and run the psql
# script $sql (with psql options @opts) as soon as the server accepts
# connections again: again and again while it does not (the postmaster
# may still be resetting the cluster), for up to 60 s.  Returns its output.
sub probe
{
	my ($self, $sql, @opts) = @_;
	my ($node, $dir) = ($self->{node}, $self->{dir});
	DlockFaults::start_postmaster($node, $self->{name}) unless defined $node->{_pid};
	my $vsql = "$dir/verify.sql";
	open(my $f, '>', $vsql) or die "cannot write $vsql: $!";
	print $f $sql;
	close($f);
	my $out;
	my $deadline = time() + 60;
	while (1)
	{
		DlockFaults::wait_ready($node);
		unlink "$dir/verify.out", "$dir/verify.err";
		my $pid = DlockFaults::spawn("$dir/verify.out", "$dir/verify.err",
			@{ $self->{psql} }, @opts, '-f', $vsql);
		waitpid($pid, 0);
		my $rc = $?;
		$out = slurp_file("$dir/verify.out");
		last if $rc == 0;
		# Not yet accepting connections (the postmaster is resetting)?
		die "verification failed: " . slurp_file("$dir/verify.err")
		  if time() > $deadline || $out ne '';
		usleep(5_000);
	}
	$self->{restart_time} += time() - $self->{t0};
	return $out;
}

# Keep $text as an example of a violation, if fewer than $limit are kept.
sub example
{
	my ($self, $limit, $text) = @_;
	push @{ $self->{examples} }, $text if @{ $self->{examples} } < $limit;
	return;
}

# Check tokens granted after a restart against everything received
# before it.
sub check_tokens
{
	my ($self, $what, @tokens) = @_;
	foreach my $t (@tokens)
	{
		$self->{checked}++;
		next if $t > $self->{max_received};
		$self->{token_violations}++;
		$self->example(10, "$what: token $t <= $self->{max_received} received before the restart");
	}
	return;
}

# Tokens received: later ones are checked against them.
sub received
{
	my ($self, @tokens) = @_;
	foreach (@tokens) { $self->{max_received} = $_ if $_ > $self->{max_received} }
	return;
}

# Note how long $cycles cycles took ($elapsed seconds, of which how long
# from the kills until $probe_done), the kills, the tokens received and
# checked, and the SQLSTATEs the clients got.
sub note_figures
{
	my ($self, $cycles, $elapsed, $probe_done) = @_;
	my ($kills, $by_kind, $errors) = @{$self}{qw(kills grants_by_kind errors)};
	note sprintf('%d cycles in %.1f s (%.0f ms per cycle, of which %.0f ms from the kill until %s)',
		$cycles, $elapsed, 1000 * $elapsed / $cycles, 1000 * $self->{restart_time} / $cycles,
		$probe_done);
	note "kills: $kills->{postmaster} of the postmaster, $kills->{backend} of a client backend, $kills->{other} of another child; $self->{orphans_killed} server processes still there 10 s (30 s after a reset) after the kill, killed too";
	note "tokens received: $self->{grants} (by client kind: "
	  . join(', ', map { "$_ $by_kind->{$_}" } sort keys %$by_kind) . ')';
	note "tokens checked against every token received before the last restart: $self->{checked}, violations: $self->{token_violations}";
	note 'errors the clients got, by SQLSTATE: '
	  . join(', ', map { "$_ $errors->{$_}" } sort keys %$errors);
	return;
}

# Every token granted after a restart was greater than every token any
# client received before it, over $cycles cycles.  1 assertion, its name
# starting with $label.
sub check_token_order
{
	my ($self, $label, $cycles) = @_;
	local $Test::Builder::Level = $Test::Builder::Level + 1;
	is($self->{token_violations}, 0,
		"${label}tokens after every restart > every token received before ($cycles cycles, $self->{checked} checks)");
	return;
}

# No client got an internal error (XX...), and the server log has no
# PANIC, no assertion failure and no process killed by a signal other than
# the loop's SIGKILLs.  1 assertion.
sub check_no_internal_error
{
	my ($self) = @_;
	local $Test::Builder::Level = $Test::Builder::Level + 1;
	my $log = slurp_file($self->{node}->logfile);
	my @bad = grep { /PANIC|TRAP:|terminated by signal (?!9:)/ } split /\n/, $log;
	note $_ foreach @bad[ 0 .. ($#bad < 9 ? $#bad : 9) ];
	ok(!(grep { /^XX/ } keys %{ $self->{errors} }) && !@bad,
		'no internal error (XX...) in any client, no PANIC, TRAP or unexpected signal in the server log');
	return;
}

# The loop tested something: clients drew tokens in transactions that never
# committed, and both kinds of kill happened.  2 assertions.
sub check_faults_happened
{
	my ($self) = @_;
	local $Test::Builder::Level = $Test::Builder::Level + 1;
	my $kills = $self->{kills};
	cmp_ok($self->{grants_by_kind}{O} // 0, '>', 0,
		'clients drew tokens in transactions that never committed');
	ok($kills->{postmaster} > 0 && $kills->{backend} + $kills->{other} > 0,
		'both the postmaster and backends were killed');
	return;
}

1;
