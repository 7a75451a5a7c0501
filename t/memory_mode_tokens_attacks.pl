# Attacks on memory mode's blocks of fencing tokens (issue 23).
#
# 1. A refill held in flight by a synchronous standby that stopped
#    answering (the block it extends was confirmed before).  Grants go on
#    from the block meanwhile; but a setval raising dlock.fence_seq (a
#    restore, or the documented "move the tokens forward by hand") is
#    obeyed by the next grant, as when no refill is in flight
#    (t/memory_mode_tokens.pl 2): it gets no token of the old block below
#    the value set.  (Before the fix it got 513.)  It waits for the refill
#    instead, which waits for the standby (57014 at statement_timeout);
#    once the standby is back, the next grant's token is above the value
#    set.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use FindBin;
use lib $FindBin::RealBin;
use DlockCluster;

my $node = dlock_node('tokatk', streaming => 1, conf => q{
shared_preload_libraries = 'dlock'
dlock.storage = memory
dlock.horizon_margin = '1s'
});
$node->safe_psql('postgres', 'CREATE DATABASE b');
$node->safe_psql('b', 'CREATE EXTENSION dlock');
my $standby = sync_standby($node, 's1', '1: the standby is synchronous');

# the first grant reserves tokens 1 .. 1,024, confirmed by s1; 510 more
# leave the block one token short of half, so the next grant refills
is( $node->safe_psql('b', q{
		SELECT sum(fence) FILTER (WHERE g = 1), count(*)
		FROM generate_series(1, 511) g, dlock.try_acquire('k' || g, '1min')}),
	'1|511', '1: 511 grants, the first with token 1');

# the standby stops answering: what it confirmed stays confirmed
$standby->stop('immediate');

# this grant takes token 512 and then refills, waiting for the standby
my ($a, $apid) = backend_session($node, 'b');
$a->query_until(qr/sent/, q{
	\echo sent
	SELECT fence FROM dlock.try_acquire('refiller', '1min');
});
ok( $node->poll_query_until('b', qq{
		SELECT wait_event = 'SyncRep' FROM pg_stat_activity WHERE pid = $apid}),
	'1: the refill waits for the synchronous standby');

# (setval's commit waits for the standby too, though its value is seen
# at once: the setting says not to wait)
my $x = $node->safe_psql('b', q{
	SET synchronous_commit = local;
	SELECT setval('dlock.fence_seq', (SELECT last_value FROM dlock.fence_seq) + 100000)});
my ($state, $t) = try_sql($node, 'b', q{
	SET statement_timeout = '2s';
	SELECT fence FROM dlock.try_acquire('after-setval', '1min')});
ok($state eq '57014' || ($state eq '' && $t > $x),
	"1: a grant after the setval gets no token below the value set ($state, '$t')");

# the standby back: the refill ends, and grants go on above the value set
$standby->start;
ok( $node->poll_query_until('b', qq{
		SELECT count(*) = 0 FROM pg_stat_activity WHERE pid = $apid AND wait_event = 'SyncRep'}),
	'1: the refill ends once the standby is back');
cmp_ok($node->safe_psql('b', q{SELECT fence FROM dlock.try_acquire('after-standby', '1min')}),
	'>', $x, '1: the next grant\'s token is above the value dlock.fence_seq was set to');

eval { $a->quit; };
$standby->stop('immediate');
$node->stop('immediate');
done_testing();
