# What a session's settings can and cannot change:
#  a. dlock.fence_bypass logs one line per statement and table, not one per
#     row;
#  b. an ordinary role cannot bypass fencing by setting dlock.fence_bypass
#     before the library is loaded (a placeholder), at connection start, or
#     through a role setting made by a superuser;
#  c. two sessions in different time zones racing for the same
#     timestamptz-keyed row: only one of them holds the row's lease and can
#     write it;
#  d. PREPARE TRANSACTION is refused (0A000) once a transaction used dlock,
#     on a server that allows prepared transactions, and the refusal leaves
#     no lock behind.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use FindBin;
use lib $FindBin::RealBin;
use DlockCluster;

my $node = dlock_node('session_settings', conf => 'max_prepared_transactions = 2');
$node->safe_psql('postgres', q{
	CREATE EXTENSION dlock;
	CREATE ROLE plain LOGIN;
	CREATE TABLE bulk (id int NOT NULL, v int, fence bigint);
	CREATE TRIGGER bulk_fence BEFORE INSERT OR UPDATE OR DELETE ON bulk
	  FOR EACH ROW EXECUTE FUNCTION dlock.fence_guard('bulk:{id}', 'fence');
	GRANT SELECT, INSERT, UPDATE, DELETE ON bulk TO plain;
	CREATE TABLE ev (day timestamptz PRIMARY KEY, v text NOT NULL, fence bigint);
	CREATE TRIGGER ev_fence BEFORE INSERT OR UPDATE OR DELETE ON ev
	  FOR EACH ROW EXECUTE FUNCTION dlock.fence_guard('ev:{day}', 'fence');
	CREATE TABLE plain_table (v int);
});

# The number of bypass log lines written to the server log since offset.
sub bypass_lines_since
{
	my ($offset) = @_;
	my $log = slurp_file($node->logfile, $offset);
	my @lines = ($log =~ /LOG:  dlock: fencing bypassed by role/g);
	return scalar @lines;
}

# Run sql (a psql script) with ON_ERROR_STOP off; return (stdout, stderr).
sub run_script
{
	my ($sql, %params) = @_;
	my ($out, $err);
	$node->psql('postgres', $sql,
		stdout => \$out, stderr => \$err, on_error_stop => 0, %params);
	return ($out, $err);
}

#
# a. One LOG line per statement (and table), not per row.
#
my $admin = $node->background_psql('postgres');
$admin->query_safe('SET dlock.fence_bypass = on');
my $offset = -s $node->logfile;
$admin->query_safe('INSERT INTO bulk SELECT g, 0 FROM generate_series(1, 1000) g');
is($node->safe_psql('postgres', 'SELECT count(*) FROM bulk'),
	'1000', 'superuser with dlock.fence_bypass inserted 1000 rows without a token');
is(bypass_lines_since($offset), 1,
	'the 1000-row INSERT logged the bypass once');
like(slurp_file($node->logfile, $offset),
	qr/LOG:  dlock: fencing bypassed by role "\w+" for writes to table "bulk", first key "bulk:1"/,
	'the line names the role, the table and the first key');
$admin->query_safe('UPDATE bulk SET v = 1');
is(bypass_lines_since($offset), 2,
	'a second statement (a 1000-row UPDATE) logged one more line');
$admin->query_safe('BEGIN');
$admin->query_safe('DELETE FROM bulk WHERE id <= 500');
$admin->query_safe('DELETE FROM bulk');
$admin->query_safe('COMMIT');
is(bypass_lines_since($offset), 4,
	'two DELETE statements in one transaction logged one line each');
$admin->quit;

#
# b. An ordinary role cannot bypass fencing, however it sets the parameter.
#
$offset = -s $node->logfile;

# In a fresh session nothing has loaded the dlock library yet, so SET takes
# the value as a placeholder; when the library loads, it refuses it.
my ($out, $err) = run_script(q{
SET dlock.fence_bypass = on;
\echo set :SQLSTATE
SHOW dlock.fence_bypass;
INSERT INTO bulk VALUES (1, 0);
\echo insert :SQLSTATE
SHOW dlock.fence_bypass;
SET dlock.fence_bypass = on;
\echo set_again :SQLSTATE
}, extra_params => [ '-U', 'plain' ]);
note "stdout:\n$out\nstderr:\n$err";
like($out, qr/^set 00000\non\n/,
	'before the library is loaded, SET accepts a placeholder');
like($err, qr/WARNING:  permission denied to set parameter "dlock.fence_bypass"/,
	'loading the library rejects the placeholder with a WARNING');
like($out, qr/^insert LF001$/m, 'the write without a token is refused with LF001');
like($err, qr/ERROR:  no fencing token presented for key "bulk:1"/,
	'refused as presenting no token: nothing was bypassed');
