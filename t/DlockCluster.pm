# t/DlockCluster.pm: setting up the servers of the TAP tests and talking to
# them, so that no test writes these again:
#
#  * dlock_node: a server with dlock's settings (preloading, storage mode,
#    ...), started;
#  * streaming_standby, sync_standby: a standby streaming from it, and one
#    its primary waits for (synchronous_standby_names);
#  * start_pgbouncer: PgBouncer in transaction mode in front of a node;
#  * try_sql: SQL that may fail, with the SQLSTATE of its error;
#  * backend_session, sleeps_in_dlock: a background session and its
#    backend's pid, and whether that backend sleeps in a dlock wait.
#
# The fault tools (the chaos checker, the kill -9 loops, crashes) are in
# t/DlockFaults.pm.
package DlockCluster;

use strict;
use warnings;
use Exporter 'import';
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use IPC::Run;
use Time::HiRes qw(usleep);

our @EXPORT = qw(dlock_node streaming_standby sync_standby start_pgbouncer try_sql
  backend_session sleeps_in_dlock);

# A server named $name, initialised (for streaming replication with
# streaming => 1), with the settings $opt{conf} in its postgresql.conf,
# started.
sub dlock_node
{
	my ($name, %opt) = @_;
	my $node = PostgreSQL::Test::Cluster->new($name);
	$node->init($opt{streaming} ? (allows_streaming => 1) : ());
	$node->append_conf('postgresql.conf', $opt{conf}) if defined $opt{conf};
	$node->start;
	return $node;
}

# A standby named $name streaming from $primary, made from its backup
# 'base', started.
sub streaming_standby
{
	my ($primary, $name) = @_;
	my $standby = PostgreSQL::Test::Cluster->new($name);
	$standby->init_from_backup($primary, 'base', has_streaming => 1);
	$standby->start;
	return $standby;
}

# A standby named $name made from a backup of $primary taken now, which
# $primary names in synchronous_standby_names; once pg_stat_replication
# shows it synchronous (1 assertion, named $what), returns it.
sub sync_standby
{
	my ($primary, $name, $what) = @_;
	local $Test::Builder::Level = $Test::Builder::Level + 1;
	$primary->backup('base');
	my $standby = streaming_standby($primary, $name);
	$primary->append_conf('postgresql.conf',
		"synchronous_standby_names = '$name'\n");
	$primary->reload;
	ok( $primary->poll_query_until('postgres', qq{
			SELECT sync_state = 'sync' FROM pg_stat_replication
			WHERE application_name = '$name'}),
		$what);
	return $standby;
}

# Debian's PgBouncer ($ENV{PGBOUNCER}, default /usr/sbin/pgbouncer) in
# front of $node: pool_mode = transaction, default_pool_size
# $opt{pool_size} (default 2), listening on a port of its own in $node's
# socket directory, trust authentication for the OS user (also its admin).
# $opt{databases}: the [databases] section, name => options appended to
# "host=... port=... dbname=postgres" (e.g. 'pool_size=1'); default one
# pool named postgres.  Its output goes to a file (a pipe nobody reads
# would fill up and block it); it is stopped when the test ends.  Returns
# a PostgreSQL::Test::Cluster object that names its host and port (for
# psql), its IPC::Run handle, and whether it answered SELECT 1 on database
# $opt{check} (default the first) within 10 s.
my @bouncers;

END
{
	# stop the PgBouncers this test started (only those), keeping the
	# test's exit status
	local $?;
	foreach my $h (@bouncers)
	{
		eval { $h->kill_kill; };
	}
}

sub start_pgbouncer
{
	my ($node, $name, %opt) = @_;
	my $bouncer = PostgreSQL::Test::Cluster->new($name,
		port => PostgreSQL::Test::Cluster::get_free_port());
	my $bdir = $bouncer->basedir;
	my $user = getpwuid($<);
	my ($nhost, $nport) = ($node->host, $node->port);
	my %dbs = %{ $opt{databases} // { postgres => '' } };
	my $databases = join '',
	  map { "$_ = host=$nhost port=$nport dbname=postgres $dbs{$_}\n" } sort keys %dbs;
	my $pool_size = $opt{pool_size} // 2;
	append_to_file("$bdir/userlist.txt", qq{"$user" ""\n});
	append_to_file("$bdir/pgbouncer.ini", qq{
[databases]
$databases
[pgbouncer]
listen_addr =
listen_port = @{[ $bouncer->port ]}
unix_socket_dir = @{[ $bouncer->host ]}
auth_type = trust
auth_file = $bdir/userlist.txt
admin_users = $user
pool_mode = transaction
default_pool_size = $pool_size
max_client_conn = 100
ignore_startup_parameters = extra_float_digits,options
logfile = $bdir/pgbouncer.log
log_connections = 0
log_disconnections = 0
pidfile = $bdir/pgbouncer.pid
});
	my $h = IPC::Run::start([ $ENV{PGBOUNCER} // '/usr/sbin/pgbouncer', '-q',
			"$bdir/pgbouncer.ini" ],
		'<' => \undef, '>' => "$bdir/pgbouncer.out", '2>&1');
	push @bouncers, $h;
	my $check = $opt{check} // (sort keys %dbs)[0];
	foreach (1 .. 100)
	{
		my ($ret, $out) = $bouncer->psql($check, 'SELECT 1');
		return ($bouncer, $h, 1) if $ret == 0 && $out eq '1';
		usleep(100_000);
	}
	diag 'pgbouncer: ' . slurp_file("$bdir/pgbouncer.out");
	return ($bouncer, $h, 0);
}

# Run $sql in database $db of $node in a psql of its own that stops at the
# first error (%params as for PostgreSQL::Test::Cluster::psql, e.g.
# extra_params => [ '-U', $role ]); return the SQLSTATE of that error (''
# if none), psql's stdout and its stderr.
sub try_sql
{
	my ($node, $db, $sql, %params) = @_;
	my ($out, $err) = ('', '');
	$node->psql($db, "\\set VERBOSITY verbose\n$sql",
		stdout => \$out, stderr => \$err, on_error_stop => 1, %params);
	my ($state) = $err =~ /ERROR:\s+([0-9A-Z]{5}):/;
	return ($state // '', $out, $err);
}

# A background psql session on database $db of $node that goes on after
# errors; returns it and its backend's pid.
sub backend_session
{
	my ($node, $db) = @_;
	my $s = $node->background_psql($db, on_error_stop => 0);
	my $pid = $s->query_safe('SELECT pg_backend_pid()');
	chomp $pid;
	return ($s, $pid);
}

# Wait until backend $pid of $node sleeps in a dlock wait (acquire() on its
# latch: wait event type Extension); returns whether it does.
sub sleeps_in_dlock
{
	my ($node, $db, $pid) = @_;
	return $node->poll_query_until($db, qq{
		SELECT wait_event_type = 'Extension' FROM pg_stat_activity WHERE pid = $pid});
}

1;
