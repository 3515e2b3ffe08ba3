#!/bin/sh
# walbytes.sh START_LSN END_LSN DB_OID [RUNS]
# go run . -workloads burn1 ... 2>&1 | sh walbytes.sh
#
# The WAL bytes that one database wrote between two WAL positions, whatever else the
# server did meanwhile: pg_waldump's records whose block references name the database,
# plus the records without one (commits) of the transactions that wrote such records.
# A burn-down prints its range and its database's oid ("WAL 0/1A2B..0/3C4D, database
# oid 16384"); give RUNS to divide. Run it as a user that can read the server's pg_wal
# (PGWAL, default /var/lib/postgresql/15/main/pg_wal), soon after the burn-down: a
# checkpoint recycles the segments: without arguments, it copies its input (the
# bench's stderr and stdout) and attributes each burn-down's WAL as soon as the
# burn-down's line appears. See docs/scaling.md.
set -eu
if [ $# -eq 0 ]; then
	while IFS= read -r line; do
		printf '%s\n' "$line"
		case $line in
		*"done in"*"; WAL "*", database oid "*)
			n=$(printf '%s\n' "$line" | sed -n 's/.*] *\([0-9][0-9]*\) done in.*/\1/p')
			r=$(printf '%s\n' "$line" | sed -n 's/.*; WAL \([0-9A-F/]*\)\.\.\([0-9A-F/]*\), database oid \([0-9]*\).*/\1 \2 \3/p')
			# shellcheck disable=SC2086
			[ -n "$r" ] && sh "$0" $r "$n" | sed 's/^/    WAL: /'
			;;
		esac
	done
	exit 0
fi
start=$1 end=$2 db=$3 runs=${4:-1}
wal=${PGWAL:-/var/lib/postgresql/15/main/pg_wal}
bin=${PGBIN:-/usr/lib/postgresql/15/bin}
"$bin/pg_waldump" -p "$wal" -s "$start" -e "$end" 2>/dev/null | awk -v db="$db" -v runs="$runs" '
{
	tot = $0; sub(/.*len \(rec\/tot\): *[0-9]+\/ */, "", tot); sub(/,.*/, "", tot); tot += 0
	tx = $0; sub(/.*tx: */, "", tx); sub(/,.*/, "", tx); tx += 0
	rmgr = $2
	all += tot
	if (match($0, /rel [0-9]+\/[0-9]+\//)) {
		d = substr($0, RSTART + 4, RLENGTH - 5); sub(/^[0-9]+\//, "", d)
		if (d == db) { mine += tot; byrmgr[rmgr] += tot; if (tx) txdb[tx] = 1 }
	} else if (tx) {
		loose[tx] += tot; looserm[tx] = rmgr
	}
}
END {
	for (tx in loose) if (tx in txdb) { mine += loose[tx]; byrmgr[looserm[tx]] += loose[tx] }
	printf "database %s: %d bytes (%.0f per run over %d runs); whole server: %d bytes\n", db, mine, mine / runs, runs, all
	for (r in byrmgr) printf "  %-12s %d bytes (%.0f per run)\n", r, byrmgr[r], byrmgr[r] / runs
}'
