package store

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// The history (migration 00009): finished runs move out of the live tables into
// tables partitioned by the UTC day their run finished; retention drops a day's
// partitions. HistoryTables are the partitioned tables, each partitioned by its
// HistoryKey column; every day has one partition in each, named
// <table>_pYYYYMMDD.
var HistoryTables = []string{"runs_history", "steps_history", "step_attempts_history",
	"signals_history", "events_history", "runs_created_history"}

// historyKey is the partition key column of a history table.
func historyKey(table string) string {
	if table == "runs_history" {
		return "finished_at"
	}
	return "run_finished_at"
}

// HistoryPartitionName is the partition of table (one of HistoryTables) that holds
// the runs that finished on day (a UTC midnight).
func HistoryPartitionName(table string, day time.Time) string {
	return table + "_p" + day.UTC().Format("20060102")
}

// historyDay parses the day of a partition name, ok false when it is not one.
func historyDay(table, name string) (time.Time, bool) {
	s, ok := strings.CutPrefix(name, table+"_p")
	if !ok || len(s) != 8 {
		return time.Time{}, false
	}
	d, err := time.Parse("20060102", s)
	return d, err == nil
}

// Beginner is a DBTX that can begin a transaction (a pool, a connection, a
// transaction: a savepoint).
type Beginner interface {
	DBTX
	Begin(ctx context.Context) (pgx.Tx, error)
}

// detachPending is pg_inherits.inhdetachpending of the row i (a detach begun
// CONCURRENTLY and not finished), read so that the statement also parses on
// PostgreSQL 13, which has no such column (false there).
const detachPending = `coalesce((to_jsonb(i) ->> 'inhdetachpending')::boolean, false)`

// historyLockKey serialises the creation and the dropping of history partitions
// between processes (an advisory lock key).
const historyLockKey = `hashtextextended('kagzi.history', 0)`

// HistoryPartitions returns the days of table's attached partitions (not pending a
// detach), oldest first.
func HistoryPartitions(ctx context.Context, db DBTX, table string) ([]time.Time, error) {
	rows, err := db.Query(ctx, `
		SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
		WHERE i.inhparent = ('kagzi.' || $1)::regclass AND NOT `+detachPending+`
		ORDER BY c.relname`, table)
	if err != nil {
		return nil, err
	}
	names, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, err
	}
	var days []time.Time
	for _, n := range names {
		if d, ok := historyDay(table, n); ok {
			days = append(days, d)
		}
	}
	return days, nil
}

// EnsureHistoryPartitions makes sure every history table has a partition for each
// UTC day from the day of from to the day of to. A partition is created as a table of
// its own and then attached, which locks the parent in SHARE UPDATE EXCLUSIVE mode
// only: reads and the archiver's inserts go on meanwhile.
func EnsureHistoryPartitions(ctx context.Context, db Beginner, from, to time.Time) error {
	first := from.UTC().Truncate(24 * time.Hour)
	last := to.UTC().Truncate(24 * time.Hour)
	if last.Before(first) {
		return nil
	}
	// Every history table's partitions, in one read.
	rows, err := db.Query(ctx, `
		SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
		WHERE i.inhparent = ANY (SELECT ('kagzi.' || t)::regclass FROM unnest($1::text[]) t) AND NOT `+detachPending,
		HistoryTables)
	if err != nil {
		return err
	}
	names, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return err
	}
	have := map[string]bool{}
	for _, name := range names {
		have[name] = true
	}
	var missing []string
	for d := first; !d.After(last); d = d.Add(24 * time.Hour) {
		for _, t := range HistoryTables {
			if name := HistoryPartitionName(t, d); !have[name] {
				missing = append(missing, name)
			}
		}
	}
	if len(missing) == 0 {
		return nil
	}
	return InTx(ctx, db, TxIdleLimit, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock(`+historyLockKey+`)`); err != nil {
			return err
		}
		for _, name := range missing {
			var table string
			var day time.Time
			for _, t := range HistoryTables {
				if d, ok := historyDay(t, name); ok {
					table, day = t, d
				}
			}
			var attached bool
			if err := tx.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
				WHERE i.inhparent = ('kagzi.' || $1)::regclass AND c.relname = $2)`, table, name).Scan(&attached); err != nil {
				return err
			}
			if attached {
				continue
			}
			lo, hi := day.Format(time.RFC3339), day.Add(24*time.Hour).Format(time.RFC3339)
			if _, err := tx.Exec(ctx, fmt.Sprintf(
				`CREATE TABLE IF NOT EXISTS kagzi.%s (LIKE kagzi.%s INCLUDING DEFAULTS INCLUDING CONSTRAINTS)`,
				name, table)); err != nil {
				return fmt.Errorf("kagzi: create history partition %s: %w", name, err)
			}
			if _, err := tx.Exec(ctx, fmt.Sprintf(
				`ALTER TABLE kagzi.%s ATTACH PARTITION kagzi.%s FOR VALUES FROM ('%s') TO ('%s')`,
				table, name, lo, hi)); err != nil {
				return fmt.Errorf("kagzi: attach history partition %s: %w", name, err)
			}
		}
		return nil
	})
}

