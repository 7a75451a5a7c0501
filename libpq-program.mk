# libpq-program.mk: what the Makefiles of dlock's libpq programs (client/,
# chaos/, fuzz/) share; each includes it after PGXS.
#
# Makefile.global's LIBS are what the server links with (PAM, LDAP, XML,
# compression, ...); a libpq program needs none of them (libpq brings its
# own), and distributions' server-dev packages do not pull in their -dev
# packages, so linking with them fails there.
LIBS := $(filter-out -lpam -lxml2 -lxslt -lselinux -lzstd -llz4 -lz \
	-lgssapi_krb5 -lkrb5 -lcom_err -lldap -llber -lssl -lcrypto \
	-lreadline -ledit -ltermcap -lncurses -lsystemd -licui18n -licuuc \
	-licudata -luuid -lossp-uuid, $(LIBS))
