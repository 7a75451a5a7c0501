# dlock behind PgBouncer in transaction pooling mode (issue 9, section 4).
#
# The test starts Debian's pgbouncer itself (pool_mode = transaction,
# default_pool_size = 5, trust over the Unix socket, its own port in the
# test's socket directory) in front of a node with dlock installed.  A
# missing pgbouncer is a failure, not a skip: CI installs it.
#
# a. The API through the pooler, one call per transaction: try_acquire
#    (and no row while held), check_fence, dlock.lease_status, renew,
#    use_fence and an UPDATE as separate statements of one transaction, a
#    write presenting its token in the token column, release; after a
#    takeover by another client the stale holder's use_fence and its token
#    column write are refused with LF001 (with the presented and current
#    tokens in the detail), and its renew and release fail.
# b. 50 pgbench clients over 5 server connections fight over 3 keys with
#    50 ms leases (they pause up to 70 ms, and queue in PgBouncer, between
#    reading the counter under the lease and writing it back, so many
#    leases run out mid-work and are taken over).  Every grant, read and
#    write is one transaction that may run on any of the 5 server
#    connections.  Each write of the read value + 1 goes through a function
#    that presents the token with use_fence or in the token column, and
#    records a refusal (LF001) instead of failing.  Checked afterwards: all
#    50 clients called try_acquire, on at most 5 server backends; grant
#    tokens are unique and strictly increase per key in grant order; per key
#    the accepted writes wrote 1, 2, ..., n exactly once each (no lost
#    update: two writers that read the same value would both write it) and
#    carry strictly increasing tokens, and the counter ends at n; writes of
#    both kinds were accepted and stale writes of both kinds refused.
# c. Waiting holds a server connection: 5 clients waiting in acquire() fill
#    the pool, so a 6th client's acquire() queues inside PgBouncer (it is
#    not on the server) and so does the holder's renew(), sent while its
#    lease still had seconds to run.  The lease runs out, a waiter is
#    granted, and only then does the 6th waiter's acquire() start on the
#    server (its query_start is after that grant: PgBouncer serves queued
#    clients in arrival order); the holder's renewal still waits for a free
#    connection, and when it finally runs it returns
#    NULL: the holder lost its lease because its renewal queued behind the
#    waiters.  Every release after that grants exactly one waiter, with
#    strictly increasing tokens.  So the pool must be larger than the number
#    of clients that wait at once.
# d. Session-bound leases behind transaction pooling (through a pool of one
#    server connection, so that which connection serves a client is known):
#    the lease is bound to the server connection, not to the client: it
#    stays held after its client disconnects, while the same server
#    connection serves other clients; another client's DISCARD ALL ends it
#    (and the session-bound lease of a third client bound to the same
#    connection); PgBouncer closing the server connection (RECONNECT) ends
#    it; and with server_reset_query_always = 1 it ends as soon as the
#    granting transaction ends, so the client is handed a lease that is
#    already over (its renew returns NULL).  A holder whose lease ended so
#    is refused (LF001) when it writes: fencing still holds.
# e. The dlock client through the pooler: acquire, renew, status, release,
#    and run (a 1 s lease kept for 2.5 s by renewals through the pooler, a
#    second run on the key exits 75, COMMAND's fenced write with
#    $DLOCK_FENCE is accepted).
#
# f. observe() through the pooler wakes on a campaign made through another
#    pooled connection; leader() and a permit's fenced write work there.
#
# Honesty: with the fence_guard triggers of b dropped, its counter and
# token order checks fail (stale token column writes are accepted and
# overwrite newer values); with default_pool_size = 6 the checks of c fail;
# with pool_mode = session for "sb" the first checks of d fail (the reset
# at the client's disconnect ends the lease); without pgbouncer at
# $PGBOUNCER (default /usr/sbin/pgbouncer) the test fails.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use FindBin;
use lib $FindBin::RealBin;
use DlockCluster;
use Time::HiRes qw(usleep);

