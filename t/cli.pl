# The dlock command-line client (issue 8).
#
# a. Usage: --help, --version, COMMAND --help; unknown options, a missing
#    KEY or COMMAND and bad durations exit 64 with one line on stderr and
#    run nothing.
# b. Two `dlock run` on one key at once: one runs COMMAND, the other exits
#    75 with one line on stderr (0 with --skip-ok) without running it; a
#    third with --wait takes the key over when the first finishes, with a
#    larger token.
# c. DLOCK_FENCE is the token the database granted, and COMMAND's fenced
#    write (use_fence, then an UPDATE of a table with fence_guard) succeeds
#    with it.
# d. COMMAND's exit status passes through (3, 127 for a program that does
#    not exist) and so does its death by a signal (128 + N).  SIGTERM sent to
#    dlock run reaches COMMAND, dlock exits with COMMAND's status, and the
#    lease is released afterwards.
# e. acquire (text, shell, json; busy: 75), renew, release (79 for an owner
#    that does not hold the lease), status (text, json).
# f. A lost lease: an administrator releases the key (with its owner, read
#    from dlock.leases) while COMMAND runs: dlock run stops COMMAND (which
#    ignores SIGTERM: SIGKILL after --grace) and exits 79.  The database
#    becomes unreachable (the server is stopped): COMMAND runs on while the
#    lease may still be valid, is sent SIGTERM (with the rest of its process
#    group) within about TTL + grace, and dlock exits 79.
# g. Connecting: a wrong password in a connection string or URI, and no
#    password with -w, exit 69 with one line on stderr that never shows the
#    password; a database without the extension: 78.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use FindBin;
use lib $FindBin::RealBin;
use DlockCluster;
use JSON::PP;
use Time::HiRes qw(time usleep);
use Cwd qw(abs_path);
use POSIX qw(mkfifo);

# How long a dlock that should exit may take, and the slack allowed on top
# of a TTL and a grace period on a loaded machine.
my $patience = 60;
my $slack = 5;

my $d = abs_path(PostgreSQL::Test::Utils::tempdir);

# If a test fails, the COMMANDs and their children that dlock should have
# stopped may still run: stop them (they note their pids in *.pid and
# *.sleep; a pid counts only while it is still one of our sleeps or
# scripts, not once it has been reused).
END
{
	foreach my $f (glob("$d/*.pid"), glob("$d/*.sleep"))
	{
		my $pid = eval { slurp_file($f) } // '';
		next unless $pid =~ /^(\d+)/;
		$pid = $1;
		my $cmdline = eval { slurp_file("/proc/$pid/cmdline") } // '';
		kill 'KILL', $pid
		  if $cmdline =~ /^sleep\x00120\x00/ || index($cmdline, $d) >= 0;
	}
}

# Exit status of a wait status $s: the exit code, or "signal N".
sub exit_status
{
	my ($s) = @_;
	return ($s & 127) ? 'signal ' . ($s & 127) : $s >> 8;
}

# Start dlock with @args in the background; the returned hash collects its
# stdout and stderr.
sub start_dlock
{
	my (@args) = @_;
	my %r = (out => '', err => '', args => "@args");
	print "# Starting: dlock @args\n";
	$r{h} = IPC::Run::start(
		[ 'dlock', @args ],
		'<' => \undef,
		'>' => \$r{out},
		'2>' => \$r{err},
		IPC::Run::timeout($patience));
	return \%r;
}

# Wait for a dlock started by start_dlock to exit; return its exit status
# ("timeout" if it did not exit in time: then it is killed).
sub finish_dlock
{
	my ($r) = @_;
	eval { $r->{h}->finish; };
	if ($@)
	{
		diag "dlock $r->{args} did not exit: $@";
		eval { $r->{h}->kill_kill; };
		return 'timeout';
	}
	print "# dlock $r->{args}: stdout <$r->{out}> stderr <$r->{err}>\n";
	return exit_status($r->{h}->full_result(0));
}

