# Memory mode (dlock.storage = memory): what an attack on it found, each
# checked here.
#
# 1. The horizon is never set back: a setval of dlock.horizon_seq by a
#    restore after the database's first use is obeyed (the barrier moves
#    with it, grants are refused until then), and a later grant moves the
#    sequence forward from it, not from the value cached before.
# 2. A session that used dlock before ALTER EXTENSION dlock UPDATE to 0.4
#    grants afterwards without an internal error.
# 3. dlock.lease_status shows a key once when a savepoint undid this
#    transaction's change of it while another change stays.
# 4. A full hash makes room by itself: entries of ended leases (released,
#    expired) are dropped as prune() would; a hash full of live leases
#    gives 53200 and loses nothing.
# 5. A grant whose confirmation of the horizon is cancelled (synchronous
#    standbys that never answer, statement_timeout) leaves the horizon
#    sequence ahead of what was confirmed: the next grant confirms it, it
#    does not take it for a restore's and lock the database out.
# 6. The horizon sequence is never left behind a lease: not after it was
#    set back (a data-only restore of an older dump), nor after a rolled
#    back ALTER EXTENSION UPDATE that granted (its sequence is gone, the
#    horizon it set is not), and that session grants without an error.
# 7. Many transactions moving the horizon at once, each granting twice,
#    right after the database's first use (whose read of the horizon keeps
#    the sequence's RowExclusiveLock): no deadlock, no failure.
# 8. A first call in a database that waits for a DROP EXTENSION gets a
#    clear error (55000) once the drop commits, not XX000.
# 9. PREPARE TRANSACTION of a transaction that granted is refused (0A000):
#    its change lives in the backend; the key stays free.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use FindBin;
use lib $FindBin::RealBin;
use DlockCluster;

my $node = dlock_node('edges', streaming => 1, conf => q{
shared_preload_libraries = 'dlock'
dlock.storage = memory
dlock.memory_max_keys = 100
dlock.horizon_margin = '1s'
max_prepared_transactions = 2
});

# Run $sql in $db; return the SQLSTATE of its error ('' if none) and stdout.
sub run_sql { return try_sql($node, @_) }

# 1. The horizon set by somebody else after the first use.
$node->safe_psql('postgres', 'CREATE DATABASE h');
$node->safe_psql('h', 'CREATE EXTENSION dlock');
is($node->safe_psql('h', q{SELECT dlock.check_fence('job', 1)}), 'f',
	'first use of the database: nothing held');
is($node->safe_psql('h', q{SELECT count(*) FROM dlock.try_acquire('early', '10 min')}),
	'1', 'a lease granted before the restore');
# what a restore's SEQUENCE SET does: the source's leases run for an hour
$node->safe_psql('h', q{
	SELECT setval('dlock.horizon_seq',
		((extract(epoch FROM now() + interval '1 hour')
		  - extract(epoch FROM timestamptz '2000-01-01 00:00:00+00'))
		 * 1000000)::int8, true)});
my $set = $node->safe_psql('h', 'SELECT last_value FROM dlock.horizon_seq');
is($node->safe_psql('h', q{SELECT count(*) FROM dlock.try_acquire('job', '1 min')}),
	'0', 'a grant after the horizon was raised by a setval is refused');
is($node->safe_psql('h', q{SELECT count(*) FROM dlock.try_acquire('other', '1 min')}),
	'0', '... and so is any key, until that horizon');
cmp_ok($node->safe_psql('h', 'SELECT last_value FROM dlock.horizon_seq'),
	'>=', $set, 'the horizon was not set back');
my ($state) = run_sql('h',
	q{SELECT * FROM dlock.acquire('job', '1 min', wait => '200 ms')});
is($state, '55P03', 'acquire waits for that horizon, then times out');
is($node->safe_psql('h', 'SELECT count(*) FROM dlock.lease_status'), '0',
	'lease_status lists nothing while the barrier holds every key');

# 2. A session open across ALTER EXTENSION UPDATE to 0.4.
$node->safe_psql('postgres', 'CREATE DATABASE u');
$node->safe_psql('u', q{CREATE EXTENSION dlock VERSION '0.3'});
my $bg = $node->background_psql('u', on_error_stop => 0);
my $first = $bg->query(q{SELECT count(*) FROM dlock.try_acquire('k1', '1 min')});
like($bg->{stderr}, qr/needs version 0.4/,
	'memory mode on 0.3: a clear error');
