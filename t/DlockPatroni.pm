# t/DlockPatroni.pm: dlock under Patroni (issue 22), shared by
# t/patroni.pl (the short run in CI) and tools/patroni-chaos (the long
# runs, which run t/patroni.pl with DLOCK_PATRONI_* settings):
#
#  * a one-node etcd on loopback ports of its own, and per Patroni node a
#    TCP proxy of ours between that Patroni and etcd, which the nemesis can
#    blackhole (a network partition of that Patroni from etcd);
#  * three PostgreSQL nodes under Patroni (REST and PostgreSQL ports of
#    their own, dlock preloaded in one storage mode, synchronous_mode
#    on, strict or off, small Patroni timings, use_pg_rewind);
#  * a watcher that records every leader change the REST API shows;
#  * the nemesis: crash the leader's node (SIGKILL of its Patroni, its
#    postmaster and every backend at once, then its Patroni again, which
#    rejoins), partition the leader's Patroni from etcd (Patroni demotes
#    its postgres itself), restart a replica's postgres (POST /restart),
#    a planned switchover (POST /switchover) and a SIGKILL of the leader's
#    postmaster alone; after each fault a probe measures how long no fresh
#    key could be granted;
#  * the chaos checker (chaos/dlock-chaos) against whichever node is the
#    leader, through a multi-host connection string with
#    target_session_attrs=read-write.
#
# Every process started here is written to a file and killed at the end,
# also when the test dies (END block).
package DlockPatroni;

use strict;
use warnings;
use Cwd ();
use Exporter 'import';
use HTTP::Tiny;
use IPC::Run;
use IO::Select;
use IO::Socket::INET;
use JSON::PP;
use POSIX ();
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Time::HiRes qw(time usleep);
use DlockFaults qw(spawn gone processes_in_dir);

our @EXPORT = qw(start_etcd patroni_cluster run_cluster);

# Where every process we start is listed ("pid" or "dir DATADIR"), for the
# cleanup; set by start_etcd.
my $registry;
my $owner = $$;

# Remember $what (a pid, or "dir $datadir") for the cleanup.
sub register
{
	my ($what) = @_;
	open(my $f, '>>', $registry) or die "cannot write $registry: $!";
	print $f "$what\n";
	close($f);
	return;
}

# Kill everything listed in the registry: Patroni, etcd, proxies,
# watchers, checkers, and every process left in a data directory.
sub cleanup
{
	return unless defined $registry && -f $registry;
	my (@pids, @dirs);
	foreach (split /\n/, slurp_file($registry))
	{
		push @pids, $1 if /^(\d+)$/;
		push @dirs, $1 if /^dir (.*)$/;
	}
	kill 'KILL', grep { !gone($_) } @pids;
	foreach my $d (@dirs)
	{
		my @p = eval { processes_in_dir($d) };
		kill 'KILL', @p if @p;
	}
	return;
}

END
{
	local $?;
	cleanup() if $$ == $owner;
}

my $http = HTTP::Tiny->new(timeout => 3);

# Microseconds since the epoch.
sub now_us { return int(time() * 1e6) }

#
# etcd and the proxies.
#

# A one-node etcd (v3 API) in $dir, on loopback ports of its own; returns
# its client port.  Also sets up the registry of processes in $dir.
sub start_etcd
{
	my ($dir) = @_;
	$registry = "$dir/processes";
	my $cport = PostgreSQL::Test::Cluster::get_free_port();
	my $pport = PostgreSQL::Test::Cluster::get_free_port();
	my $pid = spawn("$dir/etcd.log", "$dir/etcd.log", '/usr/bin/etcd',
		'--name' => 'dlock',
		'--data-dir' => "$dir/etcd",
		'--listen-client-urls' => "http://127.0.0.1:$cport",
		'--advertise-client-urls' => "http://127.0.0.1:$cport",
		'--listen-peer-urls' => "http://127.0.0.1:$pport",
		'--initial-advertise-peer-urls' => "http://127.0.0.1:$pport",
		'--initial-cluster' => "dlock=http://127.0.0.1:$pport",
		'--log-level' => 'warn');
	register($pid);
	my $deadline = time() + 60;
	until ($http->get("http://127.0.0.1:$cport/health")->{success})
	{
		die "etcd did not start, see $dir/etcd.log" if time() > $deadline || gone($pid);
		usleep(100_000);
	}
	return $cport;
}

