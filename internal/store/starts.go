package store

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"slices"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/kagzi/kagzi/internal/committer"
)

// Starts: the statements that insert runs (one, debounced, eager, or many of a type).

// NewRun is what InsertRun needs to start a run.
type NewRun struct {
	RunID        uuid.UUID
	Namespace    string
	WorkflowID   string
	WorkflowType string
	Input        []byte
	// StartAt delays the first claim; zero means now (the database's clock).
	StartAt time.Time
	// ReuseNever keeps the workflow id an idempotency key after the run finishes.
	ReuseNever bool
	// KeptID makes a start without ReuseNever look for a finished run of its workflow
	// id that was started with it, as a start with ReuseNever does: that run keeps the
	// id for good, whatever later starts ask (a caller's own id; generated ids are new).
	KeptID bool
	// IDNotBefore, with ReuseNever, is a time before which no run of the workflow id
	// can have been created (a child's derived id names its parent, created then): the
	// look for a finished run of the id then reads only the history's partitions from
	// that day on. Nil: every partition.
	IDNotBefore *time.Time
	// Deadline, when set, ends the run FAILED once it passes.
	Deadline *time.Time
	// ScheduleID and ScheduleTick, when set, record the schedule tick that fired the run.
	ScheduleID   string
	ScheduleTick *time.Time
	// ParentRunID and ParentStepKey, when set, make the run a child of that run's step.
	ParentRunID   *uuid.UUID
	ParentStepKey string
	// ParentFence, for a child, is its parent's lease as the starting execution holds
	// it: the child is inserted only while the parent is RUNNING under it (and the
	// insert holds the parent's row FOR KEY SHARE till it commits, so a takeover comes
	// before or after it); a worker that lost the parent's lease inserts nothing
	// (ErrLeaseLost). An orphan started by such a zombie outlived its parent's cancel.
	ParentFence *Fence
	// Version, when set, is the workflow version the run starts with; nil lets the
	// first worker to claim it pin its own, or with NewestVersion, takes the version
	// of the most recently started live worker of the type (none: nil).
	Version       *string
	NewestVersion bool
	// ForkedFromRunID and ForkedFromStep record the origin of a fork.
	ForkedFromRunID *uuid.UUID
	ForkedFromStep  string
	// NotifyLater leaves the workers' notification to the caller, to be sent after
	// the insert commits. Transactions that notify serialise their commits on one
	// server-wide lock; a start that commits on its own can let a notifier.Sender
	// send its notification, coalesced with others, once it is committed.
	NotifyLater bool
	// Carrier, when set, is the trace context captured at the start (JSON object).
	Carrier []byte
	// Attributes, when set, are the run's searchable attributes (a JSON object).
	Attributes []byte
	// CheckWorker asks the insert to tell whether no live worker registered the run's
	// type (and Version, when set): see InsertRunChecked.
	CheckWorker bool
	// Priority orders the run as if it had started Priority seconds earlier (a start
	// time, StartAt, is kept as it is); FlowKey is its concurrency key ("": none).
	Priority int
	FlowKey  string
	// Debounce, when set, makes the start one of a debounce key's: see insertDebounced.
	Debounce *Debounce
	// Eager, when set, names a worker of the starting process with a slot reserved
	// for the run: the insert claims the run for it (RUNNING, lease epoch 1) unless its
	// type has limits, and notifies no other worker. The caller sets it only for a run
	// that starts now, at the worker's version. A run with a concurrency key, or of a
	// type known to be limited (Eager.Limited), is claimed within the limits: unless
	// the type has a rate limit, its concurrency limit or its key's is full, or a run
	// of its key is queued. Such a start locks the type and the key first, in the same
	// transaction: db must pipeline (a pool), or the start is not eager.
	Eager *Eager
}

// Eager is the worker an eager start claims its run for: its id, its lease, and the
// version it registered for the run's type.
type Eager struct {
	WorkerID string
	Lease    time.Duration
	Version  string
	// Limited says that the type had flow-control limits when the caller last
	// looked (an eager start of it came back PENDING): the start then locks the type
	// and counts its holders (eagerLocked), and may claim the run within the limits.
	Limited bool
	// Floor is the worker's claim floor of the type (nil: none), from which the start
	// looks for runs queued before its own (see queuedAheadSQL).
	Floor *time.Time
}

// Debounce collapses the starts of one key (in a namespace) within a window into one
// run: a start of a key whose run has not started yet updates that run's input and
// pushes its start to Window from now, but never past MaxWait after the first start.
type Debounce struct {
	Key     string
	Window  time.Duration
	MaxWait time.Duration
}

// runsCreatedSQL, followed by a FROM whose rows have namespace, created_at, run_id and
// workflow_type,
// enters new runs in ListRuns' order (kagzi.runs_created): written
// once with its run, never updated, so rewrites of the run add nothing to it.
const runsCreatedSQL = `INSERT INTO kagzi.runs_created (namespace, created_at, run_id, workflow_type)
	SELECT namespace, created_at, run_id, workflow_type`