$bg->{stderr} = '';
$node->safe_psql('u', 'ALTER EXTENSION dlock UPDATE');
my $after = $bg->query(q{SELECT count(*) FROM dlock.try_acquire('k2', '1 min')});
is($after, '1', 'the same session grants after the upgrade');
unlike($bg->{stderr}, qr/ERROR/, '... without an error');
$bg->quit;

# 3. No key twice in lease_status.
$node->safe_psql('postgres', 'CREATE DATABASE s');
$node->safe_psql('s', 'CREATE EXTENSION dlock');
my $keys = $node->safe_psql('s', q{
	CREATE TEMP TABLE o AS
		SELECT key, owner FROM dlock.try_acquire('A', '10 min')
		UNION ALL SELECT key, owner FROM dlock.try_acquire('B', '10 min');
	BEGIN;
	SELECT dlock.renew('A', (SELECT owner FROM o WHERE key = 'A'), '10 min');
	SAVEPOINT a;
	SELECT dlock.release('B', (SELECT owner FROM o WHERE key = 'B'));
	ROLLBACK TO a;
	SELECT string_agg(key, ',' ORDER BY key) FROM dlock.lease_status;
	COMMIT;
});
like($keys, qr/^A,B$/m, 'lease_status lists each key once after ROLLBACK TO');

# 4. A full hash (100 entries, some used by the databases above).
$node->safe_psql('postgres', 'CREATE DATABASE f');
$node->safe_psql('f', 'CREATE EXTENSION dlock');
my ($st, $n) = run_sql('f', q{
	SELECT count(*) FROM generate_series(1, 200) i,
		LATERAL dlock.try_acquire('live' || i, '1 min')});
is($st, '53200', 'a hash full of live leases refuses a new key with 53200');
is($node->safe_psql('f', 'SELECT count(*) FROM dlock.lease_status'),
	'0', '... the statement that failed granted nothing');
# fill it with live leases one statement at a time, then release them all
$node->safe_psql('f', q{
	CREATE TABLE held (key text, owner uuid);
	DO $$
	DECLARE i int := 0;
	BEGIN
		LOOP
			i := i + 1;
			BEGIN
				INSERT INTO held SELECT key, owner
					FROM dlock.try_acquire('live' || i, '1 min');
			EXCEPTION WHEN out_of_memory THEN
				EXIT;
			END;
		END LOOP;
	END $$});
my $nheld = $node->safe_psql('f', 'SELECT count(*) FROM held');
cmp_ok($nheld, '>', 10, "$nheld live leases fill the hash");
($st) = run_sql('f', q{SELECT * FROM dlock.try_acquire('one-more', '1 min')});
is($st, '53200', 'full of live leases: 53200');
is($node->safe_psql('f', 'SELECT count(*) FROM dlock.lease_status'),
	$nheld, '... and every live lease is still there');
$node->safe_psql('f',
	'SELECT count(*) FROM held, LATERAL dlock.release(key, owner) r WHERE r');
is($node->safe_psql('f', q{SELECT count(*) FROM dlock.try_acquire('one-more', '1 min')}),
	'1', 'after the releases a new key is granted: ended leases made room');
is($node->safe_psql('f', q{
	SELECT count(*) FROM generate_series(1, 20) i,
		LATERAL dlock.try_acquire('again' || i, '1 min')}),
	'20', '... and more');
# a dropped database's entries are room too: fill the hash with live
# leases again, then drop the database holding two of the others
$node->safe_psql('f', q{
	DO $$
	DECLARE i int := 0;
	BEGIN
		LOOP
			i := i + 1;
			BEGIN
				PERFORM * FROM dlock.try_acquire('full' || i, '1 min');
			EXCEPTION WHEN out_of_memory THEN
				EXIT;
			END;
		END LOOP;
	END $$});
