# statement_timeout, lock_timeout and query cancel during every kind of
# wait dlock has, and a writer held open past its lease.
#
# Already covered elsewhere: cancel of acquire() sleeping on a live lease
# (t/wait_wakeup, not preloaded); lock_timeout ending acquire()'s wait for
# the open writer of an expired lease (t/no_lock_manager_queue d); a
# cancelled and a timed-out waiter leaving the FIFO line (specs/fifo_order,
# t/session_bound_stats_fifo c: terminated); cancel of a grant's wait for
# the synchronous standby (t/failover_sync).  This test covers the rest: every wait below is ended by statement_timeout (57014), by
# lock_timeout (55P03 where a lock wait is involved; a latch wait that is
# not a wait for a lock is not ended by it: statement_timeout ends it) and by
# pg_cancel_backend (57014), each within about 2 s of the moment it was due,
# and leaves nothing behind:
#
# a. acquire() sleeping on a live lease (latch): no lease for the caller, the
#    holder keeps its lease, and a later acquire gets the key when released.
# b. acquire() sleeping while the open writer of an expired lease holds the
#    key (latch, lock_timeout applies): the next acquire gets the key once
#    the writer commits.
# c. release() and a renew() that shortens the lease, waiting for an open
#    writer (heavyweight lock): the lease is still held by its owner, who
#    releases it once the writer has committed.
# d. renew() waiting for another renew() of the same owner in flight
#    (heavyweight lock): the lease keeps the expiry of the renewal that
#    committed.
# e. a fenced write to a 'monotonic' table waiting behind a grant of its
#    key in progress (heavyweight lock): nothing written; after the grant
#    commits the same write is refused (LF001), the new holder's accepted.
# f. prune() never waits for an open transaction: it skips that key.
# g. preloaded (FIFO line): the head of the line and a waiter behind it,
#    each interrupted all three ways; the line is not left with an
#    orphaned slot: after every interruption, a new waiter is granted
#    within seconds of the release, and try_acquire works again once
#    nobody waits.
# h. A writer held open past its lease while another session acquires the
#    key: the acquirer waits (a grant and a write of its key are ordered),
#    the writer's later write in the same transaction, after the expiry, is
#    refused (LF001); once the writer's transaction has ended the acquirer
#    is granted within seconds, with a larger token; a writer that commits
#    after the expiry without writing again keeps its earlier write.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use FindBin;
use lib $FindBin::RealBin;
use DlockCluster;
use Time::HiRes qw(time usleep);

# How late (seconds) an interrupted wait may end after it was due.
my $late = 2.5;

my $plain = dlock_node('interrupt');
my $fifo = dlock_node('interrupt_fifo', conf => "shared_preload_libraries = 'dlock'\n");

my $schema = q{
	CREATE EXTENSION dlock;
	-- one row per accepted write under key w:<k>
	CREATE TABLE ledger (k int NOT NULL, fence bigint);
	CREATE TRIGGER ledger_fence BEFORE INSERT OR UPDATE OR DELETE ON ledger
		FOR EACH ROW EXECUTE FUNCTION dlock.fence_guard('w:{k}', 'fence');
	CREATE TABLE mono (k int NOT NULL, fence bigint);
	CREATE TRIGGER mono_fence BEFORE INSERT OR UPDATE OR DELETE ON mono
		FOR EACH ROW EXECUTE FUNCTION dlock.fence_guard('w:{k}', 'fence', 'monotonic');
};
$plain->safe_psql('postgres', $schema);
$fifo->safe_psql('postgres', $schema);

my $node = $plain;

# Open a session on $node; return it and its backend's pid.
sub session
{
	my ($s, $pid) = backend_session($node, 'postgres');
	$s->query_safe('\set VERBOSITY sqlstate');
	return ($s, $pid);
}

# Grant $key for $ttl in a new connection; return owner and fence.
sub grant
{
	my ($key, $ttl) = @_;
	return split /\|/, $node->safe_psql('postgres',
		"SELECT owner, fence FROM dlock.try_acquire('$key', '$ttl')");
}

# The SQLSTATE of an error that session $s printed since it was last asked.
sub error_of
{
	my ($s) = @_;
	my ($code) = $s->{stderr} =~ /(?:ERROR|FATAL):\s+([0-9A-Z]{5})/;
	$s->{stderr} = '';
	return $code // 'none';
}

# How long statement_timeout and lock_timeout are, and the statement_timeout
# that backs lock_timeout up where it does not apply: long enough that the
# test sees the wait begin on a loaded machine.
my $timeout = 2;
my $backstop = 4;

