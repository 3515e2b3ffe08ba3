package store

import (
	"context"
	"errors"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/kagzi/kagzi/internal/vocab"
)

// newestVersionSQL is the newest version of workflow type @workflow_type that an
// ONLINE worker of namespace @namespace registered (NULL when none has it): the
// version whose oldest ONLINE worker started last, that is the version that came
// last, so that an old process restarting during a rollout (its version's other
// workers are older) does not move new runs back to old code, while a rollback's
// processes (all of them new) do. A DRAINING worker claims nothing new. See
// NewRun.NewestVersion.
const newestVersionSQL = `SELECT v.version FROM (
		SELECT workflow_versions[array_position(workflow_types, @workflow_type::text)] AS version, min(started_at) AS since
		FROM kagzi.workers
		WHERE namespace = @namespace AND status = 'ONLINE' AND @workflow_type::text = ANY(workflow_types)
		GROUP BY 1) v
		ORDER BY v.since DESC LIMIT 1`

// ErrActiveRunExists means another run holds the workflow id while this one would
// become active again.
var ErrActiveRunExists = errors.New("another active run holds the workflow id")

// rerunSetSQL is what a rerun (RerunRun, RerunRuns) sets on a run r: PENDING and
// claimable now, its attempt bumped (unless no worker ever claimed it, a run cancelled
// while it waited: its first execution is still attempt 1), its error, cancel flag and
// deadline cleared; a run of a concurrency key queues in its key again (started_at
// cleared). A debounced run leaves its debounce (debounce_key cleared): it is claimable
// now, past any window, and must neither collect the key's later starts nor collide
// with the run that collects them now.
const rerunSetSQL = `status = 'PENDING', attempt = r.attempt + CASE WHEN r.lease_epoch = 0 THEN 0 ELSE 1 END, error = NULL, debounce_key = NULL,
	cancel_requested = false, deadline_at = NULL, finished_at = NULL, locked_by = NULL,
	started_at = CASE WHEN r.flow_key IS NULL THEN r.started_at END,
	available_at = now(), updated_at = now()`

// RerunRun makes a FAILED or CANCELLED run PENDING again, claimable now, with its
// attempt bumped, its error, cancel flag and deadline cleared, and its steps that did
// not complete (failed, retrying, waiting) deleted so they run again; completed steps
// are kept and replay. It returns the status the run had. An archived run moves back
// into the live tables first, in the same transaction, which a run of another status
// rolls back: it changes nothing.
func RerunRun(ctx context.Context, db Beginner, namespace string, runID uuid.UUID) (vocab.RunStatus, error) {
	var before vocab.RunStatus
	err := InTx(ctx, db, TxIdleLimit, func(tx pgx.Tx) error {
		if _, err := RestoreRuns(ctx, tx, namespace, []uuid.UUID{runID}); err != nil {
			return err
		}
		err := tx.QueryRow(ctx, `
		WITH target AS (
			SELECT run_id, status FROM kagzi.runs WHERE namespace = $1 AND run_id = $2 FOR UPDATE
		), cleared AS (
			DELETE FROM kagzi.steps s USING target t
			WHERE s.run_id = t.run_id AND t.status IN ('FAILED', 'CANCELLED') AND s.status <> 'COMPLETED'
		), upd AS (
			UPDATE kagzi.runs r SET `+rerunSetSQL+`
			FROM target t
			WHERE r.run_id = t.run_id AND t.status IN ('FAILED', 'CANCELLED')
			RETURNING r.run_id, r.namespace, r.workflow_type, r.status, r.available_at
		)
		SELECT t.status, (SELECT (`+notifyRunSQL+`)::text FROM upd) FROM target t`, namespace, runID).Scan(&before, new(*string))
		if err == nil && before != vocab.StatusFailed && before != vocab.StatusCancelled {
			return errNotRerun // rolls the restore back: a refused rerun changes nothing
		}
		return err
	})
	switch {
	case errors.Is(err, errNotRerun):
		return before, nil
	case errors.Is(err, pgx.ErrNoRows):
		return "", ErrNotFound
	case isUniqueViolation(err):
		return "", ErrActiveRunExists
	}
	return before, err
}

// errNotRerun ends RerunRun's transaction when the run's status is not one a rerun
// takes.
var errNotRerun = errors.New("not rerun")