($st) = run_sql('f', q{SELECT * FROM dlock.try_acquire('dropped1', '1 min')});
is($st, '53200', 'full of live leases again');
$node->safe_psql('postgres', 'DROP DATABASE s');
is($node->safe_psql('f', q{
	SELECT count(*) FROM generate_series(1, 2) i,
		LATERAL dlock.try_acquire('dropped' || i, '1 min')}),
	'2', 'the entries of a dropped database are reclaimed when room is needed');

# 5. A cancelled confirmation of the horizon (in room freed by dropping f).
$node->safe_psql('postgres', 'DROP DATABASE f');
$node->safe_psql('postgres', 'CREATE DATABASE c');
$node->safe_psql('c', 'CREATE EXTENSION dlock');
my ($hold_owner, $hold_fence) = split /\|/, $node->safe_psql('c',
	q{SELECT owner, fence FROM dlock.try_acquire('holder', '5 min')});
$node->safe_psql('postgres',
	q{ALTER SYSTEM SET synchronous_standby_names = 'nobody'; SELECT pg_reload_conf()});
# the checkpointer publishes that standbys are defined after it reloads
sleep 2;
my $out;
($state, $out) = run_sql('c', q{
	SET statement_timeout = '500ms';
	SELECT * FROM dlock.try_acquire('far', '20 min')});
is($state, '57014', 'a grant whose horizon the standbys never confirm is cancelled');
$node->safe_psql('postgres',
	q{ALTER SYSTEM RESET synchronous_standby_names; SELECT pg_reload_conf()});
is($node->safe_psql('c', q{SELECT count(*) FROM dlock.try_acquire('after', '15 min')}),
	'1', 'the next grant confirms the cancelled horizon and is granted');
is($node->safe_psql('c', q{SELECT count(*) FROM dlock.try_acquire('short', '1 s')}),
	'1', '... and so is a short one: the database is not locked out');
is($node->safe_psql('c', "SELECT dlock.check_fence('holder', $hold_fence)"),
	't', 'the lease held before is still held');

# 6. The horizon sequence behind a lease.
sub horizon_covers
{
	my ($db, $key) = @_;
	return $node->safe_psql($db, qq{
		SELECT (SELECT last_value FROM dlock.horizon_seq)
		  >= ((extract(epoch FROM expires_at)
			  - extract(epoch FROM timestamptz '2000-01-01 00:00:00+00'))
			 * 1000000)::int8
		FROM dlock.lease_status WHERE key = '$key'});
}
$node->safe_psql('c', q{SELECT count(*) FROM dlock.try_acquire('long', '30 min')});
$node->safe_psql('c', q{
	SELECT setval('dlock.horizon_seq',
		((extract(epoch FROM now() - interval '1 day')
		  - extract(epoch FROM timestamptz '2000-01-01 00:00:00+00'))
		 * 1000000)::int8, true)});
is($node->safe_psql('c', q{SELECT count(*) FROM dlock.try_acquire('brief', '1 min')}),
	'1', 'a grant after the horizon was set back');
is(horizon_covers('c', 'long'), 't',
	'... moved the horizon back over the live lease it had covered');

$node->safe_psql('postgres', 'CREATE DATABASE u2');
$node->safe_psql('u2', q{CREATE EXTENSION dlock VERSION '0.3'});
my $u2 = $node->background_psql('u2', on_error_stop => 0);
$u2->query(q{
	BEGIN;
	ALTER EXTENSION dlock UPDATE TO '0.4';
	SELECT count(*) FROM dlock.try_acquire('probe', '1 hour');
	SELECT count(*) FROM dlock.lease_status;
	ROLLBACK});
$u2->{stderr} = '';
$node->safe_psql('u2', q{ALTER EXTENSION dlock UPDATE TO '0.4'});
is($u2->query(q{SELECT count(*) FROM dlock.try_acquire('job', '30 min')}), '1',
	'after a rolled-back update that granted, the same session grants');
unlike($u2->{stderr}, qr/ERROR/, '... without an error');
$u2->quit;
is(horizon_covers('u2', 'job'), 't',
	'... and the horizon sequence covers that lease');