// oldestArchivable is the finished_at of the namespace's oldest live finished run that
// ArchiveFinished would move (NULL when none).
const oldestArchivableSQL = `
SELECT min(finished_at) FROM kagzi.runs
WHERE namespace = $1 AND status IN ('COMPLETED', 'FAILED', 'CANCELLED')
  AND finished_at < now() - $2::bigint * interval '1 millisecond'
  AND ($3::bigint < 0 OR finished_at >= now() - $3::bigint * interval '1 millisecond')
  AND finished_at >= coalesce((SELECT dropping_before FROM kagzi.history_drops), '-infinity')`

// archiveSQL moves up to $4 of the namespace's runs that finished more than $2 ms
// ago (and, unless $3 < 0, less than the retention $3 ms ago: older ones are pruned,
// not archived) into the history, with their steps, step attempts, signals, events
// and listing entries, in one statement, and records the workflow ids of those started
// with IDReuseNever in kagzi.history_ids (see reuseNeverSQL). Runs another transaction
// holds are skipped. Runs that finished before the mark of a pass of history drops
// (kagzi.history_drops.dropping_before, read FOR SHARE: see MarkHistoryDrops) wait
// for the pass to end.
const archiveSQL = `
WITH drops AS (
	SELECT dropping_before FROM kagzi.history_drops FOR SHARE
), pick AS (
	SELECT run_id, finished_at FROM kagzi.runs
	WHERE namespace = $1 AND status IN ('COMPLETED', 'FAILED', 'CANCELLED')
	  AND finished_at < now() - $2::bigint * interval '1 millisecond'
	  AND ($3::bigint < 0 OR finished_at >= now() - $3::bigint * interval '1 millisecond')
	  AND finished_at >= coalesce((SELECT dropping_before FROM drops), '-infinity')
	ORDER BY finished_at
	LIMIT $4
	FOR UPDATE SKIP LOCKED
), r AS (
	DELETE FROM kagzi.runs x USING pick p WHERE x.run_id = p.run_id RETURNING x.*
), rh AS (
	INSERT INTO kagzi.runs_history SELECT * FROM r
), ih AS (
	INSERT INTO kagzi.history_ids (namespace, workflow_id, created_at, run_id, run_finished_at)
	SELECT namespace, workflow_id, created_at, run_id, finished_at FROM r WHERE id_reuse_never
	ON CONFLICT DO NOTHING
), s AS (
	DELETE FROM kagzi.steps x USING pick p WHERE x.run_id = p.run_id RETURNING x.*, p.finished_at
), sh AS (
	INSERT INTO kagzi.steps_history SELECT * FROM s
), a AS (
	DELETE FROM kagzi.step_attempts x USING pick p WHERE x.run_id = p.run_id RETURNING x.*, p.finished_at
), ah AS (
	INSERT INTO kagzi.step_attempts_history SELECT * FROM a
), g AS (
	DELETE FROM kagzi.signals x USING pick p WHERE x.run_id = p.run_id RETURNING x.*, p.finished_at
), gh AS (
	INSERT INTO kagzi.signals_history SELECT * FROM g
), e AS (
	DELETE FROM kagzi.events x USING pick p WHERE x.run_id = p.run_id RETURNING x.*, p.finished_at
), eh AS (
	INSERT INTO kagzi.events_history SELECT * FROM e
), c AS (
	DELETE FROM kagzi.runs_created x USING r
	WHERE x.namespace = r.namespace AND x.created_at = r.created_at AND x.run_id = r.run_id
	RETURNING x.*, r.finished_at
), ch AS (
	INSERT INTO kagzi.runs_created_history SELECT * FROM c
)
SELECT count(*) FROM r`