# Run dlock with @args to the end; return its exit status, stdout and
# stderr.
sub dlock
{
	my $r = start_dlock(@_);
	my $status = finish_dlock($r);
	return ($status, $r->{out}, $r->{err});
}

# Check that $err is one line starting with "dlock: ".
sub one_line
{
	my ($err, $what) = @_;
	local $Test::Builder::Level = $Test::Builder::Level + 1;
	like($err, qr/\Adlock: [^\n]+\n?\z/, "$what: one line on stderr");
}

# Write a shell script into the temporary directory; return its path.
sub script
{
	my ($name, $body) = @_;
	my $path = "$d/$name";
	open my $fh, '>', $path or die "could not write $path: $!";
	print $fh $body;
	close $fh;
	return $path;
}

# Whether a dlock started by start_dlock is still running (or its output
# still open).
sub running
{
	my ($r) = @_;
	return 0 unless $r->{h}->pumpable;
	eval { $r->{h}->pump_nb; };
	return $r->{h}->pumpable ? 1 : 0;
}

# Poll until &$cond returns true; give up (returning false) when every
# dlock of @r has exited and &$cond is still false, or after a while.
sub wait_until
{
	my ($cond, @r) = @_;
	my $until = time + $patience;
	while (1)
	{
		return 1 if $cond->();
		my $alive = grep { running($_) } @r;
		return $cond->() if @r && !$alive;
		return 0 if time > $until;
		usleep(50_000);
	}
}

# First line of $file, or undef if there is no such file.
sub first_line
{
	my ($file) = @_;
	open my $fh, '<', $file or return undef;
	my $line = <$fh>;
	chomp $line if defined $line;
	return $line;
}

# Poll until COMMAND of the dlock of $r has written $file; return its
# first line (undef if dlock exited without that).
sub wait_for_file
{
	my ($file, $r) = @_;
	wait_until(sub { -s $file }, $r) or diag "$file did not appear";
	return first_line($file);
}

# Whether process $pid exists (a zombie does not count).
sub alive
{
	my ($pid) = @_;
	return 0 unless kill 0, $pid;
	my $stat = eval { slurp_file("/proc/$pid/stat") } // '';
	return $stat !~ /^\d+ \(.*\) Z/s;
}

# Poll until process $pid is gone; return the time it was seen gone.
sub wait_gone
{
	my ($pid) = @_;
	return undef unless defined $pid;
	my $until = time + $patience;
	while (alive($pid))
	{
		return undef if time > $until;
		usleep(20_000);
	}
	return time;
}

# Check that $sql returns $want (without dying if a value the client printed
# makes it fail).
sub query_is
{
	my ($sql, $want, $what) = @_;
	local $Test::Builder::Level = $Test::Builder::Level + 1;
	my ($rc, $out, $err) = $main::node->psql('postgres', $sql);
	is($out, $want, $what) or diag $err;
}

# State of the lease of $key in dlock.lease_status.
sub lease_state
{
	my ($key) = @_;
	return $main::node->safe_psql('postgres',
		"SELECT state FROM dlock.lease_status WHERE key = '$key'");
}

# The current token of $key in dlock.leases.
sub fence
{
	my ($key) = @_;
	return $main::node->safe_psql('postgres',
		"SELECT fence FROM dlock.leases WHERE key = '$key'");
}

# COMMAND of the runs that hold a key: hold.sh TAG writes the lease's
# token to TAG.fence, then waits until TAG.go exists (at most a minute).
my $hold = script('hold.sh', qq{
echo "\$DLOCK_FENCE" > "$d/\$1.tmp" && mv "$d/\$1.tmp" "$d/\$1.fence"
i=0
while [ ! -e "$d/\$1.go" ] && [ \$i -lt 600 ]; do sleep 0.1; i=\$((i + 1)); done
});

