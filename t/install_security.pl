# Installing and upgrading dlock safely (issue 6, finding 2), and the
# 0.1 -> 0.2 upgrade path.
#
# Whoever owns the schema dlock can rename it and put a look-alike lease
# table in its place.  So:
#  1. CREATE EXTENSION refuses (42501) a schema dlock that an ordinary role
#     created beforehand, and leaves nothing behind;
#  2. an old 0.1 install in such a schema is refused at run time by every
#     function and the trigger, and cannot be upgraded in place;
#  3. on a correct install, renaming the schema and forging a dlock.leases
#     and dlock.fence_seq under the old name changes nothing: dlock finds
#     its storage through the extension, not by name, never touches the
#     forgery and runs none of its triggers;
#  4. a 0.1 install upgraded to 0.2 keeps its leases and its token counter,
#     gets the 0.2 try_acquire (no row when busy), and ends up with exactly
#     the objects of a fresh 0.2 install;
#  5. DROP EXTENSION and CREATE EXTENSION in one session: the session
#     finds the new storage, for grants, fencing and the trigger.
#
# Sections 2 and 3 also check that a session notices when the storage it
# found earlier is gone or its schema changed hands.

use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use FindBin;
use lib $FindBin::RealBin;
use DlockCluster;

my $node = dlock_node('install');
my $admin = $node->safe_psql('postgres', 'SELECT current_user');
$node->safe_psql('postgres', 'CREATE ROLE squatter LOGIN');

my @as_squatter = (extra_params => [ '-U', 'squatter' ]);

# Run $sql in database $db, in a psql of its own that stops at the first
# error, as the bootstrap superuser unless @params say otherwise.  Returns
# the SQLSTATE of the error ('' when none) and psql's stderr.
sub run_sql
{
	my ($db, $sql, @params) = @_;
	my ($state, undef, $err) = try_sql($node, $db, $sql, @params);
	return ($state, $err);
}

# The output of $sql in database $db, up to its first error if any.
sub query
{
	my ($db, $sql) = @_;
	my ($rc, $out) = $node->psql($db, $sql);
	return $out;
}

# Assert that $sql fails with $state in $db and that the error matches $re.
sub refused
{
	my ($db, $sql, $state, $re, $what, @params) = @_;
	my ($got, $err) = run_sql($db, $sql, @params);
	is($got, $state, "$what: SQLSTATE $state");
	like($err, $re, "$what: message") if defined $re;
	return;
}

# The refusal of a schema owned by the squatter names that role.
my $squatted =
  qr/schema "dlock" of extension dlock is owned by role "squatter"/;

#
# 1. A squatted schema: CREATE EXTENSION refuses it and leaves nothing.
#
$node->safe_psql('postgres', 'CREATE DATABASE squat');
$node->safe_psql('squat', 'GRANT CREATE ON DATABASE squat TO squatter');
$node->safe_psql('squat', 'CREATE SCHEMA dlock', @as_squatter);

my $leftovers = q{
	SELECT (SELECT count(*) FROM pg_extension WHERE extname = 'dlock')
		|| ' ' || (SELECT count(*) FROM pg_class WHERE relnamespace = 'dlock'::regnamespace)
		|| ' ' || (SELECT count(*) FROM pg_proc WHERE pronamespace = 'dlock'::regnamespace)
		|| ' ' || (SELECT count(*) FROM pg_type WHERE typnamespace = 'dlock'::regnamespace)};

foreach my $create ('CREATE EXTENSION dlock',
	"CREATE EXTENSION dlock VERSION '0.2'")
{
	refused('squat', $create, '42501', $squatted,
		"$create in a schema created by another role");
	is($node->safe_psql('squat', $leftovers),
		'0 0 0 0', "$create: no extension, no object left behind");
}
is( $node->safe_psql(
		'squat',
		"SELECT nspowner::regrole FROM pg_namespace WHERE nspname = 'dlock'"),
	'squatter',
	'the refused installs left the schema to its creator');

