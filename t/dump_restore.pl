# Leases and fencing tokens survive pg_dump and pg_restore.
#
# dlock registers its table and its token sequence with
# pg_extension_config_dump, so a custom-format dump carries the leases and
# the sequence position.  Restored into a fresh database of the same
# cluster, and into a database of another cluster, the held leases must
# still be held by the same owners, the released key must be free, and no
# token issued before the dump may be issued again.

use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use FindBin;
use lib $FindBin::RealBin;
use DlockCluster;

my $node = dlock_node('origin');
$node->safe_psql('postgres', 'CREATE DATABASE src');
$node->safe_psql('src', 'CREATE EXTENSION dlock');

# Grant key for an hour in database $db of $n; return (owner, fence).
sub grant
{
	my ($n, $db, $key) = @_;
	my $row = $n->safe_psql($db,
		"SELECT owner, fence FROM dlock.try_acquire('$key', '1 hour')");
	return split /\|/, $row;
}

my (%owner, $max_fence);
foreach my $key (qw(held1 held2 gone))
{
	my ($o, $fence) = grant($node, 'src', $key);
	like($fence // '', qr/^\d+$/, "$key granted");
	$owner{$key} = $o;
	$max_fence = $fence;
}
# Draw a few more tokens on a key that ends up free, so that the sequence
# is well past the tokens stored in the table.
foreach my $i (1 .. 3)
{
	my ($o, $fence) = grant($node, 'src', 'churn');
	$node->safe_psql('src', "SELECT dlock.release('churn', '$o')");
	$max_fence = $fence;
}
is($node->safe_psql('src', "SELECT dlock.release('gone', '$owner{gone}')"),
	't', 'gone released before the dump');

my $dump = PostgreSQL::Test::Utils::tempdir() . '/src.dump';
$node->command_ok([ 'pg_dump', '-Fc', '-f', $dump, '-d', 'src' ],
	'pg_dump -Fc');

# The checks made on every restored copy, in database $db of node $n.
sub check_restored
{
	my ($n, $db, $where) = @_;

	foreach my $key (qw(held1 held2))
	{
		is( $n->safe_psql(
				$db,
				"SELECT dlock.renew('$key', '$owner{$key}', '1 hour') IS NOT NULL"
			),
			't',
			"$where: the owner of $key can still renew it");
		is( $n->safe_psql(
				$db, "SELECT NOT EXISTS (SELECT FROM dlock.try_acquire('$key', '1 hour'))"),
			't',
			"$where: nobody else can acquire $key");
	}

	my (undef, $fence) = grant($n, $db, 'gone');
	cmp_ok($fence // 0, '>', $max_fence,
		"$where: the released key is free and gets a new, greater token");
	(undef, $fence) = grant($n, $db, 'fresh');
	cmp_ok($fence // 0, '>', $max_fence,
		"$where: a new key gets a token greater than any issued before the dump"
	);
	is( $n->safe_psql(
			$db, "SELECT dlock.release('held1', '$owner{held1}')"),
		't',
		"$where: the owner of held1 can release it");
	return;
}

# Same cluster, fresh database.
$node->command_ok([ 'createdb', 'restored' ], 'createdb restored');
$node->command_ok([ 'pg_restore', '-d', 'restored', $dump ],
	'pg_restore into a fresh database of the same cluster');
check_restored($node, 'restored', 'same cluster');

# Another cluster.
my $other = dlock_node('other');
$other->command_ok([ 'createdb', 'restored' ], 'createdb on the other node');
$other->command_ok([ 'pg_restore', '-d', 'restored', $dump ],
	'pg_restore into another cluster');
check_restored($other, 'restored', 'other cluster');

# The original is untouched by all this.
is( $node->safe_psql(
		'src',
		"SELECT dlock.renew('held1', '$owner{held1}', '1 hour') IS NOT NULL"),
	't',
	'the original database still has its lease on held1');

$other->stop;
$node->stop;
done_testing();