my $pgbouncer = $ENV{PGBOUNCER} // '/usr/sbin/pgbouncer';
if (!-x $pgbouncer)
{
	fail("pgbouncer is installed at $pgbouncer (apt-get install pgbouncer)");
	done_testing();
	exit 1;
}

my $node = dlock_node('pooled');
$node->safe_psql('postgres', q{
	CREATE EXTENSION dlock;

	-- a: one fenced row
	CREATE TABLE item (id int PRIMARY KEY, qty int NOT NULL, fence bigint);
	INSERT INTO item VALUES (1, 0, NULL);
	CREATE TRIGGER item_fence BEFORE INSERT OR UPDATE OR DELETE ON item
	  FOR EACH ROW EXECUTE FUNCTION dlock.fence_guard('item-{id}', 'fence');

	-- b: a counter per key, the writes that were accepted and refused, the
	-- grants (id is drawn in the granting transaction, which holds the key
	-- until it commits, so per key id order is grant order)
	CREATE TABLE counter (k int PRIMARY KEY, v bigint NOT NULL, fence bigint);
	INSERT INTO counter SELECT k, 0, NULL FROM generate_series(1, 3) k;
	CREATE TRIGGER counter_fence BEFORE INSERT OR UPDATE OR DELETE ON counter
	  FOR EACH ROW EXECUTE FUNCTION dlock.fence_guard('ctr:{k}', 'fence');
	CREATE TABLE history (id bigserial PRIMARY KEY, k int NOT NULL,
	  fence bigint, v bigint NOT NULL, how text NOT NULL, client int, pid int);
	CREATE TRIGGER history_fence BEFORE INSERT OR UPDATE OR DELETE ON history
	  FOR EACH ROW EXECUTE FUNCTION dlock.fence_guard('ctr:{k}', 'fence');
	CREATE TABLE refused (k int, fence bigint, how text, client int);
	CREATE TABLE grants (id bigserial PRIMARY KEY, k text NOT NULL,
	  fence bigint NOT NULL, client int NOT NULL, pid int NOT NULL);
	-- every try_acquire: which pgbench client, on which server backend
	CREATE TABLE tries (client int NOT NULL, pid int NOT NULL);

	-- Write seen + 1 to counter k under token f, presented with use_fence
	-- (how = 1) or in the token column (how = 0), and log it in history;
	-- a refusal (LF001) is logged in refused and returns false.
	CREATE FUNCTION fenced_write(p_k int, f bigint, seen bigint, how int,
	  client int) RETURNS boolean
	LANGUAGE plpgsql AS $$
	BEGIN
	  IF how = 1 THEN
	    PERFORM dlock.use_fence('ctr:' || p_k, f);
	    UPDATE counter SET v = seen + 1 WHERE k = p_k;
	  ELSE
	    UPDATE counter SET v = seen + 1, fence = f WHERE k = p_k;
	  END IF;
	  INSERT INTO history (k, fence, v, how, client, pid)
	  VALUES (p_k, f, seen + 1, CASE how WHEN 1 THEN 'use_fence' ELSE 'column' END,
	    client, pg_backend_pid());
	  RETURN true;
	EXCEPTION WHEN SQLSTATE 'LF001' THEN
	  INSERT INTO refused
	  VALUES (p_k, f, CASE how WHEN 1 THEN 'use_fence' ELSE 'column' END, client);
	  RETURN false;
	END $$;

	-- c: what each waiter got, and when (in its granting transaction);
	-- what the holder's renewal returned, and when it ran
	CREATE TABLE woken (who text, fence bigint, at timestamptz);
	CREATE TABLE renewals (ran_at timestamptz, expires timestamptz);

	-- e
	CREATE TABLE cli (k text PRIMARY KEY, n int NOT NULL, fence bigint);
	INSERT INTO cli VALUES ('cli-run', 0, NULL);
	CREATE TRIGGER cli_fence BEFORE INSERT OR UPDATE OR DELETE ON cli
	  FOR EACH ROW EXECUTE FUNCTION dlock.fence_guard('{k}', 'fence');
});