like($out, qr/^insert LF001\noff\n/m, 'the parameter is off once the library is loaded');
like($out, qr/^set_again 42501$/m, 'a SET after the library is loaded fails with 42501');
like($err, qr/ERROR:  permission denied to set parameter "dlock.fence_bypass"/,
	'with permission denied');

# At connection start (options=-c ...): the same.
($out, $err) = run_script(q{
SHOW dlock.fence_bypass;
INSERT INTO bulk VALUES (2, 0);
\echo insert :SQLSTATE
SHOW dlock.fence_bypass;
}, connstr => $node->connstr('postgres') . " user=plain options='-c dlock.fence_bypass=on'");
note "stdout:\n$out\nstderr:\n$err";
like($out, qr/^on\ninsert LF001\noff$/,
	'set at connection start: accepted as a placeholder, refused at load, write refused');
like($err, qr/WARNING:  permission denied to set parameter "dlock.fence_bypass"/,
	'with the same WARNING');

# A superuser's ALTER ROLE ... SET reaches the session, but the trigger
# checks the writing role's privilege.
$node->safe_psql('postgres', 'ALTER ROLE plain SET dlock.fence_bypass = on');
($out, $err) = run_script(q{
INSERT INTO bulk VALUES (3, 0);
\echo insert :SQLSTATE
}, extra_params => [ '-U', 'plain' ]);
note "stdout:\n$out\nstderr:\n$err";
like($out, qr/^insert 42501$/m,
	'a role setting made by a superuser does not let an ordinary role bypass');
like($err, qr/ERROR:  permission denied to bypass fencing/, 'permission denied to bypass fencing');
$node->safe_psql('postgres', 'ALTER ROLE plain RESET dlock.fence_bypass');

is($node->safe_psql('postgres', 'SELECT count(*) FROM bulk'), '0',
	'the ordinary role wrote no row');
is(bypass_lines_since($offset), 0, 'and no bypass was logged');

#
# c. Two sessions, UTC and Europe/Berlin, racing for one row.
#
$node->safe_psql('postgres', q{
	SET dlock.fence_bypass = on;
	INSERT INTO ev VALUES ('2026-01-01 00:00:00+00', 'initial');
});
my $utc = $node->background_psql('postgres', on_error_stop => 0);
my $berlin = $node->background_psql('postgres', on_error_stop => 0);
$utc->query_safe(q{SET TimeZone = 'UTC'});
$berlin->query_safe(q{SET TimeZone = 'Europe/Berlin'});

