# Competitors never queue in the lock manager (issue 6, finding 1).
#
# a. A holder whose writer is open keeps its lease: a competitor's unbounded
#    acquire() sleeps on its latch instead of queueing for the key lock, so
#    the holder's renew and its next writer are not stuck behind it, and the
#    holder still has the lease when the open writer commits after the
#    original expiry.  The competitor is woken by the commit of the
#    holder's release, not before.
# b. A bounded acquire() of a key whose expired lease still has an open
#    writer sleeps on its latch and is woken by the writer's commit, not by
#    its own deadline.
# c. try_acquire() of a key whose grant is not yet committed returns no row
#    at once; acquire() waits for that transaction and gets the key when the
#    grant rolls back.
# d. lock_timeout bounds acquire's wait for another transaction holding the
#    key (55P03).
# e. Keys whose locks collide under PostgreSQL's invertible string hash do
#    not share a lock.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use FindBin;
use lib $FindBin::RealBin;
use DlockCluster;

my $node = dlock_node('queue');
$node->safe_psql('postgres', q{
	CREATE EXTENSION dlock;
	-- what each session was granted, and how long it waited for it
	CREATE TABLE grants (who text PRIMARY KEY, owner uuid, fence bigint,
		expires_at timestamptz, waited interval);
	-- what each try_acquire() returned, or the SQLSTATE it failed with
	CREATE TABLE outcome (who text PRIMARY KEY, nrows bigint, nowners bigint,
		sqlstate text, waited interval);
	CREATE TABLE stock (id int PRIMARY KEY, qty int);
	INSERT INTO stock VALUES (1, 0), (2, 0);
	CREATE TRIGGER stock_fence BEFORE INSERT OR UPDATE OR DELETE ON stock
		FOR EACH ROW EXECUTE FUNCTION dlock.fence_guard('q:1');
});

# Record a grant of key to who in a new connection; return owner and fence.
sub grant
{
	my ($who, $key, $ttl) = @_;
	$node->safe_psql('postgres', qq{
		INSERT INTO grants (who, owner, fence, expires_at)
		SELECT '$who', owner, fence, expires_at FROM dlock.try_acquire('$key', '$ttl')});
	return split /\|/, $node->safe_psql('postgres',
		"SELECT owner, fence FROM grants WHERE who = '$who'");
}

# Open a session and return it with its backend's pid.
sub session { return backend_session($node, 'postgres') }

# Wait until backend pid sleeps (in the lock manager or elsewhere), then
# check that it sleeps on its latch and waits for no heavyweight lock.
sub sleeps_on_latch
{
	my ($pid, $what) = @_;
	ok( $node->poll_query_until('postgres', qq{
			SELECT wait_event_type IN ('Extension', 'Lock')
			FROM pg_stat_activity WHERE pid = $pid}),
		"$what: asleep");
	is( $node->safe_psql('postgres', qq{
			SELECT wait_event_type FROM pg_stat_activity WHERE pid = $pid}),
		'Extension', "$what: sleeps on its latch");
	is( $node->safe_psql('postgres',
			"SELECT count(*) FROM pg_locks WHERE pid = $pid AND NOT granted"),
		'0', "$what: waits for no lock in the lock manager");
}

# Poll until the clock has passed the expiry of who's lease.
sub wait_expired
{
	my ($who) = @_;
	ok( $node->poll_query_until('postgres', qq{
			SELECT clock_timestamp() > expires_at FROM grants WHERE who = '$who'}),
		"the lease granted to $who has expired by the clock");
}

# a. The issue's scenario.
my ($owner, $fence) = grant('h', 'q:1', '6 seconds');
my ($w1) = session();
$w1->query_safe(qq{
	BEGIN;
	SELECT dlock.use_fence('q:1', $fence);
	UPDATE stock SET qty = qty + 1 WHERE id = 1;
});
my ($x, $xpid) = session();
$x->query_until(qr/waiting/, q{
	\echo waiting
	INSERT INTO grants (who, owner, fence, waited)
	SELECT 'x', owner, fence, clock_timestamp() - statement_timestamp()
	FROM dlock.acquire('q:1', '1 hour');
});
sleeps_on_latch($xpid, 'unbounded acquire of a live lease whose writer is open');