#
# 2. The released 0.1 script installs into the squatted schema (it has no
#    check of its own); the library then refuses to work there, and the
#    upgrade refuses it too.
#
$node->safe_psql('squat', "CREATE EXTENSION dlock VERSION '0.1'");
is($node->safe_psql('squat',
		"SELECT extversion FROM pg_extension WHERE extname = 'dlock'"),
	'0.1', '0.1 installed into the squatted schema');
$node->safe_psql(
	'squat', q{
	CREATE TABLE public.stock (id int PRIMARY KEY, qty int, fence bigint);
	CREATE TRIGGER stock_fence BEFORE INSERT OR UPDATE OR DELETE ON public.stock
		FOR EACH ROW EXECUTE FUNCTION dlock.fence_guard('k', 'fence');
	GRANT ALL ON public.stock TO squatter;
});

my %calls = (
	'try_acquire' => "SELECT * FROM dlock.try_acquire('k', '1 hour')",
	'acquire' => "SELECT * FROM dlock.acquire('k', '1 hour', wait => '0')",
	'renew' => "SELECT dlock.renew('k', gen_random_uuid(), '1 hour')",
	'release' => "SELECT dlock.release('k', gen_random_uuid())",
	'prune' => 'SELECT dlock.prune()',
	'use_fence' => "SELECT dlock.use_fence('k', 1)",
	'check_fence' => "SELECT dlock.check_fence('k', 1)",
	'fence_guard (trigger)' => 'INSERT INTO public.stock VALUES (1, 1, 1)');
foreach my $fn (sort keys %calls)
{
	refused('squat', $calls{$fn}, '42501', $squatted,
		"0.1 in a squatted schema: $fn refused");
}
refused('squat', $calls{try_acquire}, '42501', $squatted,
	'0.1 in a squatted schema: try_acquire refused to the squatter too',
	@as_squatter);
refused('squat', $calls{'fence_guard (trigger)'}, '42501', $squatted,
	'0.1 in a squatted schema: the trigger refuses the squatter too',
	@as_squatter);
is($node->safe_psql('squat', 'SELECT count(*) FROM dlock.leases'),
	'0', 'no lease was written');

# (the hint must not tell anyone to drop the schema of an installed dlock)
refused('squat', "ALTER EXTENSION dlock UPDATE TO '0.2'",
	'42501', qr/$squatted.*HINT:.*installed there already, drop nothing/s,
	'upgrading 0.1 in a squatted schema');
is( $node->safe_psql(
		'squat', q{
		SELECT e.extversion || ' ' || p.proretset
		FROM pg_extension e, pg_proc p
		WHERE e.extname = 'dlock' AND p.oid = 'dlock.try_acquire'::regproc}),
	'0.1 false',
	'the refused upgrade changed nothing');

# Handing the schema to the extension's owner makes it usable (this is what
# the hint proposes), and then upgradable.
$node->safe_psql('squat', "ALTER SCHEMA dlock OWNER TO $admin");
is($node->safe_psql('squat', "SELECT count(*) FROM dlock.try_acquire('k', '1 hour')"),
	'1', 'schema handed to the extension owner: try_acquire grants');
$node->safe_psql('squat', "ALTER EXTENSION dlock UPDATE TO '0.2'");
is($node->safe_psql('squat',
		"SELECT extversion FROM pg_extension WHERE extname = 'dlock'"),
	'0.2', 'schema handed to the extension owner: the upgrade goes through');

# A session that has used dlock notices when the schema changes hands
# later (the storage OIDs it cached are forgotten).
$node->safe_psql(
	'squat', q{
	CREATE FUNCTION public.sqlstate_of(q text) RETURNS text
	LANGUAGE plpgsql AS $$
	BEGIN
		EXECUTE q;
		RETURN 'ok';
	EXCEPTION WHEN OTHERS THEN
		RETURN SQLSTATE;
	END $$;
});
my $s = $node->background_psql('squat');
is( $s->query_safe(
		"SELECT public.sqlstate_of(\$\$SELECT * FROM dlock.try_acquire('k2', '1 hour')\$\$)"),
	'ok',
	'a session grants while the schema belongs to the extension owner');
