# Every way to install a version of dlock gives the same catalogs (issue 19:
# one base script, dlock--0.1.sql, and the upgrade chain, as contrib keeps
# its scripts).
#
# 1. For each version V from 0.2 to the default: CREATE EXTENSION dlock
#    VERSION 'V' in one database, CREATE EXTENSION dlock VERSION '0.1' and
#    ALTER EXTENSION dlock UPDATE TO 'V' in another; both have the same
#    catalogs: the extension's row (its configuration tables by name, their
#    conditions), members, functions with every property pg_proc keeps,
#    relations, columns, defaults, views, rules, types, sequences and their
#    parameters, constraints, indexes, triggers, dependencies (pg_depend and
#    pg_shdepend), grants, initial privileges and comments; and the same
#    pg_dump --schema-only, plain and --binary-upgrade (which lists each
#    member).  OIDs aside, and what differs between any two databases: the
#    relfrozenxid that binary upgrade mode sets, and the attribute version
#    stamps recent minor releases keep in attoptions (pg_attver).
# 2. For the released versions 0.2 to 0.5, the catalogs are also those
#    recorded in t/install_paths/V.catalog from the full install scripts
#    dlock--0.2.sql, --0.3.sql and --0.4.sql (0.5: --0.4.sql and
#    --0.4--0.5.sql) before they were replaced by the chain.  To record
#    them again (only ever for a version not yet released), run the test
#    with DLOCK_CATALOG_DIR set to a directory: the listings are written
#    there instead of being compared.
# 3. Each database of 1, updated with ALTER EXTENSION dlock UPDATE, has the
#    catalogs of a fresh install of the default version: every upgrade
#    path ends in the same place.
# 4. The schema check the full scripts made before creating anything is
#    made on every path: CREATE EXTENSION dlock VERSION 'V' into a schema
#    dlock created by an ordinary role is refused (42501, naming the role)
#    and leaves nothing behind.  (On the chain the check runs after the
#    base script, in the same transaction; when the squatter's schema
#    already holds an object of that name, the refusal is the
#    duplicate-object error of the base script instead.)
#
# Everything is installed by a superuser named installer, so that the
# listings name the same roles whoever runs the test.
use strict;
use warnings;
use File::Basename;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

# The versions, in order; the last is the default version.
my @versions = ('0.1', '0.2', '0.3', '0.4', '0.5', '0.6', '0.7');
my $default = $versions[-1];
# The versions whose catalogs were recorded from the full install scripts.
my @recorded = ('0.2', '0.3', '0.4', '0.5');
my $recorded_dir = dirname(__FILE__) . '/install_paths';
my $write_dir = $ENV{DLOCK_CATALOG_DIR};

my $node = PostgreSQL::Test::Cluster->new('install_paths');
$node->init;
$node->append_conf('postgresql.conf', "shared_preload_libraries = 'dlock'\n");
$node->start;
$node->safe_psql('postgres', q{
	CREATE ROLE installer SUPERUSER LOGIN;
	CREATE ROLE squatter LOGIN;
});

my @as_installer = (extra_params => [ '-U', 'installer' ]);

is($node->safe_psql('postgres', q{
		SELECT default_version FROM pg_available_extensions WHERE name = 'dlock'}),
	$default, "the default version is $default");

