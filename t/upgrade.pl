# Upgrading to dlock 0.3 (issue 7).
#
# 1. With the 0.3 library installed, an extension still at 0.2 (the lease
#    table has its six columns) keeps working: try_acquire, acquire (woken
#    by a release), renew, release, use_fence and the fencing trigger.
# 2. An install of 0.1 with leases and a fenced table, upgraded with ALTER
#    EXTENSION dlock UPDATE (0.1 -> 0.2 -> 0.3): the old leases renew and
#    release with their owners, tokens keep rising, the fenced table still
#    refuses a stale write (LF001) and accepts the current one, the new
#    columns read NULL for the old rows, and the new arguments
#    (session_bound, lock_delay) and dlock.max_hold work.
# 2b. An install of 0.6 with a held lease, updated to 0.7 (issue 20): the
#    lease has no value, leader() shows it, its owner proclaims, its token
#    still fences writes, and a campaign gets a larger token.
# 3. The upgraded databases (from 0.1, 0.2 and 0.6, through the chain to
#    the default version) have exactly the objects of a
#    fresh install of it: members, functions with their
#    arguments and properties, relations, columns, views, types,
#    sequences, constraints, dependencies, grants, initial privileges and
#    comments.
#
# The server preloads dlock, so that the counters and the FIFO queues work
# on the old versions too.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use FindBin;
use lib $FindBin::RealBin;
use DlockCluster;

my $node = dlock_node('upgrade', conf => "shared_preload_libraries = 'dlock'\n");

# Run $sql in database $db in a psql of its own that stops at the first
# error; return the SQLSTATE of the error ('' when none) and the output.
sub run_sql { return try_sql($node, @_) }

# The extension's version in $db.
sub version
{
	my ($db) = @_;
	return $node->safe_psql($db,
		"SELECT extversion FROM pg_extension WHERE extname = 'dlock'");
}

# Grant key in $db for an hour; return owner and fence.
sub grant
{
	my ($db, $key) = @_;
	return split /\|/, $node->safe_psql($db,
		"SELECT owner, fence FROM dlock.try_acquire('$key', '1 hour')");
}

my $fenced_table = q{
	CREATE TABLE stock (id int PRIMARY KEY, qty int, fence bigint);
	CREATE TRIGGER stock_fence BEFORE INSERT OR UPDATE OR DELETE ON stock
		FOR EACH ROW EXECUTE FUNCTION dlock.fence_guard('f', 'fence');
	CREATE TABLE woken (who text, fence bigint);
};

#
# 1. The 0.3 library with the extension at 0.2.
#
$node->safe_psql('postgres', 'CREATE DATABASE v02');
$node->safe_psql('v02', "CREATE EXTENSION dlock VERSION '0.2'");
$node->safe_psql('v02', $fenced_table);
is(version('v02'), '0.2', '0.2: installed');
is( $node->safe_psql('v02', q{
		SELECT count(*) FROM pg_attribute
		WHERE attrelid = 'dlock.leases'::regclass AND attnum > 0}),
	'6', '0.2: the lease table has six columns');

my ($o2a, $f2a) = grant('v02', 'a');
like($f2a, qr/^\d+$/, '0.2: try_acquire grants');
is($node->safe_psql('v02', "SELECT count(*) FROM dlock.try_acquire('a', '1 hour')"),
	'0', '0.2: try_acquire of a held key returns no row');
is($node->safe_psql('v02', "SELECT dlock.renew('a', '$o2a', '2 hours') > now() + interval '90 minutes'"),
	't', '0.2: renew');
is((run_sql('v02', "SELECT dlock.acquire('a', '1 hour', wait => '100 ms')"))[0],
	'55P03', '0.2: acquire of a held key times out');
is( (run_sql('v02', "BEGIN; SELECT dlock.use_fence('a', $f2a); COMMIT;"))[0],
	'', '0.2: use_fence with the current token');
is((run_sql('v02', "BEGIN; SELECT dlock.use_fence('a', $f2a - 1); COMMIT;"))[0],
	'LF001', '0.2: use_fence with another token is refused');

