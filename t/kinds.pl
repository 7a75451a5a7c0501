# Leases beyond one exclusive holder (issue 20), on a preloaded server, in
# table mode and in memory mode (the same assertions on both):
#
# a. Writer preference: while an exclusive acquire() waits for a key's
#    shared leases, try_acquire(mode => 'shared') returns no row and a
#    shared acquire() queues behind it; the exclusive waiter gets the key
#    when the last shared holder releases, the shared waiter after it.
# b. Semaphores in the FIFO queue: with all N permits held, waiters are
#    served in arrival order, one per release.
# c. A session-bound permit ends with its connection: a waiter for the
#    permit is woken at once, and the old token is refused.
# d. lock_delay is per permit: an expired permit with a delay stays
#    ungrantable for the delay, the others do not.
# e. Counters: dlock.stats counts a key's permits under the key.  The view
#    dlock.waiters shows who waits for what, in which place (a, b).
# f. dlock.notify: with it on, a LISTEN session receives one JSON
#    notification per grant, takeover, proclaim, release and noticed
#    expiry, naming the key and token; none for a rolled-back grant, none
#    with it off.
# g. observe() wakes quickly after a proclaim and when a session-bound
#    leader's connection ends; a cancelled observe() leaves nothing
#    behind (the next release is not slowed, the key is grantable).
# h. A restart: in memory mode every permit, shared lease and leader is
#    unknown until the horizon (leader() shows nobody, grants wait), and
#    afterwards the new tokens are above every old one and the old ones
#    are refused; in table mode the permits survive the restart.
# j. A full pool in memory mode (dlock.memory_max_keys = 200): room is
#    made by dropping ended leases, never the head of a key whose permits
#    are live.
# i. A key of 512 bytes takes permits (its slot keys are longer than any
#    key), and a permit's notification names the key and the permit.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time);
use IPC::Run;
use FindBin;
use lib $FindBin::RealBin;
use DlockCluster;

