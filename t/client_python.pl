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
my $bouncer = PostgreSQL::Test::Cluster->new('pybouncer',
	port => PostgreSQL::Test::Cluster::get_free_port());
my $bdir = $bouncer->basedir;
my $user = getpwuid($<);
my ($nhost, $nport) = ($node->host, $node->port);
my ($bhost, $bport) = ($bouncer->host, $bouncer->port);
append_to_file("$bdir/userlist.txt", qq{"$user" ""\n});
append_to_file("$bdir/pgbouncer.ini", qq{
[databases]
postgres = host=$nhost port=$nport dbname=postgres

[pgbouncer]
listen_addr =
listen_port = $bport
unix_socket_dir = $bhost
auth_type = trust
auth_file = $bdir/userlist.txt
admin_users = $user
pool_mode = transaction
default_pool_size = 2
max_client_conn = 100
ignore_startup_parameters = extra_float_digits,options
logfile = $bdir/pgbouncer.log
pidfile = $bdir/pgbouncer.pid
});
my $bh = IPC::Run::start([ $pgbouncer, '-q', "$bdir/pgbouncer.ini" ],
	'<' => \undef, '>' => "$bdir/pgbouncer.out", '2>&1');
END
{
	local $?;
	eval { $bh->kill_kill if $bh; };
}
my $bouncer_up = 0;
foreach (1 .. 100)
{
	my ($ret, $out) = $bouncer->psql('postgres', 'SELECT 1');
	if ($ret == 0 && $out eq '1') { $bouncer_up = 1; last; }
	usleep(100_000);
}
ok($bouncer_up, 'PgBouncer accepts connections');

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
my $h = IPC::Run::run([ $python, "$src/tests/run_cases.py", $results ],
	'<' => \undef, '>' => \$stdout, '2>' => \$stderr);
my $rc = $?;

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