// insertRun starts a run in one statement and notifies the workers of its type in the
// same transaction (unless @notify_later: the caller notifies after the commit, see
// NewRun.NotifyLater). It returns the new run (inserted = true) or, when the workflow
// id is taken, the run holding it (inserted = false): the active one, or with
// @reuse_never the newest run of that id whatever its status. With @check_worker it
// also tells whether no live worker registered the run's type (and version); see
// NewRun.CheckWorker.
//
// Under a concurrent start of the same id, ON CONFLICT waits for the other transaction;
// when it commits, neither branch may see its row in this statement's snapshot, and the
// statement returns nothing: InsertRun then runs it again.
// insertRunSQL is insertRun's statement; with eager, its eager CTE decides whether
// the insert claims the run (see Eager). Without, eager is the constant false, which
// the planner folds away. Nothing in either depends on a parameter's value in a way
// the planner could fold: a CTE that did (eager_worker IS NOT NULL, ...) made custom
// plans look cheaper than the generic one, and Postgres planned every start anew
// (1.8 ms a start, more than the start's own work).
//
// With reuseNever (IDReuseNever: children, schedules, callers that ask), the id's
// newest finished run is looked up too, in the live table and kagzi.history_ids (see
// reuseNeverSQL); without, the statement reads active runs only. With notBefore too
// (NewRun.IDNotBefore), only runs finished from that time on are looked up.
func insertRunSQL(eager eagerMode, reuseNever, notBefore bool) string {
	// (@eager_floor, a parameter of every mode, is folded away with the false.)
	cte := `
	SELECT false AS ok, false AS slot, false AND @eager_floor::timestamptz IS NULL AS behind`
	switch eager {
	case eagerPlain:
		cte = `
	-- An eager start (see Eager) inserts the run claimed unless its type has
	-- flow-control limits (the claim applies them) or runs of its type wait to be
	-- claimed before it (behind: see queuedAheadSQL). The caller checked the rest: the
	-- run starts now, has no concurrency key, and its version is the worker's.
	SELECT NOT b.behind AND NOT EXISTS (SELECT 1 FROM kagzi.flow_limits l
			WHERE l.namespace = @namespace AND l.workflow_type = @workflow_type) AS ok,
		false AS slot, b.behind
	FROM (SELECT ` + queuedAheadSQL + ` AS behind OFFSET 0) b -- OFFSET 0: one probe, not one a reference`
	case eagerLocked:
		cte = `
	-- An eager start of a run whose type may have limits, or which has a concurrency
	-- key (see Eager), inserts the run claimed when its type has no rate limit, its
	-- concurrency limit has room (the type's slots held), its key's concurrency limit
	-- has room (the key's holders), and no run of its key is queued (those come
	-- first, in start order): the holders counted as a claim counts them, by a
	-- statement that starts after the caller locked the type and the key (see
	-- eagerLockSQL). A run of no key is not inserted claimed while runs of its type
	-- wait to be claimed before it (behind: see queuedAheadSQL). The run then holds a
	-- slot of its type's limit (slot).
	SELECT coalesce(l.ok, true) AND NOT b.behind AND (@flow_key::text = '' OR NOT EXISTS (SELECT 1 FROM kagzi.runs q
			WHERE q.namespace = @namespace AND q.workflow_type = @workflow_type AND q.flow_key = @flow_key::text
			  AND q.flow_key IS NOT NULL AND q.started_at IS NULL AND q.status = 'PENDING')) AS ok,
		coalesce(l.slot, false) AS slot, b.behind
	FROM (SELECT @flow_key::text = '' AND ` + queuedAheadSQL + ` AS behind OFFSET 0) b LEFT JOIN (
		SELECT l.rate IS NULL AND l.key_rate IS NULL
			AND (l.concurrency IS NULL OR (SELECT count(*) FROM kagzi.runs h
				WHERE h.namespace = @namespace AND h.workflow_type = @workflow_type AND h.holds_type_slot
				  AND h.status = 'RUNNING' AND h.available_at > now() - ` + slotGraceSQL + `) < l.concurrency)
			AND (@flow_key::text = '' OR l.key_concurrency IS NULL OR (SELECT count(*) FROM kagzi.runs h
				WHERE h.namespace = @namespace AND h.workflow_type = @workflow_type AND h.flow_key = @flow_key::text
				  AND h.flow_key IS NOT NULL AND h.started_at IS NOT NULL
				  AND h.status IN ('PENDING', 'RUNNING', 'SLEEPING')) < l.key_concurrency) AS ok,
			l.concurrency IS NOT NULL AS slot
		FROM kagzi.flow_limits l WHERE l.namespace = @namespace AND l.workflow_type = @workflow_type) l ON true`
	}
	prev := newestByWorkflowIDSQL("@namespace", "@workflow_id", "")
	if reuseNever {
		since := ""
		if notBefore {
			since = "@id_not_before::timestamptz"
		}
		prev = reuseNeverSQL("@namespace", "@workflow_id", since)
	}
	return insertRunTemplate(cte, prev)
}

