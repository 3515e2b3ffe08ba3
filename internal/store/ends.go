package store

import (
	"context"
	"errors"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/kagzi/kagzi/internal/vocab"
)

// FinishWrite ends a run its worker holds.
type FinishWrite struct {
	Fence
	// Client is the worker's client: its own waiters hear of the end in process, so
	// the end notifies only other clients' (see remoteWaitersSQL).
	Client uuid.UUID
	// Status is COMPLETED with Output, FAILED with Error, or CANCELLED.
	Status vocab.RunStatus
	Output []byte
	Error  []byte
	// HeldSlot reports that the run's claim took a slot of its type's concurrency
	// limit (ClaimedRun.HoldsSlot): the end frees it and notifies the type's workers.
	HeldSlot bool
	// Last, when set, is the run's last step, completed and not yet recorded: the
	// end records it in the same statement (its Status and StepStatus are COMPLETED,
	// its Error nil).
	Last *StepWrite
}

// finishes end runs their workers hold: COMPLETED with an output, FAILED with an
// error, or CANCELLED. A cancel requested before this commits wins: the run ends
// CANCELLED and the output is discarded. When step_key is set, the same statement
// records that step as completed, the run's last, whose record was held back so that
// both share one write; the update of the run is its fence. Waiters in other clients
// are notified when there are any: one run's end in the row that returns it, the
// ends of many one notification per 150 runs (each costs the listening backend and
// process a message; one per run was a tenth of a busy worker's CPU, and the batched
// form costs a lone end a fifth of its time). Ends of runs that held a slot of their
// type's concurrency limit or a place of their concurrency key notify the type's
// workers, once a type. Each input that held its fence returns the status the run
// ended with.
var finishes = newSetWriteOf("finishes", func(many bool) string {
	sql := `
upd AS (
	UPDATE kagzi.runs r SET
		status = CASE WHEN r.cancel_requested THEN 'CANCELLED' ELSE i.status END,
		output = CASE WHEN r.cancel_requested THEN NULL ELSE i.output END,
		error = CASE WHEN r.cancel_requested THEN NULL ELSE i.error END,
		finished_at = now(), locked_by = NULL, updated_at = now(),
		holds_type_slot = r.holds_type_slot AND NOT i.held_slot
	FROM i
	WHERE r.run_id = i.run_id AND r.lease_epoch = i.epoch AND r.lease_token IS NOT DISTINCT FROM i.token
		AND coalesce(r.status, '') = 'RUNNING' -- see KeyedPlansSQL
		AND ` + slotHeldRSQL + `
	RETURNING i.ord, i.client_id, r.run_id, r.namespace, r.workflow_type, r.status, i.held_slot, r.flow_key
), freed AS (
	-- The types whose concurrency slots or keys' places these ends freed: their
	-- workers may claim the runs the slots and keys held back (one notification a
	-- type, not one a run from the run_changed trigger, which the cleared
	-- holds_type_slot keeps quiet, and which a keyed run's completion does not fire:
	-- migration 00014).
	-- A time ending in 'k' says a key's place was freed (see KeyFreed).
	SELECT pg_notify('` + Channel + `', 'w|' || octet_length(namespace) || ':' || namespace || '|' || workflow_type || '|'
		|| (extract(epoch FROM now()) * 1000)::bigint || CASE WHEN bool_or(flow_key IS NOT NULL) THEN 'k' ELSE '' END)
	FROM upd WHERE held_slot OR flow_key IS NOT NULL
	GROUP BY namespace, workflow_type
), step AS (
	INSERT INTO kagzi.steps AS s (run_id, step_key, name, kind, status, output, attempts, position,
		started_at, finished_at)
	SELECT i.run_id, i.step_key, i.step_name, 'STEP', 'COMPLETED', i.step_output, 1, i.position,
		i.started_at, i.finished_at
	FROM upd u JOIN i ON i.ord = u.ord
	WHERE i.step_key IS NOT NULL
	ON CONFLICT (run_id, step_key) DO UPDATE SET
		status = 'COMPLETED', output = excluded.output, error = NULL, attempts = s.attempts + 1,
		started_at = excluded.started_at, finished_at = excluded.finished_at, updated_at = now()
	WHERE s.status <> 'COMPLETED'
	RETURNING s.run_id, s.step_key, s.attempts
), attempt AS (
	INSERT INTO kagzi.step_attempts (run_id, step_key, attempt, status, started_at, finished_at)
	SELECT st.run_id, st.step_key, st.attempts, 'COMPLETED', i.started_at, i.finished_at
	FROM step st JOIN i ON i.run_id = st.run_id AND i.step_key = st.step_key
	WHERE st.attempts > 1
)`
	remote := remoteWaitersSQL("upd.namespace", "upd.client_id")
	if !many {
		return sql + `
SELECT ord, status, coalesce(CASE WHEN ` + remote + `
	THEN pg_notify('` + Channel + `', 'd|' || run_id || '|' || status)::text END, '')
	|| (SELECT count(*) FROM freed)::text FROM upd`
	}
	return sql + `, notified AS (
	-- A newline, then the runs' DoneTopic payloads, one per line (Postgres takes
	-- payloads under 8000 bytes).
	SELECT pg_notify('` + Channel + `', string_agg(E'\n' || 'd|' || run_id || '|' || status, ''))
	FROM upd
	WHERE ` + remote + `
	GROUP BY (ord - 1) / 150
)
SELECT ord, status, ((SELECT count(*) FROM notified) + (SELECT count(*) FROM freed))::text FROM upd`
},
	append(fenceArgs[*FinishWrite](),
		arg("status", "text", func(w *FinishWrite) string { return string(w.Status) }),
		arg("output", "jsonb", func(w *FinishWrite) []byte { return w.Output }),
		arg("error", "jsonb", func(w *FinishWrite) []byte { return w.Error }),
		arg("step_key", "text", func(w *FinishWrite) *string { return lastStep(w, func(s *StepWrite) *string { return &s.Key }) }),
		arg("step_name", "text", func(w *FinishWrite) *string { return lastStep(w, func(s *StepWrite) *string { return &s.Name }) }),
		arg("step_output", "jsonb", func(w *FinishWrite) []byte {
			if w.Last == nil {
				return nil
			}
			return w.Last.Output
		}),
		arg("started_at", "timestamptz", func(w *FinishWrite) *time.Time {
			return lastStep(w, func(s *StepWrite) *time.Time { return &s.StartedAt })
		}),
		arg("finished_at", "timestamptz", func(w *FinishWrite) *time.Time {
			return lastStep(w, func(s *StepWrite) *time.Time { return &s.FinishedAt })
		}),
		arg("position", "integer", func(w *FinishWrite) *int { return lastStep(w, func(s *StepWrite) *int { return &s.Position }) }),
		arg("client_id", "uuid", func(w *FinishWrite) [16]byte { return w.Client }),
		arg("held_slot", "boolean", func(w *FinishWrite) bool { return w.HeldSlot }),
	)...)