#
# PgBouncer.  It listens on a port of its own in the node's socket
# directory; a Cluster object that is never initialized stands for it, so
# that psql, background_psql, poll_query_until and pgbench go through it.
# Database "postgres" is the pool of 5; "sb" a pool of one server
# connection to the same database, for d.
#
my ($bouncer, $bh, $bouncer_up) = start_pgbouncer($node, 'bouncer', pool_size => 5,
	databases => { postgres => '', sb => 'pool_size=1' }, check => 'postgres');
my $bdir = $bouncer->basedir;
my $user = getpwuid($<);
my ($nhost, $nport) = ($node->host, $node->port);
my ($bhost, $bport) = ($bouncer->host, $bouncer->port);
is($bhost, $nhost, 'PgBouncer listens in the node\'s socket directory');
ok($bouncer_up, 'PgBouncer accepts connections');

# Run $sql on PgBouncer's admin console; return its output.
sub admin
{
	my ($sql) = @_;
	return $bouncer->safe_psql('pgbouncer', $sql);
}

# Clients of database $db waiting in PgBouncer for a server connection.
sub clients_waiting
{
	my ($db) = @_;
	my $pools = $bouncer->safe_psql('pgbouncer', 'SHOW POOLS', extra_params => [ '-F', ',' ]);
	foreach my $line (split /\n/, $pools)
	{
		my @f = split /,/, $line;
		# database, user, cl_active, cl_waiting, ...
		return $f[3] if $f[0] eq $db;
	}
	return -1;
}

# Run $sql through PgBouncer with verbose errors; return (stdout, stderr).
sub via_bouncer
{
	my ($sql, $db) = @_;
	my ($ret, $out, $err) = $bouncer->psql($db // 'postgres',
		"\\set VERBOSITY verbose\n$sql");
	return ($out, $err);
}

#
# a. The API through the pooler.
#
my ($owner, $fence) = split /\|/, $bouncer->safe_psql('postgres', q{
	SELECT owner, fence FROM dlock.try_acquire('item-1', '1 hour', holder => 'a')});
like($fence, qr/^\d+$/, 'a: try_acquire through PgBouncer grants a lease');
is($bouncer->safe_psql('postgres', q{
		SELECT count(*) FROM dlock.try_acquire('item-1', '1 hour')}),
	'0', 'a: a second try_acquire gets no row while it is held');
is($bouncer->safe_psql('postgres', qq{SELECT dlock.check_fence('item-1', $fence)}),
	't', 'a: check_fence: the token is current');
is($bouncer->safe_psql('postgres', q{
		SELECT state || ' ' || holder FROM dlock.lease_status WHERE key = 'item-1'}),
	'held a', 'a: lease_status shows it held by its holder');
is($bouncer->safe_psql('postgres', qq{
		SELECT dlock.renew('item-1', '$owner', '2 hours') > now() + interval '90 minutes'}),
	't', 'a: renew extends it');
$bouncer->safe_psql('postgres', qq{UPDATE item SET qty = qty + 10, fence = $fence WHERE id = 1});
$bouncer->safe_psql('postgres', qq{
	BEGIN;
	SELECT dlock.use_fence('item-1', $fence);
	UPDATE item SET qty = qty + 1 WHERE id = 1;
	COMMIT;
});
is($node->safe_psql('postgres', 'SELECT qty || \' \' || fence FROM item'),
	"11 $fence",
	'a: a token column write, then use_fence + UPDATE in one transaction, accepted and stamped');
is($bouncer->safe_psql('postgres', qq{SELECT dlock.release('item-1', '$owner')}),
	't', 'a: release');
is($bouncer->safe_psql('postgres', qq{SELECT dlock.check_fence('item-1', $fence)}),
	'f', 'a: check_fence: released token is no longer current');
my ($owner2, $fence2) = split /\|/, $bouncer->safe_psql('postgres', q{
	SELECT owner, fence FROM dlock.try_acquire('item-1', '1 hour', holder => 'b')});