// queuedAheadSQL is true when a run of the start's type waits to be claimed before the
// new run: the earliest claimable one of runs_claimable (runs of no key, or of a key
// that started) of a version the worker runs, read from the worker's claim floor of the
// type (see Floors: the entries below it are those of runs claimed before, which a
// pinned xmin horizon keeps in the index), is due at the new run's time (now() less its
// priority in seconds) or before. (Runs of another version, which the worker would not
// claim, are walked past.) An eager start must not put its run ahead of it: with a
// backlog, every start in a worker's process would jump it, whatever the priorities.
// One ordered index probe (an EXISTS with a range condition was planned as a sequential
// scan that read the whole table when nothing was due).
const queuedAheadSQL = `coalesce((SELECT q.available_at <= now() - @priority * interval '1 second' FROM kagzi.runs q
		WHERE q.namespace = @namespace AND q.workflow_type = @workflow_type
		  AND q.status IN ('PENDING', 'RUNNING', 'SLEEPING') AND q.available_at IS NOT NULL
		  AND (q.flow_key IS NULL OR q.started_at IS NOT NULL)
		  AND q.available_at >= coalesce(@eager_floor::timestamptz, '-infinity')
		  AND (q.version IS NULL OR q.version = @eager_version::text)
		ORDER BY q.available_at LIMIT 1), false)`

// archivedStatus is the status reuseNeverSQL gives a run of kagzi.history_ids, whose
// row is in the history: only its run_id, namespace, workflow_id, created_at and
// finished_at (the partition key of its history row) are read; archivedRun reads the
// rest.
const archivedStatus = "ARCHIVED"

// reuseNeverSQL selects (runColumns and a rank) the run that keeps a workflow id from
// a start with IDReuseNever: its active run, else its newest finished run that was
// started with IDReuseNever, live or archived (and, with since set, a placeholder of a
// time, finished from then on). An archived run is read from kagzi.history_ids, one
// index, and not from the history's partitions, which a statement naming them would
// lock and probe one by one at every start: it comes back as a row of archivedStatus.
func reuseNeverSQL(ns, id, since string) string {
	liveSince, archivedSince := "", ""
	if since != "" {
		liveSince = " AND finished_at >= " + since
		archivedSince = " AND h.run_finished_at >= " + since
	}
	return `
	SELECT * FROM (
		(` + newestByWorkflowIDSQL(ns, id, "") + `)
		UNION ALL
		(SELECT * FROM (
			(SELECT ` + runColumns + `, 1 AS rank FROM kagzi.runs
			 WHERE namespace = ` + ns + ` AND workflow_id = ` + id + ` AND status IN ('COMPLETED', 'FAILED', 'CANCELLED')
			   AND id_reuse_never` + liveSince + `
			 ORDER BY created_at DESC LIMIT 1)
			UNION ALL
			(SELECT h.run_id, h.namespace, h.workflow_id, '', '` + archivedStatus + `', NULL::jsonb, NULL::jsonb, NULL::jsonb,
				0, NULL::timestamptz, NULL::text, 0::bigint, false, NULL::timestamptz, h.created_at,
				NULL::timestamptz, h.run_finished_at, h.created_at, NULL::text, NULL::timestamptz, NULL::uuid, NULL::text,
				NULL::text, NULL::uuid, NULL::text, 0, NULL::jsonb, 0::smallint, NULL::text, NULL::text,
				NULL::uuid, NULL::uuid, 1
			 FROM kagzi.history_ids h
			 WHERE h.namespace = ` + ns + ` AND h.workflow_id = ` + id + archivedSince + `
			 ORDER BY h.created_at DESC LIMIT 1)
		) finished ORDER BY created_at DESC LIMIT 1)
	) newest ORDER BY rank LIMIT 1`
}

