# A synchronous-standby chaos run (issue 18, "Prevention, in CI"): no grant
# or renewal acknowledged while synchronous replication was in force is
# missing after the promotion of the synchronous standby, in either storage
# mode, whatever wrapper functions, SET LOCAL and session settings did, and
# whatever a nemesis did to the standby and to synchronous_standby_names.
#
# Two pairs run at the same time, one in table mode and one in memory mode
# (dlock.horizon_margin = 1s): a primary with dlock preloaded and one
# streaming standby, named in synchronous_standby_names.
#
# Workers (psql, six per pair) take leases of 40 keys: each grant (2-8 s) is
# followed by 5-25 renewals (8 s, so a renewal never shortens a lease)
# 20-60 ms apart, then a release or nothing.  They print every grant,
# renewal and release that returned (key, token, expiry, the server's
# statement_timestamp()).  Two call dlock through wrapper functions with
# their own SET synchronous_commit = local, from sessions with
# synchronous_commit = local or off; two directly from such sessions; one
# either way from a session with it on; one in transaction blocks that run
# SET LOCAL synchronous_commit = off before COMMIT.
#
# The nemesis, per pair, in a child process: cycles in shuffled order of
#  * stop the standby (fast), switch synchronous replication off
#    (ALTER SYSTEM SET synchronous_standby_names = '', pg_reload_conf) and,
#    the standby still down, back on (its name again), start the standby;
#  * the same with the standby's link stalled instead (SIGSTOP of its
#    walsender: the standby stays "sync" in pg_stat_replication, as behind
#    a stalled network) and resumed (SIGCONT);
#  * stop the standby (immediate) and start it, replication left on;
#  * stall the link and resume it, replication left on;
# with the workers running 0.5-0.8 s with the standby streaming between
# them.  While replication is off the nemesis grants a 6 s lease of its
# own, so that in memory mode the horizon moves while nothing waits for the
# standby.  Each switch back on is confirmed by a probe INSERT seen waiting
# in SyncRep (the checkpointer has published it; every backend was sent the
# reload before); from then on until the next switch off, synchronous
# replication is in force.
#
# The end: the link stalled, replication switched off for 0.8-1.2 s (the
# 6 s lease), switched back on (confirmed as above), 1.5 s more of workers,
# then, with the standby "sync" in pg_stat_replication, the primary is
# stopped at once (SIGQUIT to the postmaster, an immediate shutdown, and
# SIGKILL to the stalled walsender, which would otherwise send what it has
# once resumed), and the standby is promoted.  (Why stalled: a standby that
# streams receives the WAL within a millisecond of its local flush, so a
# grant that skipped the wait for it would still be there after the
# promotion unless the primary died in that millisecond; and a standby that
# is down when the primary dies would not count as sync.  Behind a stalled
# link the standby is sync and receives nothing.)
#
# Covered: a grant or renewal invoked (statement_timestamp) after a switch
# on was confirmed, and acknowledged (the same worker's next statement
# began) before the next switch off, or at any time before the end in the
# last period.  On the promoted standby:
#  * table mode: every covered grant and renewal is there: the key's row in
#    dlock.leases has that token and an expiry at least the acknowledged
#    one (or it was released since), or a larger token;
#  * memory mode: no key is granted (try_acquire of every key, again and
#    again) before the latest acknowledged expiry of a covered lease of it
#    that was not released, nor any key before the latest of them (the
#    horizon covers every key);
#  * in both: new tokens are greater than every covered token.
# And the run did what it says: covered grants and renewals of every kind of
# worker, some of them invoked while the standby was stopped or stalled (so
# they returned once it was back), stops, stalls and switches done, the
# standby "sync" at the end;
# in memory mode some covered leases still live when the promoted standby
# was first tried.  No internal error (XX000) in any worker, no PANIC or
# TRAP in any server log.
#
# On dlock 0.5 it goes red: in table mode the wrapped renewals (and grants)
# and those committed after SET LOCAL synchronous_commit = off,
# acknowledged in the last period while the link was stalled, are missing
# (issue 18, 2); in memory mode the renewals acknowledged there relied on a
# horizon moved while replication was off and never sent (issue 18, 3), and
# the promoted standby grants their keys up to a second before they end.
# (Renewals, because they draw no token: a grant there waits, on 0.5 too,
# for the WAL of a token drawn while replication was off.)
#
# About 25 s on 2 shared cores.  DLOCK_SYNC_CHAOS_SEED replays the choices.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use FindBin;
use lib $FindBin::RealBin;
use DlockCluster;
use DlockFaults;
use POSIX ();
use Time::HiRes qw(time usleep);
use List::Util qw(max min shuffle);

