# A grant or renewal that returns to the client has reached the synchronous
# standby, whatever nested GUC levels did and whatever the memory mode's
# horizon fast path skipped (issue 18, items 2 and 3).
#
# Each pair is a primary with synchronous_standby_names naming its one
# streaming standby; dlock is preloaded.  Before the standby is stopped a
# CHECKPOINT and a grant make dlock.fence_seq log its next 32 values and
# have that WAL confirmed, so the few tokens drawn while the standby is down
# need no new WAL of their own: whatever waits below waits for the grant's
# or renewal's own durability, not for its token.
#
# Part A, table mode (item 2).  With the synchronous standby stopped, each of
# these must wait for it (its backend waits in 'SyncRep', nothing has reached
# the client after 3 s), and must complete once the standby is back:
#  1. a grant through a wrapper function with SET synchronous_commit = local,
#     called from a session with synchronous_commit = local;
#  2. a renewal through such a wrapper, of a lease granted while the standby
#     was up;
#  3. BEGIN; try_acquire; SET LOCAL synchronous_commit = off; COMMIT: the
#     COMMIT does not complete;
#  4. (reference) the direct call of try_acquire from a session with
#     synchronous_commit = local.
# Once the standby is back, 1, 3 and 4 return a token, 2 the renewal, and
# the lease of 3 is held.
#
# Part B, memory mode (item 3).  With the standby stopped and
# synchronous_standby_names emptied, a 60 s grant moves the horizon
# (dlock.horizon_seq) past its end, flushed locally only.  Then
# synchronous_standby_names is set back (the standby still down):
#  5. a 40 s grant of another key, whose end the horizon covers, must wait
#     for the standby (the horizon it relies on was never confirmed by it);
#  6. so must the owner's 30 s renewal of the 60 s lease.
# Once the standby is back both complete: 5 returns a token, 6 the renewal.

use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use FindBin;
use lib $FindBin::RealBin;
use DlockCluster;
use Time::HiRes qw(usleep time);

my $common = q{
shared_preload_libraries = 'dlock'
dlock.max_ttl = '10min'
checkpoint_timeout = '1h'
autovacuum = off
};

# A primary (storage mode $mode) with a streaming standby $sname that it
# names in synchronous_standby_names; returns both once it is synchronous.
sub pair
{
	my ($pname, $sname, $mode) = @_;
	my $primary = dlock_node($pname, streaming => 1,
		conf => $common . "dlock.storage = $mode\n" . "dlock.horizon_margin = '1s'\n");
	$primary->safe_psql('postgres', q{
		CREATE EXTENSION dlock;
		CREATE TABLE probe (i int);
	});
	my $standby = sync_standby($primary, $sname, "$mode: the standby $sname is synchronous");
	return ($primary, $standby);
}

# Make fence_seq log ahead now, with the standby up (see the header).
sub log_tokens_ahead
{
	my ($node) = @_;
	$node->safe_psql('postgres', 'CHECKPOINT');
	return split /\|/, $node->safe_psql('postgres',
		q{SELECT owner, fence FROM dlock.try_acquire('warm', '1 s')});
}

# A session of its own; returns it and its backend's pid.
sub session
{
	my ($node, $setup) = @_;
	my ($s, $pid) = backend_session($node, 'postgres');
	$s->query_safe($setup) if defined $setup;
	return ($s, $pid);
}

# Send $sql (one line or more, followed by an \echo of 'done') without
# waiting for it to return.
sub launch
{
	my ($s, $sql) = @_;
	$s->{stdin} .= "\\echo sent\n$sql\n\\echo done\n";
	pump_until($s->{run}, $s->{timeout}, \$s->{stdout}, qr/^sent\n/m);
	# keep what followed 'sent': a statement that returned at once
	$s->{stdout} =~ s/^.*?^sent\n//ms;
	return;
}

# Has the session's statement reached the client (the \echo after it ran)?
sub returned
{
	my ($s) = @_;
	$s->{run}->pump_nb;
	return $s->{stdout} =~ /^done$/m ? 1 : 0;
}