func insertRunTemplate(eager, prev string) string {
	return `
WITH prev AS (` + prev + `
), parent_held AS (
	-- A child's parent, held by the starting execution's lease (NewRun.ParentFence).
	SELECT 1 FROM kagzi.runs p
	WHERE @parent_epoch::bigint IS NOT NULL AND p.run_id = @parent_run_id::uuid AND p.lease_epoch = @parent_epoch
	  AND p.lease_token IS NOT DISTINCT FROM @parent_token::uuid AND p.status = 'RUNNING'
	  AND NOT (p.holds_type_slot AND p.available_at <= clock_timestamp())
	FOR KEY SHARE
), eager AS MATERIALIZED (` + eager + `
), ins AS (
	INSERT INTO kagzi.runs (run_id, namespace, workflow_id, workflow_type, status, input,
		available_at, id_reuse_never, deadline_at, schedule_id, schedule_tick, parent_run_id, parent_step_key,
		version, forked_from_run_id, forked_from_step, trace_carrier, attributes, priority, flow_key,
		locked_by, lease_epoch, started_at, holds_type_slot)
	SELECT @run_id, @namespace, @workflow_id, @workflow_type, CASE WHEN e.ok THEN 'RUNNING' ELSE 'PENDING' END, @input,
		CASE WHEN e.ok THEN now() + @eager_lease_ms * interval '1 millisecond'
			ELSE least(coalesce(@start_at, now() - @priority * interval '1 second'), @deadline) END,
		@reuse_never, @deadline, nullif(@schedule_id::text, ''),
		@schedule_tick::timestamptz, @parent_run_id::uuid, nullif(@parent_step_key::text, ''),
		CASE WHEN e.ok THEN @eager_version::text
			ELSE coalesce(@version::text, CASE WHEN @newest_version THEN (` + newestVersionSQL + `) END) END,
		@forked_from_run_id::uuid, nullif(@forked_from_step::text, ''), @carrier::jsonb, @attributes::jsonb,
		@priority, nullif(@flow_key::text, ''),
		CASE WHEN e.ok THEN @eager_worker::text END, CASE WHEN e.ok THEN 1 ELSE 0 END, CASE WHEN e.ok THEN now() END,
		e.ok AND e.slot
	FROM eager e
	WHERE NOT EXISTS (SELECT 1 FROM prev) AND (@parent_epoch::bigint IS NULL OR EXISTS (SELECT 1 FROM parent_held))
	ON CONFLICT (namespace, workflow_id) WHERE status IN ('PENDING', 'RUNNING', 'SLEEPING') DO NOTHING
	RETURNING ` + runColumns + `, holds_type_slot
), listed AS (
	` + runsCreatedSQL + ` FROM ins
)
SELECT ins.*, true, CASE WHEN @notify_later OR ins.status = 'RUNNING' THEN '' ELSE pg_notify('` + Channel + `',
	'w|' || octet_length(ins.namespace) || ':' || ins.namespace || '|' || ins.workflow_type || '|'
	|| (extract(epoch FROM ins.available_at) * 1000)::bigint)::text
	|| coalesce(` + notifyDeadlineSQL("ins.namespace", "ins.deadline_at") + `, '') END,
	CASE WHEN @check_worker THEN NOT ` + liveWorkerSQL("@namespace", "@workflow_type", "@version::text") + ` ELSE false END,
	(SELECT e.behind FROM eager e)
FROM ins
UNION ALL
SELECT ` + runColumns + `, false, false, '', false, false FROM prev`
}

var insertRunParams = []param[*NewRun]{
	arg("run_id", "uuid", func(n *NewRun) uuid.UUID { return n.RunID }),
	arg("namespace", "text", func(n *NewRun) string { return n.Namespace }),
	arg("workflow_id", "text", func(n *NewRun) string { return n.WorkflowID }),
	arg("workflow_type", "text", func(n *NewRun) string { return n.WorkflowType }),
	arg("input", "jsonb", func(n *NewRun) []byte { return n.Input }),
	arg("start_at", "timestamptz", func(n *NewRun) *time.Time {
		if n.StartAt.IsZero() {
			return nil
		}
		return &n.StartAt
	}),
	arg("reuse_never", "boolean", func(n *NewRun) bool { return n.ReuseNever }),
	arg("deadline", "timestamptz", func(n *NewRun) *time.Time { return n.Deadline }),
	arg("schedule_id", "text", func(n *NewRun) string { return n.ScheduleID }),
	arg("schedule_tick", "timestamptz", func(n *NewRun) *time.Time { return n.ScheduleTick }),
	arg("parent_run_id", "uuid", func(n *NewRun) *uuid.UUID { return n.ParentRunID }),
	arg("parent_step_key", "text", func(n *NewRun) string { return n.ParentStepKey }),
	arg("parent_epoch", "bigint", func(n *NewRun) *int64 {
		if n.ParentFence == nil {
			return nil
		}
		return &n.ParentFence.Epoch
	}),
	arg("parent_token", "uuid", func(n *NewRun) pgtype.UUID {
		if n.ParentFence == nil {
			return pgtype.UUID{}
		}
		return n.ParentFence.token()
	}),
	arg("version", "text", func(n *NewRun) *string { return n.Version }),
	arg("forked_from_run_id", "uuid", func(n *NewRun) *uuid.UUID { return n.ForkedFromRunID }),
	arg("forked_from_step", "text", func(n *NewRun) string { return n.ForkedFromStep }),
	arg("carrier", "jsonb", func(n *NewRun) []byte { return n.Carrier }),
	arg("notify_later", "boolean", func(n *NewRun) bool { return n.NotifyLater }),
	arg("newest_version", "boolean", func(n *NewRun) bool { return n.NewestVersion }),
	arg("attributes", "jsonb", func(n *NewRun) []byte { return n.Attributes }),
	arg("check_worker", "boolean", func(n *NewRun) bool { return n.CheckWorker }),
	arg("priority", "integer", func(n *NewRun) int { return n.Priority }),
	arg("flow_key", "text", func(n *NewRun) string { return n.FlowKey }),
	arg("eager_worker", "text", func(n *NewRun) *string {
		if n.Eager == nil {
			return nil
		}
		return &n.Eager.WorkerID
	}),
	arg("eager_version", "text", func(n *NewRun) string {
		if n.Eager == nil {
			return ""
		}
		return n.Eager.Version
	}),
	arg("eager_floor", "timestamptz", func(n *NewRun) *time.Time {
		if n.Eager == nil {
			return nil
		}
		return n.Eager.Floor
	}),
	arg("eager_lease_ms", "bigint", func(n *NewRun) int64 {
		if n.Eager == nil {
			return 0
		}
		return n.Eager.Lease.Milliseconds()
	}),
}