# The row's text output differs between the sessions ...
my $naive = q{SELECT 'ev:' || day FROM ev};
is($utc->query_safe($naive), 'ev:2026-01-01 00:00:00+00', 'the UTC session prints the UTC time');
is($berlin->query_safe($naive), 'ev:2026-01-01 01:00:00+01', 'the Berlin session prints Berlin time');
# ... the key computed as the README says (UTC, ISO) does not.
my $proper_key = q{'ev:' || to_char(day AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI:SS') || '+00'};
my $proper = "SELECT $proper_key FROM ev";
is($utc->query_safe($proper), 'ev:2026-01-01 00:00:00+00', 'UTC session: the key in UTC');
is($berlin->query_safe($proper), 'ev:2026-01-01 00:00:00+00', 'Berlin session: the same key');

# Each session takes "the" lease of the row by its naive key: both are
# granted, under two keys ...
my $a_fence = $utc->query_safe(
	q{SELECT l.fence FROM ev, dlock.try_acquire('ev:' || day, '1 hour') l});
my $b_fence = $berlin->query_safe(
	q{SELECT l.fence FROM ev, dlock.try_acquire('ev:' || day, '1 hour') l});
like($a_fence, qr/^\d+$/, 'the UTC session was granted its naive key');
like($b_fence, qr/^\d+$/, 'the Berlin session was granted its naive key');
cmp_ok($b_fence, '>', $a_fence, 'the Berlin grant has the newer token');

# ... but only the row's one key protects it: the Berlin session's writes,
# with its newer token, are refused ...
my ($res, $failed) = $berlin->query(
	qq{UPDATE ev SET v = 'berlin', fence = $b_fence});
ok($failed, 'the Berlin session cannot write the row with its token in the column');
like($berlin->{stderr}, qr/fencing token was not issued for key "ev:2026-01-01 00:00:00\+00"/,
	'refused under the row\'s UTC key');
$berlin->{stderr} = '';
($res, $failed) = $berlin->query(qq{
	BEGIN;
	SELECT dlock.use_fence('ev:2026-01-01 01:00:00+01', $b_fence);
	UPDATE ev SET v = 'berlin';
});
ok($failed, 'nor with use_fence on its naive key');
like($berlin->{stderr}, qr/no fencing token presented for key "ev:2026-01-01 00:00:00\+00"/,
	'refused as presenting no token for the row\'s key');
$berlin->{stderr} = '';
$berlin->query_safe('ROLLBACK');

# ... and the UTC session's write goes through.
($res, $failed) = $utc->query(qq{UPDATE ev SET v = 'utc', fence = $a_fence});
ok(!$failed, 'the UTC session writes the row with its token')
  or diag $utc->{stderr};
$utc->{stderr} = '';
is($node->safe_psql('postgres', 'SELECT v FROM ev'), 'utc',
	'the UTC session, holder of the row\'s key, wrote the row');

# Computed as the README says, the Berlin session finds the row's key held.
is($berlin->query_safe(
		"SELECT count(*) FROM ev, dlock.try_acquire($proper_key, '1 hour')"),
	'0', 'the Berlin session\'s try_acquire of the row\'s key returns no row');
is($berlin->query_safe(qq{SELECT dlock.check_fence('ev:2026-01-01 00:00:00+00', $b_fence)}),
	'f', 'its token is not valid for the row\'s key');
$utc->quit;
$berlin->quit;

#
# d. PREPARE TRANSACTION after using dlock: refused with 0A000.
#
($out, $err) = run_script(q{
BEGIN;
INSERT INTO plain_table VALUES (1);
PREPARE TRANSACTION 'no_dlock';
\echo plain :SQLSTATE
COMMIT PREPARED 'no_dlock';
});
like($out, qr/^plain 00000$/m,
	'a transaction that did not use dlock can be prepared (the server allows it)');

# lock_timeout everywhere below: if a transaction were prepared with dlock's
# key locks, the statements after it would wait for them forever.
my ($p_owner, $p_fence) = split /\|/, $node->safe_psql('postgres',
	q{SELECT owner, fence FROM dlock.try_acquire('prep', '1 hour')});
($out, $err) = run_script(qq{
SET lock_timeout = '10s';
BEGIN;
SELECT dlock.use_fence('prep', $p_fence);
PREPARE TRANSACTION 'with_fence';
\\echo use_fence :SQLSTATE
BEGIN;
SELECT count(*) FROM dlock.try_acquire('prep-grant', '1 hour');
PREPARE TRANSACTION 'with_grant';
\\echo grant :SQLSTATE
BEGIN;
SELECT dlock.release('prep', '$p_owner');
PREPARE TRANSACTION 'with_release';
\\echo release :SQLSTATE
});
note "stdout:\n$out\nstderr:\n$err";
like($out, qr/^use_fence 0A000$/m, 'PREPARE after use_fence: 0A000');
like($out, qr/^grant 0A000$/m, 'PREPARE after a grant: 0A000');
like($out, qr/^release 0A000$/m, 'PREPARE after a release: 0A000');
like($err, qr/ERROR:  cannot PREPARE a transaction that has used dlock/,
	'with a message that says why');
is($node->safe_psql('postgres', 'SELECT count(*) FROM pg_prepared_xacts'),
	'0', 'no transaction was prepared');
is($node->safe_psql('postgres',
		q{SET lock_timeout = '10s'; SELECT count(*) FROM dlock.try_acquire('prep-grant', '1 hour')}),
	'1', 'the refused grant was rolled back: the key is free');
is($node->safe_psql('postgres',
		qq{SET lock_timeout = '10s'; SELECT dlock.check_fence('prep', $p_fence)}),
	't', 'the refused release was rolled back: the lease is still held');
# release waits for the transactions writing under the lease
is($node->safe_psql('postgres',
		qq{SET lock_timeout = '10s'; SELECT dlock.release('prep', '$p_owner')}),
	't', 'no lock was left behind: the holder releases at once');

# should anything have been prepared after all, do not leave it behind
for my $gid (split /\n/, $node->safe_psql('postgres', 'SELECT gid FROM pg_prepared_xacts'))
{
	$node->safe_psql('postgres', "ROLLBACK PREPARED '$gid'");
}

# e. SERIALIZABLE acquirers of the same keys do not fail each other with
# 40001: dlock reads its lease rows without an MVCC snapshot, so its reads
# take no predicate locks.  (With GetLatestSnapshot reads, about 1 call in
# 4 failed here.)
$node->pgbench(
	'-n -c 4 -j 2 -T 4',
	0,
	[ qr{processed: [1-9]}, qr{number of failed transactions: 0 \(0\.000%\)} ],
	[qr{^$}],
	'4 SERIALIZABLE clients acquire 3 keys with 20 ms leases: no serialization failures',
	{
		'serializable' => q{
\set k random(1, 3)
BEGIN ISOLATION LEVEL SERIALIZABLE;
SELECT fence FROM dlock.acquire('ser:' || :k, '20 milliseconds', wait => '2 seconds');
COMMIT;
}
	});

$node->stop;
done_testing();