my $t_start = time();
my $seed = $ENV{DLOCK_SYNC_CHAOS_SEED} // (int(time() * 1000) + $$) % 1000000;
note "seed: $seed (DLOCK_SYNC_CHAOS_SEED=$seed replays the choices)";
srand($seed);

my $nkeys = 40;
my @grant_secs = (2, 8);
my $renew_secs = 8;    # not below the longest grant: renewals never shorten a lease

# Microseconds since the epoch, the server's clock and ours being one.
sub now_us { return int(time() * 1e6) }

# A primary in storage mode $mode with a streaming standby it names in
# synchronous_standby_names, and what the workers call.
sub pair
{
	my ($mode) = @_;
	my $p = dlock_node("${mode}_primary", streaming => 1, conf => qq{
shared_preload_libraries = 'dlock'
dlock.storage = $mode
dlock.horizon_margin = '1s'
max_connections = 40
autovacuum = off
log_statement = ddl
});
	$p->safe_psql('postgres', q{
		CREATE EXTENSION dlock;
		CREATE TABLE probe (i int);
		CREATE FUNCTION us(timestamptz) RETURNS bigint LANGUAGE sql STABLE
			AS $$ SELECT (extract(epoch FROM $1) * 1000000)::bigint $$;
		CREATE FUNCTION wrap_grant(k text, ttl interval) RETURNS SETOF dlock.lease
			LANGUAGE sql SET synchronous_commit = local
			AS $$ SELECT * FROM dlock.try_acquire(k, ttl) $$;
		CREATE FUNCTION wrap_renew(k text, o uuid, ttl interval) RETURNS timestamptz
			LANGUAGE sql SET synchronous_commit = local
			AS $$ SELECT dlock.renew(k, o, ttl) $$;
	});
	my $sname = "${mode}_standby";
	my $s = sync_standby($p, $sname, "$mode: the standby is synchronous");
	is($p->safe_psql('postgres', 'SHOW dlock.storage'), $mode, "$mode: dlock.storage = $mode");
	return { mode => $mode, primary => $p, standby => $s, sname => $sname };
}

#
# The workers' scripts.  Every line printed is one operation that returned:
#   g|key|token|expiry|invoked|how   a grant
#   r|key|token|expiry|invoked|how   a renewal (expiry empty: lost)
#   x|key|token|t/f|invoked|how      a release
#   p                                (transaction blocks) before COMMIT: no error so far
#   c|invoked                        (transaction blocks) after COMMIT
# with times in microseconds since the epoch by the server's clock, how 'w'
# (through a wrapper function) or 'd' (directly).  The lease granted last
# is kept in the session variable t.last ("key owner token").
#
my $key = "'k' || floor(random() * $nkeys)::int";
my $ttl = "make_interval(secs => $grant_secs[0] + random() * " . ($grant_secs[1] - $grant_secs[0]) . ')';
my $last = "FROM current_setting('t.last', true) AS v WHERE v <> ''";

sub grant_sql
{
	my ($wrap) = @_;
	my ($f, $how) = $wrap ? ('public.wrap_grant', 'w') : ('dlock.try_acquire', 'd');
	return "SELECT format('g|%s|%s|%s|%s|$how', key, fence, us(expires_at), us(statement_timestamp()))"
	  . " || substr(set_config('t.last', key || ' ' || owner || ' ' || fence, false), 1, 0)"
	  . " FROM $f($key, $ttl);";
}