# Run $sql in a new session, interrupted by $how: 'statement_timeout'
# ($timeout), 'lock_timeout' ($timeout, with a $backstop statement_timeout
# as a backstop) or 'cancel' (once it waits).  Check that it waited (wait_event_type
# $type: 'Extension' for the latch, 'Lock' for the lock manager), ended
# with SQLSTATE $code within $late seconds of the moment it was due, and
# return its session, whose transaction (if $sql opened one) is left for
# the caller to end.
sub interrupted
{
	my ($what, $how, $sql, $type, $code) = @_;
	my ($s, $pid) = session();
	$s->query_safe("SET statement_timeout = '${timeout}s'") if $how eq 'statement_timeout';
	$s->query_safe("SET lock_timeout = '${timeout}s'; SET statement_timeout = '${backstop}s'")
	  if $how eq 'lock_timeout';
	my $start = time();
	$s->query_until(qr/started/, "\\echo started\n$sql;\n\\echo finished\n");
	# what it waits for, read in the same look that sees it wait (or end)
	my $seen = '';
	foreach my $try (1 .. 600)
	{
		$seen = $node->safe_psql('postgres', qq{
			SELECT CASE WHEN state = 'idle' THEN 'ended first'
						ELSE wait_event_type END
			FROM pg_stat_activity WHERE pid = $pid});
		last if $seen =~ /^(Extension|Lock|ended first)$/;
		usleep(20_000);
	}
	is($seen, $type, "$what ($how): waits for " . ($type eq 'Lock' ? 'a lock' : 'its latch'));
	my $due = $how eq 'cancel' ? time()
	  : $start + ($code eq '55P03' || $how eq 'statement_timeout' ? $timeout : $backstop);
	$node->safe_psql('postgres', "SELECT pg_cancel_backend($pid)") if $how eq 'cancel';
	$s->query_until(qr/finished/, '');
	my $ended = time();
	is(error_of($s), $code, "$what ($how): ends with $code");
	ok( $ended - $due < $late && $ended > $due - 0.2,
		sprintf("$what ($how): ended %.2f s after it was due", $ended - $due));
	return $s;
}

# Run $sql interrupted in each of the three ways; $lock_code is what
# lock_timeout ends it with (57014: it does not, the backstop does).
sub all_three
{
	my ($what, $sql, $type, $lock_code) = @_;
	for my $how ('statement_timeout', 'lock_timeout', 'cancel')
	{
		my $code = $how eq 'lock_timeout' ? $lock_code : '57014';
		my $s = interrupted($what, $how, $sql, $type, $code);
		$s->query('ROLLBACK');
		$s->quit;
	}
}

# a. acquire() sleeping on a live lease.
my ($oa, $fa) = grant('w:1', '1 hour');
all_three('a: acquire of a live lease',
	"SELECT fence FROM dlock.acquire('w:1', '1 minute')", 'Extension', '57014');
is( $node->safe_psql('postgres', qq{
		SELECT fence = $fa AND expires_at > clock_timestamp() + interval '50 minutes'
		FROM dlock.leases WHERE key = 'w:1'}),
	't', 'a: no lease for the interrupted callers; the holder keeps its own');
my ($s, $pid) = session();
$s->query_until(qr/started/, "\\echo started\nSELECT fence > $fa FROM dlock.acquire('w:1', '1 minute');\n\\echo finished\n");
sleeps_in_dlock($node, 'postgres', $pid);
is($node->safe_psql('postgres', "SELECT dlock.release('w:1', '$oa')"), 't', 'a: the holder releases');
my $t0 = time();
like($s->query_until(qr/finished/, ''), qr/^t$/m, 'a: the next acquire gets the key, with a larger token');
ok(time() - $t0 < $late, 'a: ... within seconds of the release');
$s->quit;

# b. acquire() sleeping while the open writer of an expired lease holds the
# key.
my ($ob, $fb) = grant('w:2', '2 seconds');
my ($w, $wpid) = session();
$w->query_safe(qq{BEGIN; SELECT dlock.use_fence('w:2', $fb); INSERT INTO ledger VALUES (2, NULL);});
$node->poll_query_until('postgres', "SELECT state = 'expired' FROM dlock.lease_status WHERE key = 'w:2'");
all_three('b: acquire of a key an open writer holds',
	"SELECT fence FROM dlock.acquire('w:2', '1 minute')", 'Extension', '55P03');
$w->query_safe('COMMIT');
is( $node->safe_psql('postgres', qq{
		SET statement_timeout = '5s';
		SELECT fence > $fb FROM dlock.acquire('w:2', '1 minute', wait => '3 seconds')}),
	't', 'b: once the writer committed, the next acquire gets the key at once');
$w->quit;

