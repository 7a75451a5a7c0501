# The Go client library (clients/go, issue 21) against a real server.
#
# Starts a node with dlock preloaded (listening on TCP too, for the Go
# tests' own proxy) and Debian's PgBouncer in transaction mode in front of
# it (database "small": a pool of 2 server connections), copies clients/go
# to a temporary directory where github.com/lib/pq is replaced by Debian's
# copy (/usr/share/gocode/src/github.com/lib/pq: the build never touches
# the network; GOPROXY=off, caches in the temporary directory, HOME unset),
# then:
#
#  * go vet ./... is clean (one assertion);
#  * go test -v runs the library's tests with the connection facts in
#    DLOCK_TEST_* (see clients/go/README.md); each test is one assertion
#    here, named after it; plus one that go test exited 0 and one that
#    every Test function of the sources ran (a run that ran nothing, or
#    skipped, is red);
#  * the loss and fencing tests once more against a second node with
#    dlock.storage = memory (the ones that restart the server are left
#    out: after a restart memory mode grants nothing until its horizon).
#
# The Go tests stop, kill -9 and restart this node themselves (pg_ctl, as
# the postgres OS user that runs this test), and blackhole its traffic
# through their own TCP proxy.  What each test shows is in its comment in
# clients/go/dlock_test.go; in short: renewals, ErrBusy, a waited grant
# confirmed by a renewal, a NULL renewal lost at once, LF001 as ErrLost,
# session-bound loss, the paused worker (SIGSTOP past the TTL), the server
# stopped / killed / blackholed (loss at the deadline, old token refused,
# new lease works), PgBouncer with more leases than server connections, a
# pool of 2 shared by 20 leases, cancellation and shutdown leaving no lease
# and no goroutine, election and observe, permits and shared leases.
#
# Honesty: with the deadline timer of clients/go/renew.go disabled the
# blackhole test fails; with the NULL check of renewed() removed,
# TestNullRenewalLosesAtOnce fails; without the LF001 entry of
# clients/go/errors.go, TestUseFenceRefusedIsLost fails.  The tests of
# the attack pass's findings (TestReleaseFromOnLost,
# TestReleaseCancelledContext, TestReleaseAfterLossAndReleaseFindsItGone,
# TestPoolExhaustedLossSaysSo, TestTryAcquireBlackhole,
# TestTinyTTLAndHugeWait, TestInvalidTextAndBusyMessage,
# TestRemainingRoundsDown, TestInFlightCallsReturnAtLoss) each failed
# before its fix.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use FindBin;
use lib $FindBin::RealBin;
use DlockCluster;
use Time::HiRes qw(usleep time);

my $go = $ENV{GO} // '/usr/bin/go';
my $pgbouncer = $ENV{PGBOUNCER} // '/usr/sbin/pgbouncer';
my $pq = $ENV{LIBPQ_GO} // '/usr/share/gocode/src/github.com/lib/pq';
foreach my $need ([ $go, 'golang-go' ], [ $pgbouncer, 'pgbouncer' ])
{
	next if -x $need->[0];
	fail("$need->[0] is installed (apt-get install $need->[1])");
	done_testing();
	exit 1;
}
if (!-f "$pq/conn.go")
{
	fail("lib/pq is at $pq (apt-get install golang-github-lib-pq-dev)");
	done_testing();
	exit 1;
}
my $started = time;

my $node = dlock_node('gonode',
	conf => "shared_preload_libraries = 'dlock'\nlisten_addresses = '127.0.0.1'\n");
$node->safe_psql('postgres', 'CREATE EXTENSION dlock');
my ($nhost, $nport) = ($node->host, $node->port);
my $user = getpwuid($<);

#
# PgBouncer, as in t/pgbouncer.pl: its own port in the node's socket
# directory; "small" is a pool of 2 server connections.
#
my ($bouncer, $bh, $bouncer_up) = start_pgbouncer($node, 'gobouncer',
	databases => { small => 'pool_size=2' });
ok($bouncer_up, 'PgBouncer accepts connections');
my $bport = $bouncer->port;

#
# The module, copied, with lib/pq replaced by Debian's copy.
#
my $tmp = PostgreSQL::Test::Utils::tempdir('client_go');
my $src = "$tmp/src";
system('cp', '-R', "$ENV{TESTDIR}/clients/go", $src) == 0
  or BAIL_OUT("cannot copy clients/go");
my %goenv = (
	GOFLAGS => '-mod=mod',
	GOPROXY => 'off',
	GOTOOLCHAIN => 'local',
	GOENV => 'off',
	GOTELEMETRY => 'off',
	GOCACHE => "$tmp/gocache",
	GOPATH => "$tmp/gopath",
	CGO_ENABLED => '0',
	DLOCK_TEST_DSN =>
	  "host=$nhost port=$nport dbname=postgres user=$user sslmode=disable",
	DLOCK_TEST_TCP => "127.0.0.1:$nport",
	DLOCK_TEST_BOUNCER_DSN =>
	  "host=$nhost port=$bport dbname=small user=$user sslmode=disable binary_parameters=yes",
	DLOCK_TEST_PGDATA => $node->data_dir,
	DLOCK_TEST_BINDIR => $node->config_data('--bindir'),
	DLOCK_TEST_PGLOG => $node->logfile);

