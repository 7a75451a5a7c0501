# The Python client library (clients/python, issue 21) against a real
# cluster: this test starts a server with dlock preloaded, listening on
# 127.0.0.1 too (the library's blackhole test puts its own TCP proxy in
# front of it), and Debian's PgBouncer in transaction mode with a pool of
# 2 server connections, then runs the library's unittest suite
# (clients/python/tests, through tests/run_cases.py) with the connection
# facts in the environment:
#
#   DLOCK_TEST_DSN          direct, over the Unix socket, superuser
#   DLOCK_TEST_TCP_PORT     the server's port on 127.0.0.1
#   DLOCK_TEST_BOUNCER_DSN  PgBouncer, pool_mode = transaction, pool of 2
#   DLOCK_TEST_PGDATA       the data directory (the suite stops it with
#   DLOCK_TEST_BINDIR       pg_ctl -m immediate, kills the postmaster with
#                           -9, and starts it again)
#   DLOCK_TEST_SRC          clients/python (installed offline into a venv)
#
# Each test case is one assertion here, named after the case; one more
# checks that the runner exited 0 and ran exactly the expected number of
# cases (a runner that ran nothing is red).  What each case proves is in
# clients/python/README.md ("Tests").  Needs python3-psycopg,
# python3-psycopg-pool, python3-venv, python3-pip and pgbouncer.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use FindBin;
use lib $FindBin::RealBin;
use DlockCluster;
use Time::HiRes qw(usleep);
use Cwd qw(abs_path);

# the number of test cases in clients/python/tests
my $expected_cases = 37;

my $python = $ENV{PYTHON} // '/usr/bin/python3';
my $pgbouncer = $ENV{PGBOUNCER} // '/usr/sbin/pgbouncer';
my $src = abs_path("$FindBin::RealBin/../clients/python");

foreach my $need ([ $pgbouncer, 'pgbouncer' ], [ $python, 'python3' ])
{
	if (!-x $need->[0])
	{
		fail("$need->[1] is installed at $need->[0]");
		done_testing();
		exit 1;
	}
}

my $node = dlock_node('pynode', conf => qq{
shared_preload_libraries = 'dlock'
listen_addresses = '127.0.0.1'
});
$node->safe_psql('postgres', 'CREATE EXTENSION dlock');

# PgBouncer, transaction pooling, 2 server connections (as in t/pgbouncer.pl)
my ($bouncer, $bh, $bouncer_up) = start_pgbouncer($node, 'pybouncer', pool_size => 2);
ok($bouncer_up, 'PgBouncer accepts connections');
my ($nhost, $nport) = ($node->host, $node->port);
my ($bhost, $bport) = ($bouncer->host, $bouncer->port);

# the suite
my $tmp = PostgreSQL::Test::Utils::tempdir('client_python');
my $results = "$tmp/results.tsv";
local $ENV{DLOCK_TEST_DSN} = "host=$nhost port=$nport dbname=postgres";
local $ENV{DLOCK_TEST_TCP_PORT} = $nport;
local $ENV{DLOCK_TEST_BOUNCER_DSN} = "host=$bhost port=$bport dbname=postgres";
local $ENV{DLOCK_TEST_PGDATA} = $node->data_dir;
local $ENV{DLOCK_TEST_BINDIR} = $node->config_data('--bindir');
local $ENV{DLOCK_TEST_SRC} = $src;
local $ENV{TMPDIR} = $tmp;
local $ENV{HOME} = $tmp;
local $ENV{PYTHONDONTWRITEBYTECODE} = 1;
my ($stdout, $stderr) = ('', '');
# (bounded: a case that hangs fails the test instead of holding up the
# whole suite)
my $rc = eval {
	IPC::Run::run([ $python, "$src/tests/run_cases.py", $results ],
		'<' => \undef, '>' => \$stdout, '2>' => \$stderr,
		IPC::Run::timeout(600));
	$?;
} // do { $stderr .= "run_cases.py: $@"; 1 };

my $cases = 0;
if (-e $results)
{
	foreach my $line (split /\n/, slurp_file($results))
	{
		my ($status, $name, $took, $why) = split /\t/, $line, 4;
		$cases++;
		ok($status eq 'ok', "$name (${took}s)") or diag($why // '');
	}
}
ok($rc == 0 && $cases == $expected_cases,
	"the suite exited 0 ($rc) and ran $cases cases (expected $expected_cases)")
  or diag("runner stderr:\n$stderr");

done_testing();