// ArchiveFinished moves up to limit of the namespace's runs that finished more than
// after ago into the history (see archiveSQL), creating the partitions their days
// need first. Runs that finished before the retention ago (retention < 0: none) are
// not moved: PruneFinished deletes them. It returns how many runs it moved.
func ArchiveFinished(ctx context.Context, db Beginner, namespace string, after, retention time.Duration, limit int) (int64, error) {
	keep := int64(-1)
	if retention >= 0 {
		keep = retention.Milliseconds()
	}
	var oldest *time.Time
	if err := db.QueryRow(ctx, oldestArchivableSQL, namespace, after.Milliseconds(), keep).Scan(&oldest); err != nil {
		return 0, err
	}
	if oldest == nil {
		return 0, nil
	}
	if err := EnsureHistoryPartitions(ctx, db, *oldest, time.Now().Add(24*time.Hour)); err != nil {
		return 0, err
	}
	var n int64
	err := db.QueryRow(ctx, archiveSQL, namespace, after.Milliseconds(), keep, limit).Scan(&n)
	return n, err
}

// restoreSQL moves archived runs of the namespace ($2) back into the live tables,
// with everything archiveSQL moved with them: a rerun or a reset of a finished run
// rewrites it in the live table. It returns the runs it moved.
const restoreSQL = `
WITH r AS (
	DELETE FROM kagzi.runs_history x WHERE x.namespace = $1 AND x.run_id = ANY($2::uuid[]) RETURNING x.*
), ri AS (
	INSERT INTO kagzi.runs SELECT * FROM r
), ids AS (
	DELETE FROM kagzi.history_ids x USING r
	WHERE x.namespace = r.namespace AND x.workflow_id = r.workflow_id AND x.created_at = r.created_at AND x.run_id = r.run_id
), s AS (
	DELETE FROM kagzi.steps_history x USING r WHERE x.run_id = r.run_id AND x.run_finished_at = r.finished_at
	RETURNING x.run_id, x.step_key, x.name, x.kind, x.status, x.output, x.error, x.attempts, x.wake_at,
		x.created_at, x.updated_at, x.position, x.started_at, x.finished_at
), si AS (
	INSERT INTO kagzi.steps SELECT * FROM s
), a AS (
	DELETE FROM kagzi.step_attempts_history x USING r WHERE x.run_id = r.run_id AND x.run_finished_at = r.finished_at
	RETURNING x.run_id, x.step_key, x.attempt, x.status, x.error, x.started_at, x.finished_at
), ai AS (
	INSERT INTO kagzi.step_attempts SELECT * FROM a
), g AS (
	DELETE FROM kagzi.signals_history x USING r WHERE x.run_id = r.run_id AND x.run_finished_at = r.finished_at
	RETURNING x.id, x.run_id, x.name, x.payload, x.created_at, x.consumed_by, x.key
), gi AS (
	INSERT INTO kagzi.signals SELECT * FROM g
), e AS (
	DELETE FROM kagzi.events_history x USING r WHERE x.run_id = r.run_id AND x.run_finished_at = r.finished_at
	RETURNING x.run_id, x.key, x.value, x.updated_at
), ei AS (
	INSERT INTO kagzi.events SELECT * FROM e
), c AS (
	DELETE FROM kagzi.runs_created_history x USING r
	WHERE x.namespace = r.namespace AND x.created_at = r.created_at AND x.run_id = r.run_id
	  AND x.run_finished_at = r.finished_at
	RETURNING x.namespace, x.created_at, x.run_id, x.workflow_type
), ci AS (
	INSERT INTO kagzi.runs_created SELECT * FROM c
)
SELECT run_id FROM r`

// RestoreRuns moves archived runs of the namespace back into the live tables (see
// restoreSQL); runs that are not archived are left alone. It must run in the
// transaction that then rewrites the runs, or the archiver may move them again.
func RestoreRuns(ctx context.Context, db DBTX, namespace string, ids []uuid.UUID) (int, error) {
	rows, err := db.Query(ctx, restoreSQL, namespace, ids)
	if err != nil {
		return 0, err
	}
	got, err := pgx.CollectRows(rows, pgx.RowTo[uuid.UUID])
	return len(got), err
}