ok($fence2 > $fence, "a: another client takes the key with a larger token ($fence2 > $fence)");
my ($out, $err) = via_bouncer(qq{
	BEGIN;
	SELECT dlock.use_fence('item-1', $fence);
	UPDATE item SET qty = qty + 100 WHERE id = 1;
	COMMIT;
});
like($err, qr/ERROR:  LF001: .*\n.*DETAIL: .*\b$fence\b.*\b$fence2\b/,
	'a: the stale holder\'s use_fence is refused with LF001, naming both tokens');
($out, $err) = via_bouncer(qq{UPDATE item SET qty = qty + 100, fence = $fence WHERE id = 1});
like($err, qr/ERROR:  LF001: /,
	'a: the stale holder\'s token column write is refused with LF001');
is($bouncer->safe_psql('postgres', qq{
		SELECT coalesce(dlock.renew('item-1', '$owner', '1 hour')::text, 'null') || ' ' ||
		  dlock.release('item-1', '$owner')}),
	'null false', 'a: the stale holder can neither renew nor release');
$bouncer->safe_psql('postgres', qq{
	BEGIN;
	SELECT dlock.use_fence('item-1', $fence2);
	UPDATE item SET qty = qty + 1000 WHERE id = 1;
	COMMIT;
	SELECT dlock.release('item-1', '$owner2');
});
is($node->safe_psql('postgres', 'SELECT qty || \' \' || fence FROM item'),
	"1011 $fence2", 'a: only the current holder\'s writes landed');

#
# b. 50 clients over 5 server connections.
#
# Extended protocol (unnamed statements): PgBouncer 1.18 cannot pool
# named prepared statements in transaction mode.
my $clients = 50;
$bouncer->pgbench(
	"-n -M extended -c $clients -j 2 -T 5",
	0,
	[ qr{processed: [1-9]}, qr{number of failed transactions: 0 } ],
	[qr{^$}],
	'b: 50 pgbench clients through PgBouncer, none fails',
	{
		'pgbouncer_contention' => q{
\set k random(1, 3)
\set how random(0, 1)
WITH g AS (SELECT * FROM dlock.try_acquire('ctr:' || :k, '50 milliseconds')),
     r AS (INSERT INTO grants (k, fence, client, pid)
           SELECT key, fence, :client_id, pg_backend_pid() FROM g),
     t AS (INSERT INTO tries VALUES (:client_id, pg_backend_pid()))
SELECT count(*) AS got, coalesce(max(fence), 0) AS fence,
       coalesce(max(owner::text), '') AS owner FROM g \gset
\if :got
SELECT v AS seen FROM counter WHERE k = :k \gset
\set nap random(0, 70)
\sleep :nap ms
\if :how
SELECT dlock.renew('ctr:' || :k, :owner::uuid, '50 milliseconds');
\endif
SELECT dlock.check_fence('ctr:' || :k, :fence);
SELECT fenced_write(:k, :fence, :seen, :how, :client_id);
SELECT count(*) FROM dlock.lease_status WHERE key = 'ctr:' || :k;
SELECT dlock.release('ctr:' || :k, :owner::uuid);
\else
\sleep 30 ms
\endif
}
	});

my ($ntries, $nclients, $npids) = split / /, $node->safe_psql('postgres', q{
	SELECT count(*) || ' ' || count(DISTINCT client) || ' ' || count(DISTINCT pid)
	FROM tries});
note "b: $ntries calls of try_acquire by $nclients clients on $npids server backends; "
  . $node->safe_psql('postgres', q{
	SELECT count(*) || ' grants to ' || count(DISTINCT client) || ' clients'
	FROM grants});
is($nclients, $clients, 'b: every client called try_acquire through PgBouncer ...');
ok($npids >= 1 && $npids <= 5,
	"b: ... on at most 5 server backends ($npids)");