// eagerMode says whether an insert may claim its run for a worker of the starting
// process (see Eager), and how.
type eagerMode int

const (
	notEager    eagerMode = iota
	eagerPlain            // a run without a concurrency key, of a type without limits
	eagerLocked           // a run of a concurrency key, or of a type with limits: after eagerLockSQL
)

// insertRuns holds insertRun's statements by eager mode, then: plain, with
// ReuseNever, and with ReuseNever and IDNotBefore.
var insertRuns = func() (s [3][3]namedStatement[*NewRun]) {
	for m := range s {
		s[m][0] = named(insertRunSQL(eagerMode(m), false, false), insertRunParams...)
		s[m][1] = named(insertRunSQL(eagerMode(m), true, false), insertRunParams...)
		s[m][2] = named(insertRunSQL(eagerMode(m), true, true), insertRunSinceParams...)
	}
	return s
}()

// insertRun and insertRunEager are the statements of a run started now without an
// idempotent id, not claimed and claimed by its start.
var insertRun, insertRunEager = insertRuns[notEager][0], insertRuns[eagerPlain][0]

// lockedRowQuerier is a committer: see committer.Committer.QueryRowLocked.
type lockedRowQuerier interface {
	QueryRowLocked(ctx context.Context, lock committer.Lock, sql string, args ...any) pgx.Row
}

// idLockSQL locks a workflow id for the start of a run with its own id (WithID), to
// the start's commit. The start's statement looks for the run that holds the id in
// its snapshot, taken when it begins: two starts of an id whose statements began
// together each saw no run, and when the first one's run finished before the second
// inserted (an eager start ends in a millisecond), the second found no active run to
// conflict with and started the id again, IDReuseNever or not (found from outside: 16
// concurrent starts of each of 40 ids with IDReuseNever gave 13-24 of them two or
// three runs). Under the lock, the second's statement begins after the first
// committed, and its snapshot holds the first's run, active or finished.
//
// Only the library's own transactions take it, which end with their statement: a
// start in the caller's transaction (StartTx) does not, or it would hold the id to
// the caller's commit, and every start of the id, and every start batched with one,
// would wait for it (found in review). Starts of generated ids (a new UUID each) take
// no lock. The key (idLockKey) is two int4s, a space of advisory locks apart from the
// bigint keys of the liveness and flow-control locks.
const idLockSQL = `SELECT pg_advisory_xact_lock($1::int4, $2::int4)`

// idLockKey is the key of idLockSQL for a workflow id of a namespace: the FNV-1a hash
// of both, whose halves order a batch's locks (committer.Lock.Key) as PostgreSQL
// tells them apart.
func idLockKey(namespace, workflowID string) (hi, lo int32) {
	h := fnv.New64a()
	h.Write([]byte(namespace))
	h.Write([]byte{0})
	h.Write([]byte(workflowID))
	v := h.Sum64()
	return int32(v >> 32), int32(v)
}

// eagerLockSQL locks, for the transaction, the type's concurrency limit ($1
// namespace, $2 type) when it has one, then the concurrency key ($3; none when empty),
// as a claim locks them (kagzi.claim: the type with pg_advisory_xact_lock, then the
// keys with kagzi.flow_lock_keys, which passes over a key it cannot lock, so a claim
// never waits for a start): sent before an eager start that counts holders
// (eagerLocked), in the same transaction, so that the insert's counts see every claim
// and eager start that committed before, and none commits meanwhile. A type without a
// concurrency limit is not locked: its starts take no lock but their key's. Only a
// lone start of a client takes this way (see eager.go): the starts of one process do
// not take turns on a type's lock. The insert uses its generic plan, as a start does
// (see insertRunSQL), whatever Postgres would choose for it.
const eagerLockSQL = `WITH t AS MATERIALIZED (
	SELECT count(pg_advisory_xact_lock(hashtextextended('kagzi.flow.type|' || $1::text || '|' || $2::text, 0))) AS n
	FROM kagzi.flow_limits l WHERE l.namespace = $1::text AND l.workflow_type = $2::text AND l.concurrency IS NOT NULL
)
SELECT t.n, CASE WHEN $3::text <> '' THEN
		pg_advisory_xact_lock(hashtextextended('kagzi.flow.key|' || $1::text || '|' || $2::text || '|' || $3::text, 0))::text END,
	set_config('plan_cache_mode', 'force_generic_plan', true)
FROM t`

// insertRunSinceParams are the parameters of the statements with NewRun.IDNotBefore.
var insertRunSinceParams = append(slices.Clip(insertRunParams),
	arg("id_not_before", "timestamptz", func(n *NewRun) *time.Time { return n.IDNotBefore }))

// notifyDeadlineSQL notifies DeadlineTopic of the namespace when deadline is not
// null (it is NULL, as text, otherwise).
func notifyDeadlineSQL(namespace, deadline string) string {
	return `CASE WHEN ` + deadline + ` IS NOT NULL THEN pg_notify('` + Channel + `', 't|' || ` + namespace +
		` || '|' || (extract(epoch FROM ` + deadline + `) * 1000)::bigint)::text END`
}

