# Expiry is judged by the server's clock only: what a clock step does.
#
# The server runs under libfaketime (LD_PRELOAD, the offset read from a file
# at every clock call, FAKETIME_NO_CACHE=1), so the test steps the clock of
# the postmaster and of every backend, running or new, at run time; the
# monotonic clock stays real (FAKETIME_DONT_FAKE_MONOTONIC=1), so latch
# and timer sleeps last as long as they ask.  Durations are measured on the
# test's own (real) clock, never the server's.  The clock goes +0, +1 hour,
# +0, -1 hour, +0.
#
# a. Forward step (+1 hour): a 1-minute lease expires at once.  Before the
#    step nobody else may take the key; after it, the holder's open writer
#    is refused at its next write (LF001), another session takes the key
#    over with a larger token, the old holder's renew returns NULL and its
#    fenced writes (use_fence and the token column) are refused with LF001,
#    the new holder's are accepted.  The new holder is an acquire that
#    was already waiting (wait => '10 minutes') when the clock stepped: it
#    looks again within a second (a waiter never sleeps longer than that,
#    since its timer was computed on the server clock before the step) and
#    takes the key, though its own deadline has passed on the server clock.
# b. Backward step (-1 hour): a 3-second lease stays held after it should
#    have expired: nobody else can take it, a waiter in acquire(wait => NULL)
#    is not granted, and its holder can still write.
# c. Forward again (+0): a 1-minute lease granted during the stepped-back
#    hour has expired at once (its holder refused, the key taken over); the
#    3-second lease of b has ended (its holder refused); its waiter, asleep
#    across the step, takes the key within seconds, with a larger token.
# (Until waiters looked again every second, a waiter slept on a
# timer computed before the step (up to the hour here) unless something
# happened to set its latch: the key stayed stuck after the step back.)
# Tokens never go backwards: every grant across the steps has a larger
# token than the one before.
#
# What a clock step does (the README's statement):
#   dlock judges expiry by the server's clock (clock_timestamp()) at each
#   call.  A clock that steps forward ends leases early: the next
#   acquirer takes the key over and fencing refuses the old holder's
#   writes, so safety holds but holders lose their leases (and bounded
#   acquire calls time out early).  A clock that steps backward lengthens
#   every lease granted before the step by the size of the step: a holder
#   that died keeps its key that much longer, and a holder that paused past
#   its TTL can still write.  Waiters look at the key again at least
#   every second, so they notice a step within a second.  Tokens never go
#   backwards either way.
#   Keep the server's clock slewed (NTP, chrony), not stepped.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use FindBin;
use lib $FindBin::RealBin;
use DlockCluster;
use Time::HiRes qw(time usleep);

my ($libfaketime) = grep { defined && -e } $ENV{LIBFAKETIME},
  glob('/usr/lib/*/faketime/libfaketime.so.1');
# CI installs it (tools/pgcluster): missing, this test fails, never skips.
BAIL_OUT('libfaketime is not installed (Debian package libfaketime)')
  unless $libfaketime;

my $node = PostgreSQL::Test::Cluster->new('clock');
$node->init;
# No autovacuum: its workers, started by the jumps, would only add noise.
$node->append_conf('postgresql.conf', "autovacuum = off\n");

# The clock's offset, read by libfaketime at every clock call.  Written
# with a rename, so that no reader ever sees a half-written file.
my $rc = $node->basedir . '/faketime.rc';

# Step the server's clock to offset $offset ('+0', '+1h', '-1h').
sub set_clock
{
	my ($offset) = @_;
	open my $f, '>', "$rc.tmp" or die "$rc.tmp: $!";
	print $f "$offset\n";
	close $f or die "$rc.tmp: $!";
	rename "$rc.tmp", $rc or die "$rc: $!";
}