# acquire() waits, and is woken by the release.
my ($w, $wpid) = backend_session($node, 'v02');
$w->query_until(qr/waiting/, q{
	\echo waiting
	INSERT INTO woken SELECT 'w', fence FROM dlock.acquire('a', '1 hour', wait => '60 s');
});
ok(sleeps_in_dlock($node, 'v02', $wpid), '0.2: acquire() sleeps while the key is held');
is($node->safe_psql('v02', "SELECT dlock.release('a', '$o2a')"), 't', '0.2: release');
ok($node->poll_query_until('v02', "SELECT count(*) = 1 FROM woken WHERE fence > $f2a"),
	'0.2: the waiter was granted after the release, with a larger token');
$w->quit;

# The fencing trigger, and max_hold (capped at the grant; no column to keep
# the limit in before the upgrade).
my ($o2f, $f2f) = grant('v02', 'f');
is((run_sql('v02', "INSERT INTO stock VALUES (1, 1, $f2f)"))[0],
	'', '0.2: a fenced write under the current token');
is((run_sql('v02', "INSERT INTO stock VALUES (2, 1, $f2f - 1)"))[0],
	'LF001', '0.2: a fenced write under another token is refused');
is( $node->safe_psql('v02', q{
		SET dlock.max_hold = '10s';
		SELECT count(*) FROM dlock.try_acquire('mh', '1 hour');
		SELECT expires_at - granted_at FROM dlock.leases WHERE key = 'mh';}),
	"1\n00:00:10", '0.2: dlock.max_hold caps a grant');
is( (run_sql('v02', "SELECT count(*) FROM dlock.try_acquire('sb', '1 hour', session_bound => true)"))[0],
	'42883', '0.2: no session_bound argument before the upgrade');
my $seq02 = $node->safe_psql('v02', 'SELECT last_value FROM dlock.fence_seq');
$node->safe_psql('v02', 'ALTER EXTENSION dlock UPDATE');
is(version('v02'), '0.7', '0.2 upgraded to 0.7 (the default version)');
is($node->safe_psql('v02', 'SELECT last_value FROM dlock.fence_seq'),
	$seq02, '0.2 -> 0.3: the token sequence is untouched');
is( $node->safe_psql('v02', qq{
		SELECT dlock.release('f', '$o2f') AND
			(SELECT fence > $seq02 FROM dlock.try_acquire('f', '1 hour'))}),
	't', '0.2 -> 0.3: the old lease on f released by its owner, the next grant has a larger token');
is( $node->safe_psql('v02', q{
		SELECT acquired || ' ' || renewed || ' ' || released || ' ' || timeouts
		FROM dlock.stats WHERE key = 'a'}),
	'2 1 1 1', '0.2 -> 0.3: dlock.stats shows what was counted before the upgrade');

#
# 2. 0.1, leases and a fenced table, upgraded to 0.3.
#
$node->safe_psql('postgres', 'CREATE DATABASE v01');
$node->safe_psql('v01', "CREATE EXTENSION dlock VERSION '0.1'");
$node->safe_psql('v01', $fenced_table);
is(version('v01'), '0.1', '0.1: installed');

my ($oa, $fa) = grant('v01', 'a');    # held across the upgrade
my ($ob, $fb) = grant('v01', 'b');    # held, released after the upgrade
my ($oc, $fc) = grant('v01', 'c');    # released before the upgrade
$node->safe_psql('v01', "SELECT dlock.release('c', '$oc')");
# f: a first lease writes a row, is released, a second one writes a row.
my ($of1, $ff1) = grant('v01', 'f');
$node->safe_psql('v01', "INSERT INTO stock VALUES (1, 10, $ff1)");
$node->safe_psql('v01', "SELECT dlock.release('f', '$of1')");
my ($of2, $ff2) = grant('v01', 'f');
$node->safe_psql('v01', "UPDATE stock SET qty = 11, fence = $ff2 WHERE id = 1");
is( $node->safe_psql('v01', q{
		SELECT count(*) || ' ' || bool_and(t IS NULL) FROM dlock.try_acquire('a', '1 hour') AS t}),
	'1 true', '0.1: a refused try_acquire still returns one row of NULLs');
is((run_sql('v01', "INSERT INTO stock VALUES (2, 20, $ff1)"))[0],
	'LF001', '0.1: a stale write is refused before the upgrade');