// HistoryHorizon registers the namespace's retention (keep < 0: for ever) and returns
// the time before which every history partition may be dropped: the longest
// retention among the namespaces registered (however long ago: a namespace whose
// workers are stopped keeps its runs as it said). ok is false when one of
// them keeps its runs for ever (no partition may be dropped). shorter says that the
// namespace keeps its runs for less than that longest retention: the partitions'
// drops do not apply its retention, and its rows must be deleted.
func HistoryHorizon(ctx context.Context, db DBTX, namespace string, keep time.Duration) (horizon time.Time, ok, shorter bool, err error) {
	ms := int64(-1)
	if keep >= 0 {
		ms = keep.Milliseconds()
	}
	var forever bool
	var at *time.Time
	err = db.QueryRow(ctx, `
		WITH reg AS (
			INSERT INTO kagzi.history_retention AS h (namespace, keep_ms) VALUES ($1, $2::bigint)
			ON CONFLICT (namespace) DO UPDATE SET keep_ms = excluded.keep_ms, updated_at = now()
			RETURNING namespace, keep_ms
		), live AS (
			SELECT keep_ms FROM kagzi.history_retention WHERE namespace <> $1
			UNION ALL SELECT keep_ms FROM reg
		)
		SELECT bool_or(keep_ms < 0), now() - max(keep_ms) * interval '1 millisecond',
			$2::bigint >= 0 AND (bool_or(keep_ms < 0) OR $2::bigint < max(keep_ms)) FROM live`, namespace, ms).
		Scan(&forever, &at, &shorter)
	if err != nil || forever || at == nil {
		return time.Time{}, false, shorter, err
	}
	return *at, true, shorter, nil
}

// TakeHistoryDrops takes the lease of dropping history partitions for a while for
// holder (see kagzi.history_drops), ok false when another holds it.
func TakeHistoryDrops(ctx context.Context, db DBTX, holder string, lease time.Duration) (bool, error) {
	var ok bool
	err := db.QueryRow(ctx, `
		INSERT INTO kagzi.history_drops AS d (holder, until) VALUES ($1, now() + $2::bigint * interval '1 millisecond')
		ON CONFLICT (id) DO UPDATE SET holder = excluded.holder, until = excluded.until
		WHERE d.until < now() OR d.holder = excluded.holder
		RETURNING true`, holder, lease.Milliseconds()).Scan(&ok)
	if errors.Is(err, pgx.ErrNoRows) {
		return false, nil
	}
	return ok, err
}

// MarkHistoryDrops marks, for holder's pass of drops, the time before which it may
// drop days (the start of the UTC day of horizon): no run that finished before it is
// archived until ReleaseHistoryDrops, so no run is archived into a day the pass
// checks and drops. The update waits for the archiving statements under way (they
// read the mark FOR SHARE); those after it see the mark.
func MarkHistoryDrops(ctx context.Context, db DBTX, holder string, horizon time.Time) error {
	tag, err := db.Exec(ctx, `UPDATE kagzi.history_drops SET dropping_before = $2 WHERE holder = $1`,
		holder, horizon.UTC().Truncate(24*time.Hour))
	if err == nil && tag.RowsAffected() == 0 {
		err = errors.New("kagzi: the history drops' lease was lost before the pass began")
	}
	return err
}

// ReleaseHistoryDrops gives holder's lease of TakeHistoryDrops back, and clears its mark.
func ReleaseHistoryDrops(ctx context.Context, db DBTX, holder string) error {
	_, err := db.Exec(ctx, `UPDATE kagzi.history_drops SET until = now(), dropping_before = NULL WHERE holder = $1`, holder)
	return err
}