# The catalog listings of the extension in a database, one query each.
my $in_dlock_schema = q{(pg_identify_object(classid, objid, objsubid)).schema = 'dlock'};
my @catalog = (
	'extension' => q{
		SELECT e.extname, e.extowner::regrole, e.extnamespace::regnamespace,
			e.extrelocatable, e.extversion,
			e.extconfig::regclass[]::text, e.extcondition
		FROM pg_extension e WHERE e.extname = 'dlock'},
	'schema' => q{
		SELECT n.nspname, n.nspowner::regrole, n.nspacl
		FROM pg_namespace n WHERE n.nspname = 'dlock'},
	'members' => q{
		SELECT pg_describe_object(classid, objid, objsubid), deptype
		FROM pg_depend
		WHERE refclassid = 'pg_extension'::regclass
		  AND refobjid = (SELECT oid FROM pg_extension WHERE extname = 'dlock')
		ORDER BY 1, 2},
	'functions' => q{
		SELECT p.oid::regprocedure, p.proname, p.proowner::regrole, l.lanname,
			p.prokind, p.prosecdef, p.proleakproof, p.proisstrict, p.proretset,
			p.provolatile, p.proparallel, p.procost, p.prorows, p.prosupport,
			p.pronargs, p.pronargdefaults, p.prorettype::regtype,
			p.proargtypes::regtype[], p.proallargtypes::regtype[],
			p.proargmodes, p.proargnames,
			pg_get_expr(p.proargdefaults, 0), p.protrftypes, p.prosrc,
			p.probin, pg_get_function_sqlbody(p.oid), p.proconfig, p.proacl,
			pg_get_functiondef(p.oid)
		FROM pg_proc p JOIN pg_language l ON l.oid = p.prolang
		WHERE p.pronamespace = 'dlock'::regnamespace
		ORDER BY p.oid::regprocedure::text},
	'relations' => q{
		SELECT c.relname, c.relkind, c.relpersistence, c.relowner::regrole,
			c.reltype::regtype, c.reloftype::regtype, am.amname,
			c.reltablespace, c.reltoastrelid <> 0, c.relhasindex,
			c.relisshared, c.relnatts, c.relchecks, c.relhasrules,
			c.relhastriggers, c.relhassubclass, c.relrowsecurity,
			c.relforcerowsecurity, c.relreplident, c.relispartition,
			c.relacl, c.reloptions
		FROM pg_class c LEFT JOIN pg_am am ON am.oid = c.relam
		WHERE c.relnamespace = 'dlock'::regnamespace
		ORDER BY c.relname},
	'columns' => q{
		SELECT c.relname, a.attnum, a.attname, format_type(a.atttypid, a.atttypmod),
			a.attstattarget, a.attlen, a.attndims, a.attbyval, a.attalign,
			a.attstorage, a.attcompression, a.attnotnull, a.atthasdef,
			a.atthasmissing, a.attmissingval, a.attidentity, a.attgenerated,
			a.attisdropped, a.attislocal, a.attinhcount,
			a.attcollation::regcollation, a.attacl,
			array(SELECT o FROM unnest(a.attoptions) AS o
				  WHERE o NOT LIKE 'pg_attver=%'),
			a.attfdwoptions
		FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid
		WHERE c.relnamespace = 'dlock'::regnamespace AND a.attnum > 0
		ORDER BY c.relname, a.attnum},
	'column defaults' => q{
		SELECT d.adrelid::regclass, d.adnum, pg_get_expr(d.adbin, d.adrelid)
		FROM pg_attrdef d JOIN pg_class c ON c.oid = d.adrelid
		WHERE c.relnamespace = 'dlock'::regnamespace
		ORDER BY 1, 2},
	'views' => q{
		SELECT c.relname, pg_get_viewdef(c.oid)
		FROM pg_class c
		WHERE c.relnamespace = 'dlock'::regnamespace AND c.relkind = 'v'
		ORDER BY c.relname},
	'rules' => q{
		SELECT r.ev_class::regclass, r.rulename, r.ev_type, r.ev_enabled,
			r.is_instead, pg_get_ruledef(r.oid)
		FROM pg_rewrite r JOIN pg_class c ON c.oid = r.ev_class
		WHERE c.relnamespace = 'dlock'::regnamespace
		ORDER BY 1, 2},
	'types' => q{
		SELECT t.typname, t.typtype, t.typcategory, t.typowner::regrole,
			t.typrelid::regclass, t.typelem::regtype, t.typarray::regtype,
			t.typlen, t.typbyval, t.typalign, t.typstorage, t.typnotnull,
			t.typbasetype::regtype, t.typcollation, t.typdefault, t.typacl
		FROM pg_type t
		WHERE t.typnamespace = 'dlock'::regnamespace
		ORDER BY t.typname},
	'sequences' => q{
		SELECT s.seqrelid::regclass, s.seqtypid::regtype, s.seqstart,
			s.seqincrement, s.seqmax, s.seqmin, s.seqcache, s.seqcycle,
			v.last_value
		FROM pg_sequence s
			JOIN pg_class c ON c.oid = s.seqrelid
			JOIN pg_sequences v ON v.schemaname = 'dlock' AND v.sequencename = c.relname
		WHERE c.relnamespace = 'dlock'::regnamespace
		ORDER BY 1},
	'constraints and indexes' => q{
		SELECT conrelid::regclass::text, conname::text, contype::text,
			condeferrable::text, condeferred::text, convalidated::text,
			pg_get_constraintdef(oid)
		FROM pg_constraint WHERE connamespace = 'dlock'::regnamespace
		UNION ALL
		SELECT i.indrelid::regclass::text, i.indexrelid::regclass::text, 'index',
			i.indisunique::text || ' ' || i.indisprimary || ' ' || i.indisvalid,
			i.indisclustered::text, i.indisreplident::text,
			pg_get_indexdef(i.indexrelid)
		FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid
		WHERE c.relnamespace = 'dlock'::regnamespace
		ORDER BY 1, 2, 3},
	'triggers' => q{
		SELECT t.tgrelid::regclass, t.tgname, t.tgfoid::regprocedure, t.tgtype,
			t.tgenabled, t.tgisinternal, pg_get_triggerdef(t.oid)
		FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid
		WHERE c.relnamespace = 'dlock'::regnamespace
		   OR t.tgfoid IN (SELECT oid FROM pg_proc
						   WHERE pronamespace = 'dlock'::regnamespace)
		ORDER BY 1, 2},
	'dependencies' => qq{
		SELECT regexp_replace(pg_describe_object(classid, objid, objsubid),
				'pg_toast_[0-9]+', 'pg_toast_N'),
			regexp_replace(pg_describe_object(refclassid, refobjid, refobjsubid),
				'pg_toast_[0-9]+', 'pg_toast_N'),
			deptype
		FROM pg_depend
		WHERE $in_dlock_schema
		   OR (pg_identify_object(refclassid, refobjid, refobjsubid)).schema = 'dlock'
		   OR (classid = 'pg_namespace'::regclass AND objid = 'dlock'::regnamespace)
		   OR (refclassid = 'pg_namespace'::regclass AND refobjid = 'dlock'::regnamespace)
		ORDER BY 1, 2, 3},
	'shared dependencies' => qq{
		SELECT pg_describe_object(classid, objid, objsubid),
			pg_describe_object(refclassid, refobjid, 0), deptype
		FROM pg_shdepend
		WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())
		  AND ($in_dlock_schema
			   OR (classid = 'pg_namespace'::regclass AND objid = 'dlock'::regnamespace)
			   OR (classid = 'pg_extension'::regclass
				   AND objid = (SELECT oid FROM pg_extension WHERE extname = 'dlock')))
		ORDER BY 1, 2, 3},
	'initial privileges' => q{
		SELECT pg_describe_object(classoid, objoid, objsubid), privtype, initprivs
		FROM pg_init_privs
		WHERE (pg_identify_object(classoid, objoid, objsubid)).schema = 'dlock'
		   OR (classoid = 'pg_namespace'::regclass AND objoid = 'dlock'::regnamespace)
		ORDER BY 1},
	'comments' => q{
		SELECT pg_describe_object(d.classoid, d.objoid, d.objsubid), d.description
		FROM pg_description d
		WHERE (pg_identify_object(d.classoid, d.objoid, d.objsubid)).schema = 'dlock'
		   OR (d.classoid = 'pg_namespace'::regclass AND d.objoid = 'dlock'::regnamespace)
		   OR (d.classoid = 'pg_extension'::regclass
			   AND d.objoid = (SELECT oid FROM pg_extension WHERE extname = 'dlock'))
		ORDER BY 1});
