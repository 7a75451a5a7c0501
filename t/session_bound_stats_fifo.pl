# Operating dlock (issue 7), on a server with shared_preload_libraries =
# 'dlock', and a second one without it.
#
# a. Session-bound leases end with their connection: a terminated holder's
#    lease shows as expired at once (its TTL is an hour), its owner can no
#    longer renew it, the next grant draws a larger token and dlock.stats
#    counts a takeover and an expiry; an acquire() waiting for such a lease
#    is woken within seconds when the holder is terminated, when its client
#    disconnects, and when it runs DISCARD ALL or pg_advisory_unlock_all()
#    (which end its session-bound leases, not the others, and after which
#    it can take new ones); other connections may renew and release it; a
#    lease that is not session-bound survives its connection; a lock delay
#    does not apply when the connection ended; a backend crash (kill -9,
#    the server restarts) ends session-bound leases, keeps the others, loses
#    the counters, and the next grant draws a larger token.
# b. Counters: dlock.stats survives a clean restart unchanged and is empty
#    after a crash (immediate stop: recovery follows; core discards its statistics then too);
#    dlock.log_events writes one key=value LOG line per grant, release,
#    expiry (disconnected or TTL), takeover and refused write, every one
#    parseable, with keys and holders quoted and escaped, carrying the
#    tokens of the grants, and nothing before it is set; with
#    dlock.stats_max = 100, 300 keys leave at most 100 key rows, the most
#    active key keeps its row, so do 20 keys used three times each (only
#    keys used once are evicted), and the totals still count every grant.
# c. Waiting: 20 waiters queued one after another on one key sleep without
#    using CPU (read from /proc) and are granted in exactly their arrival
#    order as each releases in turn; the release-to-grant hand-offs (of
#    sessions that have granted and released once before, so that no
#    backend's start-up costs count) are measured, p50/p99 printed, with a
#    loose bound only (bench/waits has the real figures).  A waiter that leaves the queue (cancelled, terminated)
#    lets the next one in.  Without preloading, acquire() still waits for
#    and gets a released key (also one whose session-bound holder was
#    terminated), and the counters are NULL.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use FindBin;
use lib $FindBin::RealBin;
use DlockCluster;
use DlockFaults;
use POSIX qw(ceil);

my $node = dlock_node('operate', conf => q{
shared_preload_libraries = 'dlock'
dlock.stats_max = 100
restart_after_crash = on
});

# A waiter that is woken gets its grant within this many seconds (in
# practice well under 0.1 s; a waiter that is not woken sleeps until its
# wait limit or the lease's TTL).
my $quick = 3;

my $tables = q{
	CREATE EXTENSION dlock;
	-- what each waiter got, and when (clock_timestamp() after the grant)
	CREATE TABLE woken (who text, fence bigint, at timestamptz);
	-- when the test did something a waiter should react to
	CREATE TABLE marks (what text, at timestamptz);
};
$node->safe_psql('postgres', $tables);

# Grant $key (SQL literal) in session $s with extra arguments $args;
# return owner and fence.
sub grant_in
{
	my ($s, $key, $args) = @_;
	my $row = $s->query_safe(
		"SELECT owner, fence FROM dlock.try_acquire($key, '1 hour'$args)");
	return split /\|/, $row;
}

# Start a session waiting in acquire() for $key, recording its grant in
# woken as $who; return it and its pid once it sleeps on its latch.
sub start_waiter
{
	my ($n, $db, $who, $key, $wait) = @_;
	my ($s, $pid) = backend_session($n, $db);
	$s->query_until(qr/waiting/, qq{
		\\echo waiting
		INSERT INTO woken SELECT '$who', fence, clock_timestamp()
		FROM dlock.acquire('$key', '1 hour', wait => $wait);
	});
	ok(sleeps_in_dlock($n, $db, $pid), "$who: asleep in acquire()");
	return ($s, $pid);
}

# Wait until the waiter with backend $pid has stopped waiting (granted or
# not).
sub waiter_done
{
	my ($n, $db, $pid) = @_;
	return $n->poll_query_until($db, qq{
		SELECT state = 'idle' FROM pg_stat_activity WHERE pid = $pid});
}