set_clock('+0');
{
	local $ENV{LD_PRELOAD} = $libfaketime;
	local $ENV{FAKETIME_TIMESTAMP_FILE} = $rc;
	local $ENV{FAKETIME_NO_CACHE} = '1';
	local $ENV{FAKETIME_DONT_FAKE_MONOTONIC} = '1';
	local $ENV{DONT_FAKE_MONOTONIC} = '1';    # its name before libfaketime 0.9.8
	$node->start;
}
$node->safe_psql('postgres', q{
	CREATE EXTENSION dlock;
	-- one row per accepted write under key clk:<k>
	CREATE TABLE ledger (k int NOT NULL, fence bigint);
	CREATE TRIGGER ledger_fence BEFORE INSERT OR UPDATE OR DELETE ON ledger
		FOR EACH ROW EXECUTE FUNCTION dlock.fence_guard('clk:{k}', 'fence');
	-- what each waiter got: a token, or the SQLSTATE it failed with
	CREATE TABLE outcome (who text PRIMARY KEY, fence bigint, sqlstate text);
	CREATE FUNCTION waiter(who text, k text, w interval) RETURNS void
	LANGUAGE plpgsql AS $$
	DECLARE
		l dlock.lease;
	BEGIN
		l := dlock.acquire(k, '1 minute', wait => w, holder => who);
		INSERT INTO outcome VALUES (who, l.fence, NULL);
	EXCEPTION WHEN OTHERS OR query_canceled THEN
		INSERT INTO outcome VALUES (who, NULL, SQLSTATE);
	END $$;
});

# The server clock's offset from the test's, in seconds.
sub offset
{
	return $node->safe_psql('postgres',
		'SELECT extract(epoch FROM clock_timestamp())') - time();
}

# Step the clock to $offset and check that a new backend sees it.
sub step_clock
{
	my ($offset, $seconds) = @_;
	set_clock($offset);
	my $off = offset();
	ok(abs($off - $seconds) < 60, "clock stepped to $offset (server offset ${off}s)");
}

# Every grant's token, in grant order.
my @tokens;

# Grant $key for $ttl in a new connection; return owner and fence.
sub grant
{
	my ($key, $ttl) = @_;
	my ($owner, $fence) = split /\|/, $node->safe_psql('postgres',
		"SELECT owner, fence FROM dlock.try_acquire('$key', '$ttl')");
	push @tokens, $fence if defined $fence;
	return ($owner, $fence);
}

# Can another session take $key now?  How many rows try_acquire returned.
sub try_take
{
	my ($key) = @_;
	return $node->safe_psql('postgres',
		"SELECT count(*) FROM dlock.try_acquire('$key', '1 minute')");
}

# Run $sql in a new connection; return its SQLSTATE, or 'ok'.
sub sqlstate
{
	my ($sql) = @_;
	my ($rc, $out, $err) = $node->psql('postgres',
		"\\set VERBOSITY sqlstate\n$sql", on_error_stop => 1);
	return 'ok' if $rc == 0;
	return $1 if $err =~ /ERROR:\s+([0-9A-Z]{5})/;
	return "rc $rc: $err";
}

# A fenced write under key clk:$k presenting $fence with use_fence.
sub write_fenced
{
	my ($k, $fence) = @_;
	return sqlstate(qq{
		BEGIN;
		SELECT dlock.use_fence('clk:$k', $fence);
		INSERT INTO ledger (k) VALUES ($k);
		COMMIT;});
}

# A fenced write under key clk:$k presenting $fence in the token column.
sub write_token
{
	my ($k, $fence) = @_;
	return sqlstate("INSERT INTO ledger VALUES ($k, $fence)");
}

# How many writes under clk:$k were accepted.
sub writes
{
	my ($k) = @_;
	return $node->safe_psql('postgres', "SELECT count(*) FROM ledger WHERE k = $k");
}

# Open a session; return it and its backend's pid.
sub session { return backend_session($node, 'postgres') }