# The proxy's loop: forward connections from 127.0.0.1:$port to
# 127.0.0.1:$up.  SIGUSR1 blackholes it: bytes are no longer forwarded
# either way and new connections are accepted and left unanswered, as
# behind a partition; SIGUSR2 heals it: the connections held meanwhile are
# closed (their peers gave up on them long ago) and forwarding resumes.
sub proxy_loop
{
	my ($listener, $up) = @_;
	my ($black, $want) = (0, 0);
	local $SIG{USR1} = sub { $want = 1 };
	local $SIG{USR2} = sub { $want = 0 };
	local $SIG{PIPE} = 'IGNORE';
	my (%other, @held);
	my $sel = IO::Select->new($listener);
	my $drop = sub {
		my ($s) = @_;
		my $o = delete $other{"$s"};
		$sel->remove($s);
		close($s);
		return unless $o;
		delete $other{"$o"};
		$sel->remove($o);
		close($o);
	};
	while (1)
	{
		if ($want && !$black)
		{
			$black = 1;
			foreach my $s ($sel->handles)
			{
				next if $s == $listener;
				$sel->remove($s);
				push @held, $s;
			}
			%other = ();
		}
		elsif (!$want && $black)
		{
			$black = 0;
			close($_) foreach @held;
			@held = ();
		}
		foreach my $s ($sel->can_read(0.05))
		{
			if ($s == $listener)
			{
				my $c = $listener->accept or next;
				if ($black)
				{
					push @held, $c;
					next;
				}
				my $u = IO::Socket::INET->new(PeerAddr => '127.0.0.1', PeerPort => $up);
				unless ($u)
				{
					close($c);
					next;
				}
				$other{"$c"} = $u;
				$other{"$u"} = $c;
				$sel->add($c, $u);
				next;
			}
			my $o = $other{"$s"} or next;
			my $n = sysread($s, my $buf, 65536);
			unless ($n)
			{
				$drop->($s);
				next;
			}
			my $off = 0;
			while ($off < $n)
			{
				my $w = syswrite($o, $buf, $n - $off, $off);
				unless ($w)
				{
					$drop->($s);
					last;
				}
				$off += $w;
			}
		}
	}
}

# Start a proxy to 127.0.0.1:$up; returns { pid, port }.
sub start_proxy
{
	my ($up) = @_;
	my $port = PostgreSQL::Test::Cluster::get_free_port();
	my $listener = IO::Socket::INET->new(LocalAddr => '127.0.0.1', LocalPort => $port,
		Listen => 64, ReuseAddr => 1) or die "cannot listen on $port: $!";
	my $pid = fork();
	die "fork: $!" unless defined $pid;
	if ($pid == 0)
	{
		eval { proxy_loop($listener, $up) };
		POSIX::_exit(0);
	}
	close($listener);
	register($pid);
	return { pid => $pid, port => $port };
}

#
# Patroni.
#

