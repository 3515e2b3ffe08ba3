# shellcheck shell=bash
#
# scripts/pg.sh - find (or start) a PostgreSQL server for Kagzi's tests and
# examples. Source it, then call kagzi_find_postgres:
#
#   source scripts/pg.sh
#   kagzi_find_postgres            # sets and exports DATABASE_URL
#   trap kagzi_stop_postgres EXIT  # optional; see below
#
# kagzi_find_postgres tries, in order:
#   a. KAGZI_DATABASE_URL (takes precedence) or DATABASE_URL, if set. It must
#      answer, otherwise this fails (it never silently falls back).
#   b. a server on 127.0.0.1:5432, as user "postgres", then as the current OS
#      user (database "postgres", sslmode=disable).
#   c. a stopped Debian cluster (pg_lsclusters / pg_ctlcluster), started and
#      re-checked as in (b).
#   d. a throwaway cluster in ${TMPDIR:-/tmp}/kagzi-pg-XXXXXX built with the
#      installed initdb/pg_ctl (trust auth, fsync=off, port 54329 upward).
#      When run as root, the cluster runs as the "postgres" OS user (or
#      "nobody"), because initdb refuses to run as root.
#   e. otherwise it prints how to get a PostgreSQL server and returns 1.
#
# kagzi_stop_postgres stops and deletes the throwaway cluster of (d), if one
# was started by this shell; it is a no-op otherwise and safe to call twice.
# When (d) starts a cluster, kagzi_find_postgres installs EXIT/INT/TERM/HUP
# traps that call kagzi_stop_postgres. If you set your own EXIT trap after
# calling kagzi_find_postgres, call kagzi_stop_postgres from it.
#
# Environment knobs (mainly for testing this file):
#   KAGZI_PG_THROWAWAY=1   skip (b) and (c): always start a throwaway cluster
#                          (still honours KAGZI_DATABASE_URL / DATABASE_URL).
#   KAGZI_PG_KEEP=1        kagzi_stop_postgres leaves the throwaway cluster
#                          running and prints where it is.
#
# The code is safe under `set -euo pipefail` in the caller. Call
# kagzi_find_postgres directly (not in $(...)) so the export reaches you.

# Internal state for the throwaway cluster (not exported on purpose: child
# processes reuse it through the exported DATABASE_URL instead).
_KAGZI_PG_DIR=${_KAGZI_PG_DIR:-}
_KAGZI_PG_BINDIR=${_KAGZI_PG_BINDIR:-}
_KAGZI_PG_RUNAS=${_KAGZI_PG_RUNAS:-}
_KAGZI_PG_THROWAWAY_URL=${_KAGZI_PG_THROWAWAY_URL:-}
_KAGZI_PG_LASTERR=

_kagzi_log() {
	printf 'kagzi: %s\n' "$*" >&2
}

# _kagzi_redact URL: hide any password in a URL or key=value conninfo.
_kagzi_redact() {
	printf '%s\n' "$1" | sed -E \
		-e 's#(://[^:/@?]*):[^@/]*@#\1:***@#' \
		-e 's#(password=)[^& ]*#\1***#g'
}

# _kagzi_check_url URL: succeed if a server answers at URL (and, with psql,
# accepts the login). Never prompts for a password.
_kagzi_check_url() {
	local url=$1
	_KAGZI_PG_LASTERR=
	if command -v psql >/dev/null 2>&1; then
		_KAGZI_PG_LASTERR=$(PGCONNECT_TIMEOUT=5 psql -X -w -q -Atc 'select 1' "$url" </dev/null 2>&1 >/dev/null) && return 0
		_KAGZI_PG_LASTERR=$(printf '%s\n' "$_KAGZI_PG_LASTERR" | sed -n '1{s/^psql: //;s/^error: //;p;}')
		return 1
	elif command -v pg_isready >/dev/null 2>&1; then
		_KAGZI_PG_LASTERR=$(pg_isready -t 5 -d "$url" </dev/null 2>&1) && return 0
		return 1
	else
		_kagzi_log "warning: neither psql nor pg_isready is installed; cannot check $(_kagzi_redact "$url")"
		return 0
	fi
}