# The holder renews, then writes (another row than W1) in a new transaction:
# neither waits for the competitor (statement_timeout would cancel them if
# they did).
my ($rc, $out, $err) = $node->psql('postgres', qq{
	SET statement_timeout = '3s';
	SELECT dlock.renew('q:1', '$owner', '1 hour') IS NOT NULL;
});
is($rc, 0, 'renew did not wait behind the competitor') or diag $err;
is($out, 't', 'the holder renewed its lease in time');
($rc, $out, $err) = $node->psql('postgres', qq{
	SET statement_timeout = '3s';
	BEGIN;
	SELECT dlock.use_fence('q:1', $fence);
	UPDATE stock SET qty = qty + 10 WHERE id = 2;
	COMMIT;
}, on_error_stop => 1);
is($rc, 0, "the holder's second writer did not wait behind the competitor")
  or diag $err;

# W1 commits after the original expiry: the renewal holds.
wait_expired('h');
$w1->query_safe('COMMIT');
is( $node->safe_psql('postgres', qq{
		SELECT owner = '$owner' AND expires_at > clock_timestamp()
		FROM dlock.leases WHERE key = 'q:1'}),
	't', 'after the open writer committed, the holder still has the lease');
is($node->safe_psql('postgres', "SELECT count(*) FROM grants WHERE who = 'x'"),
	'0', 'the competitor was not granted');
is( $node->safe_psql('postgres',
		"SELECT dlock.renew('q:1', '$owner', '1 hour') IS NOT NULL"),
	't', 'the holder can still renew');
sleeps_on_latch($xpid, 'the competitor, after the writer committed,');
is($node->safe_psql('postgres', q{SELECT string_agg(qty::text, ',' ORDER BY id) FROM stock}),
	'1,10', "both of the holder's writes committed");

# The holder releases in a transaction that stays open for a while: the
# competitor is not granted before that commits, and is woken by the commit
# (else it would sleep until the renewed expiry, an hour away).
my ($r) = session();
is($r->query_safe(qq{BEGIN; SELECT dlock.release('q:1', '$owner');}),
	't', 'the holder released (not committed yet)');
sleeps_on_latch($xpid, 'the competitor, while the release is not committed,');
is($node->safe_psql('postgres', "SELECT count(*) FROM grants WHERE who = 'x'"),
	'0', 'the competitor was not granted before the release committed');
$r->query_safe('COMMIT');
ok($node->poll_query_until('postgres',
		"SELECT count(*) = 1 FROM grants WHERE who = 'x'"),
	'the competitor was granted after the release committed');
$r->quit;
is( $node->safe_psql('postgres',
		"SELECT fence > $fence FROM grants WHERE who = 'x'"),
	't', 'with a newer token');
$x->quit;
$w1->quit;

# b. A bounded acquire of a key locked by the open writer of an expired
# lease sleeps until the writer commits.  The grant and use_fence run in one
# round trip, well within the 2 second lease.
my ($wb) = session();
$wb->query_safe(q{
	INSERT INTO grants (who, owner, fence, expires_at)
	SELECT 'b', owner, fence, expires_at FROM dlock.try_acquire('b:1', '2 seconds');
	BEGIN;
	SELECT dlock.use_fence('b:1', fence) FROM grants WHERE who = 'b';
});
wait_expired('b');
my ($c, $cpid) = session();
$c->query_until(qr/waiting/, q{
	\echo waiting
	INSERT INTO grants (who, owner, fence, waited)
	SELECT 'c', owner, fence, clock_timestamp() - statement_timestamp()
	FROM dlock.acquire('b:1', '1 hour', wait => '60 seconds');
});
sleeps_on_latch($cpid, 'bounded acquire of a key an open writer holds');
is($node->safe_psql('postgres', "SELECT count(*) FROM grants WHERE who = 'c'"),
	'0', 'no grant while the writer of the expired lease is open');
$wb->query_safe('COMMIT');
ok($node->poll_query_until('postgres',
		"SELECT count(*) = 1 FROM grants WHERE who = 'c'"),
	'the bounded acquire was granted after the writer committed');
is( $node->safe_psql('postgres', qq{
		SELECT waited < interval '20 seconds'
		   AND fence > (SELECT fence FROM grants WHERE who = 'b')
		FROM grants WHERE who = 'c'}),
	't', 'woken by the commit, long before its 60 second wait ran out, with a newer token');
$c->quit;
$wb->quit;