#
# a. Usage.
#
program_help_ok('dlock');
program_version_ok('dlock');
program_options_handling_ok('dlock');
command_like([ 'dlock', '--version' ], qr/\Adlock \(dlock\) 0\.4\n?\z/,
	'dlock --version');
foreach my $cmd (qw(run acquire renew release status))
{
	my ($rc, $out, $err) = dlock($cmd, '--help');
	is($rc, 0, "dlock $cmd --help: exit 0");
	isnt($out, '', "dlock $cmd --help goes to stdout");
	is($err, '', "dlock $cmd --help: nothing on stderr");
}

# The server: a table protected by fence_guard, a role with a password and
# a database without the extension.
our $node = dlock_node('client');
$ENV{PGHOST} = $node->host;
$ENV{PGPORT} = $node->port;
$ENV{PGDATABASE} = 'postgres';
$node->safe_psql('postgres', q{
	CREATE EXTENSION dlock;
	CREATE TABLE stock (id int PRIMARY KEY, qty int NOT NULL, fence bigint);
	INSERT INTO stock VALUES (42, 0, NULL);
	CREATE TRIGGER stock_fence BEFORE INSERT OR UPDATE OR DELETE ON stock
		FOR EACH ROW EXECUTE FUNCTION dlock.fence_guard('stock:{id}', 'fence');
	CREATE ROLE pwuser LOGIN PASSWORD 'right';
	CREATE DATABASE noext;
});

my $ran = "$d/usage.ran";
my @usage = (
	[ 'no command', [] ],
	[ 'unknown option', ['--not-a-valid-option'] ],
	[ 'unknown command', [qw(frobnicate k)] ],
	[ 'unknown option of run', [qw(run --not-an-option k -- touch), $ran] ],
	[ 'run without KEY', ['run'] ],
	[ 'run without COMMAND', [qw(run k)] ],
	[ 'run without COMMAND after --', [qw(run k --)] ],
	[ 'acquire without KEY', ['acquire'] ],
	[ 'renew without OWNER', [qw(renew k)] ],
	[ 'release without OWNER', [qw(release k)] ],
	[ 'bad --ttl', [qw(run --ttl=abc k -- touch), $ran] ],
	[ 'bad unit', [qw(run --ttl=10parsecs k -- touch), $ran] ],
	[ 'empty --ttl', [qw(run --ttl= k -- touch), $ran] ],
	[ 'bad --wait', [qw(run --wait=soon k -- touch), $ran] ],
	[ 'bad --grace', [qw(run --grace=1x k -- touch), $ran] ],
	[ 'bad --on-lost', [qw(run --on-lost=maybe k -- touch), $ran] ],
	[ 'acquire with a bad --ttl', [qw(acquire k --ttl=abc)] ],
	[ 'acquire with a bad --format', [qw(acquire k --format=xml)] ],
	[ 'renew with a bad --ttl',
		[qw(renew k 00000000-0000-0000-0000-000000000000 --ttl=abc)] ]);
foreach my $u (@usage)
{
	my ($what, $args) = @$u;
	my ($rc, $out, $err) = dlock(@$args);
	is($rc, 64, "$what: exit 64");
	one_line($err, $what);
}
ok(!-e $ran, 'bad usage ran no COMMAND');
is($node->safe_psql('postgres', q{SELECT count(*) FROM dlock.leases WHERE key = 'k'}),
	'0', 'bad usage took no lease');

#
# b. Two runs on one key at once: one runs, the other is refused.
#
my %run;
$run{$_} = start_dlock(qw(run --ttl=30s race --), 'sh', $hold, $_) for qw(A B);
my ($winner, $loser);
wait_until(sub { ($winner) = grep { -s "$d/$_.fence" } qw(A B) }, values %run);
ok($winner, 'of two runs started at once, one ran COMMAND');
$winner //= 'A';
$loser = $winner eq 'A' ? 'B' : 'A';
is(finish_dlock($run{$loser}), 75, 'the other exited 75');
one_line($run{$loser}{err}, 'busy');
ok(!-e "$d/$loser.fence", 'the other did not run COMMAND');
is(lease_state('race'), 'held', 'the first still holds the key');
my $fence1 = first_line("$d/$winner.fence") // 0;
is($fence1, fence('race'), 'DLOCK_FENCE is the token the database granted');