# Run $sql in background session $s; return what it printed on stderr
# (the SQLSTATE of an error).
sub bg_error
{
	my ($s, $sql) = @_;
	$s->{stderr} = '';
	$s->query("\\set VERBOSITY sqlstate\n$sql");
	my $err = $s->{stderr};
	$s->{stderr} = '';
	return $err;
}

# Start waiter() for $who on $key in a new session ($pre: statements
# before it); return the session and its pid once it sleeps in acquire.
sub start_waiter
{
	my ($who, $key, $wait, $pre) = @_;
	my ($s, $pid) = session();
	$pre //= '';
	$s->query_until(qr/waiting/, qq{
		$pre
		\\echo waiting
		SELECT waiter('$who', '$key', $wait);
	});
	ok(sleeps_in_dlock($node, 'postgres', $pid), "$who sleeps in acquire");
	return ($s, $pid);
}

# What waiter $who got: '' while it still waits, else 'fence|sqlstate'.
sub outcome
{
	my ($who) = @_;
	return $node->safe_psql('postgres',
		"SELECT coalesce(fence::text, '') || '|' || coalesce(sqlstate, '') FROM outcome WHERE who = '$who'");
}

# Wait for waiter $who to finish; return its outcome and when it came.
sub wait_outcome
{
	my ($who) = @_;
	$node->poll_query_until('postgres',
		"SELECT count(*) = 1 FROM outcome WHERE who = '$who'");
	return (outcome($who), time());
}

# Is waiter $who (backend $pid) still asleep in acquire, $secs seconds on?
sub still_waiting
{
	my ($who, $pid, $secs) = @_;
	sleep $secs;
	return $node->safe_psql('postgres', qq{
		SELECT (SELECT count(*) FROM outcome WHERE who = '$who') = 0
		   AND (SELECT wait_event_type = 'Extension' FROM pg_stat_activity WHERE pid = $pid)});
}

ok(abs(offset()) < 60, 'the server clock starts unstepped');

# a. Forward step.
my ($o1, $f1) = grant('clk:1', '1 minute');
is(try_take('clk:1'), '0', 'a: before the step, nobody else can take the 1-minute lease');
is(write_fenced(1, $f1), 'ok', 'a: before the step, the holder writes');
my ($w1, $w1pid) = start_waiter('a-waiter', 'clk:1', "'10 minutes'");
my ($h) = session();
$h->query_safe(qq{
	BEGIN;
	SELECT dlock.use_fence('clk:1', $f1);
	INSERT INTO ledger (k) VALUES (1);
});

step_clock('+1h', 3600);
my $stepped_at = time();
is( $node->safe_psql('postgres', "SELECT state FROM dlock.lease_status WHERE key = 'clk:1'"),
	'expired', 'a: the 1-minute lease has expired at once');
like(bg_error($h, 'INSERT INTO ledger (k) VALUES (1);'), qr/LF001/,
	"a: the holder's writer, open across the step, is refused at its next write");
$h->query_safe('ROLLBACK');
my ($w1out, $w1at) = wait_outcome('a-waiter');
like($w1out, qr/^\d+\|$/,
	'a: the waiter asleep across the step takes the key, whose lease the step ended');
ok($w1at - $stepped_at < 3,
	'a: ... within seconds of the step (' . sprintf('%.1f', $w1at - $stepped_at) . ' s)');
$w1->quit;
my ($f2) = split /\|/, $w1out;
push @tokens, $f2;
ok($f2 > $f1, 'a: with a larger token');
my $o2 = $node->safe_psql('postgres', "SELECT owner FROM dlock.leases WHERE key = 'clk:1'");
is( $node->safe_psql('postgres', "SELECT dlock.renew('clk:1', '$o1', '1 minute') IS NULL"),
	't', "a: the old holder's renew returns NULL");