my $seq01 = $node->safe_psql('v01', 'SELECT last_value FROM dlock.fence_seq');
my $rows01 = $node->safe_psql('v01', q{
	SELECT string_agg(key || ':' || fence || ':' || coalesce(owner::text, '-') || ':'
		|| expires_at || ':' || granted_at, ' ' ORDER BY key)
	FROM dlock.leases});

$node->safe_psql('v01', 'ALTER EXTENSION dlock UPDATE');
is(version('v01'), '0.7', '0.1 upgraded to 0.7 by ALTER EXTENSION dlock UPDATE');
is($node->safe_psql('v01', 'SELECT last_value FROM dlock.fence_seq'),
	$seq01, '0.1 -> 0.3: the token sequence is untouched');
is( $node->safe_psql('v01', q{
		SELECT string_agg(key || ':' || fence || ':' || coalesce(owner::text, '-') || ':'
			|| expires_at || ':' || granted_at, ' ' ORDER BY key)
		FROM dlock.leases}),
	$rows01, '0.1 -> 0.3: the lease rows are untouched');
is( $node->safe_psql('v01', q{
		SELECT count(*) FILTER (WHERE pid IS NULL AND application_name IS NULL
			AND session_id IS NULL AND lock_delay IS NULL AND hold_limit IS NULL)
			|| '/' || count(*)
		FROM dlock.leases}),
	'4/4', '0.1 -> 0.3: the new columns are NULL in the old rows');
is( $node->safe_psql('v01', q{
		SELECT string_agg(key || ':' || state || ':' || coalesce(pid::text, 'NULL') || ':'
			|| coalesce(application_name, 'NULL') || ':' || session_bound, ' ' ORDER BY key)
		FROM dlock.lease_status}),
	'a:held:NULL:NULL:false b:held:NULL:NULL:false c:released:NULL:NULL:false f:held:NULL:NULL:false',
	'0.1 -> 0.3: lease_status shows the old leases, pid and application_name unknown, not session-bound');

# The old leases work with their owners.
is($node->safe_psql('v01', "SELECT dlock.renew('a', '$oa', '2 hours') > now() + interval '90 minutes'"),
	't', 'the old owner renews a');
is($node->safe_psql('v01', "SELECT dlock.check_fence('a', $fa)"),
	't', "a's old token is still valid");
is($node->safe_psql('v01', "SELECT dlock.release('b', '$ob')"),
	't', 'the old owner releases b');
is($node->safe_psql('v01', "SELECT dlock.renew('c', '$oc', '1 hour') IS NULL"),
	't', 'the released c cannot be renewed');
is($node->safe_psql('v01', "SELECT count(*) FROM dlock.try_acquire('a', '1 hour')"),
	'0', 'try_acquire of the held a returns no row');

# The fenced table.
is((run_sql('v01', "INSERT INTO stock VALUES (2, 20, $ff1)"))[0],
	'LF001', 'the fenced table refuses a stale write after the upgrade');
is((run_sql('v01', "BEGIN; SELECT dlock.use_fence('f', $ff1); COMMIT;"))[0],
	'LF001', 'use_fence refuses the stale token');
is((run_sql('v01', "INSERT INTO stock VALUES (2, 20, $ff2)"))[0],
	'', 'the fenced table accepts the current token');
is((run_sql('v01', "BEGIN; SELECT dlock.use_fence('f', $ff2); UPDATE stock SET qty = qty + 1; COMMIT;"))[0],
	'', 'use_fence with the current token, and writes');
is( $node->safe_psql('v01', qq{
		SELECT string_agg(id || ':' || qty || ':' || (fence = $ff2), ' ' ORDER BY id) FROM stock}),
	'1:12:true 2:21:true', 'the fenced rows are those written under the current token');

# Tokens keep rising.
my ($ob2, $fb2) = grant('v01', 'b');
cmp_ok($fb2, '>', $seq01, 'b granted again with a token above every token issued before the upgrade');
is($node->safe_psql('v01', "SELECT dlock.release('a', '$oa')"), 't', 'the old owner releases a');
my ($oa2, $fa2) = grant('v01', 'a');
cmp_ok($fa2, '>', $fb2, 'a granted again with a larger token still');
is((run_sql('v01', "BEGIN; SELECT dlock.use_fence('a', $fa); COMMIT;"))[0],
	'LF001', "a's token from before the upgrade is now stale");