$node->safe_psql('squat', 'ALTER SCHEMA dlock OWNER TO squatter');
is( $s->query_safe(
		"SELECT public.sqlstate_of(\$\$SELECT * FROM dlock.try_acquire('k3', '1 hour')\$\$)"),
	'42501',
	'the same session is refused once another session gave the schema away');
is( $s->query_safe(
		"SELECT public.sqlstate_of(\$\$SELECT dlock.check_fence('k2', 1)\$\$)"),
	'42501',
	'... and so is its fencing');
$s->quit;

#
# 3. A correct install, then its schema renamed and a forgery put under the
#    name dlock: dlock keeps using its own storage and ignores the forgery.
#
$node->safe_psql('postgres', 'CREATE DATABASE forge');
$node->safe_psql('forge', 'CREATE EXTENSION dlock');
is( $node->safe_psql(
		'forge',
		"SELECT nspowner::regrole FROM pg_namespace WHERE nspname = 'dlock'"),
	$admin,
	'CREATE EXTENSION created the schema, owned by the installing superuser');
$node->safe_psql(
	'forge', q{
	CREATE TABLE public.stock (id int PRIMARY KEY, qty int, fence bigint);
	CREATE TRIGGER stock_fence BEFORE INSERT OR UPDATE OR DELETE ON public.stock
		FOR EACH ROW EXECUTE FUNCTION dlock.fence_guard('k', 'fence');
});

# A first lease on k, used and released: k has a row and a token (far
# below the forged 999).
my ($owner1, $fence1) = split /\|/,
  $node->safe_psql('forge',
	"SELECT owner, fence FROM dlock.try_acquire('k', '1 hour')");
$node->safe_psql('forge', "INSERT INTO public.stock VALUES (1, 10, $fence1)");
is($node->safe_psql('forge', "SELECT dlock.release('k', '$owner1')"),
	't', 'a first lease on k was used and released');
cmp_ok($fence1, '<', 999, 'the real token is below the forged one');

# A session that found the storage before the rename, and stays open.
my $early = $node->background_psql('forge');
is( $early->query_safe(
		"SELECT count(*) FROM dlock.try_acquire('k0', '1 hour')"),
	'1', 'a session opened before the rename holds k0');

# Anyone who could rename the schema (here the superuser, standing in for a
# schema owner) does, and the squatter fills a new schema dlock with a
# lease table holding a forged live lease on k with token 999 (and an old
# released row that a prune would delete), a token sequence, and a trigger
# that records whoever writes the forged table.
$node->safe_psql(
	'forge', q{
	ALTER SCHEMA dlock RENAME TO dlock_real;
	CREATE SCHEMA dlock AUTHORIZATION squatter;
});
$node->safe_psql(
	'forge', q{
	CREATE TABLE dlock.leases (
		key text PRIMARY KEY,
		fence int8 NOT NULL,
		owner uuid,
		expires_at timestamptz NOT NULL,
		holder text,
		granted_at timestamptz NOT NULL);
	INSERT INTO dlock.leases VALUES
		('k', 999, 'a0a0a0a0-0000-4000-8000-000000000999',
		 now() + interval '100 years', 'forger', now()),
		('stale', 998, NULL, now() - interval '10 years', 'forger', now());
	CREATE SEQUENCE dlock.fence_seq AS int8 START 5000;
	CREATE TABLE dlock.fired (who text, op text);
	GRANT USAGE ON SCHEMA dlock TO PUBLIC;
	GRANT ALL ON dlock.leases, dlock.fence_seq TO PUBLIC;
	GRANT INSERT ON dlock.fired TO PUBLIC;
	CREATE FUNCTION dlock.spy() RETURNS trigger LANGUAGE plpgsql AS $$
	BEGIN
		INSERT INTO dlock.fired VALUES (current_user, TG_OP);
		RETURN CASE WHEN TG_OP = 'DELETE' THEN OLD ELSE NEW END;
	END $$;
	CREATE TRIGGER spy BEFORE INSERT OR UPDATE OR DELETE ON dlock.leases
		FOR EACH ROW EXECUTE FUNCTION dlock.spy();
}, @as_squatter);
is( $node->safe_psql(
		'forge', q{
		SELECT tgfoid::regproc FROM pg_trigger
		WHERE tgrelid = 'public.stock'::regclass AND tgname = 'stock_fence'}),
	'dlock_real.fence_guard',
	'the protected table is guarded by dlock_real.fence_guard');