# c. try_acquire never waits, not even for a grant that is not yet
# committed (such a wait would be invisible to the deadlock detector): it
# returns no row at once.  acquire waits for that transaction instead, and
# gets the key when the grant rolls back.
for my $end ('COMMIT', 'ROLLBACK')
{
	my $key = "c:$end";
	my ($g) = session();
	$g->query_safe(qq{
		BEGIN;
		SELECT count(*) FROM dlock.try_acquire('$key', '1 hour');
	});
	is( $node->safe_psql('postgres', qq{
			SET statement_timeout = '3s';
			SELECT count(*) FROM dlock.try_acquire('$key', '1 hour');}),
		'0', "try_acquire of a key granted in an open transaction: no row at once ($end)");
	my ($t, $tpid) = session();
	$t->query_until(qr/waiting/, qq{
		\\echo waiting
		INSERT INTO outcome (who, nrows, nowners, waited)
		SELECT '$end', 1, count(owner), clock_timestamp() - statement_timestamp()
		FROM dlock.acquire('$key', '1 hour', wait => '30 seconds');
	});
	sleeps_on_latch($tpid, "acquire of a key granted in an open transaction ($end)");
	is($node->safe_psql('postgres', "SELECT count(*) FROM outcome WHERE who = '$end'"),
		'0', "acquire did not answer before the grant's $end");
	$g->query_safe($end);
	if ($end eq 'ROLLBACK')
	{
		ok($node->poll_query_until('postgres',
				"SELECT count(*) = 1 FROM outcome WHERE who = '$end'"),
			"acquire answered after the grant's $end");
		is( $node->safe_psql('postgres',
				"SELECT nowners, waited < interval '20 seconds' FROM outcome WHERE who = '$end'"),
			'1|t', 'a lease once the grant rolled back, long before the wait ran out');
	}
	else
	{
		sleeps_on_latch($tpid, "acquire sleeps on after the grant committed (the lease is live)");
		$node->safe_psql('postgres', "SELECT pg_cancel_backend($tpid)");
	}
	$t->quit;
	$g->quit;
}

# d. lock_timeout bounds acquire's wait for the open writer of an expired
# lease.
my ($wd) = session();
$wd->query_safe(q{
	INSERT INTO grants (who, owner, fence, expires_at)
	SELECT 'd', owner, fence, expires_at FROM dlock.try_acquire('d:1', '2 seconds');
	BEGIN;
	SELECT dlock.use_fence('d:1', fence) FROM grants WHERE who = 'd';
});
wait_expired('d');
$node->safe_psql('postgres', q{
	SET lock_timeout = '500ms';
	DO $$
	DECLARE
		started timestamptz := clock_timestamp();
	BEGIN
		BEGIN
			INSERT INTO outcome (who, nrows, nowners)
			SELECT 'timeout', 1, count(owner) FROM dlock.acquire('d:1', '1 hour', wait => '60 seconds');
		EXCEPTION WHEN OTHERS THEN
			INSERT INTO outcome (who, sqlstate, waited)
			VALUES ('timeout', SQLSTATE, clock_timestamp() - started);
		END;
	END
	$$;
});
is( $node->safe_psql('postgres',
		"SELECT sqlstate, nrows IS NULL FROM outcome WHERE who = 'timeout'"),
	'55P03|t', 'lock_timeout ended the wait with 55P03');
is( $node->safe_psql('postgres', q{
		SELECT waited >= interval '500 milliseconds' AND waited < interval '20 seconds'
		FROM outcome WHERE who = 'timeout'}),
	't', 'after lock_timeout, not at once and not much later');
$wd->query_safe('COMMIT');
is($node->safe_psql('postgres',
		"SELECT count(*) FROM dlock.try_acquire('d:1', '1 hour')"),
	'1', 'the key is free once the writer committed');
$wd->quit;

# e. Keys whose locks would have collided under PostgreSQL's own string
# hash (which anyone can invert: hashtextextended gives the same value for
# both) do not share a lock: a role holding the colliding key in an open
# transaction cannot hold up the holder's renew or writer.
my $victim = 'stock-sync:warehouse-42';
my $collider = 'mallory-key-"XYRFSp]]R-U';
is( $node->safe_psql('postgres', qq{
		SELECT hashtextextended('$victim', 0) = hashtextextended(\$\$$collider\$\$, 0)}),
	't', 'the two keys collide under hashtextextended');
my ($eowner, $efence) = split /\|/, $node->safe_psql('postgres', qq{
	SELECT owner, fence FROM dlock.try_acquire('$victim', '1 hour')});
my ($m) = session();
$m->query_safe(qq{
	BEGIN;
	SELECT count(*) FROM dlock.try_acquire(\$\$$collider\$\$, '1 hour');
});
is( $node->safe_psql('postgres', qq{
		SET statement_timeout = '3s';
		SELECT dlock.renew('$victim', '$eowner', '1 hour') IS NOT NULL;
		BEGIN;
		SELECT dlock.use_fence('$victim', $efence);
		SELECT dlock.check_fence('$victim', $efence);
		COMMIT;}),
	"t\n\nt", 'the holder renews and writes while the colliding key is held open');
$m->query_safe('COMMIT');
$m->quit;

$node->stop;
done_testing();