# Note the time of $what (just before the test does it).
sub mark
{
	my ($n, $db, $what) = @_;
	$n->safe_psql($db, "INSERT INTO marks VALUES ('$what', clock_timestamp())");
	return;
}

# Seconds from mark $what to the grant of waiter $who, or '' if none.
sub latency
{
	my ($n, $db, $who, $what) = @_;
	return $n->safe_psql($db, qq{
		SELECT round(extract(epoch FROM w.at - m.at), 3)
		FROM woken w, marks m WHERE w.who = '$who' AND m.what = '$what'});
}

# Terminate backend $pid and wait until it has exited.
sub terminate
{
	my ($n, $db, $pid) = @_;
	return $n->safe_psql($db, "SELECT pg_terminate_backend($pid, 60000)");
}

# state, session_bound and whether remaining is set, from dlock.lease_status.
sub status
{
	my ($n, $db, $key) = @_;
	return $n->safe_psql($db, qq{
		SELECT state, session_bound, remaining IS NOT NULL
		FROM dlock.lease_status WHERE key = $key});
}

#
# a. Session-bound leases.
#

# a1. A terminated holder's lease is dead at once; the next grant is a
# takeover with a larger token, counted as such.
my ($h, $hpid) = backend_session($node, 'postgres');
my ($owner, $fence) = grant_in($h, "'sb'", ', session_bound => true');
like($fence, qr/^\d+$/, 'a1: session-bound lease granted');
is( $node->safe_psql('postgres', qq{
		SELECT state || ' ' || session_bound || ' ' || (pid = $hpid)
		FROM dlock.lease_status WHERE key = 'sb'}),
	'held true true',
	'a1: lease_status shows it held, session-bound, with the pid of its connection');
is(terminate($node, 'postgres', $hpid), 't', 'a1: holder connection terminated');
is(status($node, 'postgres', "'sb'"), 'expired|t|f',
	'a1: at once its lease shows expired (its TTL is an hour)');
is( $node->safe_psql('postgres', qq{
		SELECT dlock.renew('sb', '$owner', '1 hour') IS NULL}),
	't', 'a1: the owner can no longer renew it');
is( $node->safe_psql('postgres', qq{
		SELECT fence > $fence FROM dlock.try_acquire('sb', '1 hour')}),
	't', 'a1: try_acquire from another session gets it, with a larger token');
is( $node->safe_psql('postgres', q{
		SELECT acquired || ' ' || taken_over || ' ' || expired
		FROM dlock.stats WHERE key = 'sb'}),
	'2 1 1', 'a1: dlock.stats counts two grants, one of them a takeover, and one expiry');
$h->quit;

# a2, a3. A waiter is woken when the holder's connection ends, by
# pg_terminate_backend() or by its client disconnecting.
foreach my $how ('terminated', 'disconnected')
{
	my $key = "w-$how";
	($h, $hpid) = backend_session($node, 'postgres');
	($owner, $fence) = grant_in($h, "'$key'", ', session_bound => true');
	my ($w, $wpid) = start_waiter($node, 'postgres', $how, $key, "'60 seconds'");
	mark($node, 'postgres', $how);
	terminate($node, 'postgres', $hpid) if $how eq 'terminated';
	$h->quit;
	ok(waiter_done($node, 'postgres', $wpid), "$how: the waiter stopped waiting");
	my $lat = latency($node, 'postgres', $how, $how);
	note "$how holder: waiter granted ${lat}s after the end of the connection";
	ok($lat ne '' && $lat < $quick,
		"$how: waiter granted within seconds of the holder's end (TTL 1 hour)");
	is( $node->safe_psql('postgres',
			"SELECT fence > $fence FROM woken WHERE who = '$how'"),
		't', "$how: with a larger token");
	$w->quit;
}