# A Patroni cluster named $a{scope} of three nodes in $a{dir} (a short
# path: it holds the sockets), using the etcd on port $a{etcd}, dlock in
# storage mode $a{mode}, synchronous mode $a{sync} ('strict', 'on' or
# 'off'), Patroni's ttl $a{ttl}.  Starts all three Patroni at once (one
# bootstraps, the others clone it), waits until they all run with a leader
# (and a synchronous standby), and creates the extension.
sub patroni_cluster
{
	my (%a) = @_;
	my $c = bless { %a, nodes => [] }, 'DlockPatroni::Cluster';
	my $bindir = `pg_config --bindir`;
	chomp $bindir;
	$c->{bindir} = $bindir;
	my $ttl = $a{ttl};
	# Patroni's rule: loop_wait + 2 * retry_timeout <= ttl
	my $retry = int(($ttl - 1) / 2);
	$retry = 10 if $retry > 10;
	my $sync = $a{sync} eq 'off' ? 'false' : 'true';
	my $strict = $a{sync} eq 'strict' ? 'true' : 'false';
	mkdir "$a{dir}/logs";
	foreach my $i (1 .. 3)
	{
		my $name = "$a{scope}$i";
		my $n = {
			name => $name,
			pgport => PostgreSQL::Test::Cluster::get_free_port(),
			rest => PostgreSQL::Test::Cluster::get_free_port(),
			proxy => start_proxy($a{etcd}),
			data => "$a{dir}/$name",
			log => "$a{dir}/$name.patroni.log",
			pglog => "$a{dir}/logs/$name",
			conf => "$a{dir}/$name.yml",
		};
		register("dir $n->{data}");
		open(my $f, '>', $n->{conf}) or die "cannot write $n->{conf}: $!";
		print $f <<"EOF";
scope: $a{scope}
namespace: /dlock-test/
name: $name
log:
  level: INFO
restapi:
  listen: 127.0.0.1:$n->{rest}
  connect_address: 127.0.0.1:$n->{rest}
etcd3:
  hosts: 127.0.0.1:$n->{proxy}{port}
  use_proxies: true
bootstrap:
  dcs:
    ttl: $ttl
    loop_wait: 1
    retry_timeout: $retry
    maximum_lag_on_failover: 1048576
    synchronous_mode: $sync
    synchronous_mode_strict: $strict
    postgresql:
      use_pg_rewind: true
      use_slots: true
      parameters:
        wal_log_hints: 'on'
        max_connections: 60
        max_wal_senders: 10
        max_replication_slots: 10
        wal_keep_size: 256MB
  initdb:
  - encoding: UTF8
  - locale: C
postgresql:
  listen: 127.0.0.1:$n->{pgport}
  connect_address: 127.0.0.1:$n->{pgport}
  data_dir: $n->{data}
  bin_dir: $bindir
  pgpass: $a{dir}/$name.pgpass
  authentication:
    superuser:
      username: postgres
    replication:
      username: replicator
      password: replicator
    rewind:
      username: postgres
  pg_hba:
  - local all all trust
  - host all all 127.0.0.1/32 trust
  - host replication all 127.0.0.1/32 trust
  remove_data_directory_on_rewind_failure: true
  remove_data_directory_on_diverged_timelines: true
  parameters:
    unix_socket_directories: '$a{dir}'
    shared_preload_libraries: dlock
    dlock.storage: $a{mode}
    dlock.horizon_margin: 1s
    dlock.max_ttl: $a{max_ttl}
    fsync: 'on'
    autovacuum: 'off'
    logging_collector: 'on'
    log_directory: '$n->{pglog}'
    log_filename: 'postgresql-%Y%m%d-%H%M%S.log'
    log_min_messages: warning
watchdog:
  mode: 'off'
EOF
		close($f);
		push @{ $c->{nodes} }, $n;
	}
	$c->start_patroni($_) foreach @{ $c->{nodes} };
	$c->wait_healthy(180) or die "$a{scope}: the cluster did not come up, see $a{dir}/*.patroni.log";
	my $leader = $c->leader;
	$c->psql($leader, 'CREATE EXTENSION IF NOT EXISTS dlock');
	return $c;
}

package DlockPatroni::Cluster;

use strict;
use warnings;
use JSON::PP;
use POSIX ();
use PostgreSQL::Test::Utils;
use Time::HiRes qw(time usleep);
use DlockFaults qw(spawn gone processes_in_dir);

# Start node $n's Patroni (again).
sub start_patroni
{
	my ($c, $n) = @_;
	$n->{pid} = spawn($n->{log}, $n->{log}, '/usr/bin/patroni', $n->{conf});
	DlockPatroni::register($n->{pid});
	return;
}

# The node named $name.
sub node
{
	my ($c, $name) = @_;
	my ($n) = grep { $_->{name} eq $name } @{ $c->{nodes} };
	return $n;
}

# The cluster as the REST API of the first node that answers shows it:
# a list of members ({ name, role, state, lag, ... }), or undef.
sub members
{
	my ($c, @skip) = @_;
	foreach my $n (@{ $c->{nodes} })
	{
		next if grep { $_ eq $n->{name} } @skip;
		my $r = $http->get("http://127.0.0.1:$n->{rest}/cluster");
		next unless $r->{success};
		my $j = eval { decode_json($r->{content}) } or next;
		return $j->{members};
	}
	return undef;
}