# The new arguments.
is( $node->safe_psql('v01', q{
		SELECT count(*) FROM dlock.try_acquire('sb', '1 hour', holder => 'me', session_bound => true);
		SELECT state || ' ' || session_bound || ' ' || (pid = pg_backend_pid()) || ' ' || holder
		FROM dlock.lease_status WHERE key = 'sb';}),
	"1\nheld true true me", 'session_bound => true: a session-bound lease with its pid');
is( $node->safe_psql('v01', q{SELECT state FROM dlock.lease_status WHERE key = 'sb'}),
	'expired', '... that ended with its connection');
is( $node->safe_psql('v01', q{
		SELECT count(*) FROM dlock.acquire('sb', '1 hour', wait => '10 s', session_bound => true);
		SELECT state || ' ' || session_bound FROM dlock.lease_status WHERE key = 'sb';}),
	"1\nheld true", 'acquire(..., session_bound => true) takes it over');
my ($old, $fld) = split /\|/, $node->safe_psql('v01', q{
	SELECT owner, fence FROM dlock.try_acquire('ld', '1 second', lock_delay => '1 hour')});
ok($node->poll_query_until('v01', q{SELECT state = 'expired' FROM dlock.lease_status WHERE key = 'ld'}),
	'lock_delay: the 1 second lease expired unreleased');
is($node->safe_psql('v01', "SELECT count(*) FROM dlock.try_acquire('ld', '1 hour')"),
	'0', 'lock_delay: nobody gets the key during the delay');
is( $node->safe_psql('v01', q{
		SET dlock.max_hold = '10s';
		SELECT count(*) FROM dlock.try_acquire('mh', '1 hour');
		SELECT (expires_at - granted_at) || ' ' || (hold_limit - granted_at)
		FROM dlock.leases WHERE key = 'mh';}),
	"1\n00:00:10 00:00:10", 'dlock.max_hold: the grant is capped and its limit stored');
my $mho = $node->safe_psql('v01', q{SELECT owner FROM dlock.leases WHERE key = 'mh'});
is( $node->safe_psql('v01', qq{
		SELECT dlock.renew('mh', '$mho', '1 hour') = hold_limit FROM dlock.leases WHERE key = 'mh'}),
	't', 'dlock.max_hold: a renewal from a session without the cap still stops at the limit');
is( $node->safe_psql('v01', q{
		SELECT acquired || ' ' || renewed || ' ' || released FROM dlock.stats WHERE key = 'a'}),
	'2 1 1', 'dlock.stats counts what happened before the upgrade too');

#
# 2b. 0.6, a lease held across the update to 0.7 (elections).
#
$node->safe_psql('postgres', 'CREATE DATABASE v06');
$node->safe_psql('v06', "CREATE EXTENSION dlock VERSION '0.6'");
$node->safe_psql('v06', $fenced_table);
my ($o6, $f6) = grant('v06', 'f');
is((run_sql('v06', "SELECT dlock.campaign('e', 'x', '1 hour')"))[0],
	'42883', '0.6: no dlock.campaign before the update');
$node->safe_psql('v06', 'ALTER EXTENSION dlock UPDATE');
is(version('v06'), '0.7', '0.6 updated to 0.7');
is( $node->safe_psql('v06', q{
		SELECT count(*) FILTER (WHERE value IS NULL) || '/' || count(*) FROM dlock.leases}),
	'1/1', '0.6 -> 0.7: the old lease has no value');
is( $node->safe_psql('v06', "SELECT coalesce(value, 'NULL') || ' ' || (fence = $f6) FROM dlock.leader('f')"),
	'NULL true', '0.6 -> 0.7: leader() shows the lease held across the update, with its token');
is($node->safe_psql('v06', "SELECT dlock.proclaim('f', '$o6', 'here')"),
	't', '0.6 -> 0.7: its owner proclaims a value');
is((run_sql('v06', "INSERT INTO stock VALUES (1, 1, $f6)"))[0],
	'', '0.6 -> 0.7: its token still fences writes');
