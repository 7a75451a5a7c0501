# dlock's metrics where operators look (issue 22, part 2): Debian's
# prometheus-postgres-exporter with monitoring/postgres_exporter/dlock.yaml,
# as the least-privileged role of monitoring/postgres_exporter/setup.sql,
# against a server with dlock preloaded, scraped over HTTP; the role's
# sessions have a far TimeZone, DateStyle SQL, IntervalStyle sql_standard
# and extra_float_digits -15, none of which may change a value.
#
# a. Under load (pgbench: grants, contended try_acquire, acquire calls that
#    time out, leases that run out and are taken over, fenced writes
#    refused by the fence trigger, renewals, lost renewals, releases) every
#    scrape succeeds (pg_exporter_last_scrape_error 0, no query error in the
#    exporter's log).  With the load stopped, each scraped dlock_* counter
#    equals its column of dlock.stats's totals row read right after the
#    scrape, and the lease and waiter gauges equal the counts of
#    dlock.lease_status and dlock.waiters (one acquire waiting).
#    The exporter's role cannot read a holder's owner (the capability to
#    renew and release) from pg_stat_activity, where a renewal written with
#    the owner as a literal leaves it; dlock_extension_preloaded is 1
#    without pg_monitor.
# b. A database without dlock gets dlock_extension_installed 0 and no other
#    dlock series, and no scrape error; look-alike views that a role with
#    CREATE on it put in a schema dlock of its own are never read.
#    A database whose extension is still at version 0.5 (the package
#    upgraded, ALTER EXTENSION dlock UPDATE not run yet): setup.sql runs
#    there, its counters are scraped, it has no horizon series (no
#    observe() before 0.7) and no query fails (0.5: no horizon_mark).
# c. The number of dlock_* series is the same with 10 keys and with 10,010.
# d. Memory mode: with a lease granted, the horizon lies ahead but grants are
#    not blocked; after a restart the horizon metric says grants are blocked
#    (try_acquire indeed returns nothing) and for how long (within the
#    lease's TTL plus the margin), and then it clears (and try_acquire
#    grants).
#    Then, with a 10 s lease granted, a switch back to table mode: grants
#    are blocked until the horizon (try_acquire returns nothing) and the
#    metric says so, for how long, and then that they are not.
# e. promtool check rules and promtool test rules pass on
#    monitoring/prometheus/dlock-alerts.yml (each one assertion).
#
# DLOCK_METRICS_QUERIES names another queries file (to see the checks go
# red on a broken one); PROMETHEUS_POSTGRES_EXPORTER and PROMTOOL the
# programs (default: Debian's, in /usr/bin).
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use FindBin;
use lib $FindBin::RealBin;
use DlockCluster;
use HTTP::Tiny;
use IPC::Run;
use Time::HiRes qw(usleep time);

my $top = "$FindBin::RealBin/..";
my $queries = $ENV{DLOCK_METRICS_QUERIES}
  // "$top/monitoring/postgres_exporter/dlock.yaml";
my $exporter_bin = $ENV{PROMETHEUS_POSTGRES_EXPORTER}
  // '/usr/bin/prometheus-postgres-exporter';
my $promtool = $ENV{PROMTOOL} // '/usr/bin/promtool';