# _kagzi_port_answers HOST PORT: is a PostgreSQL server (or, without
# pg_isready, anything at all) listening on HOST:PORT?
_kagzi_port_answers() {
	local host=$1 port=$2 isready=
	if command -v pg_isready >/dev/null 2>&1; then
		isready=pg_isready
	elif [ -n "$_KAGZI_PG_BINDIR" ] && [ -x "$_KAGZI_PG_BINDIR/pg_isready" ]; then
		isready=$_KAGZI_PG_BINDIR/pg_isready
	fi
	if [ -n "$isready" ]; then
		"$isready" -q -t 3 -h "$host" -p "$port" >/dev/null 2>&1
	else
		(: <"/dev/tcp/$host/$port") >/dev/null 2>&1
	fi
}

# _kagzi_port_in_use PORT: is anything listening on 127.0.0.1:PORT?
_kagzi_port_in_use() {
	(: <"/dev/tcp/127.0.0.1/$1") >/dev/null 2>&1
}

# _kagzi_try_local PORT: if a server answers on 127.0.0.1:PORT and lets us in
# as "postgres" or as the current OS user, export DATABASE_URL and succeed.
_kagzi_try_local() {
	local port=$1 user url me
	_kagzi_port_answers 127.0.0.1 "$port" || return 1
	me=$(id -un 2>/dev/null || printf '%s' "${USER:-}")
	for user in postgres "$me"; do
		[ -n "$user" ] || continue
		url="postgres://${user}@127.0.0.1:${port}/postgres?sslmode=disable"
		if _kagzi_check_url "$url"; then
			DATABASE_URL=$url
			export DATABASE_URL
			_kagzi_log "using local PostgreSQL on 127.0.0.1:${port} as user ${user}: ${url}"
			return 0
		fi
		[ "$user" != "$me" ] || break
	done
	_kagzi_log "a server answers on 127.0.0.1:${port} but refuses user postgres${me:+ and user $me} without a password (set DATABASE_URL to use it)"
	return 1
}

# _kagzi_try_debian_clusters: start stopped Debian clusters, then try them.
_kagzi_try_debian_clusters() {
	command -v pg_lsclusters >/dev/null 2>&1 || return 1
	command -v pg_ctlcluster >/dev/null 2>&1 || return 1
	local ver name port status rest ports=
	while read -r ver name port status rest; do
		case $status in
		down*) ;;
		*) continue ;;
		esac
		_kagzi_log "starting Debian PostgreSQL cluster $ver/$name (port $port)"
		if pg_ctlcluster --skip-systemctl-redirect "$ver" "$name" start >&2; then
			ports="$ports $port"
		else
			_kagzi_log "could not start cluster $ver/$name"
		fi
	done < <(pg_lsclusters --no-header 2>/dev/null || true)
	[ -n "$ports" ] || return 1
	# Prefer the default port, then whatever the started clusters use.
	for port in 5432 $ports; do
		if _kagzi_try_local "$port"; then
			return 0
		fi
	done
	return 1
}