# c. release() and a shortening renew() waiting for an open writer.
my ($oc, $fc) = grant('w:3', '1 hour');
$w->quit;
($w, $wpid) = session();
$w->query_safe(qq{BEGIN; SELECT dlock.use_fence('w:3', $fc); INSERT INTO ledger VALUES (3, NULL);});
all_three('c: release behind an open writer',
	"SELECT dlock.release('w:3', '$oc')", 'Lock', '55P03');
all_three('c: shortening renew behind an open writer',
	"SELECT dlock.renew('w:3', '$oc', '1 second')", 'Lock', '55P03');
is( $node->safe_psql('postgres', qq{
		SELECT fence = $fc AND expires_at > clock_timestamp() + interval '50 minutes'
		FROM dlock.leases WHERE key = 'w:3'}),
	't', 'c: the lease is still held, with its expiry unchanged');
is($w->query_safe('INSERT INTO ledger VALUES (3, NULL); COMMIT;'), '',
	'c: the writer writes on and commits');
is($node->safe_psql('postgres', qq{
		SET statement_timeout = '5s';
		SELECT dlock.release('w:3', '$oc')}),
	't', 'c: the owner then releases at once');
is($node->safe_psql('postgres', 'SELECT count(*) FROM ledger WHERE k = 3'), '2',
	"c: both of the writer's rows are there");
$w->quit;

# d. renew() behind another renew() of the same owner in flight.
my ($od, $fd) = grant('w:4', '1 hour');
my ($r) = session();
$r->query_safe(qq{BEGIN; SELECT dlock.renew('w:4', '$od', '2 hours');});
all_three('d: renew behind a renewal in flight',
	"SELECT dlock.renew('w:4', '$od', '3 hours')", 'Lock', '55P03');
$r->query_safe('COMMIT');
$r->quit;
is( $node->safe_psql('postgres', qq{
		SELECT expires_at BETWEEN clock_timestamp() + interval '110 minutes'
			AND clock_timestamp() + interval '2 hours'
		FROM dlock.leases WHERE key = 'w:4'}),
	't', 'd: the lease has the expiry of the renewal that committed');
is( $node->safe_psql('postgres', qq{
		SET statement_timeout = '5s';
		SELECT dlock.renew('w:4', '$od', '1 hour') IS NOT NULL}),
	't', 'd: the owner renews at once afterwards');

# e. A fenced write to a monotonic table behind a grant in progress.
my ($oe, $fe) = grant('w:5', '1 hour');
$node->safe_psql('postgres', "SELECT dlock.release('w:5', '$oe')");
my ($g) = session();
my ($oe2, $fe2) = split /\|/, $g->query_safe(
	"BEGIN; SELECT owner, fence FROM dlock.try_acquire('w:5', '1 hour');");
ok($fe2 > $fe, 'e: a grant in progress (not committed)');
all_three('e: fenced write behind a grant in progress',
	"INSERT INTO mono VALUES (5, $fe)", 'Lock', '55P03');
$g->query_safe('COMMIT');
$g->quit;
is($node->safe_psql('postgres', 'SELECT count(*) FROM mono'), '0', 'e: nothing was written');
my ($rc, $out, $err) = $node->psql('postgres',
	"\\set VERBOSITY sqlstate\nSET statement_timeout = '5s'; INSERT INTO mono VALUES (5, $fe)");
like($err, qr/LF001/, "e: after the grant, the old holder's write is refused at once");
is( $node->safe_psql('postgres', "INSERT INTO mono VALUES (5, $fe2); SELECT count(*) FROM mono"),
	'1', "e: the new holder's is accepted");

# f. prune() never waits for an open transaction on a key.
my ($of, $ff) = grant('w:6', '1 hour');
$node->safe_psql('postgres', "SELECT dlock.release('w:6', '$of')");
($w) = session();
$w->query_safe(qq{BEGIN; SELECT count(*) FROM dlock.try_acquire('w:6', '1 hour');});
$t0 = time();
is( $node->safe_psql('postgres', q{
		SET statement_timeout = '5s';
		SELECT dlock.prune('0 seconds') >= 0;
		SELECT count(*) FROM dlock.leases WHERE key = 'w:6'}),
	"t\n1", 'f: prune skips the key an open transaction holds, and does not wait');
ok(time() - $t0 < $late, 'f: ... at once');
$w->query_safe('ROLLBACK');
$w->quit;
is( $node->safe_psql('postgres', q{
		SELECT dlock.prune('0 seconds') >= 1;
		SELECT count(*) FROM dlock.leases WHERE key = 'w:6'}),
	"t\n0", 'f: once it ended, prune deletes the row');