my @sections = @catalog[ grep { $_ % 2 == 0 } 0 .. $#catalog ];
my %catalog = @catalog;

# The listings of database $db: section name => text.
sub catalog_of
{
	my ($db) = @_;
	return { map { $_ => $node->safe_psql($db, $catalog{$_}) } @sections };
}

# The listings as one text, a "== section ==" line before each.
sub catalog_text
{
	my ($listing) = @_;
	return join '', map { "== $_ ==\n$listing->{$_}\n" } @sections;
}

# The listings in a text made by catalog_text.
sub parse_catalog
{
	my ($text) = @_;
	my (%listing, $section);
	foreach my $line (split /\n/, $text)
	{
		if ($line =~ /^== (.*) ==$/)
		{
			$section = $1;
			$listing{$section} = [];
		}
		else
		{
			push @{ $listing{$section} }, $line;
		}
	}
	return { map { $_ => join "\n", @{ $listing{$_} } } keys %listing };
}

# pg_dump --schema-only of database $db with @options, without what differs
# between two databases with the same objects: the header's versions, the
# random key of \restrict, and OIDs (binary upgrade mode sets each object's
# OID, and names the configuration tables by OID; the extension listing
# names them).
sub schema_dump
{
	my ($db, @options) = @_;
	my ($out, $err) = run_command(
		[ 'pg_dump', '--schema-only', @options, '-d', $node->connstr($db) ]);
	is($err, '', "pg_dump @options of $db: no error");
	$out =~ s/^--.*(?:Dumped (?:from|by)).*\n//mg;
	$out =~ s/^\\(?:un)?restrict .*\n//mg;
	$out =~ s/^SELECT pg_catalog\.binary_upgrade_set_next_.*\n//mg;
	$out =~ s/(binary_upgrade_create_empty_extension\(.*?, )'\{[0-9,]*\}'/$1'{OIDS}'/g;
	$out =~ s/^(SET relfrozenxid = )'[0-9]+'/$1'XID'/mg;
	$out =~ s/^(\s*WHERE oid = )'[0-9]+'/$1'OID'/mg;
	return $out;
}

# Compare two listings, per line, showing the lines only one of them has.
sub same_lines
{
	my ($got, $expected, $what) = @_;
	return 1 if is($got, $expected, $what);
	my %g = map { $_ => 1 } split /\n/, $got;
	my %e = map { $_ => 1 } split /\n/, $expected;
	diag "  only in the first:  $_" for grep { !$e{$_} } split /\n/, $got;
	diag "  only in the second: $_" for grep { !$g{$_} } split /\n/, $expected;
	return 0;
}

#
# 1. CREATE EXTENSION dlock VERSION 'V' and the chain from 0.1 by ALTER
#    EXTENSION UPDATE TO 'V'.
#
my (%direct, %chain);
foreach my $v (@versions)
{
	(my $name = $v) =~ s/\./_/;
	my ($d, $c) = ("direct_$name", "chain_$name");
	$node->safe_psql('postgres', "CREATE DATABASE $d");
	$node->safe_psql('postgres', "CREATE DATABASE $c");
	$node->safe_psql($d, "CREATE EXTENSION dlock VERSION '$v'", @as_installer);
	$node->safe_psql($c, "CREATE EXTENSION dlock VERSION '0.1'", @as_installer);
	$node->safe_psql($c, "ALTER EXTENSION dlock UPDATE TO '$v'", @as_installer)
	  if $v ne '0.1';
	$direct{$v} = catalog_of($d);
	$chain{$v} = catalog_of($c);
	is($direct{$v}{extension}, "dlock|installer|dlock|f|$v|"
		  . ($v lt '0.4' ? '{dlock.leases,dlock.fence_seq}|{"",""}'
			  : '{dlock.leases,dlock.fence_seq,dlock.horizon_seq}|{"","",""}'),
		"$v: installed, with its configuration tables");
	next if $v eq '0.1';

	foreach my $what (@sections)
	{
		same_lines($chain{$v}{$what}, $direct{$v}{$what},
			"$v: the chain from 0.1 and CREATE EXTENSION VERSION '$v': the same $what");
	}
	same_lines(schema_dump($c), schema_dump($d),
		"$v: the chain from 0.1 and CREATE EXTENSION VERSION '$v': the same pg_dump --schema-only");
	my $binary = schema_dump($d, '--binary-upgrade');
	like($binary,
		qr/binary_upgrade_create_empty_extension\('dlock', 'dlock', false, '\Q$v\E', '\{OIDS\}'/,
		"$v: pg_dump --binary-upgrade creates the extension");
	like($binary, qr/^ALTER EXTENSION dlock ADD TABLE dlock\.leases;$/m,
		"$v: pg_dump --binary-upgrade lists its members");
	same_lines(schema_dump($c, '--binary-upgrade'), $binary,
		"$v: the chain from 0.1 and CREATE EXTENSION VERSION '$v': the same pg_dump --schema-only --binary-upgrade");
}

# Listings that must not be empty, lest a query find nothing on both sides.
foreach my $what (grep { !/^(column defaults|triggers)$/ } @sections)
{
	isnt($direct{$default}{$what}, '', "$default: $what listed");
}

#
# 2. The catalogs the released full scripts made.
#
foreach my $v (@recorded)
{
	my $file = "$recorded_dir/$v.catalog";
	if (defined $write_dir)
	{
		open my $fh, '>', "$write_dir/$v.catalog" or die "$write_dir/$v.catalog: $!";
		print $fh catalog_text($direct{$v});
		close $fh or die "$write_dir/$v.catalog: $!";
		next;
	}
	my $recorded = parse_catalog(slurp_file($file));
	is_deeply([ sort keys %$recorded ], [ sort @sections ],
		"$v: $file lists every section");
	foreach my $what (@sections)
	{
		same_lines($direct{$v}{$what}, $recorded->{$what} // '',
			"$v: CREATE EXTENSION VERSION '$v' and the full script of $v: the same $what");
	}
}

#
# 3. Every version updated to the default one.
#
foreach my $v (@versions[ 0 .. $#versions - 1 ])
{
	(my $name = $v) =~ s/\./_/;
	$node->safe_psql("direct_$name", 'ALTER EXTENSION dlock UPDATE', @as_installer);
	my $updated = catalog_of("direct_$name");
	foreach my $what (@sections)
	{
		same_lines($updated->{$what}, $direct{$default}{$what},
			"$v updated to $default and a fresh $default: the same $what");
	}
}

#
# 4. A schema dlock created by another role is refused on every path.
#
my $leftovers = q{
	SELECT (SELECT count(*) FROM pg_extension WHERE extname = 'dlock')
		|| ' ' || (SELECT count(*) FROM pg_class WHERE relnamespace = 'dlock'::regnamespace)
		|| ' ' || (SELECT count(*) FROM pg_proc WHERE pronamespace = 'dlock'::regnamespace)
		|| ' ' || (SELECT count(*) FROM pg_type WHERE typnamespace = 'dlock'::regnamespace)
		|| ' ' || (SELECT nspowner::regrole FROM pg_namespace WHERE nspname = 'dlock')};
$node->safe_psql('postgres', 'CREATE DATABASE squat');
$node->safe_psql('squat', 'GRANT CREATE ON DATABASE squat TO squatter');
$node->safe_psql('squat', 'CREATE SCHEMA dlock', extra_params => [ '-U', 'squatter' ]);
foreach my $v (@versions[ 1 .. $#versions ])
{
	my ($out, $err) = ('', '');
	$node->psql('squat', "\\set VERBOSITY verbose\nCREATE EXTENSION dlock VERSION '$v'",
		stdout => \$out, stderr => \$err, @as_installer);
	like($err,
		qr/ERROR:\s+42501: schema "dlock" of extension dlock is owned by role "squatter"/,
		"CREATE EXTENSION dlock VERSION '$v' in a schema created by another role: refused");
	is($node->safe_psql('squat', $leftovers), '0 0 0 0 squatter',
		"CREATE EXTENSION dlock VERSION '$v': nothing left behind");
}

# The squatter's schema already holds a dlock.fence_seq: the base script
# fails on it (42P07) before the check of 0.1--0.2 runs; refused all the
# same, and only the squatter's own object is left.
$node->safe_psql('squat', 'CREATE SEQUENCE dlock.fence_seq',
	extra_params => [ '-U', 'squatter' ]);
my ($rc) = $node->psql('squat', 'CREATE EXTENSION dlock', @as_installer);
isnt($rc, 0, 'CREATE EXTENSION dlock in a squatted schema holding a dlock.fence_seq: refused');
is($node->safe_psql('squat', $leftovers), '0 1 0 0 squatter',
	'... leaving only the squatter\'s sequence');
is($node->safe_psql('squat', q{
		SELECT relowner::regrole FROM pg_class WHERE oid = 'dlock.fence_seq'::regclass}),
	'squatter', '... which is still the squatter\'s');

$node->stop;
done_testing();