// DropHistoryBefore drops the history partitions of days that ended at or before
// horizon, and finishes the detaches an interrupted drop left pending. On
// PostgreSQL 14 and later a partition is detached CONCURRENTLY (no lock that
// blocks readers or the archiver), then dropped. A day whose runs_history partition
// holds runs of a namespace that still keeps them (dayKeptBy) is not dropped, in any
// table; the partitions of every kept day (past the horizon or not) that an
// interrupted drop left detached or pending their detach are attached again: the horizon is
// computed from the retentions registered when it was read, and a namespace may have
// archived into the day since. The caller marks the pass first (MarkHistoryDrops), so
// that nothing is archived into a day between its check and its drop. It returns the
// partitions dropped.
func DropHistoryBefore(ctx context.Context, db DBTX, horizon time.Time) ([]string, error) {
	var version int
	if err := db.QueryRow(ctx, `SELECT current_setting('server_version_num')::int`).Scan(&version); err != nil {
		return nil, err
	}
	var dropped []string
	kept := map[time.Time]bool{} // days runs_history keeps (HistoryTables lists it first)
	for _, table := range HistoryTables {
		// The partitions, and the tables of partitions a crash left detached but not
		// dropped (detached: NULL).
		rows, err := db.Query(ctx, `
			SELECT c.relname, CASE WHEN i.inhrelid IS NOT NULL THEN `+detachPending+` END FROM pg_class c
			LEFT JOIN pg_inherits i ON i.inhrelid = c.oid AND i.inhparent = ('kagzi.' || $1)::regclass
			WHERE c.relnamespace = 'kagzi'::regnamespace AND c.relkind = 'r' AND c.relname LIKE $1 || '\_p%'
			  AND NOT EXISTS (SELECT 1 FROM pg_inherits o WHERE o.inhrelid = c.oid AND o.inhparent <> ('kagzi.' || $1)::regclass)
			ORDER BY c.relname`, table)
		if err != nil {
			return dropped, err
		}
		type part struct {
			name    string
			pending *bool
		}
		parts, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (part, error) {
			var p part
			err := row.Scan(&p.name, &p.pending)
			return p, err
		})
		if err != nil {
			return dropped, err
		}
		for _, p := range parts {
			day, ok := historyDay(table, p.name)
			if !ok {
				continue
			}
			keep := day.Add(24*time.Hour).After(horizon) || kept[day]
			if !keep && table == "runs_history" {
				k, err := dayKeptBy(ctx, db, p.name, day)
				if pgErr := (*pgconn.PgError)(nil); errors.As(err, &pgErr) && pgErr.Code == "42P01" {
					continue // another process dropped it meanwhile (a pass whose lease passed)
				}
				if err != nil {
					return dropped, err
				}
				if k {
					kept[day], keep = true, true
				}
			}
			if keep {
				// A day kept, whatever the horizon: a partition of it an interrupted
				// drop left detached, or pending its detach (a pass whose horizon was
				// later than the next one's), is attached again, or the archiver finds
				// no partition for the day's runs and moves none.
				if err := attachAgain(ctx, db, table, p.name, p.pending, day); err != nil {
					return dropped, err
				}
				continue
			}
			detach := fmt.Sprintf(`ALTER TABLE kagzi.%s DETACH PARTITION kagzi.%s`, table, p.name)
			switch {
			case p.pending == nil:
				detach = "" // detached already
			case *p.pending:
				detach += ` FINALIZE`
			case version >= 140000:
				detach += ` CONCURRENTLY`
			}
			if detach != "" {
				if _, err := db.Exec(ctx, detach); err != nil {
					if gone, gerr := partitionGone(ctx, db, table, p.name); gerr == nil && gone {
						continue // another process detached it meanwhile
					}
					if pgErr := (*pgconn.PgError)(nil); errors.As(err, &pgErr) && (pgErr.Code == "55000" || pgErr.Code == "40P01") {
						// Another process is detaching it (already pending detach), or
						// dropping it (a deadlock with its drop): that process drops it,
						// or the next drop does.
						continue
					}
					return dropped, fmt.Errorf("kagzi: detach history partition %s: %w", p.name, err)
				}
			}
			gone, err := dropTable(ctx, db, p.name)
			if err != nil {
				return dropped, fmt.Errorf("kagzi: drop history partition %s: %w", p.name, err)
			}
			if gone {
				dropped = append(dropped, p.name)
			}
		}
	}
	if err := dropHistoryIDsBefore(ctx, db, horizon); err != nil {
		return dropped, err
	}
	return dropped, nil
}