// CopyStepsBefore copies into the run to the completed steps of the origin run
// recorded before its step fromKey (in the order they were first recorded), with
// their attempt history, and what those steps left that their replays do not write
// again: the events they published and the attributes they set (over the origin's
// attributes, originAttributes, of keys no SetAttributes changed). It returns how
// many steps it copied, or ErrNotFound when the
// origin has no step fromKey. The run to must be a fork (forked_from_run_id set): a
// claim loads the steps of a run it claims for the first time only if it is one.
func CopyStepsBefore(ctx context.Context, db DBTX, origin uuid.UUID, originAttributes []byte, fromKey string, to uuid.UUID) (int, error) {
	var found bool
	var copied int
	var childStep, child *string
	err := db.QueryRow(ctx, `
		WITH cut AS (
			SELECT created_at, step_key FROM kagzi.steps_all WHERE run_id = $1 AND step_key = $2
		), src AS (
			SELECT s.* FROM kagzi.steps_all s, cut
			WHERE s.run_id = $1 AND s.status = 'COMPLETED' AND (s.created_at, s.step_key) < (cut.created_at, cut.step_key)
		), waits AS (
			-- A child the copy started (its StartChild step) whose result it does not
			-- hold, still running: the fork would wait on another run's child, whose end
			-- wakes the origin, not the fork.
			SELECT s.step_key, r.run_id FROM src s
			JOIN kagzi.runs r ON r.run_id = (s.output->>'run_id')::uuid AND r.status IN ('PENDING', 'RUNNING', 'SLEEPING')
			WHERE s.kind = 'CHILD' AND s.step_key NOT LIKE '%/result' AND jsonb_typeof(s.output) = 'object'
			  AND NOT EXISTS (SELECT 1 FROM src o WHERE o.step_key = s.step_key || '/result')
			LIMIT 1
		), ins AS (
			INSERT INTO kagzi.steps (run_id, step_key, name, kind, status, output, error, attempts, wake_at,
				created_at, updated_at, position, started_at, finished_at)
			SELECT $3, step_key, name, kind, status, output, error, attempts, wake_at, created_at, updated_at, position,
				started_at, finished_at
			FROM src
			RETURNING step_key
		), att AS (
			INSERT INTO kagzi.step_attempts (run_id, step_key, attempt, status, error, started_at, finished_at)
			SELECT $3, a.step_key, a.attempt, a.status, a.error, a.started_at, a.finished_at
			FROM kagzi.step_attempts_all a JOIN ins ON ins.step_key = a.step_key
			WHERE a.run_id = $1
		), evs AS (
			-- The events the copied SetEvent steps published (the last of each key),
			-- which their replays do not write again.
			INSERT INTO kagzi.events (run_id, key, value)
			SELECT DISTINCT ON (s.name) $3, s.name, s.output FROM src s
			WHERE s.kind = 'EVENT' AND s.output IS NOT NULL
			ORDER BY s.name, s.created_at DESC, s.step_key DESC
		), attrs AS (
			-- The attributes the copied SetAttributes steps leave (the last change of
			-- each key; a null removes it), over the origin's ($4) keys that no
			-- SetAttributes of the origin changed: those it was started with.
			SELECT (SELECT coalesce(jsonb_object_agg(o.key, o.value), '{}') FROM jsonb_each(coalesce($4::jsonb, '{}')) o
					WHERE NOT EXISTS (SELECT 1 FROM kagzi.steps_all c WHERE c.run_id = $1 AND c.kind = 'ATTRIBUTES'
						AND jsonb_typeof(c.output) = 'object' AND c.output ? o.key))
				|| (SELECT coalesce(jsonb_object_agg(x.k, x.v) FILTER (WHERE jsonb_typeof(x.v) <> 'null'), '{}') FROM (
					SELECT DISTINCT ON (e.key) e.key AS k, e.value AS v
					FROM src s, jsonb_each(s.output) e
					WHERE s.kind = 'ATTRIBUTES' AND jsonb_typeof(s.output) = 'object'
					ORDER BY e.key, s.created_at DESC, s.step_key DESC) x) AS a
		), setattrs AS (
			UPDATE kagzi.runs r SET attributes = nullif(a.a, '{}') FROM attrs a
			WHERE r.run_id = $3 AND r.attributes IS DISTINCT FROM nullif(a.a, '{}')
		)
		SELECT EXISTS (SELECT 1 FROM cut), (SELECT count(*) FROM ins), (SELECT step_key FROM waits),
			(SELECT run_id::text FROM waits)`, origin, fromKey, to, originAttributes).Scan(&found, &copied, &childStep, &child)
	if err != nil {
		return 0, err
	}
	if !found {
		return 0, ErrNotFound
	}
	if child != nil {
		// The caller rolls the copy back.
		return 0, &ChildActiveError{Step: *childStep, Child: *child}
	}
	return copied, nil
}

// ChildActiveError is CopyStepsBefore's refusal to copy the start of a child that
// is still running without its result.
type ChildActiveError struct{ Step, Child string }

func (e *ChildActiveError) Error() string {
	return "step " + e.Step + " started child run " + e.Child + ", which is still running"
}

// PruneFinished deletes up to limit runs of the namespace that finished before
// olderThan ago, oldest first, with their steps and attempts and their place in
// ListRuns' order (deleted here), signals and events (their foreign keys cascade). SKIP LOCKED keeps concurrent pruners out
// of each other's way and never waits on a row in use.
func PruneFinished(ctx context.Context, db DBTX, namespace string, olderThan time.Duration, limit int) (int64, error) {
	var n int64
	err := db.QueryRow(ctx, `
		WITH gone AS (
			DELETE FROM kagzi.runs WHERE run_id IN (
				SELECT run_id FROM kagzi.runs
				WHERE namespace = $1 AND status IN ('COMPLETED', 'FAILED', 'CANCELLED')
				  AND finished_at < now() - $2 * interval '1 millisecond'
				ORDER BY finished_at
				LIMIT $3
				FOR UPDATE SKIP LOCKED)
			RETURNING namespace, created_at, run_id
		), steps AS (
			DELETE FROM kagzi.steps WHERE run_id IN (SELECT run_id FROM gone)
		), listed AS (
			DELETE FROM kagzi.runs_created WHERE (namespace, created_at, run_id) IN (SELECT * FROM gone)
		)
		SELECT count(*) FROM gone`, namespace, olderThan.Milliseconds(), limit).Scan(&n)
	return n, err
}

func isUniqueViolation(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "23505"
}