# a4. DISCARD ALL and pg_advisory_unlock_all() in the holder's connection
# end its session-bound leases, and wake their waiters.  The connection can
# take a new session-bound lease afterwards.
foreach my $reset ('DISCARD ALL', 'SELECT pg_advisory_unlock_all()')
{
	my $tag = $reset =~ /DISCARD/ ? 'discard' : 'unlock_all';
	($h, $hpid) = backend_session($node, 'postgres');
	my ($o1, $f1) = grant_in($h, "'$tag-1'", ', session_bound => true');
	my ($o2, $f2) = grant_in($h, "'$tag-2'", ', session_bound => true');
	my ($o3, $f3) = grant_in($h, "'$tag-3'", '');
	# (its wait limit bounds the test when it is not woken: it then gets
	# the key at its deadline)
	my ($w, $wpid) = start_waiter($node, 'postgres', $tag, "$tag-2", "'8 seconds'");
	mark($node, 'postgres', $tag);
	$h->query_safe($reset);
	is( $node->safe_psql('postgres', qq{
			SELECT string_agg(state, ' ' ORDER BY key) FROM dlock.lease_status
			WHERE key IN ('$tag-1', '$tag-3')}),
		'expired held',
		"$reset: the session-bound lease ended, the other one did not");
	is( $node->safe_psql('postgres', qq{
			SELECT count(*) FROM dlock.try_acquire('$tag-1', '1 hour')
			WHERE fence > $f1}),
		'1', "$reset: another session gets the key, with a larger token");
	ok(waiter_done($node, 'postgres', $wpid), "$reset: the waiter stopped waiting");
	my $lat = latency($node, 'postgres', $tag, $tag);
	note "$reset: waiter granted ${lat}s after it";
	ok($lat ne '' && $lat < $quick,
		"$reset: the waiter of the other session-bound lease was woken and granted within seconds (TTL 1 hour)");
	is( $node->safe_psql('postgres',
			"SELECT fence > $f2 FROM woken WHERE who = '$tag'"),
		't', "$reset: with a larger token");
	my ($o4, $f4) = grant_in($h, "'$tag-4'", ', session_bound => true');
	is(status($node, 'postgres', "'$tag-4'"), 'held|t|t',
		"$reset: the connection takes a new session-bound lease afterwards");
	$h->quit;
	is(status($node, 'postgres', "'$tag-4'"), 'expired|t|f',
		"$reset: ... which ends with the connection");
	$w->quit;
}

# a5. A session-bound lease may be renewed and released from another
# connection; renewing elsewhere does not move it off its connection.
($h, $hpid) = backend_session($node, 'postgres');
my ($or, $fr) = grant_in($h, "'sr-1'", ', session_bound => true');
my ($ol, $fl) = grant_in($h, "'sr-2'", ', session_bound => true');
is( $node->safe_psql('postgres', qq{
		SELECT dlock.renew('sr-1', '$or', '2 hours') > now() + interval '90 minutes'}),
	't', 'a5: renewed from another connection');
is($node->safe_psql('postgres', "SELECT dlock.release('sr-2', '$ol')"),
	't', 'a5: released from another connection');
is( $node->safe_psql('postgres', q{
		SELECT string_agg(state, ' ' ORDER BY key) FROM dlock.lease_status
		WHERE key LIKE 'sr-%'}),
	'held released', 'a5: one held, one released');
terminate($node, 'postgres', $hpid);
$h->quit;
is(status($node, 'postgres', "'sr-1'"), 'expired|t|f',
	'a5: the renewed lease still ended with the connection that took it');
is( $node->safe_psql('postgres', qq{
		SELECT dlock.renew('sr-1', '$or', '1 hour') IS NULL}),
	't', 'a5: and cannot be renewed any more');

# a6. A lease that is not session-bound survives its connection.
($h, $hpid) = backend_session($node, 'postgres');
my ($on, $fn) = grant_in($h, "'ns'", '');
terminate($node, 'postgres', $hpid);
$h->quit;
is(status($node, 'postgres', "'ns'"), 'held|f|t',
	'a6: a lease that is not session-bound is still held after its connection was terminated');
is( $node->safe_psql('postgres', qq{
		SELECT dlock.renew('ns', '$on', '1 hour') IS NOT NULL}),
	't', 'a6: its owner renews it from another connection');

# a7. A session-bound lease granted with a lock delay is free at once when
# its connection ends (the delay is for a holder that may still be at work).
($h, $hpid) = backend_session($node, 'postgres');
my ($od, $fd) = grant_in($h, "'sbd'", ", lock_delay => '1 hour', session_bound => true");
terminate($node, 'postgres', $hpid);
$h->quit;
is( $node->safe_psql('postgres', qq{
		SELECT fence > $fd FROM dlock.try_acquire('sbd', '1 hour')}),
	't', 'a7: a session-bound lease with a lock delay: the key is free once its connection ended');