# The leader's node, if there is one running.
sub leader
{
	my ($c, @skip) = @_;
	my $m = $c->members(@skip) or return undef;
	my ($l) = grep { $_->{role} eq 'leader' && $_->{state} eq 'running' } @$m;
	return $l ? $c->node($l->{name}) : undef;
}

# Wait up to $limit seconds until three members run, one of them the
# leader, and (synchronous mode) one a synchronous standby, the other two
# streaming from the leader.  Returns whether they do.
sub wait_healthy
{
	my ($c, $limit) = @_;
	my $deadline = time() + $limit;
	while (time() < $deadline)
	{
		my $m = $c->members;
		if ($m && @$m == 3
			&& (grep { $_->{state} eq 'running' || $_->{state} eq 'streaming' } @$m) == 3
			&& (grep { $_->{role} eq 'leader' } @$m) == 1
			&& ($c->{sync} eq 'off' || (grep { $_->{role} eq 'sync_standby' } @$m) >= 1)
			&& !(grep { $_->{role} ne 'leader' && ($_->{lag} // 'x') !~ /^\d+$/ } @$m))
		{
			# and the leader accepts writes, both replicas stream from it
			# (a rejoining node shows a lag in bytes before it streams)
			my $l = $c->leader;
			return 1 if $l && $c->psql($l, "SELECT NOT pg_is_in_recovery()
				AND (SELECT count(*) FROM pg_stat_replication WHERE state = 'streaming') = 2") eq 't';
		}
		usleep(200_000);
	}
	return 0;
}

# Run $sql on node $n through its socket; returns its output ('' on error).
sub psql
{
	my ($c, $n, $sql, $timeout) = @_;
	my ($out, $err) = ('', '');
	# (a timeout kills psql and dies)
	eval {
		IPC::Run::run([ "$c->{bindir}/psql", '-X', '-A', '-t', '-q',
			'-d', "host=127.0.0.1 port=$n->{pgport} dbname=postgres user=postgres connect_timeout=2",
			'-c', $sql ], '<', \undef, '>', \$out, '2>', \$err,
			IPC::Run::timeout($timeout // 20));
	};
	chomp $out;
	return $out;
}

# The libpq connection string that reaches whichever node is the leader
# (of the nodes whose ports are not in @not).
sub conninfo
{
	my ($c, @not) = @_;
	my @ports = grep { my $p = $_; !grep { $_ == $p } @not } map { $_->{pgport} } @{ $c->{nodes} };
	return 'host=' . join(',', ('127.0.0.1') x @ports)
	  . ' port=' . join(',', @ports)
	  . ' dbname=postgres user=postgres target_session_attrs=read-write';
}

# One try of the probe: a grant of the fresh key $key through the
# multi-host connection string (without the nodes whose ports are in
# @not).  Returns the port of the node that granted it, or undef.
sub probe_once
{
	my ($c, $key, @not) = @_;
	my ($out, $err) = ('', '');
	eval {
		IPC::Run::run([ "$c->{bindir}/psql", '-X', '-A', '-t', '-q',
			'-d', $c->conninfo(@not) . ' connect_timeout=2 options=-cstatement_timeout=3s',
			'-c', "SELECT inet_server_port() FROM dlock.try_acquire('$key', '1 s')" ],
			'<', \undef, '>', \$out, '2>', \$err,
			IPC::Run::timeout(10));
	};
	return $out =~ /^(\d+)$/ ? $1 : undef;
}

# Probe, after a fault at $t0 (us), until a fresh key is granted by a node
# other than @not (by port); returns (microseconds from $t0 to the
# grant's return, the node that granted it, and the last time before that
# a node in @not granted one).  With $avoid the probe's connection string
# leaves the nodes in @not out (a zombie primary: libpq's
# target_session_attrs=read-write would pick it as long as it runs, a
# router that asks Patroni's REST API would not).
sub probe_until_grant
{
	my ($c, $t0, $limit, $avoid, @not) = @_;
	my $deadline = time() + $limit;
	my $last_old;
	while (time() < $deadline)
	{
		my $port = $c->probe_once('patroni-probe-' . ++$c->{probes}, $avoid ? @not : ());
		my $t = DlockPatroni::now_us();
		if (defined $port)
		{
			return ($t - $t0, $port, $last_old) unless grep { $_ == $port } @not;
			$last_old = $t;
		}
		usleep(50_000);
	}
	return (undef, undef, $last_old);
}

# Probe, after a fault at $t0 (us), until the REST call $post has been
# answered and 1 s more; returns (the longest time without a grant,
# counted from $t0, in microseconds, the port of the node that granted the
# last key).
sub probe_during
{
	my ($c, $t0, $post) = @_;
	my ($last, $longest, $port, $done) = ($t0, 0, undef, undef);
	my $deadline = time() + 240;
	while (time() < $deadline)
	{
		my $p = $c->probe_once('patroni-probe-' . ++$c->{probes});
		my $t = DlockPatroni::now_us();
		if (defined $p)
		{
			$longest = $t - $last if $t - $last > $longest;
			($last, $port) = ($t, $p);
			$done //= $t if -f $post->{file};
			last if defined $done && $t - $done > 1e6;
		}
		usleep(50_000);
	}
	return defined $done ? ($longest, $port) : (undef, undef);
}

# The pid of node $n's postmaster, from postmaster.pid.
sub postmaster_pid
{
	my ($c, $n) = @_;
	open(my $f, '<', "$n->{data}/postmaster.pid") or return undef;
	my $pid = <$f>;
	close($f);
	chomp $pid if defined $pid;
	return defined $pid && $pid =~ /^\d+$/ && !gone($pid) ? $pid : undef;
}

# Stop every Patroni (they stop their postgres).
sub stop
{
	my ($c) = @_;
	foreach my $n (@{ $c->{nodes} })
	{
		kill 'TERM', $n->{pid} if $n->{pid} && !gone($n->{pid});
	}
	foreach my $n (@{ $c->{nodes} })
	{
		my $deadline = time() + 60;
		usleep(100_000) while $n->{pid} && !gone($n->{pid}) && time() < $deadline;
		waitpid($n->{pid}, POSIX::WNOHANG());
	}
	return;
}

package DlockPatroni;

# A watcher: a child process that polls the REST API every 200 ms and
# appends "time_us leader" to $file whenever the running leader it sees
# changes ("-" when none).
sub start_watcher
{
	my ($c, $file) = @_;
	my $pid = fork();
	die "fork: $!" unless defined $pid;
	if ($pid == 0)
	{
		my $last = '';
		open(my $f, '>>', $file) or POSIX::_exit(1);
		$f->autoflush(1);
		while (1)
		{
			my $m = $c->members;
			my $l = '-';
			if ($m)
			{
				my ($x) = grep { $_->{role} eq 'leader' && $_->{state} eq 'running' } @$m;
				$l = $x->{name} if $x;
			}
			if ($l ne $last)
			{
				print $f now_us() . " $l\n";
				$last = $l;
			}
			usleep(200_000);
		}
	}
	register($pid);
	return $pid;
}

# The distinct leaders in turn in the watcher's file $file: the number of
# leader changes it saw.
sub leader_changes
{
	my ($file) = @_;
	my @seq;
	foreach (split /\n/, slurp_file($file))
	{
		my (undef, $l) = split / /;
		next if $l eq '-';
		push @seq, $l unless @seq && $seq[-1] eq $l;
	}
	return @seq ? scalar(@seq) - 1 : 0;
}

#
# The run: one cluster, the checker, and the nemesis.
#

# Run a whole test on one cluster, in a child process or not: set up the
# cluster ($a{scope}, $a{mode}, $a{sync}, $a{ttl}, $a{max_ttl}, in
# $a{dir}, etcd on $a{etcd}), start the checker ($a{prog}, $a{workers})
# and the watcher, run the nemesis until $a{failovers} planned failovers
# were done, stop the checker, and write what happened to $a{dir}/result
# as JSON: the checker's exit status, output and counts; each fault's
# kind, node, time to the first fresh grant elsewhere, etc.; the leader
# changes seen; PANIC or TRAP lines in the server logs.
sub run_cluster
{
	my (%a) = @_;
	my %res = (scope => $a{scope}, mode => $a{mode}, sync => $a{sync}, faults => []);
	my $t_start = time();
	my $c = patroni_cluster(%a);
	$res{setup_s} = time() - $t_start;
	my $watch = "$a{dir}/leaders";
	start_watcher($c, $watch);

	my ($cout, $cerr) = ("$a{dir}/chaos.out", "$a{dir}/chaos.err");
	my $chaos = spawn($cout, $cerr, $a{prog}, '-d', $c->conninfo,
		'--duration' => 100000, '--workers' => $a{workers}, '--keys' => 4,
		'--logdir' => "$a{dir}/chaos-logs", (defined $a{seed} ? ('--seed' => $a{seed}) : ()));
	register($chaos);
	$c->{chaos_started} = now_us();
	sleep 3;

	my @kinds = @{ $a{kinds} // [qw(crash replica_restart partition pmkill switchover)] };
	my $failovers = 0;
	my $i = 0;
	# (a list without failovers runs as many faults)
	my $fails = grep { /^(crash|partition|switchover|zombie)$/ } @kinds;
	while (($fails ? $failovers : $i) < $a{failovers})
	{
		my $kind = $kinds[ $i++ % @kinds ];
		my $f = fault($c, $kind);
		push @{ $res{faults} }, $f;
		$failovers++ if $kind =~ /^(crash|partition|switchover|zombie)$/;
		if (!$c->wait_healthy(240))
		{
			$f->{error} .= 'the cluster did not become healthy again; ';
			last;
		}
		usleep(int(1e6 * (1 + rand(2))));
	}

	# The checker checks, then exits.
	kill 'INT', $chaos;
	my $t_end = time() + 600;
	while (waitpid($chaos, POSIX::WNOHANG()) == 0)
	{
		if (time() > $t_end)
		{
			kill 'KILL', $chaos;
			waitpid($chaos, 0);
			last;
		}
		usleep(100_000);
	}
	$res{chaos_rc} = $? >> 8;
	$res{chaos_out} = slurp_file($cout);
	$res{chaos_err} = substr(slurp_file($cerr), 0, 20000);
	my %counts;
	%counts = $1 =~ /(\w+)=(\d+)/g if $res{chaos_out} =~ /^dlock-chaos: counts: (.*)$/m;
	$res{counts} = \%counts;
	$res{leader_changes} = leader_changes($watch);
	$res{leaders} = slurp_file($watch);
	$c->stop;
	my @bad;
	foreach my $n (@{ $c->{nodes} })
	{
		opendir(my $d, $n->{pglog}) or next;
		foreach my $file (sort grep { /\.log$/ } readdir($d))
		{
			push @bad, grep { /PANIC|TRAP:/ } split /\n/, slurp_file("$n->{pglog}/$file");
		}
		closedir($d);
	}
	$res{panics} = \@bad;
	$res{total_s} = time() - $t_start;
	open(my $f, '>', "$a{dir}/result") or die "cannot write $a{dir}/result: $!";
	print $f JSON::PP->new->canonical->encode(\%res);
	close($f);
	return \%res;
}

# POST $body (JSON) to node $n's REST API at /$what, from a child process
# (Patroni answers once it is done: the probe runs meanwhile); returns a
# handle for rest_answer.
sub rest_post
{
	my ($c, $n, $what, $body) = @_;
	my $file = "$c->{dir}/post." . ++$c->{posts};
	my $pid = fork();
	die "fork: $!" unless defined $pid;
	if ($pid == 0)
	{
		my $r = HTTP::Tiny->new(timeout => 120)->post("http://127.0.0.1:$n->{rest}/$what",
			{ content => encode_json($body), headers => { 'Content-Type' => 'application/json' } });
		if (open(my $f, '>', $file))
		{
			print $f "$r->{status} $r->{content}";
			close($f);
		}
		POSIX::_exit(0);
	}
	register($pid);
	return { pid => $pid, file => $file };
}

# The status and answer of a rest_post (waits for it).
sub rest_answer
{
	my ($post) = @_;
	waitpid($post->{pid}, 0);
	return -f $post->{file} ? slurp_file($post->{file}) : 'no answer';
}

# One fault of kind $kind (see the header); returns what happened:
# { kind, node (the leader, or the replica restarted), new (the node that
# granted the probe's key), gap_s (from the fault to that grant),
# old_granted_s (partition: the last grant on the old leader after the
# fault), error }.
sub fault
{
	my ($c, $kind) = @_;
	my $l = $c->leader;
	my %f = (kind => $kind, error => '');
	unless ($l)
	{
		$f{error} = 'no leader';
		return \%f;
	}
	$f{node} = $l->{name};
	my $t0 = now_us();
	$f{at_s} = ($t0 - $c->{chaos_started}) / 1e6 if $c->{chaos_started};
	my @not = ($l->{pgport});
	my $post;
	if ($kind eq 'zombie')
	{
		# Patroni dies, its postgres runs on as a primary (no watchdog)
		kill 'KILL', $l->{pid};
		waitpid($l->{pid}, 0);
	}
	elsif ($kind eq 'crash')
	{
		# a machine crash: Patroni, the postmaster and every backend at once
		my @pg = processes_in_dir($l->{data});
		kill 'KILL', $l->{pid}, @pg;
		waitpid($l->{pid}, 0);
	}
	elsif ($kind eq 'partition')
	{
		kill 'USR1', $l->{proxy}{pid};
	}
	elsif ($kind eq 'switchover')
	{
		$post = rest_post($c, $l, 'switchover', { leader => $l->{name} });
	}
	elsif ($kind eq 'pmkill')
	{
		my $pm = $c->postmaster_pid($l);
		kill 'KILL', $pm if $pm;
		@not = ();
	}
	elsif ($kind eq 'replica_restart')
	{
		my $m = $c->members;
		my ($r) = grep { $_->{role} eq 'sync_standby' } @$m;
		($r) = grep { $_->{role} ne 'leader' } @$m unless $r;
		my $n = $c->node($r->{name});
		$f{node} = $n->{name};
		$post = rest_post($c, $n, 'restart', {});
		# the grant gap seen meanwhile (the leader stays)
		@not = ();
	}
	my ($gap, $port, $old) = $kind eq 'replica_restart'
	  ? $c->probe_during($t0, $post)
	  : $c->probe_until_grant($t0, 240, $kind eq 'zombie', @not);
	if (defined $gap)
	{
		$f{gap_s} = $gap / 1e6;
		($f{new}) = map { $_->{name} } grep { $_->{pgport} == $port } @{ $c->{nodes} };
	}
	else
	{
		$f{error} .= 'no fresh key granted within 240 s; ';
	}
	$f{old_granted_s} = ($old - $t0) / 1e6 if defined $old;
	if ($post)
	{
		my $answer = rest_answer($post);
		$f{error} .= "$kind refused: $answer; " unless $answer =~ /^2/;
	}
	if ($kind eq 'zombie' || $kind eq 'partition')
	{
		# Does the old primary still grant a fresh key, now that another
		# node is the leader?  (A grant that waits for its synchronous
		# standby, which follows the new leader now, never returns.)
		my $t1 = time();
		my $out = $c->psql($l, "SELECT fence FROM dlock.try_acquire('patroni-old-$c->{probes}', '1 s')", 6);
		$f{old_after} = $out =~ /^\d+$/ ? sprintf('granted in %.2f s', time() - $t1) : 'no grant';
	}
	if ($kind eq 'zombie')
	{
		# what a watchdog does: the machine is reset, its Patroni rejoins
		my @pg = processes_in_dir($l->{data});
		kill 'KILL', @pg if @pg;
		$c->start_patroni($l);
	}
	elsif ($kind eq 'crash')
	{
		# the machine is back: its Patroni rejoins
		$c->start_patroni($l);
	}
	elsif ($kind eq 'partition')
	{
		# the network heals once the old leader runs as a standby
		my $deadline = time() + 60;
		usleep(100_000)
		  while time() < $deadline && $c->psql($l, 'SELECT pg_is_in_recovery()', 5) ne 't';
		$f{healed_s} = (now_us() - $t0) / 1e6;
		kill 'USR2', $l->{proxy}{pid};
	}
	return \%f;
}

1;