is($node->safe_psql('postgres', q{
		SELECT count(*) - count(DISTINCT fence) FROM grants}),
	'0', 'b: every grant has its own token');
is($node->safe_psql('postgres', q{
		SELECT count(*) FROM (SELECT fence, lag(fence) OVER (PARTITION BY k ORDER BY id) AS prev
		  FROM grants) s WHERE fence <= prev}),
	'0', 'b: per key, tokens strictly increase in grant order');
my $tally = $node->safe_psql('postgres', q{
	SELECT string_agg(how || '=' || n, ' ' ORDER BY how) FROM
	  (SELECT 'accepted_' || how AS how, count(*) AS n FROM history GROUP BY 1
	   UNION ALL
	   SELECT 'refused_' || how, count(*) FROM refused GROUP BY 1) s});
note "b: $tally";
like($tally, qr/accepted_column=[1-9].*accepted_use_fence=[1-9]/,
	'b: writes presenting the token both ways were accepted');
like($tally, qr/refused_column=[1-9].*refused_use_fence=[1-9]/,
	'b: stale writes of both ways were refused (leases ran out mid-work)');
is($node->safe_psql('postgres', q{
		SELECT string_agg(format('key %s: counter %s, %s accepted writes of %s distinct values',
		  k, v, n, d), '; ' ORDER BY k)
		FROM counter c, LATERAL (SELECT count(*) AS n, count(DISTINCT h.v) AS d
		  FROM history h WHERE h.k = c.k) s
		WHERE v <> n OR v <> d}),
	'', 'b: each counter equals its number of accepted writes, each value written once (no lost update)');
is($node->safe_psql('postgres', q{
		SELECT count(*) FROM (SELECT fence, lag(fence) OVER (PARTITION BY k ORDER BY v) AS prev
		  FROM history) s WHERE fence <= prev}),
	'0', 'b: per key, accepted writes carry strictly increasing tokens');
note 'b: counters ' . $node->safe_psql('postgres',
	q{SELECT string_agg(k || '=' || v, ' ' ORDER BY k) FROM counter});

#
# c. Waiters hold server connections.
#
my @sessions;
my $holder = $bouncer->background_psql('postgres', on_error_stop => 0);
my ($hown, $hfence) = split /\|/, $holder->query_safe(q{
	SELECT owner, fence FROM dlock.try_acquire('w', '6 seconds')});

# Start a client through PgBouncer waiting in acquire() for 'w', recording
# its grant in woken as $who.  The comment in the query names it in
# pg_stat_activity.
sub start_waiter
{
	my ($who) = @_;
	my $s = $bouncer->background_psql('postgres', on_error_stop => 0);
	$s->query_until(qr/sent/, qq{
		\\echo sent
		INSERT INTO woken /* $who */ SELECT '$who', fence, clock_timestamp()
		FROM dlock.acquire('w', '1 hour', wait => '30 seconds');
	});
	push @sessions, $s;
	return $s;
}

# Backends on the server running $who's acquire().
sub on_server
{
	my ($who) = @_;
	return $node->safe_psql('postgres', qq{
		SELECT count(*) FROM pg_stat_activity
		WHERE query LIKE '%/* $who */%' AND pid <> pg_backend_pid()
		  AND state = 'active'});
}

start_waiter("w$_") foreach 1 .. 5;
ok( $node->poll_query_until('postgres', q{
		SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Extension'
		  AND query LIKE '%dlock.acquire%'}, '5'),
	'c: 5 clients wait in acquire(), one per server connection');
start_waiter('w6');
ok(poll_until(sub { clients_waiting('postgres') == 1 }),
	'c: a 6th waiter queues in PgBouncer ...');
is(on_server('w6'), '0', 'c: ... and its acquire() is not on the server');
my $sent = $node->safe_psql('postgres', 'SELECT clock_timestamp()');
$holder->query_until(qr/sent/, qq{
	\\echo sent
	INSERT INTO renewals SELECT clock_timestamp(), dlock.renew('w', '$hown', '6 seconds');
});
ok(poll_until(sub { clients_waiting('postgres') == 2 }),
	'c: the holder\'s renewal queues in PgBouncer too');