# a8. A backend crash: the server restarts, the crashed holder's
# session-bound lease is dead, and the next grant draws a larger token.
# The counters are gone with the crash.
($h, $hpid) = backend_session($node, 'postgres');
my ($oc, $fc) = grant_in($h, "'crash'", ', session_bound => true');
my ($ocn, $fcn) = grant_in($h, "'crash-ns'", '');
isnt($node->safe_psql('postgres', 'SELECT acquired FROM dlock.stats WHERE key IS NULL'),
	'0', 'a8: grants counted before the crash');
ok(crash_and_wait($node, $hpid), 'a8: the server restarted after the crash');
$h->quit;
is(status($node, 'postgres', "'crash'"), 'expired|t|f',
	"a8: after the crash, the crashed connection's session-bound lease is dead");
is(status($node, 'postgres', "'crash-ns'"), 'held|f|t',
	'a8: its lease that is not session-bound is still held');
is( $node->safe_psql('postgres', 'SELECT acquired FROM dlock.stats WHERE key IS NULL'),
	'0', 'a8: the counters did not survive the crash');
is( $node->safe_psql('postgres', qq{
		SELECT fence > greatest($fc, $fcn) FROM dlock.try_acquire('crash', '1 hour')}),
	't', 'a8: the next grant gets the key, with a larger token');

#
# b. Counters.
#
$node->safe_psql('postgres', 'CREATE DATABASE counts');
$node->safe_psql('counts', q{
	CREATE EXTENSION dlock;
	CREATE TABLE fenced (id int PRIMARY KEY, fence bigint);
	CREATE TRIGGER fenced_guard BEFORE INSERT OR UPDATE OR DELETE ON fenced
		FOR EACH ROW EXECUTE FUNCTION dlock.fence_guard('c1', 'fence');
});
my ($o1, $f1) = split /\|/, $node->safe_psql('counts',
	"SELECT owner, fence FROM dlock.try_acquire('c1', '1 hour')");
$node->safe_psql('counts', qq{INSERT INTO fenced VALUES (1, $f1)});
$node->psql('counts', "SELECT count(*) FROM dlock.try_acquire('c1', '1 hour')");
$node->psql('counts', "SELECT dlock.renew('c1', '$o1', '1 hour')");
$node->psql('counts', "INSERT INTO fenced VALUES (2, $f1 - 1)");
$node->psql('counts', "SELECT dlock.release('c1', '$o1')");
$node->psql('counts', "SELECT count(*) FROM dlock.try_acquire('c2', '1 hour')");
$node->psql('counts', "SELECT dlock.renew('c2', gen_random_uuid(), '1 hour')");
$node->psql('counts', "SELECT dlock.acquire('c2', '1 hour', wait => '50 ms')");

my $snapshot = q{
	SELECT coalesce(key, '(totals)'), acquired, contended, timeouts, expired,
		taken_over, renewed, released, lost_renewals, stale_writes_refused,
		hold_time_total, hold_time_max, hold_time_mean, wait_time_total,
		wait_time_max
	FROM dlock.stats ORDER BY key NULLS FIRST};
my $before = $node->safe_psql('counts', $snapshot);
is( $node->safe_psql('counts', q{
		SELECT acquired || ' ' || contended || ' ' || timeouts || ' ' || renewed
			|| ' ' || released || ' ' || lost_renewals || ' ' || stale_writes_refused
			|| ' ' || (hold_time_max > '0') || ' ' || (wait_time_max >= '50 ms')
		FROM dlock.stats WHERE key IS NULL}),
	'2 2 1 1 1 1 1 true true',
	'b1: the totals count grants, contention, a timeout, renewals, a release, a lost renewal and a refused write');
is($node->safe_psql('counts', $snapshot), $before, 'b1: reading the counters again changes nothing');
$node->restart;
is($node->safe_psql('counts', $snapshot), $before,
	'b1: after a clean restart the counters are the same');
$node->stop('immediate');
$node->start;
is( $node->safe_psql('counts', q{
		SELECT count(*) FILTER (WHERE key IS NOT NULL) || ' ' ||
			sum(acquired + contended + timeouts + renewed + released + lost_renewals
				+ stale_writes_refused)
		FROM dlock.stats}),
	'0 0', 'b2: after a crash (immediate stop) the counters are gone');