my $node = dlock_node('metrics', streaming => 1, conf => q{
shared_preload_libraries = 'dlock'
dlock.horizon_margin = '1s'
max_connections = 40
});
$node->safe_psql('postgres', q{
	CREATE EXTENSION dlock;
	CREATE DATABASE other;
	-- the load: a guarded table, one row per key
	CREATE TABLE guarded (k int PRIMARY KEY, v int NOT NULL, fence bigint);
	INSERT INTO guarded SELECT g, 0, NULL FROM generate_series(1, 20) g;
	CREATE TRIGGER guard BEFORE INSERT OR UPDATE OR DELETE ON guarded
		FOR EACH ROW EXECUTE FUNCTION dlock.fence_guard('load:{k}', 'fence');
	-- one unit of work on key k: grant (or contend, or wait and time out),
	-- sometimes pause past the TTL, write under the token (refused when the
	-- lease ran out), renew (lost when it ran out), release or let it run
	-- out (the next grant is a takeover)
	CREATE FUNCTION work(k int) RETURNS void LANGUAGE plpgsql AS $$
	DECLARE
		l record;
		paused boolean := random() < 0.3;
	BEGIN
		IF random() < 0.2 THEN
			BEGIN
				SELECT * INTO l FROM dlock.acquire('load:' || k, '50 ms', wait => '15 ms');
			EXCEPTION WHEN lock_not_available THEN
				RETURN;
			END;
		ELSE
			SELECT * INTO l FROM dlock.try_acquire('load:' || k, '50 ms');
		END IF;
		IF l.key IS NULL THEN
			RETURN;
		END IF;
		IF paused THEN
			PERFORM pg_sleep(0.07);
		END IF;
		BEGIN
			UPDATE guarded SET v = v + 1, fence = l.fence WHERE guarded.k = work.k;
		EXCEPTION WHEN SQLSTATE 'LF001' THEN
			NULL;
		END;
		PERFORM dlock.renew('load:' || k, l.owner, '50 ms');
		IF random() < 0.5 THEN
			PERFORM dlock.release('load:' || k, l.owner);
		END IF;
	END
	$$;
});
$node->safe_psql('postgres', slurp_file("$top/monitoring/postgres_exporter/setup.sql"));
$node->safe_psql('other', slurp_file("$top/monitoring/postgres_exporter/setup.sql"));
$node->safe_psql('postgres', 'CREATE DATABASE olddb');
$node->safe_psql('olddb', q{CREATE EXTENSION dlock VERSION '0.5'});
my ($setup_rc, $setup_out, $setup_err) = $node->psql('olddb',
	slurp_file("$top/monitoring/postgres_exporter/setup.sql"),
	on_error_stop => 1);
is($setup_rc, 0, 'setup.sql runs in a database with dlock 0.5')
  or diag $setup_err;
# The exporter's sessions with settings that change how times and floats
# are written: the values must not change.
$node->safe_psql('postgres', q{
	ALTER ROLE dlock_exporter SET TimeZone = 'Pacific/Kiritimati';
	ALTER ROLE dlock_exporter SET DateStyle = 'SQL, DMY';
	ALTER ROLE dlock_exporter SET IntervalStyle = 'sql_standard';
	ALTER ROLE dlock_exporter SET extra_float_digits = -15;
});
# In database other (no dlock), a role with CREATE on the database squats
# the schema dlock with look-alike views whose function records every call,
# made by whoever reads them (the exporter's role, if it did).
$node->safe_psql('other', q{
	CREATE ROLE mallory LOGIN;
	GRANT CREATE ON DATABASE other TO mallory;
	SET ROLE mallory;
	CREATE SCHEMA dlock;
	GRANT USAGE ON SCHEMA dlock TO PUBLIC;
	CREATE TABLE dlock.called (who name, at timestamptz);
	GRANT INSERT ON dlock.called TO PUBLIC;
	CREATE FUNCTION dlock.spy() RETURNS int LANGUAGE sql
		AS $$ INSERT INTO dlock.called VALUES (current_user, now()) RETURNING 1 $$;
	CREATE VIEW dlock.waiters AS
		SELECT dlock.spy() AS pid, 'k'::text AS key, 'exclusive'::text AS mode,
			   1 AS permits, now() AS waiting_since, 1 AS position;
	CREATE VIEW dlock.stats AS
		SELECT NULL::text AS key, dlock.spy()::bigint AS acquired;
	CREATE VIEW dlock.lease_status AS
		SELECT dlock.spy() AS state;
	GRANT SELECT ON dlock.waiters, dlock.stats, dlock.lease_status TO PUBLIC;
});

# The exporter, as dlock_exporter, discovering the databases, on a port of
# its own; stopped when the test ends.
my $port = PostgreSQL::Test::Cluster::get_free_port();
my $log = "$PostgreSQL::Test::Utils::tmp_check/metrics_exporter.log";
my ($exporter, $standby_exporter);
END
{
	local $?;
	eval { $exporter->kill_kill if $exporter; };
	eval { $standby_exporter->kill_kill if $standby_exporter; };
}

# An exporter for server $n (default $node) on port $p (default $port).
sub start_exporter
{
	my ($n, $p) = @_;
	$n //= $node;
	$p //= $port;
	my $h = IPC::Run::start(
		[
			$exporter_bin, "--extend.query-path=$queries",
			'--auto-discover-databases', "--web.listen-address=127.0.0.1:$p",
		],
		'<' => \undef, '>>' => $log, '2>>' => $log,
		init => sub {
			$ENV{DATA_SOURCE_NAME} =
			  'host=' . $n->host . ' port=' . $n->port
			  . ' user=dlock_exporter dbname=postgres sslmode=disable';
		});
	$exporter = $h if $n == $node;
	return $h;
}
start_exporter();