is($node->safe_psql('postgres', qq{
		SELECT expires_at > '$sent'::timestamptz + interval '1 second'
		FROM dlock.lease_status WHERE key = 'w'}),
	't', 'c: ... sent more than a second before its lease would end');
ok($node->poll_query_until('postgres', 'SELECT count(*) FROM woken', '1'),
	'c: the lease runs out, a waiter is granted');
ok(poll_until(sub { on_server('w6') eq '1' }),
	'c: then the 6th waiter\'s acquire() reaches the server');
is($node->safe_psql('postgres', q{
		SELECT a.query_start > w.at FROM pg_stat_activity a, woken w
		WHERE a.query LIKE '%/* w6 */%' AND a.pid <> pg_backend_pid()}),
	't', 'c: ... it started after the grant that freed a connection');
is($node->safe_psql('postgres', 'SELECT count(*) FROM renewals'),
	'0', 'c: the holder\'s renewal still waits for a connection');
is(clients_waiting('postgres'), '1', 'c: ... in PgBouncer');

# From here on release each granted lease directly (a release through
# PgBouncer would queue behind the waiters too).
my $granted = 1;
while ($granted < 6)
{
	$node->safe_psql('postgres',
		q{SELECT dlock.release('w', owner) FROM dlock.leases WHERE key = 'w'});
	$granted++;
	last unless $node->poll_query_until('postgres',
		'SELECT count(*) FROM woken', $granted);
}
is($granted, 6, 'c: each release grants one waiter, all 6 in the end');
is($node->safe_psql('postgres', q{
		SELECT count(*) FROM (SELECT fence, lag(fence) OVER (ORDER BY at) AS prev
		  FROM woken) s WHERE fence <= prev}) . ' ' .
	$node->safe_psql('postgres', "SELECT min(fence) > $hfence FROM woken"),
	'0 t', 'c: with strictly increasing tokens, all larger than the holder\'s');
ok($node->poll_query_until('postgres', 'SELECT count(*) FROM renewals', '1'),
	'c: the holder\'s renewal ran once connections were free');
is($node->safe_psql('postgres', q{
		SELECT coalesce(expires::text, 'null') || ' ' || (ran_at > (SELECT min(at) FROM woken))
		FROM renewals}),
	'null true', 'c: ... after its lease had run out: it returned NULL, the lease was lost');
$_->quit foreach @sessions;
$holder->quit;

# Call $cond every 0.1 s until it is true or 30 s have passed.
sub poll_until
{
	my ($cond) = @_;
	foreach (1 .. 300)
	{
		return 1 if $cond->();
		usleep(100_000);
	}
	return 0;
}

#
# d. Session-bound leases behind transaction pooling, through "sb", a pool
# of one server connection.
#
my $ca = $bouncer->background_psql('sb', on_error_stop => 0);
my ($sbf, $spid) = split /\|/, $ca->query_safe(q{
	SELECT fence, pg_backend_pid() FROM dlock.try_acquire('sb-1', '1 hour', session_bound => true)});
$ca->quit;
is($node->safe_psql('postgres', q{
		SELECT state || ' ' || session_bound || ' ' || pid FROM dlock.lease_status WHERE key = 'sb-1'}),
	"held true $spid",
	'd: a session-bound lease stays held after its client disconnected (bound to the server connection)');
is($bouncer->safe_psql('sb', q{
		SELECT pg_backend_pid() || ' ' || count(*) FROM dlock.try_acquire('sb-1', '1 hour')}),
	"$spid 0",
	'd: another client, served by the same server connection, cannot take it');
my $cb = $bouncer->background_psql('sb', on_error_stop => 0);
my $bbound = $cb->query_safe(q{
	SELECT fence FROM dlock.try_acquire('sb-2', '1 hour', session_bound => true)});