is( $node->safe_psql('counts', q{
		SELECT count(*) FROM dlock.lease_status WHERE key = 'c2' AND state = 'held'}),
	'1', 'b2: ... while the leases are still there');

# b3. dlock.log_events: one LOG line per event, key=value, the key quoted
# and escaped.  The key has a space, a double quote, a backslash and a
# newline in it; the holder a space, a double quote and a backslash.
$node->safe_psql('postgres', 'CREATE DATABASE logdb');
$node->safe_psql('logdb', 'CREATE EXTENSION dlock');
my $sqlkey = q{'we "ird\key' || chr(10) || 'end'};
my $perlkey = qq{we "ird\\key\nend};
$node->safe_psql('logdb', qq{SELECT count(*) FROM dlock.try_acquire($sqlkey || '-off', '1 hour')});
$node->safe_psql('logdb', 'ALTER DATABASE logdb SET dlock.log_events = on');
my $log_offset = -s $node->logfile;

my ($lo1, $lf1) = split /\|/, $node->safe_psql('logdb', qq{
	SELECT owner, fence FROM dlock.try_acquire($sqlkey, '1 hour', holder => 'h "1"\\')});
$node->safe_psql('logdb', "SELECT dlock.release($sqlkey, '$lo1')");
($h, $hpid) = backend_session($node, 'logdb');
my ($lo2, $lf2) = grant_in($h, $sqlkey, ', session_bound => true');
terminate($node, 'logdb', $hpid);
$h->quit;
is(status($node, 'logdb', $sqlkey), 'expired|t|f', 'b3: the session-bound lease ended');
my ($lo3, $lf3) = split /\|/, $node->safe_psql('logdb', qq{
	SELECT owner, fence FROM dlock.try_acquire($sqlkey, '1 second')});
my ($rc) = $node->psql('logdb', "SELECT dlock.use_fence($sqlkey, $lf2)");
isnt($rc, 0, 'b3: a stale token was refused');
ok( $node->poll_query_until('logdb', qq{
		SELECT state = 'expired' FROM dlock.lease_status WHERE key = $sqlkey}),
	'b3: the 1 second lease expired');
my ($lo4, $lf4) = split /\|/, $node->safe_psql('logdb', qq{
	SELECT owner, fence FROM dlock.try_acquire($sqlkey, '1 hour')});
$node->safe_psql('logdb', "SELECT dlock.release($sqlkey, '$lo4')");
# One line after the last event, to know that all of them are in the log.
$node->safe_psql('logdb', q{SELECT count(*) FROM dlock.try_acquire('last', '1 hour')});
$node->wait_for_log(qr/dlock event=grant .*key="last"/, $log_offset);

# Parse "name=value name=value ...", values bare or double-quoted with
# backslash escapes; undef unless the whole line parses.
sub parse_event
{
	my ($line) = @_;
	my %f;
	return undef unless $line =~ s/^dlock //;
	while ($line =~ /\G(\w+)=("(?:[^"\\]|\\.)*"|[^\s"]+)(?: |$)/gc)
	{
		my ($name, $v) = ($1, $2);
		return undef if exists $f{$name};
		if ($v =~ s/^"(.*)"$/$1/s)
		{
			$v =~ s/\\(x[0-9a-f]{2}|.)/
			  $1 eq 'n' ? "\n" : $1 eq 't' ? "\t" :
			  length($1) == 3 ? chr(hex(substr($1, 1))) : $1/ge;
		}
		$f{$name} = $v;
	}
	return undef unless (pos($line) // 0) == length($line);
	return \%f;
}

my @lines = grep { /LOG:  dlock event=/ }
  split /\n/, slurp_file($node->logfile, $log_offset);
my @events;
my $unparsed = 0;
foreach my $line (@lines)
{
	my ($payload) = $line =~ /LOG:  (dlock event=.*)$/;
	my $f = parse_event($payload);
	if (!$f)
	{
		$unparsed++;
		diag "unparseable: $payload";
		next;
	}
	push @events, $f;
}
is($unparsed, 0, 'b3: every dlock event line parses as key=value pairs');
my @ours = grep { $_->{key} eq $perlkey } @events;
is( join(' ', map { $_->{event} } @ours),
	'grant release grant expired takeover refused expired takeover release',
	'b3: the events of the key, in order, with the key round-tripped through the escaping');