# _kagzi_find_bindir: print a directory holding both initdb and pg_ctl.
_kagzi_find_bindir() {
	local d initdb pgctl
	initdb=$(command -v initdb 2>/dev/null || true)
	pgctl=$(command -v pg_ctl 2>/dev/null || true)
	if [ -n "$initdb" ] && [ -n "$pgctl" ]; then
		# Prefer the directory initdb really lives in (it may be a symlink),
		# so that pg_ctl/postgres/pg_isready come from the same version.
		d=$(dirname "$(readlink -f "$initdb" 2>/dev/null || printf '%s' "$initdb")")
		if [ -x "$d/pg_ctl" ]; then
			printf '%s\n' "$d"
			return 0
		fi
		d=$(dirname "$initdb")
		if [ -x "$d/pg_ctl" ]; then
			printf '%s\n' "$d"
			return 0
		fi
	fi
	# Newest /usr/lib/postgresql/<version>/bin (Debian/Ubuntu layout).
	d=$(
		for d in /usr/lib/postgresql/*/bin; do
			[ -x "$d/initdb" ] && [ -x "$d/pg_ctl" ] && printf '%s\n' "$d"
		done | sort -V | tail -n 1
	) || true
	if [ -n "$d" ]; then
		printf '%s\n' "$d"
		return 0
	fi
	return 1
}

# _kagzi_as_pg CMD...: run CMD as the user owning the throwaway cluster.
_kagzi_as_pg() {
	if [ -z "$_KAGZI_PG_RUNAS" ]; then
		"$@"
	elif command -v runuser >/dev/null 2>&1; then
		(cd / && runuser -u "$_KAGZI_PG_RUNAS" -- "$@")
	else
		local cmd
		cmd=$(printf '%q ' "$@")
		(cd / && su "$_KAGZI_PG_RUNAS" -s /bin/sh -c "$cmd")
	fi
}

# _kagzi_start_throwaway: start a private cluster; set DATABASE_URL.
_kagzi_start_throwaway() {
	local bindir base dir port last tries ok=
	bindir=$(_kagzi_find_bindir) || return 1
	_KAGZI_PG_BINDIR=$bindir

	_KAGZI_PG_RUNAS=
	if [ "$(id -u)" = 0 ]; then
		if id -u postgres >/dev/null 2>&1; then
			_KAGZI_PG_RUNAS=postgres
		elif id -u nobody >/dev/null 2>&1; then
			_KAGZI_PG_RUNAS=nobody
		else
			_kagzi_log "running as root and there is neither a 'postgres' nor a 'nobody' user to run initdb as"
			return 1
		fi
		if ! command -v runuser >/dev/null 2>&1 && ! command -v su >/dev/null 2>&1; then
			_kagzi_log "running as root but neither runuser nor su is available to drop privileges for initdb"
			return 1
		fi
	fi

	for base in "${TMPDIR:-/tmp}" /tmp; do
		dir=$(mktemp -d "${base%/}/kagzi-pg-XXXXXX" 2>/dev/null) || continue
		if [ -n "$_KAGZI_PG_RUNAS" ]; then
			chown "$_KAGZI_PG_RUNAS" "$dir" 2>/dev/null || true
			if ! _kagzi_as_pg test -w "$dir" 2>/dev/null; then
				# e.g. TMPDIR under /root: not reachable by the server's user.
				rm -rf -- "$dir"
				dir=
				continue
			fi
		fi
		break
	done
	if [ -z "${dir:-}" ]; then
		_kagzi_log "could not create a temporary directory for a throwaway PostgreSQL under ${TMPDIR:-/tmp}"
		return 1
	fi
	_KAGZI_PG_DIR=$dir

	# From now on make sure the cluster goes away when the shell exits.
	trap kagzi_stop_postgres EXIT
	trap 'kagzi_stop_postgres; trap - INT; kill -INT $$' INT
	trap 'kagzi_stop_postgres; trap - TERM; kill -TERM $$' TERM
	trap 'kagzi_stop_postgres; trap - HUP; kill -HUP $$' HUP

	_kagzi_log "starting a throwaway PostgreSQL from $bindir in $dir${_KAGZI_PG_RUNAS:+ (as user $_KAGZI_PG_RUNAS)}"
	if ! _kagzi_as_pg "$bindir/initdb" -D "$dir/data" --auth=trust -U postgres \
		-E UTF8 --locale=C --no-sync >"$dir/initdb.log" 2>&1; then
		_kagzi_log "initdb failed:"
		tail -n 20 "$dir/initdb.log" >&2 || true
		kagzi_stop_postgres
		return 1
	fi

	port=54329
	last=$((port + 100))
	tries=0
	while [ "$port" -lt "$last" ] && [ "$tries" -lt 10 ]; do
		if _kagzi_port_in_use "$port"; then
			port=$((port + 1))
			continue
		fi
		tries=$((tries + 1))
		if _kagzi_as_pg "$bindir/pg_ctl" -D "$dir/data" -l "$dir/postgres.log" -w -t 60 \
			-o "-p $port -k '$dir' -c listen_addresses=127.0.0.1 -c fsync=off -c synchronous_commit=off -c full_page_writes=off" \
			start >/dev/null 2>&1; then
			ok=1
			break
		fi
		if grep -qiE 'address already in use|could not create listen socket|could not bind' "$dir/postgres.log" 2>/dev/null; then
			: >"$dir/postgres.log" 2>/dev/null || true
			port=$((port + 1))
			continue
		fi
		break
	done
	if [ -z "$ok" ]; then
		_kagzi_log "could not start the throwaway PostgreSQL; server log:"
		tail -n 20 "$dir/postgres.log" >&2 2>/dev/null || true
		kagzi_stop_postgres
		return 1
	fi

	DATABASE_URL="postgres://postgres@127.0.0.1:${port}/postgres?sslmode=disable"
	export DATABASE_URL
	if ! _kagzi_check_url "$DATABASE_URL"; then
		_kagzi_log "the throwaway PostgreSQL started but does not answer at $DATABASE_URL"
		kagzi_stop_postgres
		return 1
	fi
	_kagzi_log "using throwaway PostgreSQL on 127.0.0.1:${port} (data in $dir): $DATABASE_URL"
}

# kagzi_stop_postgres: stop and delete the throwaway cluster, if any.
kagzi_stop_postgres() {
	local dir=${_KAGZI_PG_DIR:-}
	[ -n "$dir" ] || return 0
	if [ "${KAGZI_PG_KEEP:-}" = 1 ]; then
		_kagzi_log "KAGZI_PG_KEEP=1: leaving the throwaway PostgreSQL running in $dir (stop it with: ${_KAGZI_PG_RUNAS:+runuser -u $_KAGZI_PG_RUNAS -- }$_KAGZI_PG_BINDIR/pg_ctl -D $dir/data -m fast stop)"
		_KAGZI_PG_DIR=
		return 0
	fi
	_KAGZI_PG_DIR=
	if [ -f "$dir/data/postmaster.pid" ]; then
		_kagzi_as_pg "$_KAGZI_PG_BINDIR/pg_ctl" -D "$dir/data" -m fast -w -t 60 stop >/dev/null 2>&1 ||
			_kagzi_log "warning: pg_ctl stop failed for $dir/data"
	fi
	case $dir in
	*/kagzi-pg-*) rm -rf -- "$dir" ;;
	esac
	if [ "${DATABASE_URL:-}" != "" ] && [ -n "${_KAGZI_PG_THROWAWAY_URL:-}" ] && [ "$DATABASE_URL" = "$_KAGZI_PG_THROWAWAY_URL" ]; then
		unset DATABASE_URL
	fi
	_KAGZI_PG_THROWAWAY_URL=
	return 0
}