foreach my $mode ('table', 'memory')
{
	my $node = dlock_node("kinds_$mode", conf => qq{
shared_preload_libraries = 'dlock'
dlock.storage = '$mode'
dlock.horizon_margin = '2s'
dlock.max_ttl = '1h'
dlock.memory_max_keys = 200
});
	$node->safe_psql('postgres', q{
		CREATE EXTENSION dlock;
		CREATE TABLE woken (who text, owner uuid, fence bigint, at timestamptz);
	});

	# Start a session waiting in acquire() with $args, recording its grant
	# in woken as $who; return it and its pid once it sleeps on its latch.
	my $start_waiter = sub {
		my ($who, $key, $args) = @_;
		my ($s, $pid) = backend_session($node, 'postgres');
		$s->query_until(qr/waiting/, qq{
			\\echo waiting
			INSERT INTO woken SELECT '$who', owner, fence, clock_timestamp()
			FROM dlock.acquire('$key', '1 hour', wait => '60 s'$args);
		});
		ok(sleeps_in_dlock($node, 'postgres', $pid), "$mode: $who asleep in acquire()");
		return ($s, $pid);
	};
	# End session $s (backend $pid), cancelling what it still runs.
	my $finish = sub {
		my ($s, $pid) = @_;
		$node->safe_psql('postgres', "SELECT pg_cancel_backend($pid)");
		$s->quit;
	};
	my $woken = sub {
		return $node->safe_psql('postgres',
			q{SELECT coalesce(string_agg(who, ' ' ORDER BY at), '') FROM woken});
	};
	my $wait_woken = sub {
		my ($n) = @_;
		return $node->poll_query_until('postgres', "SELECT count(*) >= $n FROM woken");
	};

	#
	# a. Writer preference.
	#
	my ($so1) = split /\|/, $node->safe_psql('postgres',
		q{SELECT owner FROM dlock.try_acquire('rw', '1 hour', mode => 'shared')});
	my ($so2) = split /\|/, $node->safe_psql('postgres',
		q{SELECT owner FROM dlock.try_acquire('rw', '1 hour', mode => 'shared')});
	my ($x, $xpid) = $start_waiter->('x', 'rw', '');
	is($node->safe_psql('postgres',
			q{SELECT count(*) FROM dlock.try_acquire('rw', '1 hour', mode => 'shared')}),
		'0', "$mode: a: no new shared lease while an exclusive acquirer waits");
	my ($r, $rpid) = $start_waiter->('r', 'rw', ", mode => 'shared'");
	is($node->safe_psql('postgres', qq{
			SELECT string_agg(mode || ':' || coalesce(permits::text, '-') || ':' || position
				|| ':' || (pid = CASE mode WHEN 'exclusive' THEN $xpid ELSE $rpid END), ' '
				ORDER BY position)
			FROM dlock.waiters WHERE key = 'rw'}),
		'exclusive:1:1:true shared:-:2:true',
		"$mode: a: dlock.waiters shows the exclusive waiter first, the shared one behind it");
	$node->safe_psql('postgres', "SELECT dlock.release('rw', '$so1')");
	sleep 0.3;
	is($woken->(), '', "$mode: a: one shared holder left, the exclusive waiter still waits");
	$node->safe_psql('postgres', "SELECT dlock.release('rw', '$so2')");
	ok($wait_woken->(1), "$mode: a: the last shared release wakes the exclusive waiter");
	is($woken->(), 'x', "$mode: a: ... and only it");
	$node->safe_psql('postgres',
		q{SELECT dlock.release('rw', owner) FROM woken WHERE who = 'x'});
	ok($wait_woken->(2), "$mode: a: the shared waiter is granted after the exclusive lease ends");
	is($woken->(), 'x r', "$mode: a: in arrival order");
	$finish->($x, $xpid);
	$finish->($r, $rpid);
	$node->safe_psql('postgres', q{TRUNCATE woken; SELECT dlock.forget('rw')});

	#
	# b. Semaphore waiters in arrival order.
	#
	my @owners;
	for my $i (1 .. 2)
	{
		push @owners, $node->safe_psql('postgres',
			q{SELECT owner FROM dlock.try_acquire('sem', '1 hour', permits => 2)});
	}
	my @waiters;
	for my $w ('w1', 'w2', 'w3')
	{
		push @waiters, [ $start_waiter->($w, 'sem', ', permits => 2') ];
	}
	$node->safe_psql('postgres', "SELECT dlock.release('sem', '$owners[0]')");
	ok($wait_woken->(1), "$mode: b: a released permit goes to a waiter");
	sleep 0.3;
	is($woken->(), 'w1', "$mode: b: to the first in line, and to nobody else");
	is($node->safe_psql('postgres', q{
			SELECT string_agg(mode || ':' || permits || ':' || position, ' ' ORDER BY position)
			FROM dlock.waiters WHERE key = 'sem'}),
		'permit:2:1 permit:2:2', "$mode: b: dlock.waiters shows the two permit waiters left, in order");
	$node->safe_psql('postgres', "SELECT dlock.release('sem', '$owners[1]')");
	ok($wait_woken->(2), "$mode: b: the next release, the next waiter");
	is($woken->(), 'w1 w2', "$mode: b: in arrival order");
	is($node->safe_psql('postgres',
			q{SELECT count(*) FROM dlock.lease_status WHERE key = 'sem' AND state = 'held'}),
		'2', "$mode: b: never more than two holders");
	$finish->(@$_) foreach @waiters;
	$node->safe_psql('postgres', q{TRUNCATE woken; SELECT dlock.forget('sem')});

	#
	# c. A session-bound permit ends with its connection.
	#
	my ($holder, $hpid) = backend_session($node, 'postgres');
	my $hf = $holder->query_safe(
		q{SELECT fence FROM dlock.try_acquire('sb', '1 hour', permits => 1, session_bound => true)});
	my ($hf2) = $holder->query_safe(
		q{SELECT fence FROM dlock.try_acquire('sbp', '1 hour', permits => 2, session_bound => true)});
	$node->safe_psql('postgres', q{SELECT dlock.try_acquire('sbp', '1 hour', permits => 2)});
	my ($sw, $swpid) = $start_waiter->('sw', 'sbp', ', permits => 2');
	my $t0 = time;
	$holder->quit;
	ok($wait_woken->(1), "$mode: c: the holder's connection ends: the permit's waiter is granted");
	cmp_ok(time - $t0, '<', 5, "$mode: c: ... within seconds, not at the TTL");
	my ($st) = try_sql($node, 'postgres', "SELECT dlock.use_fence('sbp', $hf2)");
	is($st, 'LF001', "$mode: c: the ended permit's token is refused");
	$finish->($sw, $swpid);
	$node->safe_psql('postgres', q{TRUNCATE woken; SELECT dlock.forget('sbp'), dlock.forget('sb')});

	#
	# c2. With client_connection_check_interval, a waiter whose client dies
	#     gives up: it is not granted the key afterwards.
	#
	$node->safe_psql('postgres', q{SELECT dlock.try_acquire('cc', '1 hour')});
	my ($ccin, $ccout, $ccerr) = ('', '', '');
	my $cc = IPC::Run::start(
		[ 'psql', '-X', '-h', $node->host, '-p', $node->port, '-d', 'postgres',
		  '-c', q{SET client_connection_check_interval = '500ms'; SET application_name = 'cc_waiter'; SELECT dlock.acquire('cc', '1 hour', wait => NULL)} ],
		\$ccin, \$ccout, \$ccerr);
	ok($node->poll_query_until('postgres', q{
			SELECT count(*) = 1 FROM pg_stat_activity
			WHERE application_name = 'cc_waiter' AND wait_event_type = 'Extension'}),
		"$mode: c2: the waiter sleeps");
	$cc->kill_kill;
	ok($node->poll_query_until('postgres', q{
			SELECT count(*) = 0 FROM pg_stat_activity WHERE application_name = 'cc_waiter'}),
		"$mode: c2: its client killed, the waiting backend exits");
	$node->safe_psql('postgres', q{SELECT dlock.forget('cc')});
	is($node->safe_psql('postgres', q{SELECT count(*) FROM dlock.lease_status WHERE key = 'cc'}),
		'0', "$mode: c2: nobody is granted the key for the dead client");

	#
	# d. lock_delay per permit.
	#
	$node->safe_psql('postgres',
		q{SELECT dlock.try_acquire('ld', '1 second', permits => 2, lock_delay => '1 hour')});
	my ($ldo) = $node->safe_psql('postgres',
		q{SELECT owner FROM dlock.try_acquire('ld', '1 hour', permits => 2)});
	sleep 1.2;
	is($node->safe_psql('postgres',
			q{SELECT count(*) FROM dlock.try_acquire('ld', '1 hour', permits => 2)}),
		'0', "$mode: d: the expired permit is in its lock delay, the other held: no grant");
	$node->safe_psql('postgres', "SELECT dlock.release('ld', '$ldo')");
	is($node->safe_psql('postgres',
			q{SELECT count(*) FROM dlock.try_acquire('ld', '1 hour', permits => 2)}),
		'1', "$mode: d: the released permit is granted; the delay holds only its own");
	is($node->safe_psql('postgres',
			q{SELECT count(*) FROM dlock.try_acquire('ld', '1 hour')}),
		'0', "$mode: d: an exclusive grant waits for the delay too");

	#
	# e. Counters.
	#
	is($node->safe_psql('postgres', q{SELECT acquired FROM dlock.stats WHERE key = 'ld'}),
		'3', "$mode: e: dlock.stats counts the key's permits under the key");
	is($node->safe_psql('postgres', q{SELECT count(*) FROM dlock.stats WHERE key LIKE E'%\x1f%'}),
		'0', "$mode: e: no slot key shows");

	#
	# f. dlock.notify.
	#
	my ($l, $lpid) = backend_session($node, 'postgres');
	$l->query_safe('LISTEN dlock');
	$node->safe_psql('postgres', q{
		SET dlock.notify = on;
		SELECT dlock.try_acquire('n', '1 second');
		BEGIN; SELECT dlock.try_acquire('n2', '1 hour'); ROLLBACK;
	});
	sleep 1.1;
	$node->safe_psql('postgres', q{
		SET dlock.notify = on;
		CREATE TEMP TABLE o AS SELECT owner FROM dlock.try_acquire('n', '1 hour');
		SELECT dlock.proclaim('n', owner, 'v') FROM o;
		SELECT dlock.release('n', owner) FROM o;
		SELECT dlock.try_acquire('n3', '1 hour');
		SET dlock.notify = off;
		SELECT dlock.try_acquire('n4', '1 hour');
	});
	my $all = $l->query_safe('SELECT 1');
	my @payloads = $all =~ /Asynchronous notification "dlock" with payload "(\{.*?\})" received/g;
	note "notifications: @payloads";
	my @events = map { /"event":"(\w+)"/ ? $1 : '?' } @payloads;
	is("@events", 'grant expired takeover proclaim release grant',
		"$mode: f: one notification per grant, noticed expiry, takeover, proclaim, release; none rolled back, none with it off");
	ok((grep { /"key":"n","fence":\d+/ } @payloads) == 5, "$mode: f: each names key and token");
	$l->quit;

	#
	# g. observe() wake-ups.
	#
	my ($lead, $leadpid) = backend_session($node, 'postgres');
	my ($eo, $ef) = split /\|/, $lead->query_safe(
		q{SELECT owner, fence FROM dlock.campaign('el', 'a', '1 hour', session_bound => true)});
	my ($ob, $obpid) = backend_session($node, 'postgres');
	$ob->query_until(qr/watching/, qq{
		\\echo watching
		SELECT 'seen', value, state FROM dlock.observe('el', $ef, '60 s', 'a');
	});
	ok(sleeps_in_dlock($node, 'postgres', $obpid), "$mode: g: the observer sleeps");
	$t0 = time;
	$lead->query_safe("SELECT dlock.proclaim('el', '$eo', 'b')");
	my $seen = $ob->query_safe(q{SELECT 'done'});
	my $dt = time - $t0;
	like($seen, qr/seen\|b\|held/, "$mode: g: observe() returns the proclaimed value");
	cmp_ok($dt, '<', 2, "$mode: g: ... promptly (${dt}s, including the proclaim's commit)");
	$ob->query_until(qr/watching/, qq{
		\\echo watching
		SELECT 'seen', value, state FROM dlock.observe('el', $ef, '60 s', 'b');
	});
	ok(sleeps_in_dlock($node, 'postgres', $obpid), "$mode: g: observing again");
	$t0 = time;
	$lead->quit;
	$seen = $ob->query_safe(q{SELECT 'done'});
	$dt = time - $t0;
	like($seen, qr/seen\|b\|expired/,
		"$mode: g: the session-bound leader's connection ends: observe() reports its end");
	cmp_ok($dt, '<', 5, "$mode: g: ... within seconds ($dt s), not at the TTL");
	# a cancelled observe leaves nothing behind
	my ($ob2, $ob2pid) = backend_session($node, 'postgres');
	$ob2->query_until(qr/watching/, q{
		\echo watching
		SELECT * FROM dlock.observe('never-granted', 0, '60 s', NULL, true);
	});
	ok(sleeps_in_dlock($node, 'postgres', $ob2pid), "$mode: g: an observer of a key nobody holds sleeps");
	$node->safe_psql('postgres', "SELECT pg_cancel_backend($ob2pid)");
	ok($node->poll_query_until('postgres',
			"SELECT state = 'idle' FROM pg_stat_activity WHERE pid = $ob2pid"),
		"$mode: g: a cancel ends observe()");
	my ($out) = $ob2->query(q{SELECT count(*) FROM dlock.try_acquire('never-granted', '1 hour')});
	like($out, qr/^1$/m, "$mode: g: the cancelled observer's session grants the key at once");
	like($ob2->{stderr}, qr/canceling statement/, "$mode: g: ... after the cancel's error");
	$finish->($ob, $obpid);
	$finish->($ob2, $ob2pid);

	#
	# i. A key of the longest length, 512 bytes, with permits (its slot
	#    keys are longer than any key) and a NOTIFY naming the permit.
	#
	my $long = 'k' x 512;
	is($node->safe_psql('postgres', join("\n", map {
				qq{SELECT count(*) FROM dlock.try_acquire('$long', '1 hour', permits => 1000);} } 1 .. 3)),
		"1\n1\n1", "$mode: i: three permits of a 512-byte key");
	is($node->safe_psql('postgres', qq{
			SELECT count(*) FILTER (WHERE dlock.check_fence(key, fence)) || ' '
				|| string_agg(permit::text, ',' ORDER BY permit)
			FROM dlock.lease_status WHERE key = '$long'}),
		'3 1,2,3', "$mode: i: each fences writes, shown as permits 1 to 3");
	my ($l2, $l2pid) = backend_session($node, 'postgres');
	$l2->query_safe('LISTEN dlock');
	$node->safe_psql('postgres', q{
		SET dlock.notify = on;
		SELECT dlock.try_acquire('np', '1 hour', permits => 2);
		SELECT dlock.try_acquire('np', '1 hour', permits => 2);
	});
	my $got = $l2->query_safe('SELECT 1');
	like($got, qr/"event":"grant","key":"np","permit":2,"fence":\d+/,
		"$mode: i: a permit's notification names the key and the permit");
	$l2->quit;
	is($node->safe_psql('postgres', qq{SELECT dlock.forget('$long')}),
		't', "$mode: i: forget() of the long key");

	#
	# j. A full pool: memory mode drops ended leases to make room, never
	#    the head of a key whose permits are live (table mode: no pool).
	#
	my ($evo, $evf) = split /\|/, $node->safe_psql('postgres',
		q{SELECT owner, fence FROM dlock.try_acquire('ev', '1 hour', permits => 2)});
	$node->safe_psql('postgres', q{
		SELECT count(*) FROM generate_series(1, 150) g, LATERAL dlock.try_acquire('fill:' || g, '1 ms')});
	sleep 0.1;
	$node->safe_psql('postgres', q{
		SELECT count(*) FROM generate_series(151, 300) g, LATERAL dlock.try_acquire('fill:' || g, '1 ms')});
	my ($evs) = try_sql($node, 'postgres', "SELECT dlock.use_fence('ev', $evf)");
	is($evs, '', "$mode: j: after the pool filled and made room, the permit still fences writes");
	is($node->safe_psql('postgres', q{SELECT count(*) FROM dlock.try_acquire('ev', '1 hour')}),
		'0', "$mode: j: ... and still excludes an exclusive lease");
	$node->safe_psql('postgres', "SELECT dlock.release('ev', '$evo')");
	cmp_ok($node->safe_psql('postgres', q{SELECT dlock.prune('0')}), '>', 0,
		"$mode: j: prune() frees the ended leases");
	is($node->safe_psql('postgres', q{SELECT count(*) FROM dlock.leases WHERE split_part(key, E'\x1f', 1) = 'ev'})
		. ' ' . $node->safe_psql('postgres', q{SELECT count(*) FROM dlock.lease_status WHERE key = 'ev'}),
		'0 0', "$mode: j: ... and the key whose permits all ended, with its record of them");

	#
	# k. forget() refused (55P03: a fenced write under one of the key's
	#    permits is in flight) leaves every permit as it was, in memory
	#    mode too, where its deletes take effect at once.
	#
	my @fk = map { $node->safe_psql('postgres',
		q{SELECT fence FROM dlock.try_acquire('fk', '10 min', permits => 3)}) } 1 .. 3;
	my ($fw, $fwpid) = backend_session($node, 'postgres');
	$fw->query_safe("BEGIN; SELECT dlock.use_fence('fk', $fk[1]);");
	my ($fst) = try_sql($node, 'postgres', q{SELECT dlock.forget('fk')});
	is($fst, '55P03', "$mode: k: forget() of a key whose permit a writer holds is refused");
	is($node->safe_psql('postgres', q{
			SELECT string_agg(permit::text, ',' ORDER BY permit) FROM dlock.lease_status
			WHERE key = 'fk' AND state = 'held'}),
		'1,2,3', "$mode: k: ... and every permit is still held");
	$fw->query_safe('COMMIT');
	$fw->quit;
	is($node->safe_psql('postgres', q{SELECT dlock.forget('fk')}), 't',
		"$mode: k: once the writer committed, forget() drops the key");

	#
	# h. A restart, in a database of its own whose leases are short (in
	#    memory mode the horizon, per database, covers every lease granted).
	#
	$node->safe_psql('postgres', 'CREATE DATABASE r');
	$node->safe_psql('r', 'CREATE EXTENSION dlock');
	my $ttl = $mode eq 'memory' ? '3 s' : '10 min';
	my ($pf1) = $node->safe_psql('r',
		qq{SELECT fence FROM dlock.try_acquire('keep', '$ttl', permits => 3)});
	$node->safe_psql('r', qq{SELECT dlock.try_acquire('keep', '$ttl', permits => 3)});
	$node->safe_psql('r', qq{SELECT dlock.campaign('lead', 'node-a', '$ttl')});
	my $max_before = $node->safe_psql('r', 'SELECT last_value FROM dlock.token_seq');
	$node->restart;
	if ($mode eq 'memory')
	{
		is($node->safe_psql('r', q{SELECT count(*) FROM dlock.leader('lead')}),
			'0', "$mode: h: after a restart nobody leads until the horizon");
		is($node->safe_psql('r',
				q{SELECT count(*) FROM dlock.try_acquire('keep', '1 hour', permits => 3)}),
			'0', "$mode: h: no permit is granted before the horizon");
		my ($s) = try_sql($node, 'r', "SELECT dlock.use_fence('keep', $pf1)");
		is($s, 'LF001', "$mode: h: an old permit's token is refused");
		ok($node->poll_query_until('r',
				q{SELECT count(*) = 1 FROM dlock.try_acquire('keep', '1 hour', permits => 3)}),
			"$mode: h: a permit is granted after the horizon");
		cmp_ok($node->safe_psql('r',
				q{SELECT max(fence) FROM dlock.lease_status WHERE key = 'keep'}),
			'>', $max_before, "$mode: h: with a token above every one before the restart");
	}
	else
	{
		is($node->safe_psql('r', q{SELECT value FROM dlock.leader('lead')}),
			'node-a', "$mode: h: the leader survives a restart");
		my ($s) = try_sql($node, 'r', "SELECT dlock.use_fence('keep', $pf1)");
		is($s, '', "$mode: h: a permit's token is still accepted after a restart");
		is($node->safe_psql('r',
				q{SELECT count(*) FROM dlock.try_acquire('keep', '1 hour')}),
			'0', "$mode: h: the permits still exclude an exclusive lease");
	}
	$node->stop;
}

done_testing();