my ($rc, $out, $err) = dlock(qw(run --skip-ok race --), 'touch', "$d/skip.ran");
is($rc, 0, '--skip-ok: a busy key exits 0');
ok(!-e "$d/skip.ran", '--skip-ok: COMMAND did not run');

# --wait: a third run waits in acquire() and takes over when the first
# finishes (its COMMAND exits as soon as it has noted its token).
append_to_file("$d/C.go", 'go');
my $waiter = start_dlock(qw(run --ttl=30s --wait=60s race --), 'sh', $hold, 'C');
ok( wait_until(
		sub {
			$node->safe_psql('postgres', q{
				SELECT count(*) > 0 FROM pg_stat_activity
				WHERE state = 'active' AND query LIKE '%acquire%'
				  AND pid <> pg_backend_pid()}) eq 't';
		},
		$waiter),
	'--wait: the third run waits in acquire()');
ok(!-e "$d/C.fence", '--wait: ... and has not run COMMAND yet');
append_to_file("$d/$winner.go", 'go');
is(finish_dlock($run{$winner}), 0, 'the first run exited 0 when its COMMAND did');
is(finish_dlock($waiter), 0, '--wait: the third run ran COMMAND and exited 0');
my $fence3 = first_line("$d/C.fence") // 0;
cmp_ok($fence3, '>', $fence1, '--wait: with a larger token');
is($fence3, fence('race'), '--wait: the token the database granted');
is(lease_state('race'), 'released', 'the key was released when COMMAND exited');