# kagzi_find_postgres: see the top of this file.
kagzi_find_postgres() {
	local url src

	# (a) explicit configuration: use it or fail loudly.
	if [ -n "${KAGZI_DATABASE_URL:-}" ]; then
		url=$KAGZI_DATABASE_URL
		src=KAGZI_DATABASE_URL
	elif [ -n "${DATABASE_URL:-}" ]; then
		url=$DATABASE_URL
		src=DATABASE_URL
	else
		url=
		src=
	fi
	if [ -n "$url" ]; then
		if ! _kagzi_check_url "$url"; then
			_kagzi_log "error: $src is set to $(_kagzi_redact "$url") but connecting to it fails:"
			[ -z "${_KAGZI_PG_LASTERR:-}" ] || _kagzi_log "       ($_KAGZI_PG_LASTERR)"
			_kagzi_log "       Start that server, fix $src, or unset it to let scripts/pg.sh find or start one."
			return 1
		fi
		DATABASE_URL=$url
		export DATABASE_URL
		_kagzi_log "using PostgreSQL from $src: $(_kagzi_redact "$url")"
		return 0
	fi

	if [ "${KAGZI_PG_THROWAWAY:-}" != 1 ]; then
		# (b) a server on the default local port.
		if _kagzi_try_local 5432; then
			return 0
		fi
		# (c) a registered but stopped Debian cluster.
		if ! _kagzi_port_answers 127.0.0.1 5432 && _kagzi_try_debian_clusters; then
			return 0
		fi
	fi

	# (d) a throwaway cluster from the installed binaries.
	if [ -n "$_KAGZI_PG_DIR" ] && [ -n "${_KAGZI_PG_THROWAWAY_URL:-}" ] && _kagzi_check_url "$_KAGZI_PG_THROWAWAY_URL"; then
		DATABASE_URL=$_KAGZI_PG_THROWAWAY_URL
		export DATABASE_URL
		_kagzi_log "reusing throwaway PostgreSQL: $DATABASE_URL"
		return 0
	fi
	if _kagzi_find_bindir >/dev/null; then
		if _kagzi_start_throwaway; then
			_KAGZI_PG_THROWAWAY_URL=$DATABASE_URL
			return 0
		fi
		return 1
	fi

	# (e) nothing works.
	cat >&2 <<'EOF'
kagzi: error: no PostgreSQL server found, and no PostgreSQL binaries (initdb, pg_ctl) to start one.
kagzi: Kagzi's tests and examples need PostgreSQL. Any one of these works:
kagzi:   - point at an existing server:
kagzi:       export DATABASE_URL='postgres://USER:PASSWORD@HOST:5432/DBNAME?sslmode=disable'
kagzi:   - install PostgreSQL locally (this script then uses or starts it):
kagzi:       sudo apt-get install postgresql        # Debian/Ubuntu
kagzi:       brew install postgresql@16             # macOS
kagzi:   - run one in a container:
kagzi:       docker run -d -p 5432:5432 -e POSTGRES_HOST_AUTH_METHOD=trust postgres:16
EOF
	return 1
}