# The forged token does not let anyone write, in new sessions or in the
# one that found the storage before the rename.
refused('forge', 'INSERT INTO public.stock VALUES (2, 20, 999)',
	'LF001', qr/presented token 999/,
	'a fenced write presenting the forged token 999');
refused('forge', "BEGIN; SELECT dlock_real.use_fence('k', 999);",
	'LF001', undef, 'use_fence with the forged token 999');
is($node->safe_psql('forge', "SELECT dlock_real.check_fence('k', 999)"),
	'f', 'check_fence: the forged token is not valid');
is($early->query_safe("SELECT dlock_real.check_fence('k', 999)"),
	'f', 'check_fence in the session opened before the rename: not valid');
is( $early->query_safe(
		"SELECT count(*) FROM dlock_real.try_acquire('k0', '1 hour')"),
	'0', '... and that session still sees its lease on k0');
$early->quit;

# The real grant ignores the forged live lease on k, draws its token from
# the real sequence and writes the real table.
# (query() and the defaults: a refusal makes the assertions below fail, so
# that the ones after them still run.)
my $nobody = '00000000-0000-4000-8000-000000000000';
my ($owner2, $fence2) = split /\|/,
  query('forge', "SELECT owner, fence FROM dlock_real.try_acquire('k', '1 hour')");
$owner2 ||= $nobody;
$fence2 ||= 0;
cmp_ok($fence2, '>', $fence1, 'k granted for real despite the forged lease');
is( $node->safe_psql(
		'forge', "SELECT last_value = $fence2 FROM dlock_real.token_seq"),
	't',
	'... with a token from the real sequence');
is( $node->safe_psql(
		'forge', q{
		SELECT count(*) FILTER (WHERE key = 'k' AND owner IS NOT NULL)
			|| ' ' || count(*) FROM dlock_real.leases}),
	'1 2',
	'... written into the real table');
is( (run_sql('forge', "INSERT INTO public.stock VALUES (2, 20, $fence2)"))[0],
	'', 'a write under the real token is accepted');

# Everything else dlock does goes to the real storage too.
my ($owner3) = split /\|/,
  query('forge', "SELECT owner, fence FROM dlock_real.try_acquire('k2', '1 hour')");
ok($owner3, 'k2 granted');
$owner3 ||= $nobody;
is( query(
		'forge',
		"SELECT dlock_real.renew('k', '$owner2', '2 hours') IS NOT NULL"),
	't', 'renew of k');
is(query('forge', "SELECT dlock_real.release('k2', '$owner3')"),
	't', 'release of k2');
is(query('forge', "SELECT dlock_real.prune('1 hour')"), '0', 'prune');
is( $node->safe_psql(
		'forge',
		q{SELECT string_agg(key, ' ' ORDER BY key) FROM dlock_real.leases}),
	'k k0 k2', 'the real table has k, k0 and k2');

# The forgery was never touched.
is( $node->safe_psql(
		'forge', q{
		SELECT string_agg(key || ':' || fence || ':' || coalesce(owner::text, '-'),
			' ' ORDER BY key)
		FROM dlock.leases}),
	'k:999:a0a0a0a0-0000-4000-8000-000000000999 stale:998:-',
	'the forged table still holds only its forged rows');
is($node->safe_psql('forge', 'SELECT is_called FROM dlock.fence_seq'),
	'f', 'the forged sequence was never used');