my ($oe, $fe) = split /\|/, $node->safe_psql('v06',
	"SELECT owner, fence FROM dlock.campaign('e', 'node-1', '1 hour')");
cmp_ok($fe, '>', $f6, '0.6 -> 0.7: a campaign has a token above every one before');
is($node->safe_psql('v06', "SELECT value || ' ' || (fence = $fe) FROM dlock.leader('e')"),
	'node-1 true', '0.6 -> 0.7: leader() after a campaign');

# Privileges changed since the install are kept across the update, on
# the objects it drops and creates again (in a database of its own: its
# catalogs differ from a fresh install's on purpose).
$node->safe_psql('postgres', 'CREATE DATABASE v06acl');
$node->safe_psql('v06acl', "CREATE EXTENSION dlock VERSION '0.6'");
$node->safe_psql('v06acl', q{
	CREATE ROLE v06_worker; CREATE ROLE v06_other;
	REVOKE EXECUTE ON FUNCTION dlock.try_acquire(text, interval, text, interval, boolean) FROM PUBLIC;
	GRANT EXECUTE ON FUNCTION dlock.try_acquire(text, interval, text, interval, boolean) TO v06_worker;
	REVOKE SELECT ON dlock.lease_status FROM PUBLIC;
	GRANT SELECT ON dlock.lease_status TO v06_worker;
});
$node->safe_psql('v06acl', 'ALTER EXTENSION dlock UPDATE');
is( $node->safe_psql('v06acl', q{
		SELECT has_function_privilege('v06_worker', 'dlock.try_acquire(text, interval, text, interval, boolean, integer, text)', 'EXECUTE')
			|| ' ' || has_function_privilege('v06_other', 'dlock.try_acquire(text, interval, text, interval, boolean, integer, text)', 'EXECUTE')
			|| ' ' || has_table_privilege('v06_worker', 'dlock.lease_status', 'SELECT')
			|| ' ' || has_table_privilege('v06_other', 'dlock.lease_status', 'SELECT')
			|| ' ' || has_function_privilege('v06_other', 'dlock.acquire(text, interval, interval, text, interval, boolean, integer, text)', 'EXECUTE')}),
	'true false true false true',
	'0.6 -> 0.7: try_acquire and lease_status, created again, keep the privileges granted and revoked before; acquire keeps its default');

#
# 3. The upgraded installs have exactly the objects of a fresh install of
#    the default version.
#
$node->safe_psql('postgres', 'CREATE DATABASE fresh');
$node->safe_psql('fresh', 'CREATE EXTENSION dlock');
$node->safe_psql('fresh', $fenced_table);
is(version('fresh'), '0.7', 'a fresh install is 0.7 (0.1 and the update scripts)');

# Show the lines that only one of two listings has.
sub diag_lines
{
	my ($fresh, $upgraded) = @_;
	my %f = map { $_ => 1 } split /\n/, $fresh;
	my %u = map { $_ => 1 } split /\n/, $upgraded;
	diag "only in the fresh install: $_" for grep { !$u{$_} } split /\n/, $fresh;
	diag "only in the upgraded one: $_" for grep { !$f{$_} } split /\n/, $upgraded;
	return;
}

# Objects of the extension's schema, and what depends on them.
my $in_dlock = q{(pg_identify_object(classid, objid, objsubid)).schema = 'dlock'
	OR (pg_identify_object(refclassid, refobjid, refobjsubid)).schema = 'dlock'};
