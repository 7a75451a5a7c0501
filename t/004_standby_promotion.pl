# Leases and fencing tokens survive the promotion of a synchronous standby.
#
# The primary's session runs with synchronous_commit = off; dlock raises it
# for its grants, so a grant that returned has reached the synchronous
# standby.  A token drawn inside an explicit transaction block is flushed
# and replicated before it is returned, so the promoted standby never issues
# it again even though that transaction never committed.

use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $primary = PostgreSQL::Test::Cluster->new('primary');
$primary->init(allows_streaming => 1);
$primary->append_conf('postgresql.conf', "fsync = on\n");
$primary->start;
$primary->safe_psql('postgres', 'CREATE EXTENSION dlock');
$primary->backup('base');

my $standby = PostgreSQL::Test::Cluster->new('standby');
$standby->init_from_backup($primary, 'base', has_streaming => 1);
$standby->start;
$primary->append_conf('postgresql.conf',
	"synchronous_standby_names = 'standby'\n");
$primary->reload;
ok( $primary->poll_query_until(
		'postgres',
		"SELECT sync_state = 'sync' FROM pg_stat_replication WHERE application_name = 'standby'"
	),
	'the standby is synchronous');

my $s = $primary->background_psql('postgres');
$s->query_safe('SET synchronous_commit = off');

my (%owner, $max_seen);
foreach my $key (map { "p$_" } 1 .. 20)
{
	my ($owner, $fence) = split /\|/,
	  $s->query_safe("SELECT owner, fence FROM dlock.try_acquire('$key', '1 hour')");
	$owner{$key} = $owner;
	$max_seen = $fence;
}

# Tokens seen inside a transaction that never commits: 40 of them, more
# than the sequence logs ahead at a time (32), so the last ones are covered
# only by WAL this transaction wrote.
$s->query_safe('BEGIN');
my $uncommitted = $s->query_safe(
	q{SELECT max(l.fence) FROM generate_series(1, 40) AS i,
	  LATERAL dlock.try_acquire('open' || i, '1 hour') AS l});
cmp_ok($uncommitted, '>', $max_seen + 39, '40 tokens drawn in an open transaction');
$max_seen = $uncommitted;

# Fail over at once: no waiting for the standby to catch up.
$primary->stop('immediate');
$s->quit;
$standby->promote;

my $values = join(', ', map { "('$_', '$owner{$_}'::uuid)" } sort keys %owner);
is( $standby->safe_psql(
		'postgres', qq{
	SELECT count(*) FROM (VALUES $values) AS v(k, o)
	WHERE dlock.renew(k, o, '1 hour') IS NOT NULL}),
	'20',
	'every lease granted on the old primary is held on the promoted standby');
is($standby->safe_psql('postgres',
		"SELECT NOT EXISTS (SELECT FROM dlock.try_acquire('p1', '1 hour'))"),
	't', 'nobody else can acquire a key held before the failover');

my $new = $standby->safe_psql('postgres',
	"SELECT fence FROM dlock.try_acquire('after', '1 hour')");
cmp_ok($new, '>', $max_seen,
	'a new token on the promoted standby is greater than every token seen before, committed or not');

# With a synchronous standby that is not there, a token cannot be
# confirmed: a grant whose wait is cancelled fails instead of returning an
# unconfirmed token, and leaves no lease behind.
$standby->append_conf('postgresql.conf',
	"synchronous_standby_names = 'nobody'\n");
$standby->reload;
my ($ret, $stdout, $stderr) = $standby->psql('postgres', q{
	SET statement_timeout = '1s';
	BEGIN;
	SELECT fence FROM dlock.try_acquire('unconfirmed', '1 hour');
	COMMIT;});
isnt($ret, 0, 'a grant whose standby wait is cancelled fails');
like($stderr, qr/fencing token not confirmed by the synchronous standbys/,
	'the error says the token was not confirmed');
unlike($stdout, qr/^\d+$/m, 'no token was returned');
$standby->append_conf('postgresql.conf', "synchronous_standby_names = ''\n");
$standby->reload;
is($standby->safe_psql('postgres',
		"SELECT count(*) FROM dlock.leases WHERE key = 'unconfirmed'"),
	'0', 'the failed grant left no lease');

$standby->stop;
done_testing();