// lastStep points at a field of w's last step (no copy: a copy would cost an
// allocation a field a run), nil when it has none.
func lastStep[V any](w *FinishWrite, field func(*StepWrite) *V) *V {
	if w.Last == nil {
		return nil
	}
	return field(w.Last)
}

// FinishRun ends a run; see finishes. It returns the status the run ended with.
func FinishRun(ctx context.Context, db Writer, w FinishWrite) (vocab.RunStatus, error) {
	var final, notified string // not vocab.RunStatus: pgx scans a named type through reflection
	err := write(ctx, db, finishes, &w, &final, &notified)
	if errors.Is(err, pgx.ErrNoRows) {
		return "", ErrLeaseLost
	}
	return vocab.RunStatus(final), err
}

// remoteWaitersSQL is true when a client other than me waits for run ends in the
// namespace (kagzi.waiters). A run's end notifies only then: a notifying transaction
// holds a server-wide lock through its commit, and the ending worker tells its own
// client's waiters in process.
func remoteWaitersSQL(namespace, me string) string {
	return `EXISTS (SELECT 1 FROM kagzi.waiters w WHERE w.namespace = ` + namespace +
		` AND w.client_id <> ` + me + ` AND w.expires_at > now())`
}

// RegisterWaiter records that the client waits for run ends in the namespace until ttl
// from now (see remoteWaitersSQL), and deletes the namespace's registrations expired
// for an hour.
func RegisterWaiter(ctx context.Context, db DBTX, namespace string, clientID uuid.UUID, ttl time.Duration) error {
	_, err := db.Exec(ctx, `
WITH gone AS (
	DELETE FROM kagzi.waiters WHERE namespace = $1 AND expires_at < now() - interval '1 hour'
)
INSERT INTO kagzi.waiters (namespace, client_id, expires_at)
VALUES ($1, $2, now() + $3 * interval '1 millisecond')
ON CONFLICT (namespace, client_id) DO UPDATE SET expires_at = excluded.expires_at`,
		namespace, clientID, ttl.Milliseconds())
	return err
}

// EndedUnder reports how a run ended when its end was written under the fence f (an
// end keeps the claim's epoch and token): its status, the code of its error (""
// without one) and the run it continued as, if it did. A worker whose end committed
// but whose answer the connection lost is refused by its next try (the run is not
// RUNNING any more) and finds here that the end was its own; the code tells its end
// from another's under the same fence (a deadline's, a cancel's hand-back). ok is
// false when the run has not ended, or ended under another claim.
func EndedUnder(ctx context.Context, db DBTX, f Fence) (end RunEnded, ok bool, err error) {
	var s string
	var code pgtype.Text
	var next pgtype.UUID
	err = db.QueryRow(ctx, `SELECT status, error->>'code', continued_as_run_id FROM kagzi.runs
		WHERE run_id = $1 AND lease_epoch = $2 AND lease_token IS NOT DISTINCT FROM $3
		  AND status IN ('COMPLETED', 'FAILED', 'CANCELLED')`, f.RunID, f.Epoch, f.token()).Scan(&s, &code, &next)
	if errors.Is(err, pgx.ErrNoRows) {
		return RunEnded{}, false, nil
	}
	if err != nil {
		return RunEnded{}, false, err
	}
	end = RunEnded{Status: vocab.RunStatus(s), Code: code.String}
	if next.Valid {
		end.ContinuedAs = next.Bytes
	}
	return end, true, nil
}

// RunEnded is what EndedUnder finds.
type RunEnded struct {
	Status      vocab.RunStatus
	Code        string
	ContinuedAs uuid.UUID
}