sub renew_sql
{
	my ($wrap) = @_;
	my ($f, $how) = $wrap ? ('public.wrap_renew', 'w') : ('dlock.renew', 'd');
	return "SELECT format('r|%s|%s|%s|%s|$how', split_part(v, ' ', 1), split_part(v, ' ', 3),"
	  . " us($f(split_part(v, ' ', 1), split_part(v, ' ', 2)::uuid, '$renew_secs s')),"
	  . " us(statement_timestamp())) $last;";
}

sub release_sql
{
	return "SELECT format('x|%s|%s|%s|%s|d', split_part(v, ' ', 1), split_part(v, ' ', 3),"
	  . " dlock.release(split_part(v, ' ', 1), split_part(v, ' ', 2)::uuid), us(statement_timestamp()))"
	  . " || substr(set_config('t.last', '', false), 1, 0) $last;";
}

# Worker kinds: session synchronous_commit, and how it calls dlock ('w'
# wrappers, 'd' directly, 'm' either, 't' transaction blocks of either).
my @kinds = (
	[ 'wrap_local', 'local', 'w' ],
	[ 'wrap_off', 'off', 'w' ],
	[ 'direct_local', 'local', 'd' ],
	[ 'direct_off', 'off', 'd' ],
	[ 'mixed_on', 'on', 'm' ],
	[ 'txn_local', 'local', 't' ]);

my $dir = PostgreSQL::Test::Utils::tempdir;

# The walsender the nemesis has stopped, if any (resumed if it fails).
my $stalled;

# A script of leases, each granted, renewed 5-25 times 20-60 ms apart (as
# holders do; renewals draw no token, so they go on where grants wait for
# one), then released or left to run out; it ends by running itself again.
sub write_script
{
	my ($name, $how) = @_;
	my @s;
	my $wrap = sub { return $how eq 'w' ? 1 : $how eq 'd' ? 0 : rand() < 0.5 };
	# in a transaction block that lowers synchronous_commit before COMMIT
	my $block = sub {
		return ('BEGIN;', $_[0], 'SET LOCAL synchronous_commit = off;', "SELECT 'p';",
			'COMMIT;', "SELECT format('c|%s', us(statement_timestamp()));");
	};
	my $sleep = 'SELECT pg_sleep(0.02 + random() * 0.04);';
	while (@s < 300)
	{
		push @s, $how eq 't' ? $block->(grant_sql($wrap->())) : grant_sql($wrap->());
		foreach (1 .. 5 + int(rand(21)))
		{
			push @s, $sleep, $how eq 't' ? $block->(renew_sql($wrap->())) : renew_sql($wrap->());
		}
		push @s, release_sql() if $how ne 't' && rand() < 0.5;
	}
	push @s, "\\ir $name.sql";
	open(my $f, '>', "$dir/$name.sql") or die "cannot write $dir/$name.sql: $!";
	print $f join("\n", @s), "\n";
	close($f);
	return;
}
write_script($_->[0], $_->[2]) foreach @kinds;