is(write_fenced(1, $f1), 'LF001', "a: the old holder's use_fence write is refused");
is(write_token(1, $f1), 'LF001', "a: the old holder's token-column write is refused");
is(writes(1), '1', 'a: only the write made before the step counted');
is(write_fenced(1, $f2), 'ok', "a: the new holder's write is accepted");
is(write_token(1, $f2), 'ok', "a: ... also with the token column");
is(writes(1), '3', 'a: both of them');
is( $node->safe_psql('postgres', "SELECT dlock.release('clk:1', '$o2')"),
	't', 'a: the new holder releases');
$h->quit;

# Back to the right time: a step back by an hour too, but nothing is held.
step_clock('+0', 0);

# b. Backward step.
my ($o3, $f3) = grant('clk:2', '3 seconds');
my $expiry3 = time() + 3;
ok($f3 > $f2, 'b: a larger token after the step back');
my ($w2, $w2pid) = start_waiter('b-waiter', 'clk:2', 'NULL');

step_clock('-1h', -3600);
usleep(1e6 * ($expiry3 + 4 - time())) if $expiry3 + 4 > time();
is( $node->safe_psql('postgres', qq{
		SELECT state, remaining > interval '50 minutes'
		FROM dlock.lease_status WHERE key = 'clk:2'}),
	'held|t', 'b: 4 s after its 3-second lease should have ended, it is held for an hour more');
is(try_take('clk:2'), '0', 'b: nobody else can take it');
is(still_waiting('b-waiter', $w2pid, 2), 't',
	'b: the waiter, looking again every second, is not granted');
is( $node->safe_psql('postgres', "SELECT dlock.check_fence('clk:2', $f3)"),
	't', 'b: the holder may still write');
is(write_fenced(2, $f3), 'ok', "b: the holder's write is accepted");
my ($o4, $f4) = grant('clk:3', '1 minute');
ok($f4 > $f3, 'b: a grant during the stepped-back hour has a larger token');
is(try_take('clk:3'), '0', 'b: ... and holds its key');

# c. Forward again.
step_clock('+0', 0);
my $stepped_back_at = time();
is( $node->safe_psql('postgres', "SELECT state FROM dlock.lease_status WHERE key = 'clk:3'"),
	'expired', 'c: the 1-minute lease granted during the stepped-back hour has expired at once');
is( $node->safe_psql('postgres', "SELECT dlock.renew('clk:3', '$o4', '1 minute') IS NULL"),
	't', "c: its holder's renew returns NULL");
is(write_fenced(3, $f4), 'LF001', "c: its holder's write is refused");
my ($o5, $f5) = grant('clk:3', '1 minute');
ok(defined $f5 && $f5 > $f4, 'c: another session takes it over, with a larger token');
is(write_fenced(2, $f3), 'LF001', "c: the 3-second lease of b has ended: its holder's write is refused");
is( $node->safe_psql('postgres', "SELECT dlock.renew('clk:2', '$o3', '1 minute') IS NULL"),
	't', "c: ... and its renew returns NULL");
# Its waiter, asleep across the step, looks at the key again within a
# second and takes it, with nobody else touching the key.
my ($w2out, $w2at) = wait_outcome('b-waiter');
like($w2out, qr/^\d+\|$/, 'c: the waiter asleep across the step is granted');
ok($w2at - $stepped_back_at < 3,
	'c: ... within seconds of the step (' . sprintf('%.1f', $w2at - $stepped_back_at) . ' s)');
my ($f7) = split /\|/, $w2out;
ok($f7 > $f4, 'c: with a larger token than every grant before the step');
$w2->quit;

# Tokens never went backwards (the waiter's grant, at a time the test does
# not control, was checked above).
is_deeply(\@tokens, [ sort { $a <=> $b } @tokens ], 'tokens rose at every grant: ' . join(' ', @tokens));
push @tokens, $f7;
is(scalar(keys %{ { map { $_ => 1 } @tokens } }), scalar(@tokens), 'no token was issued twice');

$node->stop;
done_testing();
