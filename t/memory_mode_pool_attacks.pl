# Memory mode: what the attack pass on issue 18's fixes found.
#
# 1. Live session-bound leases do not crowd ended leases out of eviction:
#    with dlock.memory_max_keys = 400 and 60 released entries, one
#    connection takes session-bound leases until a grant fails with 53200
#    (more than one eviction batch of 256): by then no ended lease is left
#    (each was dropped, wherever it came in the hash), and another
#    database's new key gets 53200 too; once that connection is gone, its
#    leases have ended and a new key is granted.
# 2. A DROP DATABASE that fails (the current database; one in use) leaves
#    that database's leases alone: its live lease is still held, its
#    holder still renews, and its fenced token is still accepted.
# 3. Slots: with dlock.memory_max_databases = 3, databases whose leases
#    have all ended (released, entries left in memory, horizons passed)
#    give their slots up: a fourth and a fifth database are granted keys
#    without anybody running dlock.prune().
# 4. Slot churn: four databases over three slots, each granting a 150 ms
#    lease in a loop for 4 s: only 53400 as an error, and no key granted
#    while an acknowledged lease of it ran.
#
# And nothing fails with XX000.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use FindBin;
use lib $FindBin::RealBin;
use DlockCluster;

my $node = dlock_node('attacks', conf => q{
shared_preload_libraries = 'dlock'
dlock.storage = memory
dlock.memory_max_keys = 400
dlock.memory_max_databases = 3
dlock.max_ttl = '2min'
dlock.horizon_margin = 0
autovacuum = off
});

# Run $sql in $db; return the SQLSTATE of its first error ('' if none),
# stdout and stderr.
sub run_sql { return try_sql($node, @_) }

foreach my $db (qw(a b))
{
	$node->safe_psql('postgres', "CREATE DATABASE $db");
	$node->safe_psql($db, 'CREATE EXTENSION dlock');
}

#
# 1. Live session-bound leases and ended leases.
#
is($node->safe_psql('a', q{
	SELECT count(*) FROM generate_series(1, 60) AS i,
	LATERAL dlock.try_acquire('rel' || i, '2 s') AS l
	WHERE dlock.release(l.key, l.owner)}),
	'60', '60 leases granted and released');
my $holder = $node->background_psql('a');
my $held = $holder->query_safe(q{
	DO $$
	BEGIN
		FOR i IN 1 .. 500 LOOP
			BEGIN
				PERFORM dlock.try_acquire('sb' || i, '8 s', session_bound => true);
			EXCEPTION WHEN out_of_memory THEN
				EXIT;
			END;
		END LOOP;
	END $$;
	SELECT count(*) FROM dlock.lease_status WHERE state = 'held'});
cmp_ok($held, '>', 256,
	'one connection holds more session-bound leases than an eviction batch');
is($node->safe_psql('a', q{SELECT count(*) FROM dlock.lease_status WHERE state <> 'held'}),
	'0', 'when its next grant failed with 53200, no ended lease was left to drop');
my ($st, $out) = run_sql('b', q{SELECT count(*) FROM dlock.try_acquire('new-b', '2 s')});
is($st, '53200', 'with every entry live, a new key of another database gets 53200');
$holder->quit;
# its leases end with its connection: entries any grant may drop
ok( $node->poll_query_until('b', q{
		SELECT count(*) = 1 FROM dlock.try_acquire('new-b', '2 s')}),
	'once that connection is gone, a new key of another database is granted');

#
# 2. A DROP DATABASE that fails.
#
my ($owner, $fence) = split /\|/, $node->safe_psql('b', q{
	SELECT owner, fence FROM dlock.try_acquire('live', '5 s')});
($st) = run_sql('b', 'DROP DATABASE b');
is($st, '55006', 'DROP DATABASE of the current database fails');
is($node->safe_psql('b', q{SELECT state FROM dlock.lease_status WHERE key = 'live'}),
	'held', '... and the lease is still held');
is($node->safe_psql('b', "SELECT dlock.renew('live', '$owner', '5 s') IS NOT NULL"),
	't', '... its holder still renews');
is($node->safe_psql('b', "SELECT dlock.check_fence('live', $fence)"),
	't', '... and its token is still accepted');
is($node->safe_psql('b', q{SELECT count(*) FROM dlock.try_acquire('live', '5 s')}),
	'0', '... and nobody else is granted the key');