# 7. Concurrent moves of the horizon (a margin of 0: every grant moves it).
$node->safe_psql('postgres', 'DROP DATABASE u2');
$node->safe_psql('postgres', 'CREATE DATABASE p');
$node->safe_psql('p', 'CREATE EXTENSION dlock');
$node->append_conf('postgresql.conf', "dlock.horizon_margin = 0\n");
$node->reload;
my $script = $node->basedir . '/two_grants.sql';
PostgreSQL::Test::Utils::append_to_file($script, q{
BEGIN;
SELECT count(*) FROM dlock.try_acquire('a' || (random() * 40)::int, (1 + random() * 3)::int * interval '100 ms');
SELECT count(*) FROM dlock.try_acquire('b' || (random() * 40)::int, (1 + random() * 3)::int * interval '100 ms');
COMMIT;
});
# two transactions that each moved the horizon, then move it again
my ($ta, $tb) = map { $node->background_psql('p', on_error_stop => 0) } 1 .. 2;
# (a statement_timeout, so that a wait for the other shows as a failure)
$ta->query(q{SET statement_timeout = '5s'; BEGIN; SELECT count(*) FROM dlock.try_acquire('tx', '1 min')});
$tb->query(q{SET statement_timeout = '5s'; BEGIN; SELECT count(*) FROM dlock.try_acquire('ty', '2 min')});
$ta->query_until(qr/sent/, "\\echo sent\nSELECT count(*) FROM dlock.try_acquire('tz', '3 min');\n");
my $second = $tb->query(q{SELECT count(*) FROM dlock.try_acquire('tw', '4 min')});
$ta->query('SELECT 1');
is($second, '1', 'a transaction that moved the horizon moves it again while another did too');
unlike($ta->{stderr} . $tb->{stderr}, qr/deadlock|timeout/,
	'... without waiting for it, nor a deadlock');
$ta->query('COMMIT');
$tb->query('COMMIT');
$ta->quit;
$tb->quit;

my $logstart = -s $node->logfile;
my ($pb_out, $pb_err) = ('', '');
IPC::Run::run([ 'pgbench', '-n', '-c', '8', '-T', '3', '-f', $script,
		'-h', $node->host, '-p', $node->port, 'p' ],
	'>', \$pb_out, '2>', \$pb_err);
like($pb_out, qr/number of failed transactions: 0 /,
	'8 clients moving the horizon at once, two grants a transaction: no failure');
unlike(substr(PostgreSQL::Test::Utils::slurp_file($node->logfile), $logstart),
	qr/deadlock detected/, '... and no deadlock');

# 8. DROP EXTENSION racing the first call.
$node->safe_psql('postgres', 'CREATE DATABASE d');
$node->safe_psql('d', 'CREATE EXTENSION dlock');
my $dropper = $node->background_psql('d', on_error_stop => 0);
my $caller = $node->background_psql('d', on_error_stop => 0);
$dropper->query('BEGIN; DROP EXTENSION dlock');
$caller->query_until(qr/sent/, "\\set VERBOSITY verbose\n\\echo sent\nSELECT dlock.release('x', gen_random_uuid());\n");
ok( $node->poll_query_until('d', q{
		SELECT count(*) > 0 FROM pg_stat_activity
		WHERE wait_event_type = 'Lock' AND query LIKE '%dlock.release%'}),
	'the first call waits for the uncommitted DROP EXTENSION');
$dropper->query('COMMIT');
$caller->query('SELECT 1');
like($caller->{stderr}, qr/ERROR:\s+55000/,
	'... and gets 55000 when it commits');
unlike($caller->{stderr}, qr/XX000/, '... not XX000');
$dropper->quit;
$caller->quit;

# 9. PREPARE TRANSACTION.
$node->safe_psql('postgres', 'CREATE DATABASE x');
$node->safe_psql('x', 'CREATE EXTENSION dlock');
($state) = run_sql('x', q{
	BEGIN;
	SELECT count(*) FROM dlock.try_acquire('prep', '1 min');
	PREPARE TRANSACTION 'p1'});
is($state, '0A000', 'PREPARE TRANSACTION after a grant is refused');
is($node->safe_psql('x', q{SELECT count(*) FROM pg_prepared_xacts}), '0',
	'... nothing was prepared');
is($node->safe_psql('x', q{SELECT count(*) FROM dlock.try_acquire('prep', '1 min')}),
	'1', '... and the key is free');

$node->stop;
done_testing();