$bouncer->safe_psql('sb', 'DISCARD ALL');
is($node->safe_psql('postgres', q{
		SELECT string_agg(state, ' ' ORDER BY key) FROM dlock.lease_status
		WHERE key IN ('sb-1', 'sb-2')}),
	'expired expired',
	'd: a third client\'s DISCARD ALL ends both session-bound leases (one of a connected client)');
($out, $err) = via_bouncer("SELECT dlock.use_fence('sb-2', $bbound)", 'sb');
like($err, qr/ERROR:  LF001: /,
	'd: ... whose holder\'s fenced writes are then refused with LF001');
is($cb->query_safe(q{SELECT count(*) FROM dlock.try_acquire('sb-2', '1 hour') WHERE fence > } . $bbound),
	'1', 'd: ... and the key can be taken again, with a larger token');
$cb->quit;

$bouncer->safe_psql('sb', q{
	SELECT fence FROM dlock.try_acquire('sb-3', '1 hour', session_bound => true)});
is($node->safe_psql('postgres', q{SELECT state FROM dlock.lease_status WHERE key = 'sb-3'}),
	'held', 'd: a session-bound lease outlives its client ...');
admin('RECONNECT sb');
ok($node->poll_query_until('postgres', qq{
		SELECT state FROM dlock.lease_status WHERE key = 'sb-3'}, 'expired'),
	'd: ... until PgBouncer closes the server connection (RECONNECT)');

admin('SET server_reset_query_always = 1');
my $c = $bouncer->background_psql('sb', on_error_stop => 0);
my ($cown, $cfence) = split /\|/, $c->query_safe(q{
	SELECT owner, fence FROM dlock.try_acquire('sb-4', '1 hour', session_bound => true)});
like($cown, qr/^[0-9a-f-]{36}$/, 'd: server_reset_query_always = 1: a session-bound lease is granted ...');
is($node->safe_psql('postgres', q{SELECT state FROM dlock.lease_status WHERE key = 'sb-4'}),
	'expired', 'd: ... and over as soon as its transaction ends (the reset ran DISCARD ALL)');
is($c->query_safe(qq{SELECT coalesce(dlock.renew('sb-4', '$cown', '1 hour')::text, 'null')}),
	'null', 'd: ... its holder\'s renew returns NULL');
($out, $err) = via_bouncer("SELECT dlock.use_fence('sb-4', $cfence)", 'sb');
like($err, qr/ERROR:  LF001: /, 'd: ... and its fenced writes are refused with LF001');
$c->quit;
admin('SET server_reset_query_always = 0');

#
# e. The dlock client through the pooler.
#
my @conn = ('-h', $bhost, '-p', $bport, '-d', 'postgres');

# Run dlock with @args to the end; return (exit status, stdout, stderr).
sub dlock
{
	my (@args) = @_;
	my ($o, $e) = ('', '');
	IPC::Run::run([ 'dlock', @conn, @args ], '<' => \undef, '>' => \$o, '2>' => \$e,
		IPC::Run::timeout(60));
	note "dlock @args: $? <$o> <$e>";
	return ($? >> 8, $o, $e);
}

my ($st, $o, $e) = dlock('acquire', '--ttl=30s', '--format=shell', 'cli-1');
my %l = $o =~ /^(DLOCK_\w+)='?([^'\n]*)'?$/mg;
is($st, 0, 'e: dlock acquire through PgBouncer');
like($l{DLOCK_FENCE}, qr/^\d+$/, 'e: ... prints the lease');
($st) = dlock('renew', '--ttl=60s', 'cli-1', $l{DLOCK_OWNER});
is($st, 0, 'e: dlock renew');
($st, $o) = dlock('status', 'cli-1');
like($o, qr/cli-1.*held/, 'e: dlock status shows it held');
($st) = dlock('release', 'cli-1', $l{DLOCK_OWNER});
is($st, 0, 'e: dlock release');
($st) = dlock('release', 'cli-1', $l{DLOCK_OWNER});
is($st, 79, 'e: dlock release again: not held (79)');