is(scalar(grep { $_->{key} =~ /-off$/ } @events), 0,
	'b3: nothing logged before dlock.log_events was set');
is(scalar(grep { $_->{db} ne 'logdb' || $_->{at} !~ /^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z$/ } @ours),
	0, 'b3: every line names the database and has a UTC time with microseconds');
my @f = map { $_->{event} eq 'refused' ? "$_->{token}/$_->{current}" : $_->{fence} } @ours;
is( join(' ', @f),
	join(' ', $lf1, $lf1, $lf2, $lf2, $lf3, "$lf2/$lf3", $lf3, $lf4, $lf4),
	'b3: the tokens of the lines are those of the grants (a refusal: presented/current)');
is( join(' ', map { $_->{reason} // '-' } grep { $_->{event} eq 'expired' } @ours),
	'disconnected ttl', 'b3: expiries say why: connection ended, TTL ran out');
is( join(' ', map { $_->{previous_fence} } grep { $_->{event} eq 'takeover' } @ours),
	"$lf2 $lf3", 'b3: takeovers name the previous token');
is($ours[0]{holder}, qq{h "1"\\}, 'b3: the holder is quoted and escaped too');
is( join(' ', map { $_->{session_bound} } grep { $_->{event} =~ /grant|takeover/ } @ours),
	'false true false false', 'b3: grants say whether they are session-bound');

# b4. dlock.stats_max = 100: one busy key and 20 warm keys (used three
# times each), then 300 keys touched once.  At most 100 keys keep rows,
# the busy and the warm ones among them (evictions, 10 keys each, take the
# least active: only cold keys, though the usage of all decays meanwhile),
# and the totals still count every grant.
$node->safe_psql('postgres', 'CREATE DATABASE evict');
$node->safe_psql('evict', 'CREATE EXTENSION dlock');
$node->safe_psql('evict', q{
	DO $$
	BEGIN
		FOR i IN 1 .. 50 LOOP
			PERFORM dlock.try_acquire('hot', '1 hour');
		END LOOP;
		FOR w IN 1 .. 20 LOOP
			FOR i IN 1 .. 3 LOOP
				PERFORM dlock.try_acquire('warm-' || w, '1 hour');
			END LOOP;
		END LOOP;
	END $$;
});
is( $node->safe_psql('evict', q{
		SELECT count(*) FROM generate_series(1, 300) i,
			LATERAL dlock.try_acquire('cold-' || i, '1 hour')}),
	'300', 'b4: 300 keys granted');
is( $node->safe_psql('evict', q{
		SELECT count(*) FILTER (WHERE key IS NOT NULL) BETWEEN 50 AND 100
		FROM dlock.stats}),
	't', 'b4: at most dlock.stats_max = 100 keys have rows');
is( $node->safe_psql('evict', q{
		SELECT acquired || ' ' || contended FROM dlock.stats WHERE key = 'hot'}),
	'1 49', 'b4: the busiest key kept its row');
is( $node->safe_psql('evict', q{
		SELECT count(*) FROM dlock.stats
		WHERE key LIKE 'warm-%' AND acquired = 1 AND contended = 2}),
	'20', 'b4: so did every key used three times: only keys used once were evicted');
is( $node->safe_psql('evict', q{
		SELECT acquired || ' ' || contended FROM dlock.stats WHERE key IS NULL}),
	'321 89', 'b4: the totals count every grant, evicted keys included');

#
# c. FIFO and hand-off latency: 20 waiters queue one after another.
#
$node->safe_psql('postgres', 'CREATE DATABASE fifo');
$node->safe_psql('fifo', q{
	CREATE EXTENSION dlock;
	CREATE TABLE marks (what text, at timestamptz);
	-- seq 0 is the first holder; granted_at is taken right after the
	-- grant, release_at right before the release, in the same statements
	CREATE TABLE handoff (seq int, fence bigint, granted_at timestamptz,
		release_at timestamptz);
	ALTER DATABASE fifo SET log_statement = 'none';
});
my $nwaiters = 20;
my ($ho, $hf) = split /\|/, $node->safe_psql('fifo',
	"SELECT owner, fence FROM dlock.try_acquire('q', '1 hour')");
my (@w, @wpid);
# Each session first takes and releases another key: the first grant and
# release in a backend pay for setting up caches, which would count in
# the hand-offs measured.
my $warm_up = "SELECT dlock.release('warm', owner) FROM dlock.try_acquire('warm', '1 hour')";
foreach my $i (1 .. $nwaiters)
{
	my ($s, $pid) = backend_session($node, 'fifo');
	$s->query_safe($warm_up);
	$s->query_until(qr/queued/, qq{
		\\echo queued
		SELECT owner AS o, fence AS f, clock_timestamp() AS t
		FROM dlock.acquire('q', '1 hour') \\gset
		SELECT clock_timestamp() AS r, dlock.release('q', :'o') AS ok \\gset
		INSERT INTO handoff VALUES ($i, :f, :'t', :'r');
	});
	sleeps_in_dlock($node, 'fifo', $pid)
	  or die "waiter $i did not go to sleep";
	push @w, $s;
	push @wpid, $pid;
}
is( $node->safe_psql('fifo', q{
		SELECT count(*) FROM pg_stat_activity
		WHERE wait_event_type = 'Extension' AND query LIKE '%dlock.acquire%'}),
	$nwaiters, "c: $nwaiters waiters asleep in acquire()");
is($node->safe_psql('fifo', "SELECT count(*) FROM dlock.try_acquire('q', '1 hour')"),
	'0', 'c: try_acquire of the held key returns no row');

# CPU used by the sleeping waiters' backends over 2 seconds.
sub cpu_ticks
{
	my $ticks = 0;
	foreach my $pid (@wpid)
	{
		my $stat = slurp_file("/proc/$pid/stat");
		$stat =~ s/^.*\) //s;
		my @f = split / /, $stat;
		$ticks += $f[11] + $f[12];    # utime, stime (fields 14 and 15)
	}
	return $ticks;
}
my $t0 = cpu_ticks();
sleep 2;
my $ticks = cpu_ticks() - $t0;
note "CPU used by $nwaiters sleeping waiters in 2 s: $ticks clock ticks";
cmp_ok($ticks, '<', 5, "c: $nwaiters sleeping waiters used (almost) no CPU in 2 s");

# The holder releases; each waiter, once granted, releases in turn.
$node->safe_psql('fifo', qq{
	$warm_up;
	SELECT clock_timestamp() AS r, dlock.release('q', '$ho') AS ok \\gset
	INSERT INTO handoff VALUES (0, $hf, NULL, :'r');
});
ok( $node->poll_query_until('fifo',
		"SELECT count(*) = $nwaiters + 1 FROM handoff"),
	'c: every waiter was granted and released');
is( $node->safe_psql('fifo', q{
		SELECT string_agg(seq::text, ' ' ORDER BY fence) FROM handoff}),
	join(' ', 0 .. $nwaiters),
	'c: the waiters were granted in exactly their arrival order');
my @handoff = split /\n/, $node->safe_psql('fifo', q{
	SELECT extract(epoch FROM granted_at - lag(release_at) OVER (ORDER BY fence)) * 1000
	FROM handoff ORDER BY fence OFFSET 1});
@handoff = sort { $a <=> $b } @handoff;
# nearest-rank percentiles
my $p50 = $handoff[ ceil(0.50 * @handoff) - 1 ];
my $p99 = $handoff[ ceil(0.99 * @handoff) - 1 ];
note sprintf('release-to-grant hand-off, %d waiters: p50 %.2f ms, p99 %.2f ms, max %.2f ms',
	scalar(@handoff), $p50, $p99, $handoff[-1]);
is(scalar(@handoff), $nwaiters, "c: $nwaiters hand-offs measured");
cmp_ok($p99, '<', 200, 'c: p99 hand-off under 200 ms (loose; bench/waits measures it)');
cmp_ok($handoff[0], '>=', 0, 'c: no grant before the release that preceded it');
is( $node->safe_psql('fifo', q{
		SELECT acquired || ' ' || contended FROM dlock.stats WHERE key = 'q'}),
	($nwaiters + 1) . ' ' . ($nwaiters + 1),
	'c: every grant and every wait (and the refused try) counted');
$_->quit for @w;

# A waiter that leaves the queue (cancelled, or its connection ends) lets
# the next one in: four waiters queue, the first is cancelled, the second
# terminated; the third and fourth are granted, in order, as soon as the
# key is released.
($ho, $hf) = split /\|/, $node->safe_psql('fifo',
	"SELECT owner, fence FROM dlock.try_acquire('q2', '1 hour')");
my (@q2, @q2pid);
foreach my $i (1 .. 4)
{
	my ($s, $pid) = backend_session($node, 'fifo');
	$s->query_until(qr/queued/, qq{
		\\echo queued
		SELECT owner AS o, fence AS f FROM dlock.acquire('q2', '1 hour', wait => '30 s') \\gset
		INSERT INTO handoff VALUES (100 + $i, :f, clock_timestamp(), clock_timestamp());
		SELECT dlock.release('q2', :'o');
	});
	sleeps_in_dlock($node, 'fifo', $pid)
	  or die "waiter $i on q2 did not go to sleep";
	push @q2, $s;
	push @q2pid, $pid;
}
$node->safe_psql('fifo', "SELECT pg_cancel_backend($q2pid[0])");
terminate($node, 'fifo', $q2pid[1]);
ok(waiter_done($node, 'fifo', $q2pid[0]), 'c: the first waiter on q2 was cancelled');
$node->safe_psql('fifo', qq{
	INSERT INTO marks VALUES ('q2', clock_timestamp());
	SELECT dlock.release('q2', '$ho');
});
ok( $node->poll_query_until('fifo', 'SELECT count(*) = 2 FROM handoff WHERE seq > 100'),
	'c: after the release, the two waiters left were granted');
is( $node->safe_psql('fifo', q{
		SELECT string_agg(seq::text, ' ' ORDER BY fence) || ' '
			|| (max(granted_at) - (SELECT at FROM marks WHERE what = 'q2') < interval '3 s')
		FROM handoff WHERE seq > 100}),
	'103 104 true', 'c: the third and the fourth, in order, at once');
# (the psql of the terminated waiter has exited already)
eval { $_->quit } for @q2;

$node->stop;

#
# Without preloading: no queues, no counters, but acquire() waits for and
# gets a released key, and session-bound leases work.
#
my $plain = dlock_node('plain');
$plain->safe_psql('postgres', $tables);
($ho, $hf) = split /\|/, $plain->safe_psql('postgres',
	"SELECT owner, fence FROM dlock.try_acquire('p', '1 hour')");
my ($pw, $pwpid) = start_waiter($plain, 'postgres', 'plain', 'p', "'60 seconds'");
mark($plain, 'postgres', 'plain');
$plain->safe_psql('postgres', "SELECT dlock.release('p', '$ho')");
ok(waiter_done($plain, 'postgres', $pwpid), 'not preloaded: the waiter stopped waiting');
my $lat = latency($plain, 'postgres', 'plain', 'plain');
note "not preloaded: waiter granted ${lat}s after the release";
ok($lat ne '' && $lat < $quick, 'not preloaded: the waiter got the key soon after the release');
$pw->quit;

($h, $hpid) = backend_session($plain, 'postgres');
($owner, $fence) = grant_in($h, "'psb'", ', session_bound => true');
my ($pw2, $pw2pid) = start_waiter($plain, 'postgres', 'plain-sb', 'psb', "'60 seconds'");
terminate($plain, 'postgres', $hpid);
$h->quit;
ok(waiter_done($plain, 'postgres', $pw2pid),
	'not preloaded: the waiter of a session-bound lease stopped waiting');
is( $plain->safe_psql('postgres',
		"SELECT fence > $fence FROM woken WHERE who = 'plain-sb'"),
	't', 'not preloaded: ... granted once the holder was terminated, with a larger token');
$pw2->quit;

is( $plain->safe_psql('postgres', q{
		SELECT count(*) || ' ' || bool_and(acquired IS NULL AND released IS NULL)
		FROM dlock.stats WHERE key IS NULL}),
	'1 true', 'not preloaded: dlock.stats has a totals row with NULL counters');
my ($prc, $pout, $perr) = $plain->psql('postgres', 'SELECT dlock.stats_reset()');
like($perr, qr/need the module to be preloaded/, 'not preloaded: stats_reset() says why it cannot');

$plain->stop;
done_testing();