is( $node->safe_psql(
		'forge',
		"SELECT count(*) || ' ' || coalesce(string_agg(DISTINCT who, ','), '') FROM dlock.fired"
	),
	'0 ',
	'no trigger of the forged table ever fired');

#
# 4. Upgrade from 0.1: leases and tokens survive, try_acquire changes shape,
#    and the result is the same set of objects as a fresh 0.2 install.
#
$node->safe_psql('postgres', 'CREATE DATABASE upgraded');
$node->safe_psql('upgraded', "CREATE EXTENSION dlock VERSION '0.1'");
my ($owner_a, $fence_a) = split /\|/,
  $node->safe_psql('upgraded',
	"SELECT owner, fence FROM dlock.try_acquire('a', '1 hour')");
like($fence_a // '', qr/^\d+$/, '0.1: a granted');
# 0.1's trap: a refusal is one row of NULLs.
is( $node->safe_psql(
		'upgraded', q{
		SELECT count(*) || ' ' || bool_and(t IS NULL)
		FROM dlock.try_acquire('a', '1 hour') AS t}),
	'1 true',
	'0.1: a refused try_acquire returns one all-NULL row');
# Draw a few more tokens, so that the sequence is ahead of the table.
foreach my $i (1 .. 3)
{
	my ($o) = split /\|/,
	  $node->safe_psql('upgraded',
		"SELECT owner, fence FROM dlock.try_acquire('b', '1 hour')");
	$node->safe_psql('upgraded', "SELECT dlock.release('b', '$o')");
}
my $seq_before =
  $node->safe_psql('upgraded', 'SELECT last_value FROM dlock.fence_seq');

$node->safe_psql('upgraded', "ALTER EXTENSION dlock UPDATE TO '0.2'");
is($node->safe_psql('upgraded',
		"SELECT extversion FROM pg_extension WHERE extname = 'dlock'"),
	'0.2', 'upgraded to 0.2');
is($node->safe_psql('upgraded', 'SELECT last_value FROM dlock.fence_seq'),
	$seq_before, 'the token sequence survived the upgrade');
is( $node->safe_psql(
		'upgraded',
		"SELECT fence = $fence_a AND owner = '$owner_a' FROM dlock.leases WHERE key = 'a'"
	),
	't',
	'the lease on a survived the upgrade, same owner and token');
is( $node->safe_psql(
		'upgraded',
		"SELECT dlock.renew('a', '$owner_a', '1 hour') IS NOT NULL"),
	't',
	'the old owner renews a after the upgrade');
is($node->safe_psql('upgraded', "SELECT dlock.check_fence('a', $fence_a)"),
	't', 'the old token of a is still valid');
is( $node->safe_psql(
		'upgraded', "SELECT count(*) FROM dlock.try_acquire('a', '1 hour')"),
	'0',
	'0.2: a refused try_acquire returns no row');
my $fence_c =
  $node->safe_psql('upgraded',
	"SELECT string_agg(fence::text, ',') FROM dlock.try_acquire('c', '1 hour')");
like($fence_c, qr/^\d+$/, '0.2: try_acquire of a free key returns one row');
cmp_ok($fence_c, '>', $seq_before,
	'tokens keep growing across the upgrade');
is($node->safe_psql('upgraded', "SELECT dlock.release('a', '$owner_a')"),
	't', 'the old owner releases a after the upgrade');
my $fence_a2 =
  $node->safe_psql('upgraded',
	"SELECT fence FROM dlock.try_acquire('a', '1 hour')");
cmp_ok($fence_a2 || 0, '>', $fence_c, 'a granted again with a greater token');

# The upgraded install has the objects of a fresh 0.2 install, and they
# look the same.
$node->safe_psql('postgres', 'CREATE DATABASE fresh');
$node->safe_psql('fresh', "CREATE EXTENSION dlock VERSION '0.2'");
is($node->safe_psql('fresh',
		"SELECT extversion FROM pg_extension WHERE extname = 'dlock'"),
	'0.2', 'a fresh install of VERSION 0.2 is 0.2');

my %catalog = (
	'extension members' => q{
		SELECT pg_describe_object(classid, objid, objsubid)
		FROM pg_depend
		WHERE refclassid = 'pg_extension'::regclass AND deptype = 'e'
		  AND refobjid = (SELECT oid FROM pg_extension WHERE extname = 'dlock')
		ORDER BY 1},
	'functions' => q{
		SELECT p.oid::regprocedure, pg_get_function_arguments(p.oid),
			pg_get_function_result(p.oid), p.proretset, p.prorows,
			p.provolatile, p.proparallel, p.proisstrict, p.prosecdef,
			p.prosrc, p.probin, p.proacl,
			obj_description(p.oid, 'pg_proc')
		FROM pg_proc p
		WHERE p.pronamespace = 'dlock'::regnamespace
		ORDER BY p.oid::regprocedure::text},
	'relations' => q{
		SELECT c.relname, c.relkind, c.relacl, c.reloptions,
			obj_description(c.oid, 'pg_class')
		FROM pg_class c
		WHERE c.relnamespace = 'dlock'::regnamespace
		ORDER BY c.relname},
	'columns' => q{
		SELECT c.relname, a.attname, a.atttypid::regtype, a.attnotnull,
			a.attacl, col_description(c.oid, a.attnum)
		FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid
		WHERE c.relnamespace = 'dlock'::regnamespace
		  AND a.attnum > 0 AND NOT a.attisdropped
		ORDER BY c.relname, a.attnum},
	'schema and extension' => q{
		SELECT n.nspacl, e.extconfig::regclass[], e.extcondition,
			e.extrelocatable
		FROM pg_extension e JOIN pg_namespace n ON n.oid = e.extnamespace
		WHERE e.extname = 'dlock'});
foreach my $what (sort keys %catalog)
{
	my $fresh = $node->safe_psql('fresh', $catalog{$what});
	my $upgraded = $node->safe_psql('upgraded', $catalog{$what});
	isnt($fresh, '', "fresh 0.2 install: $what listed");
	is($upgraded, $fresh, "upgraded install: same $what as a fresh 0.2 one");
}

#
# 5. DROP EXTENSION and CREATE EXTENSION again in one session: that session
#    finds the new table and sequence (the OIDs it cached are forgotten),
#    for grants, fencing functions and the trigger alike.
#
$node->safe_psql('postgres', 'CREATE DATABASE recreate');
$node->safe_psql('recreate', 'CREATE EXTENSION dlock');
is( $node->safe_psql(
		'recreate', q{
		SET client_min_messages = warning;
		CREATE TABLE public.t (id int, fence bigint);
		SELECT count(*) FROM dlock.try_acquire('r', '1 hour');
		SELECT dlock.check_fence('r', (SELECT fence FROM dlock.leases WHERE key = 'r'));
		CREATE TRIGGER t_fence BEFORE INSERT OR UPDATE OR DELETE ON public.t
			FOR EACH ROW EXECUTE FUNCTION dlock.fence_guard('r', 'fence');
		INSERT INTO public.t SELECT 1, fence FROM dlock.leases WHERE key = 'r';
		DROP EXTENSION dlock CASCADE;
		CREATE EXTENSION dlock;
		CREATE TRIGGER t_fence BEFORE INSERT OR UPDATE OR DELETE ON public.t
			FOR EACH ROW EXECUTE FUNCTION dlock.fence_guard('r', 'fence');
		SELECT count(*) FROM dlock.try_acquire('r', '1 hour');
		SELECT count(*) FROM dlock.leases;
		SELECT dlock.check_fence('r', (SELECT fence FROM dlock.leases WHERE key = 'r'));
		INSERT INTO public.t SELECT 2, fence FROM dlock.leases WHERE key = 'r';
		SELECT count(*) FROM public.t;
		SELECT count(fence) FROM dlock.try_acquire('r', '1 hour');
	}),
	join("\n", 1, 't', 1, 1, 't', 2, 0),
	'one session: grant, write, drop, create, grant and write again in the new table');

$node->stop;
done_testing();