# Run go with @args in the copy, HOME unset (the postgres OS user's home
# may not be writable); return (exit status, output).
sub run_go
{
	my @args = @_;
	local %ENV = (%ENV, %goenv);
	delete $ENV{HOME};
	my $out = '';
	my $h = IPC::Run::start([ $go, @args ], '<' => \undef, '>&' => \$out,
		init => sub { chdir $src or die "chdir: $!" });
	$h->finish;
	return ($h->result(0), $out);
}

my ($rc, $out) = run_go('mod', 'edit', "-replace=github.com/lib/pq=$pq");
is($rc, 0, 'go.mod of the copy points at Debian\'s lib/pq') or diag $out;

($rc, $out) = run_go('vet', './...');
is($rc, 0, 'go vet ./... is clean') or diag $out;

my $t0 = time;
# DLOCK_GO_RUN=regexp runs only those tests (by hand, e.g. to see a test
# fail with its check disabled; the count below is then red)
($rc, $out) = run_go('test', '-v', '-count=1', '-timeout=150s',
	($ENV{DLOCK_GO_RUN} ? ('-run', $ENV{DLOCK_GO_RUN}) : ()), './...');
note sprintf('go test took %.1f s', time - $t0);
append_to_file("$PostgreSQL::Test::Utils::log_path/client_go_test.out", $out);

# Each test function of the sources must have run and passed
my %expected;
foreach my $f (glob("$src/*_test.go"))
{
	my $text = slurp_file($f);
	$expected{$1} = 1 while $text =~ /^func (Test\w+)\(t \*testing\.T\)/mg;
}
my (%seen, %body, $current);
foreach my $line (split /\n/, $out)
{
	if ($line =~ /^=== RUN\s+(\S+)/) { $current = $1; next; }
	$body{$current} .= "$line\n" if defined $current;
	next unless $line =~ /^\s*--- (PASS|FAIL|SKIP): (\S+) \(([\d.]+)s\)/;
	my ($res, $name, $secs) = ($1, $2, $3);
	$seen{$name} = 1;
	ok($res eq 'PASS', "go: $name ($secs s)")
	  or diag $body{$name} // '';
}
is($rc, 0, 'go test exited 0') or diag substr($out, -3000);
is_deeply([ sort grep { !$seen{$_} } keys %expected ], [],
	sprintf('go test ran all %d test functions', scalar keys %expected));

#
# The loss and fencing tests again with dlock.storage = memory (no restart
# among them: after one, memory mode grants nothing until its horizon).
#
my @memory_tests = qw(TestNullRenewalLosesAtOnce TestUseFenceRefusedIsLost
  TestSessionBound TestPausedWorker TestNetworkBlackhole TestElection);
my $mem = dlock_node('gomem',
	conf => "shared_preload_libraries = 'dlock'\ndlock.storage = memory\n"
	  . "listen_addresses = '127.0.0.1'\n");
$mem->safe_psql('postgres', 'CREATE EXTENSION dlock');
{
	my ($mhost, $mport) = ($mem->host, $mem->port);
	my %saved = %goenv;
	%goenv = (%goenv,
		DLOCK_TEST_DSN =>
		  "host=$mhost port=$mport dbname=postgres user=$user sslmode=disable",
		DLOCK_TEST_TCP => "127.0.0.1:$mport",
		DLOCK_TEST_PGDATA => $mem->data_dir,
		DLOCK_TEST_PGLOG => $mem->logfile);
	($rc, $out) = run_go('test', '-v', '-count=1', '-timeout=100s',
		'-run', '^(' . join('|', @memory_tests) . ')$', './...');
	append_to_file("$PostgreSQL::Test::Utils::log_path/client_go_test_memory.out", $out);
	my (%mseen, %mbody, $cur);
	foreach my $line (split /\n/, $out)
	{
		if ($line =~ /^=== RUN\s+(\S+)/) { $cur = $1; next; }
		$mbody{$cur} .= "$line\n" if defined $cur;
		next unless $line =~ /^\s*--- (PASS|FAIL|SKIP): (\S+) \(([\d.]+)s\)/;
		$mseen{$2} = 1;
		ok($1 eq 'PASS', "go, memory mode: $2 ($3 s)") or diag $mbody{$2} // '';
	}
	is($rc, 0, 'go test in memory mode exited 0') or diag substr($out, -3000);
	is_deeply([ grep { !$mseen{$_} } @memory_tests ], [],
		'go test in memory mode ran all ' . scalar(@memory_tests) . ' tests');
	%goenv = %saved;
}
$mem->stop;

ok($bh->pumpable, 'PgBouncer is still running');
$node->stop;
unlike(slurp_file($node->logfile) . slurp_file($mem->logfile),
	qr/PANIC|TRAP|XX000|terminated by signal/,
	'no PANIC, assertion failure, internal error or crashed backend in the servers\' logs');
note sprintf('t/client_go.pl took %.0f s', time - $started);
done_testing();