#
# c. COMMAND writes under the lease with DLOCK_FENCE.
#
my $write = script('write.sh', qq{
printf '%s\\n' "\$DLOCK_KEY" "\$DLOCK_OWNER" "\$DLOCK_FENCE" "\$DLOCK_EXPIRES_AT" > "$d/write.env"
psql -X -q -At -v ON_ERROR_STOP=1 -v key="\$DLOCK_KEY" -v fence="\$DLOCK_FENCE" <<'EOF'
BEGIN;
SELECT dlock.use_fence(:'key', :fence);
UPDATE stock SET qty = qty + 1 WHERE id = 42;
COMMIT;
EOF
});
($rc) = $node->psql('postgres', 'UPDATE stock SET qty = 100 WHERE id = 42');
isnt($rc, 0, 'a write without the token is refused');
($rc, $out, $err) = dlock(qw(run --holder=writer stock:42 --), 'sh', $write);
is($rc, 0, 'the fenced write under dlock run succeeded') or diag $err;
my @env = split /\n/, (-e "$d/write.env" ? slurp_file("$d/write.env") : '');
my ($ekey, $eowner, $efence, $eexpires) = map { $env[$_] // '' } 0 .. 3;
is($ekey, 'stock:42', 'DLOCK_KEY');
is($efence, fence('stock:42'), 'DLOCK_FENCE is the token the database granted');
query_is(qq{
		SELECT '$eowner'::uuid IS NOT NULL, '$eexpires'::timestamptz > granted_at
		FROM dlock.lease_status WHERE key = 'stock:42'},
	't|t', 'DLOCK_OWNER is a uuid, DLOCK_EXPIRES_AT a time after the grant');
is($node->safe_psql('postgres', 'SELECT qty, fence FROM stock WHERE id = 42'),
	"1|$efence", 'the row was written, stamped with the token');
is($node->safe_psql('postgres', q{SELECT holder FROM dlock.lease_status WHERE key = 'stock:42'}),
	'writer', '--holder');

#
# d. Exit statuses and signals pass through; SIGTERM is forwarded.
#
foreach my $t (
	[ 'exit 3', 3 ],
	[ 'kill -KILL $$', 128 + 9 ],
	[ 'kill -TERM $$', 128 + 15 ])
{
	my ($sh, $want) = @$t;
	($rc) = dlock(qw(run status-key --), 'sh', '-c', $sh);
	is($rc, $want, "COMMAND sh -c '$sh': dlock exits $want");
	is(lease_state('status-key'), 'released', "... and released the lease");
}
($rc, $out, $err) = dlock(qw(run status-key --), "$d/no-such-program");
is($rc, 127, 'COMMAND not found: exit 127');
one_line($err, 'COMMAND not found');

my $trap = script('trap.sh', qq{
trap 'echo term > "$d/\$1.term"; exit 7' TERM
sleep 120 >/dev/null 2>&1 &
echo \$! > "$d/\$1.sleep"
echo \$\$ > "$d/\$1.tmp" && mv "$d/\$1.tmp" "$d/\$1.pid"
wait
});
my $sig = start_dlock(qw(run sigterm --), 'sh', $trap, 'sig');
wait_for_file("$d/sig.pid", $sig);
is(lease_state('sigterm'), 'held', 'SIGTERM: the lease is held while COMMAND runs');
$sig->{h}->signal('TERM');
is(finish_dlock($sig), 7, "SIGTERM to dlock run: dlock exits with COMMAND's status 7");
ok(-e "$d/sig.term", 'SIGTERM was forwarded to COMMAND');
ok(wait_gone(first_line("$d/sig.sleep")), "... and to COMMAND's process group");
is(lease_state('sigterm'), 'released', '... and the lease was released after COMMAND exited');

#
# e. acquire, renew, release, status.
#
($rc, $out, $err) = dlock(qw(acquire cli:text --ttl=60s --holder=cli --format=text));
is($rc, 0, 'acquire --format=text: exit 0') or diag $err;
chomp $out;
my @text = split /\t/, $out;
my ($akey, $aowner, $afence, $aexpires) = map { $text[$_] // '' } 0 .. 3;
is($akey, 'cli:text', 'acquire --format=text: the key');
is( $node->safe_psql('postgres', q{
		SELECT owner || ' ' || fence FROM dlock.leases WHERE key = 'cli:text'}),
	"$aowner $afence", 'acquire --format=text: the owner and token granted');
query_is(qq{
		SELECT '$aexpires'::timestamptz = expires_at FROM dlock.leases WHERE key = 'cli:text'},
	't', 'acquire --format=text: the expiry');

($rc, $out, $err) = dlock(qw(acquire cli:text --ttl=60s));
is($rc, 75, 'acquire of a held key: exit 75');
one_line($err, 'acquire of a held key');
($rc, $out, $err) = dlock(qw(acquire cli:text --ttl=60s --wait=500ms));
is($rc, 75, "acquire of a held key: exit 75 when --wait runs out");

my $shkey = q{cli:it's "shell" \\ $HOME `x`};
($rc, $out, $err) = dlock('acquire', $shkey, qw(--ttl=60s --format=shell));
is($rc, 0, 'acquire --format=shell: exit 0') or diag $err;
script('acquired.sh', $out);
my $shout;
IPC::Run::run(
	[ 'sh', '-c',
		'eval "$(cat "$1")" && printf "%s|%s|%s|%s" "$DLOCK_KEY" "$DLOCK_OWNER" "$DLOCK_FENCE" "$DLOCK_EXPIRES_AT"',
		'sh', "$d/acquired.sh" ],
	'>', \$shout);
my @sh = split /\|/, $shout // '';
$sh[$_] //= '' for 0 .. 3;
is($sh[0], $shkey, 'acquire --format=shell: eval gives back the key, quotes and all');
query_is(qq{
		SELECT owner = '$sh[1]' AND fence = '$sh[2]' AND expires_at = '$sh[3]'::timestamptz
		FROM dlock.leases WHERE key = \$k\$$shkey\$k\$},
	't', 'acquire --format=shell: owner, token and expiry');

my $jskey = q{cli:"json" \\ it's};
($rc, $out, $err) = dlock('acquire', $jskey, qw(--ttl=60s --format=json));
is($rc, 0, 'acquire --format=json: exit 0') or diag $err;
my $j = eval { decode_json($out) } // {};
$j->{$_} //= '' for qw(owner fence expires_at);
is($j->{key}, $jskey, 'acquire --format=json: the key, escaped');
query_is(qq{
		SELECT owner = '$j->{owner}' AND fence = '$j->{fence}'
		   AND expires_at = '$j->{expires_at}'::timestamptz
		FROM dlock.leases WHERE key = \$k\$$jskey\$k\$},
	't', 'acquire --format=json: owner, token and expiry');

($rc, $out, $err) = dlock(qw(renew cli:text), $aowner, '--ttl=120s');
is($rc, 0, 'renew: exit 0') or diag $err;
chomp $out;
query_is(qq{
		SELECT '$out'::timestamptz = expires_at AND expires_at > '$aexpires'
		FROM dlock.leases WHERE key = 'cli:text'},
	't', 'renew printed the new expiry');
my $nobody = '00000000-0000-0000-0000-000000000000';
($rc, $out, $err) = dlock(qw(renew cli:text), $nobody, '--ttl=60s');
is($rc, 79, 'renew by an owner that does not hold the lease: exit 79');
one_line($err, 'renew of a lost lease');

($rc, $out, $err) = dlock('status');
is($rc, 0, 'status: exit 0');
like($out, qr/^\s*key\b.*\bstate\b/m, 'status: a table with a header');
like($out, qr/^\s*cli:text\b.*\bheld\b/m, 'status: the held key');
like($out, qr/^\s*race\b.*\breleased\b/m, 'status: a released key');
($rc, $out, $err) = dlock(qw(status cli:text));
is($rc, 0, 'status KEY: exit 0');
like($out, qr/cli:text/, 'status KEY: the key');
unlike($out, qr/race/, 'status KEY: no other key');
($rc, $out, $err) = dlock(qw(status --format=json));
is($rc, 0, 'status --format=json: exit 0');
my $all = eval { decode_json($out) } // [];
my ($row) = grep { ref $_ eq 'HASH' && $_->{key} eq 'cli:text' } @$all;
is($row && "$row->{state} $row->{fence}", "held $afence",
	'status --format=json: state and token of the key');
is(scalar(@$all),
	$node->safe_psql('postgres', 'SELECT count(*) FROM dlock.lease_status'),
	'status --format=json: every key');
($rc, $out, $err) = dlock(qw(status cli:text --format=json));
$all = eval { decode_json($out) } // [];
is(scalar(@$all) . ' ' . ($all->[0]{key} // ''), '1 cli:text',
	'status KEY --format=json: an array of that key only');

($rc, $out, $err) = dlock(qw(release cli:text), $nobody);
is($rc, 79, 'release by an owner that does not hold the lease: exit 79');
one_line($err, 'release by another owner');
is(lease_state('cli:text'), 'held', '... and the lease is still held');
($rc, $out, $err) = dlock(qw(release cli:text), $aowner);
is($rc, 0, 'release: exit 0') or diag $err;
is(lease_state('cli:text'), 'released', 'release released the lease');
($rc) = dlock(qw(release cli:text), $aowner);
is($rc, 79, 'release of a lease already released: exit 79');

#
# f. Lost leases.
#
# An administrator releases the lease of a running COMMAND that ignores
# SIGTERM: dlock run notices at its next renewal, and SIGKILLs COMMAND
# after the grace period.
my $stubborn = script('stubborn.sh', qq{
trap '' TERM
echo \$\$ > "$d/\$1.tmp" && mv "$d/\$1.tmp" "$d/\$1.pid"
exec sleep 120 >/dev/null 2>&1
});
my $lost = start_dlock(qw(run --ttl=2s --grace=1s lost --), 'sh', $stubborn, 'lost');
my $lostpid = wait_for_file("$d/lost.pid", $lost);
is(lease_state('lost'), 'held', 'lost lease: held while COMMAND runs');
my $t0 = time;
is( $node->safe_psql('postgres', q{
		SELECT dlock.release(key, owner) FROM dlock.leases WHERE key = 'lost'}),
	't', 'lost lease: an administrator released it');
my $gone = wait_gone($lostpid);
ok($gone, 'lost lease: COMMAND was stopped');
$gone //= time;
note sprintf('lost lease: COMMAND stopped %.2f s after the release', $gone - $t0);
cmp_ok($gone - $t0, '<', 2 + 1 + $slack, 'lost lease: ... within TTL + grace');
cmp_ok($gone - $t0, '>=', 1, 'lost lease: ... not before the grace period (it ignores SIGTERM)');
is(finish_dlock($lost), 79, 'lost lease: dlock run exits 79');
one_line($lost->{err}, 'lost lease');

# The database becomes unreachable: renewals cannot be confirmed.  COMMAND
# runs on while the last confirmed renewal may still hold, and is sent
# SIGTERM (with its process group) when it may not.
my $unreach = start_dlock(qw(run --ttl=3s --grace=1s --renew-every=500ms unreach --),
	'sh', $trap, 'unreach');
my $unreachpid = wait_for_file("$d/unreach.pid", $unreach);
is(lease_state('unreach'), 'held', 'unreachable: held while COMMAND runs');
$t0 = time;
$node->stop('fast');
# (while the server is down: put a line that asks pwuser for a password
# before the trust line of pg_hba.conf, for g)
my $hba = $node->data_dir . '/pg_hba.conf';
my $hbaconf = slurp_file($hba);
open my $fh, '>', $hba or die "could not write $hba: $!";
print $fh "local all pwuser scram-sha-256\n$hbaconf";
close $fh;
$gone = wait_gone($unreachpid);
ok($gone, 'unreachable: COMMAND was stopped');
$gone //= time;
note sprintf('unreachable: COMMAND stopped %.2f s after the server was stopped', $gone - $t0);
cmp_ok($gone - $t0, '<', 3 + 1 + $slack, 'unreachable: ... within TTL + grace');
cmp_ok($gone - $t0, '>=', 1, 'unreachable: ... not at the first failed renewal');
ok(-e "$d/unreach.term", 'unreachable: COMMAND got SIGTERM');
ok(wait_gone(first_line("$d/unreach.sleep")), 'unreachable: ... and so did its process group');
is(finish_dlock($unreach), 79, 'unreachable: dlock run exits 79');
one_line($unreach->{err}, 'unreachable');
$node->start;

#
# g. Connection failures.
#
my ($host, $port) = ($node->host, $node->port);
foreach my $c (
	[ 'a wrong password in a connection string',
		"host=$host port=$port dbname=postgres user=pwuser password=wrongsecret" ],
	[ 'a wrong password in a URI',
		"postgresql://pwuser:wrongsecret\@/postgres?host=$host&port=$port" ])
{
	my ($what, $conn) = @$c;
	($rc, $out, $err) = dlock('-d', $conn, qw(status));
	is($rc, 69, "$what: exit 69");
	one_line($err, $what);
	unlike("$out$err", qr/wrongsecret/, "$what: the password is not shown");
	($rc, $out, $err) = dlock('-d', $conn, qw(run pw --), 'touch', "$d/pw.ran");
	is($rc, 69, "$what: run exits 69");
	unlike("$out$err", qr/wrongsecret/, "$what: run does not show the password");
}
ok(!-e "$d/pw.ran", 'run did not run COMMAND without a connection');
# a malformed URI: libpq's complaint quotes pieces of it, the password too
foreach my $bad ('postgresql://alice:WrongPw9@[zz/postgres',
	'postgresql://alice:WrongPwA@[::1]x/db')
{
	($rc, $out, $err) = dlock('-d', $bad, qw(status));
	is($rc, 69, "malformed URI $bad: exit 69");
	one_line($err, "malformed URI $bad");
	unlike("$out$err", qr/WrongPw/, "malformed URI $bad: the password is not shown");
}
($rc, $out, $err) = dlock(qw(-w -U pwuser status));
is($rc, 69, 'no password with -w: exit 69');
one_line($err, 'no password with -w');
($rc, $out, $err) = dlock('-d', "host=$host port=$port dbname=postgres user=pwuser password=right",
	qw(status race));
is($rc, 0, 'the right password connects') or diag $err;

# (-d after the command, too)
foreach my $args (
	[qw(status -d noext)],
	[qw(-d noext acquire k)],
	[ qw(-d noext run k --), 'touch', "$d/noext.ran" ])
{
	($rc, $out, $err) = dlock(@$args);
	is($rc, 78, "dlock @$args[0..2] in a database without the extension: exit 78");
	one_line($err, "dlock @$args[0..2] without the extension");
}
ok(!-e "$d/noext.ran", 'run did not run COMMAND without the extension');

# ^Z (SIGTSTP) to dlock run stops COMMAND's process group too: COMMAND does
# not run on while nobody renews its lease; once continued past the TTL,
# the lease is lost and COMMAND is stopped.
{
	my $ticks = "$d/ticks";
	my $ticker = script('ticker.sh', qq{while :; do echo x >> "$ticks"; sleep 0.1; done\n});
	my $r = start_dlock(qw(run --ttl=2s --grace=1s tstp -- sh), $ticker);
	wait_for_file($ticks, $r);
	my $pid = $r->{h}->{KIDS}[0]{PID};
	kill 'TSTP', $pid;
	usleep(300_000);
	my $n1 = -s $ticks;
	usleep(2_500_000);
	is(-s $ticks, $n1, 'while dlock run is stopped by ^Z, COMMAND is stopped too');
	kill 'CONT', $pid;
	is(finish_dlock($r), 79, 'continued past its TTL: the lease is lost, exit 79');
}

# The watchdog: when the renewal loop is blocked (here libpq, reconnecting,
# opens a service file that has become a FIFO nobody writes to, as a
# synchronous host name lookup can block), COMMAND is still stopped at the
# lease's deadline.
{
	my $svc = "$d/pg_service.conf";
	my $marker = "$d/wd.term";
	my $service = "[wd]\nhost=$host\nport=$port\ndbname=postgres\n";
	open my $fh, '>', $svc or die "could not write $svc: $!";
	print $fh $service;
	close $fh;
	local $ENV{PGSERVICEFILE} = $svc;
	my $cmd = script('wd.sh',
		qq{trap 'echo term > "$marker"; exit 0' TERM\nwhile :; do sleep 0.1; done\n});
	my $r = start_dlock(qw(-d service=wd run --ttl=3s --grace=1s --renew-every=500ms wd -- sh), $cmd);
	ok(wait_until(sub { lease_state('wd') eq 'held' }, $r), 'watchdog: the lease is held');
	unlink $svc;
	mkfifo($svc, 0600) or die "mkfifo: $!";
	my $t0 = time;
	$node->safe_psql('postgres',
		"SELECT pg_terminate_backend(pid) FROM dlock.lease_status WHERE key = 'wd'");
	ok(wait_until(sub { -e $marker }, $r), 'watchdog: COMMAND got SIGTERM while dlock was blocked');
	my $took = time - $t0;
	cmp_ok($took, '<', 3 + 4, "watchdog: within the TTL (and some slack) of the last renewal ($took s)");
	# let the blocked open go on: dlock finds the lease lost
	open my $w, '>', $svc or die "could not open $svc: $!";
	print $w $service;
	close $w;
	is(finish_dlock($r), 79, 'watchdog: dlock run exits 79 once unblocked');
}

$node->stop;
done_testing();