# h. A writer held open past its lease while another session acquires.
for my $end ('write again', 'commit')
{
	my $k = $end eq 'commit' ? 8 : 7;
	my ($oh, $fh) = grant("w:$k", '2 seconds');
	($w, $wpid) = session();
	$w->query_safe(qq{BEGIN; SELECT dlock.use_fence('w:$k', $fh); INSERT INTO ledger VALUES ($k, NULL);});
	$node->poll_query_until('postgres', "SELECT state = 'expired' FROM dlock.lease_status WHERE key = 'w:$k'");
	my ($a, $apid) = session();
	$a->query_until(qr/started/, "\\echo started\nSELECT fence > $fh FROM dlock.acquire('w:$k', '1 minute', wait => '1 minute');\n\\echo finished\n");
	sleeps_in_dlock($node, 'postgres', $apid);
	sleep 1;
	is( $node->safe_psql('postgres', "SELECT state, wait_event_type FROM pg_stat_activity WHERE pid = $apid"),
		'active|Extension', "h ($end): the acquirer waits for the writer's transaction");
	if ($end eq 'write again')
	{
		$w->query("INSERT INTO ledger VALUES ($k, NULL)");
		is(error_of($w), 'LF001', "h ($end): the writer's next write, after the expiry, is refused");
		$w->query('ROLLBACK');
	}
	else
	{
		$w->query_safe('COMMIT');
	}
	$t0 = time();
	like($a->query_until(qr/finished/, ''), qr/^t$/m,
		"h ($end): once the writer's transaction ended, the acquirer is granted a larger token");
	ok(time() - $t0 < $late, "h ($end): ... within seconds");
	is($node->safe_psql('postgres', "SELECT count(*) FROM ledger WHERE k = $k"),
		$end eq 'commit' ? '1' : '0',
		"h ($end): " . ($end eq 'commit' ? 'the write made under the lease committed' : 'nothing of the refused transaction'));
	$a->quit;
	$w->quit;
}

# g. The FIFO line (preloaded).
$node = $fifo;

# Start acquire() of key q in a new session (after statements $pre);
# return the session and its pid once it sleeps.
sub queue_up
{
	my ($who, $pre) = @_;
	my ($q, $qpid) = session();
	$q->query_safe($pre) if $pre;
	$q->query_until(qr/started/,
		"\\echo started\nSELECT '$who', fence FROM dlock.acquire('q', '1 minute');\n\\echo finished\n");
	sleeps_in_dlock($node, 'postgres', $qpid);
	return ($q, $qpid);
}

# Release q's lease, whoever holds it, from a new connection.
sub release_q
{
	return $node->safe_psql('postgres', q{
		SELECT dlock.release('q', owner) FROM dlock.leases WHERE key = 'q'});
}

# Waiters behind the head of the line.
my ($og) = grant('q', '1 hour');
my ($head, $headpid) = queue_up('head');
all_three('g: waiter behind the head of the line',
	"SELECT fence FROM dlock.acquire('q', '1 minute')", 'Extension', '57014');
my $t1 = time();
is(release_q(), 't', 'g: the holder releases');
like($head->query_until(qr/finished/, ''), qr/head\|\d+/, 'g: the head of the line is granted');
ok(time() - $t1 < $late, 'g: ... within seconds of the release');
$head->quit;

# The head of the line leaves.
for my $how ('statement_timeout', 'lock_timeout', 'cancel')
{
	my $pre = $how eq 'statement_timeout' ? "SET statement_timeout = '${timeout}s'"
	  : $how eq 'lock_timeout' ? "SET lock_timeout = '${timeout}s'; SET statement_timeout = '${backstop}s'" : '';
	my ($x, $xpid) = queue_up('head', $pre);
	my $due = time() + ($how eq 'cancel' ? 0 : $how eq 'lock_timeout' ? $backstop : $timeout);
	my ($y, $ypid) = queue_up('behind');
	$node->safe_psql('postgres', "SELECT pg_cancel_backend($xpid)") if $how eq 'cancel';
	$x->query_until(qr/finished/, '');
	my $ended = time();
	is(error_of($x), '57014', "g: the head of the line ($how): 57014");
	ok($ended - $due < $late, sprintf("g: the head of the line ($how): ended %.2f s after it was due", $ended - $due));
	$x->quit;
	$t1 = time();
	is(release_q(), 't', "g: ($how) the holder releases");
	like($y->query_until(qr/finished/, ''), qr/behind\|\d+/,
		"g: ($how) the waiter that was behind it is granted");
	ok(time() - $t1 < $late, "g: ($how) ... within seconds of the release");
	$y->quit;
}
# Nothing orphaned: with nobody in the line, try_acquire works.
is(release_q(), 't', 'g: the last holder releases');
is($node->safe_psql('postgres', "SELECT count(*) FROM dlock.try_acquire('q', '1 minute')"),
	'1', 'g: with nobody in the line, try_acquire gets the key (no orphaned slot)');

$plain->stop;
$fifo->stop;
done_testing();