// dropHistoryIDsBefore deletes the kagzi.history_ids rows of the runs whose history
// partitions DropHistoryBefore dropped (or would have: those of days that ended at or
// before horizon), a batch per statement so that no statement holds many row locks
// for long. A later day's rows are kept even when their partition could not be
// dropped yet: the start that finds such a row checks the history itself.
func dropHistoryIDsBefore(ctx context.Context, db DBTX, horizon time.Time) error {
	end := horizon.UTC().Truncate(24 * time.Hour)
	for {
		tag, err := db.Exec(ctx, `
			DELETE FROM kagzi.history_ids x USING (
				SELECT namespace, workflow_id, created_at, run_id FROM kagzi.history_ids
				WHERE run_finished_at < $1 LIMIT 5000
			) d
			WHERE x.namespace = d.namespace AND x.workflow_id = d.workflow_id AND x.created_at = d.created_at
			  AND x.run_id = d.run_id`, end)
		if err != nil {
			return fmt.Errorf("kagzi: delete dropped days' history ids: %w", err)
		}
		if tag.RowsAffected() < 5000 {
			return nil
		}
	}
}

// attachAgain attaches a day's partition of table that an interrupted drop left
// detached (pending nil) or pending its detach (true: the detach is finished first);
// an attached one (false) is left alone. A partition another process attached or
// dropped meanwhile is left to it.
func attachAgain(ctx context.Context, db DBTX, table, name string, pending *bool, day time.Time) error {
	if pending != nil && !*pending {
		return nil
	}
	if pending != nil {
		if _, err := db.Exec(ctx, fmt.Sprintf(`ALTER TABLE kagzi.%s DETACH PARTITION kagzi.%s FINALIZE`, table, name)); err != nil {
			if gone, gerr := partitionGone(ctx, db, table, name); gerr != nil || !gone {
				return fmt.Errorf("kagzi: finish the detach of history partition %s: %w", name, err)
			}
		}
	}
	if _, err := db.Exec(ctx, fmt.Sprintf(`ALTER TABLE kagzi.%s ATTACH PARTITION kagzi.%s FOR VALUES FROM ('%s') TO ('%s')`,
		table, name, day.Format(time.RFC3339), day.Add(24*time.Hour).Format(time.RFC3339))); err != nil {
		if pgErr := (*pgconn.PgError)(nil); errors.As(err, &pgErr) && (pgErr.Code == "42P01" || pgErr.Code == "42P17") {
			return nil // dropped, or attached, by another process meanwhile
		}
		return fmt.Errorf("kagzi: attach history partition %s again: %w", name, err)
	}
	return nil
}

// dropTable drops a detached history partition's table. A drop that a concurrent
// dropper's DETACH ... FINALIZE of the same partition deadlocks with (one waits for the
// other's lock, the other for its transaction; the FINALIZE then finds it detached) is
// tried again: the drop is idempotent, and the other statement has ended.
// It reports whether this call dropped the table (false: another process had).
func dropTable(ctx context.Context, db DBTX, name string) (bool, error) {
	var err error
	for range 3 {
		_, err = db.Exec(ctx, `DROP TABLE kagzi.`+name)
		pgErr := (*pgconn.PgError)(nil)
		switch {
		case err == nil:
			return true, nil
		case errors.As(err, &pgErr) && pgErr.Code == "42P01": // undefined_table: dropped by another
			return false, nil
		case !errors.As(err, &pgErr) || pgErr.Code != "40P01":
			return false, err
		}
	}
	return false, err
}

// dayKeptBy tells whether a runs_history partition (attached or detached) of day
// holds runs of a namespace that keeps them still: one whose registered retention
// (kagzi.history_retention, however long ago, as HistoryHorizon counts it) has not
// passed the day's end, or that keeps its runs for ever, or one with no
// registration, taken to keep its runs for the default 30 days. Its namespaces are
// read with one index probe each (runs_history_finished).
func dayKeptBy(ctx context.Context, db DBTX, partition string, day time.Time) (bool, error) {
	var keepers []string
	err := db.QueryRow(ctx, `
		WITH RECURSIVE ns(n) AS (
			(SELECT namespace FROM kagzi.`+partition+` ORDER BY namespace LIMIT 1)
			UNION ALL
			SELECT (SELECT namespace FROM kagzi.`+partition+` WHERE namespace > ns.n ORDER BY namespace LIMIT 1)
			FROM ns WHERE ns.n IS NOT NULL
		)
		SELECT coalesce(array_agg(ns.n), '{}') FROM ns
		LEFT JOIN kagzi.history_retention h ON h.namespace = ns.n
		WHERE ns.n IS NOT NULL AND CASE
			WHEN h.namespace IS NULL THEN $1::timestamptz > now() - interval '30 days'
			ELSE h.keep_ms < 0 OR $1::timestamptz > now() - h.keep_ms * interval '1 millisecond' END`,
		day.Add(24*time.Hour)).Scan(&keepers)
	return len(keepers) > 0, err
}