// InsertRun starts a run, or returns the run that already holds its workflow id.
func InsertRun(ctx context.Context, db DBTX, n NewRun) (run Run, inserted bool, err error) {
	run, st, err := InsertRunChecked(ctx, db, n)
	return run, st.Inserted, err
}

// Started is what InsertRunChecked tells besides the run.
type Started struct {
	// Inserted: the run was inserted (false: the run that holds its workflow id).
	Inserted bool
	// NoWorker, when n.CheckWorker is set and the run was inserted: no live worker
	// registered its type (and version).
	NoWorker bool
	// HoldsSlot: an eager start claimed a slot of the type's concurrency limit for the
	// run (see Eager).
	HoldsSlot bool
	// BehindQueue: an eager start did not claim its run because runs of its type wait
	// to be claimed before it (not because of limits).
	BehindQueue bool
}

// InsertRunChecked is InsertRun that also reports what Started holds.
func InsertRunChecked(ctx context.Context, db DBTX, n NewRun) (run Run, st Started, err error) {
	if n.Debounce != nil {
		run, st.Inserted, err = insertDebounced(ctx, db, n)
		return run, st, err
	}
	mode := notEager
	if n.Eager != nil {
		mode = eagerPlain
		if n.FlowKey != "" || n.Eager.Limited {
			// The locks must come first, in the same transaction: without a pipeline
			// (a caller's transaction is never eager), no eager start.
			mode = eagerLocked
			if _, ok := db.(batcher); !ok {
				mode = notEager
			}
		}
	}
	variant := 0
	switch {
	case n.ReuseNever && n.IDNotBefore != nil:
		variant = 2
	case n.ReuseNever, n.KeptID:
		variant = 1
	}
	stmt := insertRuns[mode][variant]
	for try := 0; ; try++ {
		if try > 0 {
			// Each lost race means another start or end of the id committed between the
			// insert's conflict and its look: under a hot id (runs started and ended
			// back to back) that happens several times in a row. Look again at once,
			// then after a short wait, until ctx ends.
			if err := raceWait(ctx, try); err != nil {
				return Run{}, Started{}, err
			}
		}
		var notified string
		var row pgx.Row
		var setups []setupStmt
		_, callersTx := db.(pgx.Tx)
		locked := variant != 0 && !callersTx // see idLockSQL
		var lockKey string
		if locked {
			hi, lo := idLockKey(n.Namespace, n.WorkflowID)
			setups = append(setups, setupStmt{idLockSQL, []any{hi, lo}})
			lockKey = fmt.Sprintf("%08x%08x", uint32(hi), uint32(lo))
		}
		if mode == eagerLocked {
			setups = append(setups, setupStmt{eagerLockSQL, []any{n.Namespace, n.WorkflowType, n.FlowKey}})
		}
		locker, batched := db.(lockedRowQuerier)
		switch {
		case len(setups) == 1 && locked && batched:
			// Starts batched by a committer: the id's lock goes first in its batch.
			row = locker.QueryRowLocked(ctx, committer.Lock{Key: lockKey, SQL: idLockSQL, Args: setups[0].args},
				stmt.sql, stmt.args(&n)...)
		case len(setups) > 0:
			rows, err := queryAfterAll(ctx, db, setups, stmt.sql, stmt.args(&n)...)
			row = firstRow{rows: rows, err: err}
		default:
			row = db.QueryRow(ctx, stmt.sql, stmt.args(&n)...)
		}
		st = Started{}
		run, err = scanRun(row, &st.HoldsSlot, &st.Inserted, &notified, &st.NoWorker, &st.BehindQueue)
		if errors.Is(err, pgx.ErrNoRows) {
			if n.ParentFence != nil {
				// Or the parent's lease was lost: then the child is not started.
				if held, err := parentHeld(ctx, db, *n.ParentFence); err != nil || !held {
					return Run{}, Started{}, cmp.Or(err, ErrLeaseLost)
				}
			}
			continue // lost a race with a concurrent start of the same id: look again
		}
		if err == nil && !st.Inserted && run.Status == archivedStatus {
			var found bool
			if run, found, err = archivedRun(ctx, db, run); err == nil && !found {
				continue // its history row is gone (retention): the id is free, look again
			}
		}
		return run, st, err
	}
}