$node->safe_psql('b', "SELECT dlock.release('live', '$owner')");

#
# 3. Slots of databases whose leases have all ended.
#
$node->safe_psql('postgres', 'CREATE EXTENSION dlock');
# every slot taken: a, b and postgres, each with ended entries only
$node->safe_psql('postgres', q{
	SELECT dlock.release(key, owner) FROM dlock.try_acquire('p', '1 s')});
$node->safe_psql('a', 'SELECT 1');
ok( $node->poll_query_until('postgres', q{
		SELECT clock_timestamp() > timestamptz '2000-01-01 00:00:00+00'
			+ (greatest(last_value, 0) / 1000000.0) * interval '1 s' + interval '1 s'
		FROM dlock.horizon_seq}),
	'the horizon of postgres has passed');
# the session-bound leases of part 1 ended with their connection; wait
# until the horizons of a and b have passed too
foreach my $db (qw(a b))
{
	$node->poll_query_until($db, q{
		SELECT clock_timestamp() > timestamptz '2000-01-01 00:00:00+00'
			+ (greatest(last_value, 0) / 1000000.0) * interval '1 s' + interval '1 s'
		FROM dlock.horizon_seq});
}
foreach my $db (qw(c d))
{
	$node->safe_psql('postgres', "CREATE DATABASE $db");
	$node->safe_psql($db, 'CREATE EXTENSION dlock');
	($st, $out) = run_sql($db, q{SELECT count(*) FROM dlock.try_acquire('k', '1 min')});
	is("$st/$out", '/1', "database $db takes the slot of one whose leases ended (no 53400)");
}

#
# 4. Slot churn: four databases, three slots, short leases granted in a
#    loop in each for a few seconds.  A grant either works or fails with
#    53400 (no slot), never another error; and no key is granted while an
#    acknowledged lease of it runs (a slot taken over must not forget a
#    live lease).
#
my @churn = qw(c d e f);
foreach my $db (qw(e f))
{
	$node->safe_psql('postgres', "CREATE DATABASE $db");
	$node->safe_psql($db, 'CREATE EXTENSION dlock');
}
my @loops;
foreach my $db (@churn)
{
	$node->safe_psql($db, q{
		CREATE TABLE grants (fence bigint, granted_at timestamptz, expires_at timestamptz);
		CREATE TABLE errors (state text)});
	my $bg = $node->background_psql($db);
	$bg->query_until(qr/started/, q{
		\echo started
		DO $$
		DECLARE
			l record;
			deadline timestamptz := clock_timestamp() + interval '4 s';
		BEGIN
			WHILE clock_timestamp() < deadline LOOP
				BEGIN
					SELECT * INTO l FROM dlock.try_acquire('churn', '150 ms');
					IF l.fence IS NOT NULL THEN
						INSERT INTO grants VALUES (l.fence, l.expires_at - interval '150 ms', l.expires_at);
					END IF;
				EXCEPTION WHEN OTHERS THEN
					INSERT INTO errors VALUES (SQLSTATE);
				END;
				PERFORM pg_sleep(0.01);
			END LOOP;
		END $$;
		\echo done
	});
	push @loops, $bg;
}
foreach my $bg (@loops)
{
	PostgreSQL::Test::Utils::pump_until($bg->{run}, $bg->{timeout}, \$bg->{stdout}, qr/done/);
	$bg->quit;
}
my ($granted, $bad_errors, $overlaps) = (0, '', 0);
foreach my $db (@churn)
{
	$granted += $node->safe_psql($db, 'SELECT count(*) FROM grants');
	$bad_errors .= $node->safe_psql($db,
		q{SELECT string_agg(DISTINCT state, ',') FROM errors WHERE state <> '53400'});
	$overlaps += $node->safe_psql($db, q{
		SELECT count(*) FROM (
			SELECT granted_at, lag(expires_at) OVER (ORDER BY fence) AS prev_end
			FROM grants) g
		WHERE granted_at < prev_end});
}
cmp_ok($granted, '>', 20, "slot churn: grants in four databases over three slots ($granted)");
is($bad_errors, '', 'slot churn: no error but 53400');
is($overlaps, 0, 'slot churn: no key granted while an acknowledged lease of it ran');

unlike(slurp_file($node->logfile), qr/XX000|TRAP|terminated by signal/,
	'no internal error, assertion failure or crash in the server log');
$node->stop;
done_testing();