# 'state/wait_event' of each backend in @pids, once each waits in SyncRep
# or is idle again (done), or after 10 s.
sub states
{
	my ($node, @pids) = @_;
	my $list = join(', ', @pids);
	my %st;
	my $deadline = time + 10;
	while (1)
	{
		%st = map { split /=/ } split /\n/, $node->safe_psql('postgres', qq{
			SELECT pid || '=' || state || '/' || coalesce(wait_event, '')
			FROM pg_stat_activity WHERE pid IN ($list)});
		last if time > $deadline
		  || !grep { ($st{$_} // '') !~ m{^(active/(SyncRep|advisory)|idle/.*)$} } @pids;
		usleep(100_000);
	}
	$st{$_} //= 'gone' foreach @pids;
	return %st;
}

# What the session printed up to the \echo after its statement (waits for
# it); the outputs of the statement, one a line.
sub finish
{
	my ($s) = @_;
	pump_until($s->{run}, $s->{timeout}, \$s->{stdout}, qr/^done\n/m);
	my $out = $s->{stdout};
	$s->{stdout} = '';
	$out =~ s/^done\n//m;
	return $out;
}

# Wait until the checkpointer has published that synchronous standbys are
# defined: a commit then waits in SyncRep (statement_timeout does not cover
# a commit, so the probe is cancelled by hand, which leaves a warning).
sub wait_sync_defined
{
	my ($node) = @_;
	my ($s, $pid) = session($node);
	my $ok = 0;
	foreach (1 .. 50)
	{
		launch($s, 'INSERT INTO probe VALUES (1);');
		my %st = states($node, $pid);
		if ($st{$pid} eq 'active/SyncRep')
		{
			$node->safe_psql('postgres', "SELECT pg_cancel_backend($pid)");
			$ok = 1;
		}
		finish($s);
		last if $ok;
		usleep(100_000);
	}
	$s->quit;
	return $ok;
}

#
# Part A: table mode.
#
my ($tp, $ts) = pair('primary', 'standby', 'table');
$tp->safe_psql('postgres', q{
	CREATE FUNCTION wrap_grant(k text) RETURNS bigint LANGUAGE sql
		SET synchronous_commit = local
		AS $$ SELECT fence FROM dlock.try_acquire(k, '10 min') $$;
	CREATE FUNCTION wrap_renew(k text, o uuid) RETURNS boolean LANGUAGE sql
		SET synchronous_commit = local
		AS $$ SELECT dlock.renew(k, o, '10 min') IS NOT NULL $$;
});
log_tokens_ahead($tp);
my ($o2) = split /\|/, $tp->safe_psql('postgres',
	q{SELECT owner, fence FROM dlock.try_acquire('k2', '10 min')});

my ($a1, $p1) = session($tp, 'SET synchronous_commit = local');
my ($a2, $p2) = session($tp, 'SET synchronous_commit = local');
my ($a3, $p3) = session($tp);
my ($a4, $p4) = session($tp, 'SET synchronous_commit = local');

$ts->stop;
launch($a1, q{SELECT wrap_grant('k1');});
launch($a2, qq{SELECT wrap_renew('k2', '$o2');});
launch($a3, q{BEGIN; SELECT fence FROM dlock.try_acquire('k3', '10 min'); SET LOCAL synchronous_commit = off; COMMIT;});
launch($a4, q{SELECT fence FROM dlock.try_acquire('k4', '10 min');});

my %st = states($tp, $p1, $p2, $p3, $p4);
is($st{$p1}, 'active/SyncRep',
	'A1: a grant through a wrapper with SET synchronous_commit = local waits for the standby');
is($st{$p2}, 'active/SyncRep',
	'A2: a renewal through such a wrapper waits for the standby');
is($st{$p3}, 'active/SyncRep',
	'A3: the COMMIT of a grant after SET LOCAL synchronous_commit = off waits for the standby');
is($st{$p4}, 'active/SyncRep',
	'A4: a direct grant from a session with synchronous_commit = local waits for the standby');
sleep 3;
%st = states($tp, $p1, $p2, $p3, $p4);
is("$st{$p1}/" . returned($a1), 'active/SyncRep/0',
	'A1: 3 s later the wrapper\'s grant still waits and has returned no token');
is("$st{$p2}/" . returned($a2), 'active/SyncRep/0',
	'A2: 3 s later the wrapper\'s renewal still waits and has not returned');
is("$st{$p3}/" . returned($a3), 'active/SyncRep/0',
	'A3: 3 s later the COMMIT still waits and has not completed');
is("$st{$p4}/" . returned($a4), 'active/SyncRep/0',
	'A4: 3 s later the direct grant still waits and has returned no token');

$ts->start;
like(finish($a1), qr/^\d+\n?$/, 'A1: once the standby is back, the wrapper returns a token');
is(finish($a2), "t\n", 'A2: ... the wrapper\'s renewal returns');
like(finish($a3), qr/^\d+\n?$/, 'A3: ... the COMMIT completes');
like(finish($a4), qr/^\d+\n?$/, 'A4: ... the direct grant returns a token');
is($tp->safe_psql('postgres', q{
		SELECT string_agg(key || ':' || state, ',' ORDER BY key) FROM dlock.lease_status
		WHERE key IN ('k1', 'k2', 'k3', 'k4')}),
	'k1:held,k2:held,k3:held,k4:held', 'A: all four leases are held');
unlike(join('', map { $_->{stderr} } ($a1, $a2, $a3, $a4)), qr/ERROR|WARNING/,
	'A: no error nor warning in the four sessions');
$_->quit foreach ($a1, $a2, $a3, $a4);

#
# Part B: memory mode.
#
my ($mp, $ms) = pair('mprimary', 'mstandby', 'memory');
log_tokens_ahead($mp);
my ($b2s, $pb2) = session($mp);
my ($rs, $pr) = session($mp);

$ms->stop;
$mp->safe_psql('postgres',
	q{ALTER SYSTEM SET synchronous_standby_names = ''; SELECT pg_reload_conf()});
# waits (in SyncRep) only until the checkpointer has seen the change
my ($ob1) = split /\|/, $mp->safe_psql('postgres',
	q{SELECT owner, fence FROM dlock.try_acquire('b1', '60 s')});
like($ob1 // '', qr/^[0-9a-f-]{36}$/,
	'B: b1 granted for 60 s without synchronous standbys');
$mp->safe_psql('postgres', q{
	ALTER SYSTEM SET synchronous_standby_names = 'mstandby'; SELECT pg_reload_conf()});
ok(wait_sync_defined($mp), 'B: synchronous_standby_names names the stopped standby again');

launch($b2s, q{SELECT fence FROM dlock.try_acquire('b2', '40 s');});
launch($rs, qq{SELECT dlock.renew('b1', '$ob1', '30 s') IS NOT NULL;});
# Both need the same WAL, the horizon's: one waits for the standby, the
# other for its turn to (dlock lets one backend at a time wait for a given
# LSN, wait event "advisory").
%st = states($mp, $pb2, $pr);
like($st{$pb2}, qr{^active/(SyncRep|advisory)$},
	'B5: a grant inside a horizon flushed before the standby was named again waits for it');
like($st{$pr}, qr{^active/(SyncRep|advisory)$},
	'B6: so does the owner\'s renewal inside that horizon');
ok(grep({ $_ eq 'active/SyncRep' } @st{ $pb2, $pr }),
	'B5, B6: one of them in the queue for synchronous replication');
sleep 3;
%st = states($mp, $pb2, $pr);
like("$st{$pb2}/" . returned($b2s), qr{^active/(SyncRep|advisory)/0$},
	'B5: 3 s later the grant still waits and has returned no token');
like("$st{$pr}/" . returned($rs), qr{^active/(SyncRep|advisory)/0$},
	'B6: 3 s later the renewal still waits and has not returned');

$ms->start;
like(finish($b2s), qr/^\d+\n?$/, 'B5: once the standby is back, the grant returns a token');
is(finish($rs), "t\n", 'B6: ... and the renewal returns');
is($mp->safe_psql('postgres', q{
		SELECT string_agg(key || ':' || state, ',' ORDER BY key) FROM dlock.lease_status
		WHERE key IN ('b1', 'b2')}),
	'b1:held,b2:held', 'B: both leases are held');
unlike($b2s->{stderr} . $rs->{stderr}, qr/ERROR|WARNING/,
	'B: no error nor warning in the two sessions');
$_->quit foreach ($b2s, $rs);

$ts->stop;
$tp->stop;
$ms->stop;
$mp->stop;
done_testing();