my $psql = join ' ', map { "'$_'" } ('psql', '-X', '-q', '-v', 'ON_ERROR_STOP=1',
	'-h', $bhost, '-p', $bport, '-d', 'postgres');
my ($ro, $re) = ('', '');
my $run = IPC::Run::start(
	[ 'dlock', @conn, 'run', '--ttl=1s', 'cli-run', '--', 'sh', '-c', qq{
		sleep 2.5
		$psql -c "BEGIN" -c "SELECT dlock.use_fence('\$DLOCK_KEY', \$DLOCK_FENCE)" \\
		  -c "UPDATE cli SET n = n + 1 WHERE k = 'cli-run'" -c "COMMIT"
		echo "fence \$DLOCK_FENCE"
	} ],
	'<' => \undef, '>' => \$ro, '2>' => \$re, IPC::Run::timeout(60));
ok($node->poll_query_until('postgres', q{
		SELECT state FROM dlock.lease_status WHERE key = 'cli-run'}, 'held'),
	'e: dlock run holds the key');
($st, $o, $e) = dlock('run', 'cli-run', '--', 'true');
is($st, 75, 'e: a second dlock run on the key exits 75');
$run->finish;
note "dlock run: <$ro> <$re>";
is($? >> 8, 0, 'e: dlock run with a 1 s lease kept 2.5 s through PgBouncer exits 0');
my ($rfence) = $ro =~ /^fence (\d+)$/m;
is($node->safe_psql('postgres', q{SELECT n || ' ' || fence FROM cli}),
	"1 " . ($rfence // 'none'), 'e: COMMAND\'s fenced write under $DLOCK_FENCE was accepted');
is($node->safe_psql('postgres', q{SELECT state FROM dlock.lease_status WHERE key = 'cli-run'}),
	'released', 'e: and the lease was released');

#
# f. observe() and an election through the pooler: a long poll is one
#    statement, so it works in transaction mode; it returns once a
#    campaign made through another pooled connection commits, and a
#    permit's token fences a write through the pooler.
#
{
	my $obs = $bouncer->background_psql('postgres', on_error_stop => 0);
	$obs->query_until(qr/watching/, q{
		\echo watching
		SELECT 'seen', value, state FROM dlock.observe('pb-el', 0, '30 s', NULL, true);
	});
	ok($node->poll_query_until('postgres', q{
			SELECT count(*) = 1 FROM pg_stat_activity
			WHERE query LIKE '%dlock.observe(''pb-el''%' AND wait_event_type = 'Extension'}),
		'f: observe() through PgBouncer sleeps on the server');
	my ($eo, $ef) = split /\|/, $bouncer->safe_psql('postgres', q{
		SELECT owner, fence FROM dlock.campaign('pb-el', 'node-1', '1 minute')});
	my $seen = $obs->query_safe(q{SELECT 'done'});
	like($seen, qr/seen\|node-1\|held/, 'f: ... and returns the campaign through another pooled connection');
	$obs->quit;
	is($bouncer->safe_psql('postgres', q{SELECT value FROM dlock.leader('pb-el')}),
		'node-1', 'f: leader() through PgBouncer');
	my ($po, $pf) = split /\|/, $bouncer->safe_psql('postgres', q{
		SELECT owner, fence FROM dlock.try_acquire('pb-sem', '1 minute', permits => 2)});
	my ($out, $err) = via_bouncer("BEGIN; SELECT dlock.use_fence('pb-sem', $pf); COMMIT;");
	is($err, '', "f: a permit's token fences a write through PgBouncer");
	is($bouncer->safe_psql('postgres', qq{SELECT dlock.release('pb-sem', '$po')}),
		't', 'f: ... and its owner releases it through PgBouncer');
}

ok($bh->pumpable, 'PgBouncer is still running');
$node->stop;
unlike(slurp_file($node->logfile), qr/PANIC|TRAP|XX000|terminated by signal/,
	'no PANIC, assertion failure, internal error or crashed backend in the server log');
done_testing();