#
# The nemesis (in a child process per pair; see the header).  It appends
# to $pair->{events}: "S us" synchronous replication in force from then,
# "O us" switched off from then, "K us" the primary stopped, "D us" and
# "R us" the standby stopped or stalled until then and back, "A action",
# "F sync_state" before the stop, "E message" if it failed.
#
sub nemesis
{
	my ($pair) = @_;
	my ($p, $s, $sname, $mode) = @{$pair}{qw(primary standby sname mode)};
	my $bindir = $p->config_data('--bindir');
	open(my $ev, '>>', $pair->{events}) or die "cannot write $pair->{events}: $!";
	$ev->autoflush(1);
	my $event = sub { print $ev "@_\n" };
	my @procs;
	my $nprobe = 0;

	foreach my $k (@kinds)
	{
		my ($name, $sc) = @$k;
		push @procs, spawn("$dir/$mode.$name.out", "$dir/$mode.$name.err",
			"$bindir/psql", '-X', '-A', '-t', '-q', '-v', 'VERBOSITY=sqlstate',
			'-d', $p->connstr('postgres') . " application_name=$name",
			'-c', "SET synchronous_commit = $sc", '-f', "$dir/$name.sql");
	}

	my $bg = $p->background_psql('postgres', on_error_stop => 1);
	my $q = sub { return $bg->query_safe($_[0]) };
	my $run = sub {
		my ($lo, $hi) = @_;
		usleep(int(1e6 * ($lo + rand($hi - $lo))));
	};
	# Stall the standby's link (SIGSTOP its walsender), or resume it.
	my $stall = sub {
		my $pid = $q->("SELECT pid FROM pg_stat_replication WHERE application_name = '$sname'");
		die "no walsender for $sname" unless $pid =~ /^\d+$/;
		$event->('D', now_us());
		kill 'STOP', $pid;
		$stalled = $pid;
	};
	my $resume = sub {
		kill 'CONT', $stalled;
		$stalled = undef;
	};
	my $wait_sync = sub {
		my $deadline = time() + 60;
		until ($q->("SELECT count(*) FROM pg_stat_replication
				WHERE application_name = '$sname' AND sync_state = 'sync'") eq '1')
		{
			die "$sname not sync after 60 s" if time() > $deadline;
			usleep(20_000);
		}
	};
	my $off = sub {
		$event->('O', now_us());
		$q->("ALTER SYSTEM SET synchronous_standby_names = ''; SELECT pg_reload_conf();");
		$event->('A', 'off');
		# a lease of its own, so that the horizon moves now (memory mode)
		$q->("SELECT count(*) FROM dlock.try_acquire('nemesis', '6 s')");
	};
	# Back on while the standby cannot confirm anything: done once a
	# probe's commit waits in SyncRep.
	my $on = sub {
		$q->("ALTER SYSTEM SET synchronous_standby_names = '$sname'; SELECT pg_reload_conf();");
		my $deadline = time() + 60;
		while (1)
		{
			my $app = 'probe' . ++$nprobe;
			my $probe = spawn("$dir/$mode.$app.out", "$dir/$mode.$app.err",
				"$bindir/psql", '-X', '-q', '-d', $p->connstr('postgres') . " application_name=$app",
				'-c', 'INSERT INTO probe VALUES (1)');
			push @procs, $probe;
			# (a probe that committed without waiting came too early: again)
			while (!gone($probe) && time() < $deadline)
			{
				if ($q->("SELECT count(*) FROM pg_stat_activity
						WHERE application_name = '$app' AND wait_event = 'SyncRep'") eq '1')
				{
					$event->('S', now_us());
					$event->('A', 'on');
					return;
				}
				usleep(20_000);
			}
			die 'no commit waits for the standby after the switch back on' if time() > $deadline;
		}
	};

	my %cycle = (
		stop_toggle => sub {
			$event->('D', now_us());
			$s->stop('fast');
			$event->('A', 'stop');
			$off->();
			$run->(0.3, 0.6);
			$on->();
			$run->(0.3, 0.6);
			$s->start;
			$event->('A', 'start');
			$event->('R', now_us());
		},
		stall_toggle => sub {
			$stall->();
			$event->('A', 'stall');
			$off->();
			$run->(0.3, 0.6);
			$on->();
			$run->(0.3, 0.6);
			$resume->();
			$event->('A', 'resume');
			$event->('R', now_us());
		},
		stop => sub {
			$event->('D', now_us());
			$s->stop('immediate');
			$event->('A', 'stop');
			$run->(0.5, 1);
			$s->start;
			$event->('A', 'start');
			$event->('R', now_us());
		},
		stall => sub {
			$stall->();
			$event->('A', 'stall');
			$run->(0.5, 1);
			$resume->();
			$event->('A', 'resume');
			$event->('R', now_us());
		});

	# Synchronous replication in force from the start: confirm it the same
	# way (not a stall of the cycles: no D or R event).
	my $ws = $q->("SELECT pid FROM pg_stat_replication WHERE application_name = '$sname'");
	kill 'STOP', $ws;
	$stalled = $ws;
	$on->();
	$resume->();
	foreach my $c (shuffle(sort keys %cycle))
	{
		$wait_sync->();
		$run->(0.5, 0.8);
		$cycle{$c}->();
	}

	# The end.
	$wait_sync->();
	$run->(0.8, 1.2);
	$stall->();
	$event->('A', 'stall');
	$off->();
	$run->(0.8, 1.2);
	$on->();
	usleep(1_500_000);
	$event->('F', $q->("SELECT sync_state FROM pg_stat_replication WHERE application_name = '$sname'"));
	my $pm = $p->{_pid};
	kill 'QUIT', $pm;
	kill 'KILL', $stalled;
	$stalled = undef;
	$event->('K', now_us());
	my $deadline = time() + 60;
	while (kill 0, $pm)
	{
		die 'the primary did not stop' if time() > $deadline;
		usleep(10_000);
	}

	# The workers and probes end with their connections.
	reap(60, @procs);
	$bg->quit;
	$event->('A', 'done');
	return;
}

# Set both pairs up, then run both nemeses at once.
# (memory mode first: its check waits for leases to end)
my @pairs = (pair('memory'), pair('table'));
note sprintf('pairs set up: %.1f s', time() - $t_start);
my $t_run = time();
foreach my $i (0 .. $#pairs)
{
	my $pair = $pairs[$i];
	$pair->{events} = "$dir/$pair->{mode}.events";
	my $pid = fork();
	die "fork: $!" unless defined $pid;
	if ($pid == 0)
	{
		# no TAP output and no END blocks (they would stop the nodes) here
		srand($seed + $i + 1);
		my $ok = eval { nemesis($pair); 1 };
		unless ($ok)
		{
			kill 'CONT', $stalled if $stalled;
			if (open(my $ev, '>>', $pair->{events}))
			{
				(my $msg = $@) =~ s/\n/ /g;
				print $ev "E $msg\n";
				close($ev);
			}
		}
		POSIX::_exit($ok ? 0 : 1);
	}
	$pair->{nemesis} = $pid;
}
foreach my $pair (@pairs)
{
	waitpid($pair->{nemesis}, 0);
	next if is($? >> 8, 0, "$pair->{mode}: the nemesis ran to its end");
	diag slurp_file($pair->{events});
	$pair->{primary}->stop('immediate', fail_ok => 1);
}
note sprintf('nemesis runs: %.1f s', time() - $t_run);

foreach my $pair (@pairs)
{
	$pair->{primary}->_update_pid(-1);
	$pair->{standby}->_update_pid(-1);
	$pair->{standby}->promote;
}

# The operations a pair's workers saw return, with whether they are
# covered (see the header).
sub read_ops
{
	my ($pair) = @_;
	my (@S, @O, @D, @R, %actions);
	my $mode = $pair->{mode};
	foreach (split /\n/, slurp_file($pair->{events}))
	{
		my ($what, $v) = split / /, $_, 2;
		push @S, $v if $what eq 'S';
		push @O, $v if $what eq 'O';
		push @D, $v if $what eq 'D';
		push @R, $v if $what eq 'R';
		$pair->{killed} = $v if $what eq 'K';
		$pair->{final_state} = $v if $what eq 'F';
		$actions{$v}++ if $what eq 'A';
	}
	$pair->{actions} = \%actions;

	# the end of the period in force from $s: the next switch off, or never
	my $end_of = sub {
		my ($s) = @_;
		my ($o) = grep { $_ > $s } @O;
		return $o // 9e18;
	};
	my $covered = sub {
		my ($inv, $acked_by) = @_;
		my ($s) = grep { $_ < $inv } reverse @S;
		return 0 unless defined $s;
		my $end = $end_of->($s);
		return $end == 9e18 || $acked_by < $end ? 1 : 0;
	};

	my (@ops, %errors);
	foreach my $k (@kinds)
	{
		my $name = $k->[0];
		my (@lines, @pending, $no_error);
		foreach my $line (split /\n/, slurp_file("$dir/$mode.$name.out"))
		{
			if ($line =~ /^([grx])\|([^|]*)\|(\d+)\|([^|]*)\|(\d+)\|([wd])$/)
			{
				my $op = { op => $1, key => $2, token => $3, value => $4, inv => $5, how => $6, kind => $name };
				if ($k->[2] eq 't')
				{
					push @pending, $op;
				}
				else
				{
					push @lines, $op;
				}
			}
			elsif ($line eq 'p')
			{
				$no_error = 1;
			}
			elsif ($line =~ /^c\|(\d+)$/)
			{
				# the block committed: acknowledged by its COMMIT, before $1
				$_->{acked_by} = $1 foreach @pending;
				push @lines, @pending if $no_error;
				@pending = ();
				$no_error = 0;
			}
		}
		# acknowledged before the next statement began
		for my $i (0 .. $#lines)
		{
			$lines[$i]{acked_by} //= $i < $#lines ? $lines[ $i + 1 ]{inv} : 9e18;
		}
		foreach my $op (@lines)
		{
			$op->{covered} = $covered->($op->{inv}, $op->{acked_by});
			$op->{final} = @S && $op->{inv} > $S[-1] ? 1 : 0;
			# invoked while the standby was stopped or stalled, before it was back
			$op->{waited} = grep { $D[$_] < $op->{inv} && $op->{inv} < ($R[$_] // 0) } 0 .. $#D;
		}
		push @ops, @lines;
		count_sqlstates("$dir/$mode.$name.err", \%errors);
	}
	return (\@ops, \%errors);
}

# When $op was acknowledged, for messages.
sub acked
{
	my ($op, $killed) = @_;
	return $op->{acked_by} > $killed ? 'its worker\'s last'
	  : sprintf('acknowledged %.3f s before the stop', ($killed - $op->{acked_by}) / 1e6);
}

# Grants and renewals that returned an expiry.
sub leases { return grep { ($_->{op} eq 'g' || $_->{op} eq 'r') && $_->{value} ne '' } @_ }

foreach my $pair (@pairs)
{
	my $mode = $pair->{mode};
	my ($ops, $errors) = read_ops($pair);
	my @covered = grep { $_->{covered} } leases(@$ops);
	my %a = %{ $pair->{actions} };
	note "$mode: nemesis: " . join(', ', map { "$_ $a{$_}" } sort keys %a);
	note sprintf('%s: %d grants and renewals returned, %d covered (%d invoked while the standby was away; %d in the last period: %d grants, %d wrapped); errors: %s',
		$mode, scalar(leases(@$ops)), scalar(@covered),
		scalar(grep { $_->{waited} } @covered),
		scalar(grep { $_->{final} } @covered),
		scalar(grep { $_->{final} && $_->{op} eq 'g' } @covered),
		scalar(grep { $_->{final} && $_->{how} eq 'w' } @covered),
		join(', ', map { "$_ $errors->{$_}" } sort keys %$errors) || 'none');

	is($pair->{final_state} // '', 'sync', "$mode: the standby was sync when the primary was stopped");
	ok(($a{stop} // 0) >= 2 && ($a{stall} // 0) >= 3 && ($a{off} // 0) >= 3 && ($a{on} // 0) >= 4,
		"$mode: the standby was stopped and stalled, replication switched off and on");
	foreach my $k (@kinds)
	{
		my $n = grep { $_->{kind} eq $k->[0] } @covered;
		cmp_ok($n, '>', 0, "$mode: covered grants or renewals from $k->[0] workers");
	}
	cmp_ok(scalar(grep { $_->{op} eq 'r' } @covered), '>', 0, "$mode: covered renewals");
	cmp_ok(scalar(grep { $_->{waited} } @covered), '>', 0,
		"$mode: covered grants or renewals invoked while the standby was stopped or stalled");
	ok(!grep({ /^XX/ } keys %$errors), "$mode: no internal error in any worker");

	my $new = $pair->{standby};
	my $max_token = max(0, map { $_->{token} } @covered);
	my @bad;
	if ($mode eq 'table')
	{
		my %row;
		foreach (split /\n/, $new->safe_psql('postgres',
				'SELECT key, fence, us(expires_at), owner IS NULL FROM dlock.leases'))
		{
			my ($k, $f, $e, $released) = split /\|/;
			$row{$k} = [ $f, $e, $released eq 't' ];
		}
		foreach my $op (@covered)
		{
			my $r = $row{ $op->{key} };
			next if $r && ($r->[0] > $op->{token}
				|| ($r->[0] == $op->{token} && ($r->[1] >= $op->{value} || $r->[2])));
			push @bad, sprintf('%s of %s, token %d (%s, %s, %s, %s): the row has %s',
				$op->{op}, $op->{key}, $op->{token}, $op->{how}, $op->{kind},
				$op->{final} ? 'last period' : 'earlier', acked($op, $pair->{killed}),
				$r ? "token $r->[0]" . ($r->[0] == $op->{token} ? sprintf(', ending %.3f s earlier', ($op->{value} - $r->[1]) / 1e6) : '') : 'no row');
		}
		is(scalar(@bad), 0,
			'table: every covered grant and renewal is on the promoted standby (' . scalar(@covered) . ' checked)');
		my $t = $new->safe_psql('postgres', "SELECT fence FROM dlock.try_acquire('after', '1 s')");
		cmp_ok($t || 0, '>', $max_token, 'table: a new token is greater than every covered one');
	}
	else
	{
		# The end of each key's covered leases that were not released.
		my %released = map { ("$_->{key}|$_->{token}" => 1) }
		  grep { $_->{op} eq 'x' && $_->{value} eq 't' } @$ops;
		my (%need, %why);
		foreach my $op (@covered)
		{
			next if $released{"$op->{key}|$op->{token}"};
			next if ($need{ $op->{key} } // 0) >= $op->{value};
			$need{ $op->{key} } = $op->{value};
			$why{ $op->{key} } = $op;
		}
		my $latest = max(0, values %need);
		my @keys = ('after', map { "k$_" } 0 .. $nkeys - 1);
		my (%granted, @tokens, $first_try, $tries, $refused);
		my $deadline = time() + 60;
		while (@keys && time() < $deadline)
		{
			my $list = join(',', map { "'$_'" } @keys);
			my $out = $new->safe_psql('postgres', qq{
				SELECT 'a|' || us(clock_timestamp());
				SELECT format('g|%s|%s|%s', k, l.fence, us(l.expires_at))
				FROM unnest(ARRAY[$list]) AS k, LATERAL dlock.try_acquire(k, '1 ms') AS l;});
			$tries++;
			my $got = 0;
			foreach (split /\n/, $out)
			{
				$first_try //= $1 if /^a\|(\d+)$/;
				next unless /^g\|([^|]*)\|(\d+)\|(\d+)$/;
				$granted{$1} = $3 - 1000;    # its TTL: 1 ms
				push @tokens, $2;
				$got++;
			}
			$refused++ unless $got;
			@keys = grep { !exists $granted{$_} } @keys;
			usleep(50_000) if @keys;
		}
		is(scalar(@keys), 0, 'memory: every key granted again on the promoted standby');
		foreach my $k (sort keys %need)
		{
			next unless defined $granted{$k} && $granted{$k} < $need{$k};
			my $op = $why{$k};
			push @bad, sprintf('%s granted %.3f s before the end of %s token %d (%s, %s, %s, %s)',
				$k, ($need{$k} - $granted{$k}) / 1e6, $op->{op}, $op->{token}, $op->{how}, $op->{kind},
				$op->{final} ? 'last period' : 'earlier', acked($op, $pair->{killed}));
		}
		is(scalar(@bad), 0,
			'memory: no key granted before the end of a covered lease of it (' . scalar(keys %need) . ' keys)');
		my $first = min(9e18, values %granted);
		ok($first >= $latest,
			'memory: no key granted before the latest covered lease ended')
		  or diag sprintf('the first grant came %.3f s before it', ($latest - $first) / 1e6);
		cmp_ok(min(9e18, @tokens), '>', $max_token, 'memory: new tokens are greater than every covered one');
		my $live = grep { $_ > ($first_try // 9e18) } values %need;
		note "memory: $tries tries on the promoted standby, $refused refused every key; $live keys with a covered lease live at the first";
		cmp_ok($live, '>', 0, 'memory: some covered leases were still live when the promoted standby was first tried');
	}
	diag "$mode: $_" foreach @bad[ 0 .. min($#bad, 19) ];

	my $log = slurp_file($pair->{primary}->logfile) . slurp_file($new->logfile);
	my @panic = grep { /PANIC|TRAP:/ } split /\n/, $log;
	is(scalar(@panic), 0, "$mode: no PANIC or TRAP in the server logs");
}

$_->{standby}->stop foreach @pairs;
note sprintf('total %.1f s', time() - $t_start);
done_testing();