my %catalog = (
	'extension members' => q{
		SELECT pg_describe_object(classid, objid, objsubid)
		FROM pg_depend
		WHERE refclassid = 'pg_extension'::regclass AND deptype = 'e'
		  AND refobjid = (SELECT oid FROM pg_extension WHERE extname = 'dlock')
		ORDER BY 1},
	'functions' => q{
		SELECT p.oid::regprocedure, pg_get_function_arguments(p.oid),
			pg_get_function_result(p.oid), p.proretset, p.prorows, p.procost,
			p.provolatile, p.proparallel, p.proisstrict, p.prosecdef,
			p.proleakproof, p.prokind, l.lanname, p.proconfig,
			p.prosrc, p.probin, p.proowner::regrole, p.proacl,
			obj_description(p.oid, 'pg_proc')
		FROM pg_proc p JOIN pg_language l ON l.oid = p.prolang
		WHERE p.pronamespace = 'dlock'::regnamespace
		ORDER BY p.oid::regprocedure::text},
	'relations' => q{
		SELECT c.relname, c.relkind, c.relpersistence, c.relowner::regrole,
			c.relacl, c.reloptions, obj_description(c.oid, 'pg_class')
		FROM pg_class c
		WHERE c.relnamespace = 'dlock'::regnamespace
		ORDER BY c.relname},
	'columns' => q{
		SELECT c.relname, a.attnum, a.attname, format_type(a.atttypid, a.atttypmod),
			a.attnotnull, a.atthasdef, a.attcollation, a.attacl,
			col_description(c.oid, a.attnum)
		FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid
		WHERE c.relnamespace = 'dlock'::regnamespace
		  AND a.attnum > 0 AND NOT a.attisdropped
		ORDER BY c.relname, a.attnum},
	'views' => q{
		SELECT c.relname, pg_get_viewdef(c.oid)
		FROM pg_class c
		WHERE c.relnamespace = 'dlock'::regnamespace AND c.relkind = 'v'
		ORDER BY c.relname},
	'types' => q{
		SELECT t.typname, t.typtype, t.typrelid::regclass, t.typowner::regrole,
			t.typacl, obj_description(t.oid, 'pg_type')
		FROM pg_type t
		WHERE t.typnamespace = 'dlock'::regnamespace
		ORDER BY t.typname},
	'sequences' => q{
		SELECT s.seqrelid::regclass, s.seqtypid::regtype, s.seqstart,
			s.seqincrement, s.seqmax, s.seqmin, s.seqcache, s.seqcycle
		FROM pg_sequence s JOIN pg_class c ON c.oid = s.seqrelid
		WHERE c.relnamespace = 'dlock'::regnamespace
		ORDER BY 1},
	'constraints and indexes' => q{
		SELECT conrelid::regclass::text, conname::text, contype::text,
			pg_get_constraintdef(oid)
		FROM pg_constraint WHERE connamespace = 'dlock'::regnamespace
		UNION ALL
		SELECT i.indrelid::regclass::text, i.indexrelid::regclass::text, 'index',
			pg_get_indexdef(i.indexrelid)
		FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid
		WHERE c.relnamespace = 'dlock'::regnamespace
		ORDER BY 1, 2, 3},
	'dependencies' => qq{
		SELECT regexp_replace(pg_describe_object(classid, objid, objsubid),
				'pg_toast_[0-9]+', 'pg_toast_N'),
			pg_describe_object(refclassid, refobjid, refobjsubid), deptype
		FROM pg_depend
		WHERE $in_dlock
		ORDER BY 1, 2, 3},
	'initial privileges' => q{
		SELECT pg_describe_object(classoid, objoid, objsubid), privtype, initprivs
		FROM pg_init_privs
		WHERE (pg_identify_object(classoid, objoid, objsubid)).schema = 'dlock'
		   OR (classoid = 'pg_namespace'::regclass AND objoid = 'dlock'::regnamespace)
		ORDER BY 1},
	'schema and extension' => q{
		SELECT n.nspowner::regrole, n.nspacl, obj_description(n.oid, 'pg_namespace'),
			e.extowner::regrole, e.extconfig::regclass[], e.extcondition,
			e.extrelocatable
		FROM pg_extension e JOIN pg_namespace n ON n.oid = e.extnamespace
		WHERE e.extname = 'dlock'});
foreach my $what (sort keys %catalog)
{
	my $fresh = $node->safe_psql('fresh', $catalog{$what});
	isnt($fresh, '', "fresh 0.3 install: $what listed");
	foreach my $db ('v01', 'v02', 'v06')
	{
		my $from = $db eq 'v01' ? '0.1' : $db eq 'v02' ? '0.2' : '0.6';
		my $upgraded = $node->safe_psql($db, $catalog{$what});
		is($upgraded, $fresh,
			"upgraded from $from: the same $what as a fresh 0.3 install")
		  or diag_lines($fresh, $upgraded);
	}
}

$node->stop;
done_testing();