my $http = HTTP::Tiny->new(timeout => 60);
my @scrape_errors;

# One scrape (of the exporter on port $_[0], default $port): a hash of
# "name{label="value",...}" (labels sorted, without the exporter's server
# label) => value.  Notes a scrape error.
sub scrape
{
	my ($p) = @_;
	$p //= $port;
	my $r;
	foreach (1 .. 100)
	{
		$r = $http->get("http://127.0.0.1:$p/metrics");
		last if $r->{success};
		usleep(100_000);
	}
	die "no answer from the exporter: $r->{status} $r->{content}"
	  unless $r->{success};
	my %m;
	foreach my $line (split /\n/, $r->{content})
	{
		next if $line =~ /^#/;
		my ($name, $labels, $value) = $line =~ /^(\w+)(?:\{(.*)\})? (\S+)$/
		  or next;
		my @l = grep { !/^server=/ } split /,(?=\w+=")/, $labels // '';
		$m{ $name . '{' . join(',', sort @l) . '}' } = $value;
	}
	push @scrape_errors, $m{'pg_exporter_last_scrape_error{}'}
	  if ($m{'pg_exporter_last_scrape_error{}'} // 1) != 0;
	return \%m;
}

# The value of metric $name of database $db (undef when absent).
sub metric
{
	my ($m, $name, $db, $extra) = @_;
	my @l = (qq{datname="$db"}, $extra ? ($extra) : ());
	return $m->{ $name . '{' . join(',', sort @l) . '}' };
}

# The dlock_* series of a scrape.
sub dlock_series
{
	my ($m) = @_;
	return scalar grep { /^dlock_/ } keys %$m;
}

# Scrape until the horizon no longer blocks grants in memdb, at most 60 s
# after $granted (when the lease that set it was granted): then 0 s left.
sub horizon_clears
{
	my ($granted) = @_;
	my ($m, $cleared) = (undef, 0);
	while (time() < $granted + 60)
	{
		$m = scrape();
		if ((metric($m, 'dlock_horizon_grants_blocked', 'memdb') // 1) == 0)
		{
			$cleared = 1;
			last;
		}
		usleep(100_000);
	}
	ok($cleared && metric($m, 'dlock_horizon_blocked_seconds', 'memdb') == 0,
		'then the horizon passes: not blocked, 0 s left');
	return;
}

# a. Under load.
my $script = "$PostgreSQL::Test::Utils::tmp_check/metrics_load.sql";
PostgreSQL::Test::Utils::append_to_file($script,
	"\\set k random(1, 20)\nSELECT work(:k);\n");
my ($lout, $lerr) = ('', '');
my $load = IPC::Run::start(
	[
		'pgbench', '-n', '-c', '4', '-T', '6', '-f', $script,
		'-h', $node->host, '-p', $node->port, 'postgres'
	],
	'<' => \undef, '>' => \$lout, '2>' => \$lerr);
my $scrapes = 0;
my $deadline = time() + 5;
while (time() < $deadline)
{
	scrape();
	$scrapes++;
	usleep(300_000);
}
$load->finish;
note "pgbench: $lout";
is($?, 0, 'the load (pgbench) ran without error');
cmp_ok($scrapes, '>=', 3, "scraped $scrapes times under load");

# The load stopped: let every lease run out, read the views once so that
# dlock notices each expiry (a read counts it), then hold key held:w and
# queue one acquire for it.
usleep(200_000);
$node->safe_psql('postgres', 'SELECT count(*) FROM dlock.lease_status');
$node->safe_psql('postgres', q{
	SELECT count(*) FROM dlock.try_acquire('held:w', '1 hour');
	WITH g AS (SELECT l.* FROM generate_series(1, 10) i,
				 dlock.try_acquire('held:' || i, '1 hour') l)
	SELECT count(*) FILTER (WHERE dlock.release(key, owner))
	FROM (SELECT * FROM g ORDER BY key LIMIT 3) r;
});
my ($waiter, $wpid) = backend_session($node, 'postgres');
$waiter->query_safe(q{
	SELECT count(*) FROM generate_series(1, 2) i,
		dlock.try_acquire('sb:' || i, '1 hour', session_bound => true)});
$waiter->query_until(qr/start/, q{
	\echo start
	SELECT * FROM dlock.acquire('held:w', '1 hour', wait => '5 min');
});
ok(sleeps_in_dlock($node, 'postgres', $wpid), 'one acquire waits for held:w');
# a holder that renewed with its owner written into the statement, idle
my ($holder) = backend_session($node, 'postgres');
my $owner = $holder->query_safe(q{SELECT owner FROM dlock.try_acquire('secret:1', '1 hour')});
chomp $owner;
$holder->query_safe(qq{SELECT dlock.renew('secret:1', '$owner', '1 hour') IS NOT NULL});
my $seen = q{SELECT count(*) FROM pg_stat_activity
	WHERE pid <> pg_backend_pid() AND strpos(query, '} . $owner . q{') > 0};
is($node->safe_psql('postgres', $seen), 1,
	"a superuser sees the idle holder's owner in pg_stat_activity");
is($node->safe_psql('postgres', $seen, extra_params => [ '-U', 'dlock_exporter' ]), 0,
	"the exporter's role does not");

my $m = scrape();
my $stats = $node->safe_psql('postgres', q{
	SELECT acquired, contended, timeouts, expired, taken_over, renewed,
		   released, lost_renewals, stale_writes_refused,
		   extract(epoch from hold_time_total), released + expired,
		   extract(epoch from hold_time_max),
		   extract(epoch from wait_time_total), extract(epoch from wait_time_max)
	FROM dlock.stats WHERE key IS NULL});
my @stats = split /\|/, $stats;
my @names = qw(grants_total contended_total timeouts_total expirations_total
  takeovers_total renewals_total releases_total lost_renewals_total
  stale_writes_refused_total hold_seconds_sum hold_seconds_count
  hold_seconds_max wait_seconds_total wait_seconds_max);
note "dlock.stats totals: $stats";
foreach my $i (0 .. $#names)
{
	my $v = metric($m, "dlock_$names[$i]", 'postgres');
	ok(defined $v && abs($v - $stats[$i]) <= 1e-6 * (1 + abs($stats[$i])),
		"dlock_$names[$i] is dlock.stats's " . (split /,\s*/, 'acquired, contended, timeouts, expired, taken_over, renewed, released, lost_renewals, stale_writes_refused, hold_time_total, released + expired, hold_time_max, wait_time_total, wait_time_max')[$i]
		  . " ($stats[$i])")
	  or diag "scraped: " . ($v // 'nothing');
}
# the load did what it was meant to
my %s;
@s{@names} = @stats;
foreach my $n (qw(grants_total contended_total timeouts_total takeovers_total
	renewals_total releases_total lost_renewals_total stale_writes_refused_total
	expirations_total))
{
	cmp_ok($s{$n}, '>', 0, "the load made $n non-zero");
}

my $status = $node->safe_psql('postgres', q{
	SELECT count(*) FILTER (WHERE state = 'held'),
		   count(*) FILTER (WHERE state = 'held' AND session_bound),
		   count(*) FILTER (WHERE state = 'expired'),
		   count(*) FILTER (WHERE state = 'released'),
		   count(*) FILTER (WHERE state = 'held' AND remaining <= '2 s'),
		   (SELECT count(*) FROM dlock.waiters)
	FROM dlock.lease_status});
my ($held, $held_sb, $expired, $released, $soon, $waiters) = split /\|/, $status;
note "lease_status: held $held (session-bound $held_sb), expired $expired, released $released; waiters $waiters";
is(metric($m, 'dlock_leases_held', 'postgres'), $held,
	"dlock_leases_held is lease_status's held ($held)");
is(metric($m, 'dlock_leases_held_session_bound', 'postgres'), $held_sb,
	"dlock_leases_held_session_bound is lease_status's ($held_sb)");
is(metric($m, 'dlock_leases_expired', 'postgres'), $expired,
	"dlock_leases_expired is lease_status's expired ($expired)");
is(metric($m, 'dlock_leases_released', 'postgres'), $released,
	"dlock_leases_released is lease_status's released ($released)");
is(metric($m, 'dlock_leases_held_remaining_seconds_count', 'postgres'), $held,
	'the histogram of remaining times counts every held lease');
is(metric($m, 'dlock_leases_held_remaining_seconds_bucket', 'postgres', 'le="2"'), $soon,
	"leases expiring within 2 s: $soon");
cmp_ok(metric($m, 'dlock_leases_oldest_held_seconds', 'postgres') // -1, '>', 0,
	'the oldest hold has an age');
is(metric($m, 'dlock_waiters_queued', 'postgres'), 1,
	'dlock_waiters_queued is 1, as dlock.waiters says') or diag "dlock.waiters: $waiters";
cmp_ok(metric($m, 'dlock_waiters_oldest_seconds', 'postgres') // -1, '>', 0,
	'the oldest wait has an age');
my $version = $node->safe_psql('postgres',
	q{SELECT extversion FROM pg_extension WHERE extname = 'dlock'});
is(metric($m, 'dlock_extension_preloaded', 'postgres', qq{storage="table",version="$version"}), 1,
	'dlock_extension_preloaded is 1, storage table');
is(metric($m, 'dlock_horizon_grants_blocked', 'postgres'), 0,
	'table mode: grants not blocked');

# b. The database without dlock.
is(metric($m, 'dlock_extension_installed', 'other', 'storage="table",version=""'), 0,
	'database other: dlock_extension_installed 0');
is(scalar(grep { /^dlock_/ && /datname="other"/ } keys %$m), 3,
	'database other: no dlock series but the three of dlock_extension');
is($node->safe_psql('other', 'SELECT count(*) FROM dlock.called'), 0,
	"database other: the squatter's look-alike views in a schema dlock were never read");

# The database at version 0.5.
is(metric($m, 'dlock_extension_installed', 'olddb', 'storage="table",version="0.5"'), 1,
	'database olddb: dlock 0.5 installed');
is(metric($m, 'dlock_grants_total', 'olddb'), 0,
	'database olddb: its counters are scraped');
ok(!defined metric($m, 'dlock_horizon_grants_blocked', 'olddb'),
	'database olddb: no horizon series before 0.7');

# c. Cardinality: 10,000 keys more.
my $before = dlock_series($m);
# (500 grants a statement: each keeps a lock until its transaction ends)
$node->safe_psql('postgres', join '', map {
	"SELECT count(*) FROM generate_series($_ * 500 + 1, ($_ + 1) * 500) g,
		dlock.try_acquire('many:' || g, '1 hour');\n" } 0 .. 19);
my $m2 = scrape();
is(metric($m2, 'dlock_leases_held', 'postgres'), $held + 10000,
	'10,000 keys more are held');
is(dlock_series($m2), $before,
	"as many dlock series with 10,000 keys more ($before)");
# let the waiter in, and go
$node->safe_psql('postgres', q{SELECT dlock.forget('held:w')});
$waiter->quit;
$holder->quit;

is_deeply(\@scrape_errors, [], 'no scrape reported an error');
my $exlog = slurp_file($log);
my @qerr = $exlog =~ /^(.*Error running query.*)$/mg;
is_deeply(\@qerr, [], "no query error in the exporter's log");

# d. Memory mode, in a database of its own (in 'postgres' the hour-long
# leases of table mode would hold every key for that hour).  The horizon
# moves ahead with each grant without blocking anything; after a restart
# with a 15 s lease outstanding it blocks grants until that lease could have
# ended (plus the 1 s margin).
$exporter->kill_kill;
$node->append_conf('postgresql.conf', "dlock.storage = memory\n");
$node->restart;
$node->safe_psql('postgres', 'CREATE DATABASE memdb');
$node->safe_psql('memdb', 'CREATE EXTENSION dlock');
$node->safe_psql('memdb', slurp_file("$top/monitoring/postgres_exporter/setup.sql"));
start_exporter();
$node->safe_psql('memdb', q{SELECT * FROM dlock.try_acquire('mem:a', '15 s')});
my $granted = time();
$m = scrape();
is(metric($m, 'dlock_extension_info', 'memdb', qq{storage="memory",version="$version"}), 1,
	'memory mode: the storage label says memory');
is(metric($m, 'dlock_horizon_grants_blocked', 'memdb'), 0,
	'memory mode, a lease granted: grants are not blocked');
cmp_ok(metric($m, 'dlock_horizon_timestamp_seconds', 'memdb') // 0, '>', time() + 5,
	'... while the horizon lies ahead (past the lease)');
$exporter->kill_kill;
$node->restart;
start_exporter();
# (the time before the scrape: the server judged the horizon after it)
my $asked = time();
$m = scrape();
my $left = metric($m, 'dlock_horizon_blocked_seconds', 'memdb') // -1;
my $bound = 15 + 1 + 1 - ($asked - $granted);
is(metric($m, 'dlock_horizon_grants_blocked', 'memdb'), 1,
	'after the restart: grants blocked');
ok($left > 0 && $left <= $bound,
	sprintf("... for %.1f s, no longer than the lease's TTL and the margin (<= %.1f)", $left, $bound));
is($node->safe_psql('memdb', q{SELECT count(*) FROM dlock.try_acquire('mem:b', '1 s')}),
	0, '... and try_acquire of a free key indeed returns nothing');
# (the horizon passes about 16 s after the grant)
horizon_clears($granted);
is($node->safe_psql('memdb', q{SELECT count(*) FROM dlock.try_acquire('mem:b', '1 s')}),
	1, '... and try_acquire grants again');

# A hot standby, which grants nothing, of a database (a horizon of its own)
# with a 30 s lease: the horizon it replays lies ahead, so observe() sees
# every key held until then, and yet no grant waits for it there (an alert
# on it would fire on every standby as long as the primary grants leases).
# What a promotion now would cost is its timestamp.
$node->safe_psql('postgres', 'CREATE DATABASE sbdb');
$node->safe_psql('sbdb', 'CREATE EXTENSION dlock');
$node->safe_psql('sbdb', slurp_file("$top/monitoring/postgres_exporter/setup.sql"));
$node->safe_psql('sbdb', q{SELECT * FROM dlock.try_acquire('sb:a', '30 s')});
$node->backup('base');
my $standby = streaming_standby($node, 'metrics_standby');
$node->wait_for_catchup($standby);
my $sport = PostgreSQL::Test::Cluster::get_free_port();
$standby_exporter = start_exporter($standby, $sport);
my $sm = scrape($sport);
is(metric($sm, 'dlock_horizon_grants_blocked', 'sbdb'), 0,
	'on a hot standby: grants are not said to be blocked by the horizon');
is(metric($sm, 'dlock_horizon_blocked_seconds', 'sbdb'), 0, '... 0 s left');
cmp_ok(metric($sm, 'dlock_horizon_timestamp_seconds', 'sbdb') // 0, '>', time(),
	"... while the horizon it replayed lies ahead: a promotion's wait");
$standby_exporter->kill_kill;
$standby->stop;
is_deeply(\@scrape_errors, [], 'no scrape reported an error in memory mode');

# Back to table mode with a 10 s lease granted in memory mode: every key
# without a live row is held until the horizon, which dlock.observe() on a
# fresh key does not see (no row: 'none').
$node->safe_psql('memdb', q{SELECT * FROM dlock.try_acquire('mem:c', '10 s')});
$granted = time();
$exporter->kill_kill;
$node->append_conf('postgresql.conf', "dlock.storage = table\n");
$node->restart;
start_exporter();
$asked = time();
$m = scrape();
is(metric($m, 'dlock_extension_info', 'memdb', qq{storage="table",version="$version"}), 1,
	'back in table mode: the storage label says table');
is($node->safe_psql('memdb', q{SELECT count(*) FROM dlock.try_acquire('mem:d', '1 s')}),
	0, '... try_acquire of a free key returns nothing until the horizon');
$left = metric($m, 'dlock_horizon_blocked_seconds', 'memdb') // -1;
$bound = 10 + 1 + 1 - ($asked - $granted);
is(metric($m, 'dlock_horizon_grants_blocked', 'memdb'), 1,
	'... and the metric says grants are blocked');
ok($left > 0 && $left <= $bound,
	sprintf("... for %.1f s, no longer than the lease's TTL and the margin (<= %.1f)", $left, $bound));
horizon_clears($granted);
is($node->safe_psql('memdb', q{SELECT count(*) FROM dlock.try_acquire('mem:d', '1 s')}),
	1, '... and try_acquire grants again');
is_deeply(\@scrape_errors, [], 'no scrape reported an error back in table mode');

# e. The alert rules.
my $rules = "$top/monitoring/prometheus";
my ($out, $err);
ok(IPC::Run::run([ $promtool, 'check', 'rules', "$rules/dlock-alerts.yml" ],
		'>' => \$out, '2>' => \$err), 'promtool check rules dlock-alerts.yml')
  or diag "$out$err";
ok( IPC::Run::run(
		[ $promtool, 'test', 'rules', "$rules/dlock-alerts.test.yml" ],
		'>' => \$out, '2>' => \$err),
	'promtool test rules dlock-alerts.test.yml') or diag "$out$err";

done_testing();
