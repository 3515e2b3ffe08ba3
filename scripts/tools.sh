# scripts/tools.sh - sourced by scripts/test: make sure the programs the tests drive are here.
#
# The tests need pg_dump (the schema snapshot test), Debian's chromium (the console's browser
# tests in ui/uitest; or KAGZI_CHROMIUM naming another Chromium) and pgbouncer (the deployment
# tests). On a machine where they are missing and this runs as root with apt-get, they are
# installed; otherwise a warning says which tests will fail and how to get the program.

kagzi_apt_install() { # package...
	if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
		echo "scripts/test: installing $* (apt-get)" >&2
		if [ -z "${kagzi_apt_updated:-}" ]; then
			apt-get update -qq >&2 || true
			kagzi_apt_updated=1
		fi
		DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >&2
	else
		return 1
	fi
}

kagzi_install_test_tools() {
	if ! command -v pg_dump >/dev/null 2>&1 && ! ls /usr/lib/postgresql/*/bin/pg_dump >/dev/null 2>&1; then
		kagzi_apt_install postgresql-client ||
			echo "scripts/test: warning: pg_dump not found: the schema snapshot test will fail (install postgresql-client)" >&2
	fi
	if ! command -v chromium >/dev/null 2>&1 && ! command -v chromium-browser >/dev/null 2>&1 && [ -z "${KAGZI_CHROMIUM:-}" ]; then
		kagzi_apt_install chromium ||
			echo "scripts/test: warning: chromium not found: the console's browser tests will fail (install chromium, or set KAGZI_CHROMIUM)" >&2
	fi
	if ! command -v pgbouncer >/dev/null 2>&1 && [ ! -x /usr/sbin/pgbouncer ]; then
		kagzi_apt_install pgbouncer ||
			echo "scripts/test: warning: pgbouncer not found: the PgBouncer and connection-budget tests will fail (install pgbouncer)" >&2
	fi
	return 0
}