// partitionGone tells whether name is no longer a partition of table (another
// process detached or dropped it).
func partitionGone(ctx context.Context, db DBTX, table, name string) (bool, error) {
	var attached bool
	err := db.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
		WHERE i.inhparent = ('kagzi.' || $1)::regclass AND c.relname = $2)`, table, name).Scan(&attached)
	return !attached, err
}

// pruneHistorySQL deletes up to $3 of the namespace's archived runs that finished
// before $2 ms ago, with what was archived with them: the retention of a namespace
// shorter than the longest, which decides when partitions are dropped. Every
// statement also bounds the partition key, so that only the partitions of the days
// concerned are read.
const pruneHistorySQL = `
WITH r AS (
	DELETE FROM kagzi.runs_history x USING (
		SELECT run_id, finished_at FROM kagzi.runs_history
		WHERE namespace = $1 AND finished_at < now() - $2::bigint * interval '1 millisecond'
		ORDER BY finished_at LIMIT $3
	) p
	WHERE x.run_id = p.run_id AND x.finished_at = p.finished_at
	  AND x.finished_at < now() - $2::bigint * interval '1 millisecond'
	RETURNING x.run_id, x.finished_at, x.namespace, x.created_at, x.workflow_id
), ids AS (
	DELETE FROM kagzi.history_ids x USING r
	WHERE x.namespace = r.namespace AND x.workflow_id = r.workflow_id AND x.created_at = r.created_at AND x.run_id = r.run_id
), s AS (
	DELETE FROM kagzi.steps_history x USING r WHERE x.run_id = r.run_id AND x.run_finished_at = r.finished_at
	  AND x.run_finished_at < now() - $2::bigint * interval '1 millisecond'
), a AS (
	DELETE FROM kagzi.step_attempts_history x USING r WHERE x.run_id = r.run_id AND x.run_finished_at = r.finished_at
	  AND x.run_finished_at < now() - $2::bigint * interval '1 millisecond'
), g AS (
	DELETE FROM kagzi.signals_history x USING r WHERE x.run_id = r.run_id AND x.run_finished_at = r.finished_at
	  AND x.run_finished_at < now() - $2::bigint * interval '1 millisecond'
), e AS (
	DELETE FROM kagzi.events_history x USING r WHERE x.run_id = r.run_id AND x.run_finished_at = r.finished_at
	  AND x.run_finished_at < now() - $2::bigint * interval '1 millisecond'
), c AS (
	DELETE FROM kagzi.runs_created_history x USING r
	WHERE x.namespace = r.namespace AND x.created_at = r.created_at AND x.run_id = r.run_id
	  AND x.run_finished_at = r.finished_at AND x.run_finished_at < now() - $2::bigint * interval '1 millisecond'
)
SELECT count(*) FROM r`

// PruneHistory deletes up to limit archived runs of the namespace that finished more
// than keep ago (see pruneHistorySQL), and returns how many. Its transaction turns
// hash and merge joins and sequential scans off: the planner would otherwise read
// whole partitions to delete a batch of their rows, which the primary keys find.
func PruneHistory(ctx context.Context, db Beginner, namespace string, keep time.Duration, limit int) (int64, error) {
	var n int64
	err := InTx(ctx, db, TxIdleLimit, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SELECT set_config('enable_hashjoin', 'off', true), set_config('enable_mergejoin', 'off', true),
			set_config('enable_seqscan', 'off', true)`); err != nil {
			return err
		}
		return tx.QueryRow(ctx, pruneHistorySQL, namespace, keep.Milliseconds(), limit).Scan(&n)
	})
	return n, err
}