// parentHeld reports whether a child's parent is still RUNNING under the lease f.
func parentHeld(ctx context.Context, db DBTX, f Fence) (bool, error) {
	var held bool
	err := db.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM kagzi.runs WHERE run_id = $1 AND lease_epoch = $2
		AND lease_token IS NOT DISTINCT FROM $3 AND status = 'RUNNING')`, f.RunID, f.Epoch, f.token()).Scan(&held)
	return held, err
}

// raceWait waits before the try-th look after a lost race with concurrent starts of
// one workflow id: none for the first few, then a millisecond more each time, at most
// 20 ms. It returns ctx's error (a raceError) when ctx ends first.
func raceWait(ctx context.Context, try int) error {
	if ctx.Err() != nil {
		return raceError{ctx.Err()}
	}
	if try < 4 {
		return nil
	}
	t := time.NewTimer(time.Duration(min(try-3, 20)) * time.Millisecond)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return raceError{ctx.Err()}
	case <-t.C:
		return nil
	}
}

// raceError is the end of ctx while a start looked again after lost races with
// concurrent starts of its workflow id.
type raceError struct{ err error }

func (e raceError) Error() string {
	return "kagzi: gave up starting or finding the run of a workflow id under concurrent starts: " + e.err.Error()
}

func (e raceError) Unwrap() error { return e.err }

// firstRow is the first row of rows as a pgx.Row (pgx.ErrNoRows when there is none;
// err when the query failed). Scan closes rows, and reports an error of their
// closing: a batch's commit.
type firstRow struct {
	rows pgx.Rows
	err  error
}

func (r firstRow) Scan(dest ...any) error {
	if r.err != nil {
		return r.err
	}
	defer r.rows.Close()
	if !r.rows.Next() {
		r.rows.Close()
		if err := r.rows.Err(); err != nil {
			return err
		}
		return pgx.ErrNoRows
	}
	if err := r.rows.Scan(dest...); err != nil {
		return err
	}
	r.rows.Close()
	return r.rows.Err()
}

// archivedRun reads the run a reuseNeverSQL row of archivedStatus names from its
// history partition. When the run is no longer there (its partition was dropped, or
// its namespace's retention deleted it, and its kagzi.history_ids row was left
// behind), it deletes that row and returns found false.
func archivedRun(ctx context.Context, db DBTX, a Run) (run Run, found bool, err error) {
	run, err = scanRun(db.QueryRow(ctx, `SELECT `+runColumns+` FROM kagzi.runs_history
		WHERE run_id = $1 AND finished_at = $2`, a.RunID, a.FinishedAt))
	if errors.Is(err, pgx.ErrNoRows) {
		_, err = db.Exec(ctx, `DELETE FROM kagzi.history_ids
			WHERE namespace = $1 AND workflow_id = $2 AND created_at = $3 AND run_id = $4`,
			a.Namespace, a.WorkflowID, a.CreatedAt, a.RunID)
		return Run{}, false, err
	}
	return run, err == nil, err
}

// liveWorkerSQL is true when a live (see workerLiveSQL) worker of namespace ns
// registered the workflow type typ and, unless version is NULL, that version of it.
func liveWorkerSQL(ns, typ, version string) string {
	return `EXISTS (SELECT 1 FROM kagzi.workers w, unnest(w.workflow_types, w.workflow_versions) AS t(workflow_type, version)
		WHERE w.namespace = ` + ns + ` AND ` + workerLiveSQL + ` AND t.workflow_type = ` + typ + `
		  AND (` + version + ` IS NULL OR t.version = ` + version + `))`
}

// LiveWorkerRegistered tells whether a live (see workerLiveSQL) worker of the
// namespace registered the workflow type and, unless version is nil, that version.
func LiveWorkerRegistered(ctx context.Context, db DBTX, namespace, workflowType string, version *string) (bool, error) {
	var ok bool
	err := db.QueryRow(ctx, `SELECT `+liveWorkerSQL("$1", "$2", "$3::text"), namespace, workflowType, version).Scan(&ok)
	return ok, err
}

// insertDebounced starts a run of a debounce key, or, when the key's run has not
// started yet, gives that run the new input (the last start's input wins) and pushes
// its start to the window from now, never past its debounce_until (the first start
// plus the maximum wait) nor its deadline. inserted tells which. Its times, the run's
// creation included, are the statement's (statement_timestamp), not its transaction's
// start: a StartTx in a transaction begun earlier times its window from the start, as
// Start does.
var insertDebouncedRun = named(`
WITH ins AS (
	INSERT INTO kagzi.runs AS r (run_id, namespace, workflow_id, workflow_type, status, input, created_at, available_at,
		deadline_at, version, trace_carrier, attributes, priority, flow_key, debounce_key, debounce_until)
	SELECT @run_id, @namespace, @workflow_id, @workflow_type, 'PENDING', @input, statement_timestamp(),
		least(statement_timestamp() + @window_ms * interval '1 millisecond', @deadline), @deadline,
		coalesce(@version::text, CASE WHEN @newest_version THEN (`+newestVersionSQL+`) END), @carrier::jsonb,
		@attributes::jsonb, @priority, nullif(@flow_key::text, ''), @debounce_key,
		statement_timestamp() + @max_wait_ms * interval '1 millisecond'
	ON CONFLICT (namespace, workflow_type, debounce_key) WHERE debounce_key IS NOT NULL AND started_at IS NULL AND status = 'PENDING'
	DO UPDATE SET input = excluded.input,
		available_at = least(statement_timestamp() + @window_ms * interval '1 millisecond', r.debounce_until, r.deadline_at),
		updated_at = now()
	RETURNING `+runColumns+`, xmax = 0 AS inserted
), listed AS (
	`+runsCreatedSQL+` FROM ins WHERE inserted
)
SELECT ins.*, pg_notify('`+Channel+`', 'w|' || octet_length(ins.namespace) || ':' || ins.namespace || '|'
	|| ins.workflow_type || '|' || (extract(epoch FROM ins.available_at) * 1000)::bigint)::text
FROM ins`,
	arg("run_id", "uuid", func(n *NewRun) uuid.UUID { return n.RunID }),
	arg("namespace", "text", func(n *NewRun) string { return n.Namespace }),
	arg("workflow_id", "text", func(n *NewRun) string { return n.WorkflowID }),
	arg("workflow_type", "text", func(n *NewRun) string { return n.WorkflowType }),
	arg("input", "jsonb", func(n *NewRun) []byte { return n.Input }),
	arg("window_ms", "bigint", func(n *NewRun) int64 { return n.Debounce.Window.Milliseconds() }),
	arg("deadline", "timestamptz", func(n *NewRun) *time.Time { return n.Deadline }),
	arg("version", "text", func(n *NewRun) *string { return n.Version }),
	arg("newest_version", "boolean", func(n *NewRun) bool { return n.NewestVersion }),
	arg("carrier", "jsonb", func(n *NewRun) []byte { return n.Carrier }),
	arg("attributes", "jsonb", func(n *NewRun) []byte { return n.Attributes }),
	arg("priority", "integer", func(n *NewRun) int { return n.Priority }),
	arg("flow_key", "text", func(n *NewRun) string { return n.FlowKey }),
	arg("debounce_key", "text", func(n *NewRun) string { return n.Debounce.Key }),
	arg("max_wait_ms", "bigint", func(n *NewRun) int64 { return n.Debounce.MaxWait.Milliseconds() }))

func insertDebounced(ctx context.Context, db DBTX, n NewRun) (Run, bool, error) {
	var inserted bool
	var notified string
	r, err := scanRun(db.QueryRow(ctx, insertDebouncedRun.sql, insertDebouncedRun.args(&n)...), &inserted, &notified)
	return r, inserted, err
}

// ManyRuns is what InsertManyRuns needs to start many runs of one type.
type ManyRuns struct {
	Namespace    string
	WorkflowType string
	Version      *string
	// IDs are the runs' ids, which are also their workflow ids; Inputs and Carriers
	// (nil or one per run) go with them.
	IDs      []uuid.UUID
	Inputs   [][]byte
	Carriers [][]byte
	StartAt  time.Time
	Deadline *time.Time
	// Attributes, when set, are every run's attributes (a JSON object).
	Attributes []byte
	// Priority and FlowKey: see NewRun.
	Priority int
	FlowKey  string
	// ReuseNever keeps every run's workflow id an idempotency key after it finishes.
	ReuseNever bool
}

// InsertRuns starts many runs of one type in one statement, their workflow ids their
// run ids, and notifies the workers of the type once.
func InsertRuns(ctx context.Context, db DBTX, namespace, workflowType string, version *string,
	ids []uuid.UUID, inputs, carriers [][]byte, startAt time.Time, deadline *time.Time) error {
	return InsertManyRuns(ctx, db, ManyRuns{Namespace: namespace, WorkflowType: workflowType, Version: version,
		IDs: ids, Inputs: inputs, Carriers: carriers, StartAt: startAt, Deadline: deadline})
}

// InsertManyRuns is InsertRuns with every option.
func InsertManyRuns(ctx context.Context, db DBTX, m ManyRuns) error {
	var start *time.Time
	if !m.StartAt.IsZero() {
		start = &m.StartAt
	}
	texts := make([]string, len(m.Inputs))
	for i, in := range m.Inputs {
		texts[i] = string(in)
	}
	raw := make([][16]byte, len(m.IDs)) // binary, not a driver.Valuer string per id
	for i, id := range m.IDs {
		raw[i] = id
	}
	var n int
	var ignored *string
	err := db.QueryRow(ctx, `
		WITH ins AS (
			INSERT INTO kagzi.runs (run_id, namespace, workflow_id, workflow_type, status, input,
				available_at, deadline_at, version, trace_carrier, attributes, priority, flow_key, id_reuse_never)
			SELECT id, $1, id::text, $2, 'PENDING', input, least(coalesce($5, now() - $10 * interval '1 second'), $6), $6, $7,
				carrier, $9::jsonb, $10, nullif($11::text, ''), $12
			FROM unnest($3::uuid[], $4::jsonb[], $8::jsonb[]) AS t(id, input, carrier)
			RETURNING namespace, created_at, run_id, workflow_type, available_at
		), listed AS (
			`+runsCreatedSQL+` FROM ins
		)
		SELECT count(*), (SELECT pg_notify('`+Channel+`', 'w|' || octet_length($1::text) || ':' || $1 || '|' || $2 || '|'
			|| (extract(epoch FROM min(available_at)) * 1000)::bigint)::text FROM ins),
			`+notifyDeadlineSQL("$1::text", "$6::timestamptz")+`
		FROM ins`, m.Namespace, m.WorkflowType, raw, texts, start, m.Deadline, m.Version, m.Carriers, m.Attributes,
		m.Priority, m.FlowKey, m.ReuseNever).
		Scan(&n, &ignored, &ignored)
	if err == nil && n != len(m.IDs) {
		err = fmt.Errorf("inserted %d of %d runs", n, len(m.IDs))
	}
	return err
}
