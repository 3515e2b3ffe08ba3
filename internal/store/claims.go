package store

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/kagzi/kagzi/internal/vocab"
)

// ClaimedRun is a run a worker has just claimed, with every step it has recorded.
type ClaimedRun struct {
	// Fence is the run and the epoch this claim took it with: every write of this
	// execution carries it.
	Fence
	Namespace       string
	WorkflowID      string
	WorkflowType    string
	Version         string
	Input           []byte
	Attempt         int
	CancelRequested bool
	Deadline        *time.Time
	CreatedAt       time.Time
	// DBNow is the database's clock at the claim, so that a worker can tell how far
	// a recorded wake time is without trusting its own clock to agree.
	DBNow time.Time
	// Takeovers counts the claims, this one included, that took the run over after
	// its worker's lease passed.
	Takeovers int
	// ConcurrencyKey is the run's concurrency key ("": none); HoldsSlot reports that the
	// claim took a slot of its type's concurrency limit.
	ConcurrencyKey string
	HoldsSlot      bool
	// Steps holds the run's recorded steps by key (nil: none).
	Steps map[string]StepRecord
	// AvailableAt is when the run became claimable (before this claim); Carrier the
	// trace context stored at its start (nil: none).
	AvailableAt time.Time
	Carrier     []byte
}

// StepRecord is a recorded step as replay needs it.
type StepRecord struct {
	Name     string
	Position *int
	Kind     vocab.StepKind
	Status   vocab.StepStatus
	Output   []byte
	Error    []byte
	Attempts int
	WakeAt   *time.Time
}

// claimSQL claims up to $13 claimable runs of the worker's types ($2, with the version
// it registered for each, $3) in one statement: a call of kagzi.claim (migration
// 00003), or, for types without limits and queued keys, the short way below, which
// claims up to $7 (the worker's runs ahead as well: see Claimer.Ahead). The
// claim applies flow control: PENDING runs whose start time has come, SLEEPING runs whose
// wake time has come, RUNNING runs whose lease expired (their worker died or stalled),
// and the heads of concurrency keys' queues with room; each claim bumps the lease
// epoch, and a claim of a RUNNING run counts a takeover. $4 holds the worker's key
// cursor of each type (the last key it visited: see the rows without a run). A key
// whose lock another claim holds is passed over, and counted in a row without a run
// (migration 00015). The runs of no key are read from runs_claimable, one ordered
// range per type from the worker's floor of the type ($9, see Floors; types with
// limits or queued keys too since migration 00016), the queues of concurrency keys from
// the worker's floor of each type's key queue ($11, migration 00017; $12 says which
// types' rings of keys to walk with a skip scan rather than read from that floor), and
// SKIP LOCKED lets any number of workers claim side by side.
//
// It runs with Postgres's generic plans (see genericPlanSQL and KeyedPlansSQL):
// planning the claim anew at each call, as Postgres chose to, took 0.26 ms, more than
// the claim of one run itself (0.15 ms).
//
// Types without limits and without queued keyed runs (most claims) take a shorter way
// in the same statement: the plain read of kagzi.claim, from the floors, and the update
// of kagzi.claim_runs (claimUpdateSQL), without kagzi.claim's PL/pgSQL (each of whose
// statements and expressions sets up its executor state at every call: ~130 µs a
// claim, a third of a one-run claim). The rows it returns are the ones kagzi.claim
// returns for such types: the claimed runs, each type's next key-queue floor, and
// the next floor of each type when the claim read its runs (see kagzi.claim). When
// any of the types has limits or keyed runs queued from its key floor (gate), the
// statement calls kagzi.claim instead, for all of them (or the claim goes
// claimLimitedSQL's way: types whose only limit is a concurrency limit). The plain read
// stands in all three: a change to it is made in each.
const claimSQL = `
WITH gate AS MATERIALIZED (
	SELECT EXISTS (SELECT 1 FROM kagzi.flow_limits l WHERE l.namespace = $1 AND l.workflow_type = ANY ($2::text[]))
		OR ` + claimKeyedQueuedSQL + ` AS flow
), picked AS MATERIALIZED (
	SELECT c.run_id, c.available_at, t.version, t.workflow_type, false AS holds
	FROM unnest($2::text[], $3::text[], $9::timestamptz[]) AS t(workflow_type, version, floor),
	LATERAL (
` + claimReadSQL + `$7
		FOR UPDATE SKIP LOCKED
	) c
	WHERE $7 > 0 AND NOT (SELECT flow FROM gate)
	ORDER BY c.available_at
	LIMIT greatest($7, 0)
), claimed AS MATERIALIZED (` + claimUpdateSQL + `)
SELECT * FROM claimed
UNION ALL
` + claimLimitedTypesSQL + `
` + claimKeyFloorsSQL + `
-- Each type's next floor: a second before now() when the claim got fewer runs than
-- it asked for (every type's range up to now was read through), else before the last
-- run it claimed of the type (none for a type it claimed nothing of).
SELECT NULL, $1, NULL, t.workflow_type, NULL, NULL, NULL, NULL, NULL, NULL, NULL, now(),
	CASE WHEN (SELECT count(*) FROM claimed) < $7 THEN now()
		ELSE (SELECT max(c.prev_available_at) FROM claimed c WHERE c.workflow_type = t.workflow_type) END
		- interval '1 second',
	NULL, NULL, NULL, NULL, NULL
FROM unnest($2::text[]) AS t(workflow_type)
WHERE $7 > 0 AND NOT (SELECT flow FROM gate)
  AND ((SELECT count(*) FROM claimed) < $7 OR EXISTS (SELECT 1 FROM claimed c WHERE c.workflow_type = t.workflow_type))
UNION ALL
` + claimFallbackSQL + `$13::integer` + claimFallbackEndSQL + `$13 > 0`

// claimLimitedSQL is claimSQL for a worker some of whose types have a concurrency
// limit and nothing else (no rate limit, no concurrency keys queued): the claim's
// setup statement, in the same round trip, takes those types' locks ($13, the types
// the worker's claims last found limited: Claimer.Limited) before this statement
// starts, so its count of each type's slot holders sees every claim and eager start
// of the type that committed before, as kagzi.claim's does. Each limited type's room
// is its limit less its holders (not counting the worker's finishing runs, $8, while
// they are still locked by it, $5: see migration 00020), its
// runs are claimed holding a slot, and its next floor is now() only when it got fewer
// runs than its room (its range was read through). Any other limit, a concurrency
// limit on a type not locked, or queued keyed runs, send the claim to kagzi.claim as
// claimSQL's gate does.
//
// On a busy worker of a type limited to its slots it halved what a claim of ~50 runs
// costs over a plain one (0.6-0.7 ms of ~3.5 ms, from 0.9-1.3): kagzi.claim's
// PL/pgSQL set-ups, and its holders' count, which matched each holder against every
// finishing run (a <> ALL over an array parameter is a linear search, and an
// anti-join with it a nested loop in the generic plan, 5.7 ms for 267 holders and 133
// finishing runs; the NOT IN below hashes the array once).
const claimLimitedSQL = `
WITH lims AS MATERIALIZED (
	SELECT t.workflow_type, l.concurrency,
		l.workflow_type IS NULL OR (l.rate IS NULL AND l.key_concurrency IS NULL AND l.key_rate IS NULL
			AND (l.concurrency IS NULL OR t.workflow_type = ANY ($13::text[]))) AS short
	FROM unnest($2::text[]) AS t(workflow_type)
	LEFT JOIN kagzi.flow_limits l ON l.namespace = $1 AND l.workflow_type = t.workflow_type
), gate AS MATERIALIZED (
	SELECT EXISTS (SELECT 1 FROM lims WHERE NOT short)
		OR ` + claimKeyedQueuedSQL + ` AS flow
), room AS MATERIALIZED (
	SELECT lm.workflow_type, lm.concurrency IS NOT NULL AS holds,
		CASE WHEN lm.concurrency IS NULL THEN greatest($7, 0) ELSE greatest(least($7, lm.concurrency - (
			-- A holder whose lease passed (its worker died) no longer counts, after a
			-- grace for a renewal in flight (slotGraceSQL).
			SELECT count(*) FROM kagzi.runs r
			WHERE r.namespace = $1 AND r.workflow_type = lm.workflow_type AND r.holds_type_slot
			  AND r.status = 'RUNNING' AND r.available_at > now() - ` + slotGraceSQL + `
			  AND (r.run_id NOT IN (SELECT unnest($8::uuid[])) OR r.locked_by IS DISTINCT FROM $5::text))), 0) END AS allow
	FROM lims lm
	WHERE $7 > 0 AND NOT (SELECT flow FROM gate)
), picked AS MATERIALIZED (
	SELECT c.run_id, c.available_at, t.version, t.workflow_type, rm.holds
	FROM unnest($2::text[], $3::text[], $9::timestamptz[]) AS t(workflow_type, version, floor)
	JOIN room rm ON rm.workflow_type = t.workflow_type,
	LATERAL (
` + claimReadSQL + `rm.allow
		FOR UPDATE SKIP LOCKED
	) c
	ORDER BY c.available_at
	LIMIT greatest($7, 0)
), claimed AS MATERIALIZED (` + claimUpdateSQL + `)
SELECT * FROM claimed
UNION ALL
` + claimLimitedTypesSQL + `
` + claimKeyFloorsSQL + `
-- Each type's next floor: a second before now() when the claim got fewer runs of the
-- type than its room and fewer than it asked for in all (the type's range up to now
-- was read through), else before the last run it claimed of the type (none for a
-- type it claimed nothing of).
SELECT NULL, $1, NULL, f.workflow_type, NULL, NULL, NULL, NULL, NULL, NULL, NULL, now(),
	CASE WHEN f.through THEN now() ELSE f.last END - interval '1 second', NULL, NULL, NULL, NULL, NULL
FROM (
	SELECT rm.workflow_type, tk.last,
		(SELECT count(*) FROM claimed) < $7 AND coalesce(tk.n, 0) < rm.allow AS through
	FROM room rm
	LEFT JOIN (SELECT c.workflow_type, count(*) AS n, max(c.prev_available_at) AS last
		FROM claimed c GROUP BY c.workflow_type) tk ON tk.workflow_type = rm.workflow_type
) f
WHERE f.through OR f.last IS NOT NULL
UNION ALL
` + claimFallbackSQL + `$7::integer` + claimFallbackEndSQL + `$7 > 0`

// claimLocksSQL is what claimSetupSQL adds for claimLimitedSQL: the locks of the
// namespace's ($2) types that the claim takes for limited ($4), and of every other
// type of the worker's ($3) with a concurrency limit, in the worker's order of its
// types (kagzi.claim's, which takes them again when the claim goes its way: two
// claims never take two types' locks in opposite orders), held to the commit.
const claimLocksSQL = `,
	(SELECT count(pg_advisory_xact_lock(hashtextextended('kagzi.flow.type|' || $2::text || '|' || s.t, 0)))
	 FROM (SELECT t.t FROM unnest($3::text[]) WITH ORDINALITY AS t(t, o)
		WHERE t.t = ANY ($4::text[]) OR EXISTS (SELECT 1 FROM kagzi.flow_limits l
			WHERE l.namespace = $2::text AND l.workflow_type = t.t AND l.concurrency IS NOT NULL)
		ORDER BY t.o) s)`

// The parts claimSQL and claimLimitedSQL share (the read also stands in kagzi.claim).
const (
	// claimKeyedQueuedSQL: some type ($2) has a keyed run queued from its key floor ($11).
	claimKeyedQueuedSQL = `EXISTS (SELECT 1 FROM unnest($2::text[], $11::timestamptz[]) AS t(workflow_type, floor),
			LATERAL (SELECT 1 FROM kagzi.runs r
				WHERE r.namespace = $1 AND r.workflow_type = t.workflow_type
				  AND r.flow_key IS NOT NULL AND r.started_at IS NULL AND r.status = 'PENDING' AND r.priority >= 0
				  AND r.available_at >= coalesce(t.floor, '-infinity')
				LIMIT 1) q)`
	// claimReadSQL reads a type's (t) claimable runs of no key from its floor, in
	// order; the LIMIT's value follows it.
	claimReadSQL = `
		SELECT r.run_id, r.available_at FROM kagzi.runs r
		WHERE r.namespace = $1 AND r.workflow_type = t.workflow_type
		  AND r.status IN ('PENDING', 'RUNNING', 'SLEEPING') AND r.available_at <= now()
		  AND r.available_at >= coalesce(t.floor, '-infinity')
		  AND (r.flow_key IS NULL OR r.started_at IS NOT NULL)
		  AND (r.version IS NULL OR r.version = t.version)
		ORDER BY r.available_at
		LIMIT `
	// claimKeyFloorsSQL: each type's next key-queue floor, none of its keyed runs being
	// queued from the floor (a row without a run each, then UNION ALL). Its 'short' in
	// the workflow id's column tells ClaimRuns that the claim took a short way (kagzi.claim's
	// rows without a run have none there).
	claimKeyFloorsSQL = `
SELECT NULL, $1, 'short', t.workflow_type, NULL, NULL, NULL, NULL, NULL, NULL,
	greatest(t.floor, now() - interval '1 second'), NULL, NULL, NULL, NULL, NULL, NULL, false
FROM unnest($2::text[], $11::timestamptz[]) AS t(workflow_type, floor)
WHERE $7 > 0 AND NOT (SELECT flow FROM gate)
UNION ALL`
	// claimUpdateSQL claims the runs picked (each with the version it is claimed for,
	// its available_at before the claim and, in claimLimitedSQL, whether it takes a slot
	// of its type's limit: holds), as kagzi.claim_runs does for kagzi.claim, with the
	// same columns as kagzi.claimed_run. Written into the statement rather than called:
	// the call of the PL/pgSQL function, and its second lookup of each run for its
	// available_at, cost ~0.2-0.5 ms a claim (BenchmarkRunCycle/plain, claims of 10 and
	// 50 runs: 8-15% of a claim's time). A picked run is locked (FOR UPDATE SKIP
	// LOCKED, which follows its updates in READ COMMITTED), and the update of a run
	// updated since the statement's snapshot updates its latest version, as the
	// function's own snapshot did. A migration that changes kagzi.claim_runs changes
	// this too (TestTheClaimStatementsClaimARunAsKagziClaimRunsDoes compares them).
	claimUpdateSQL = `
	UPDATE kagzi.runs r SET
		status = 'RUNNING',
		locked_by = $5,
		lease_epoch = r.lease_epoch + 1,
		lease_token = nullif(current_setting('kagzi.lease_token', true), '')::uuid,
		available_at = now() + $6::bigint * interval '1 millisecond',
		started_at = coalesce(r.started_at, now()),
		waiting_signal = NULL, wake_pending = false,
		version = coalesce(r.version, p.version),
		takeovers = r.takeovers + CASE WHEN r.status = 'RUNNING' THEN 1 ELSE 0 END,
		holds_type_slot = p.holds,
		updated_at = now()
	FROM picked p
	WHERE r.run_id = p.run_id
	RETURNING r.run_id, r.namespace, r.workflow_id, r.workflow_type, r.version, r.input, r.attempt,
		r.lease_epoch, r.cancel_requested, r.deadline_at, r.created_at, now() AS db_now,
		p.available_at AS prev_available_at, r.trace_carrier,
		r.lease_epoch > 1 OR r.forked_from_run_id IS NOT NULL AS has_steps, r.takeovers, r.flow_key,
		r.holds_type_slot AS holds_slot
`
	// claimFallbackSQL: kagzi.claim, when the gate says the claim needs it.
	// Its limit (the free slots: never runs ahead, see Claimer.Ahead) stands between
	// the two parts, and after them again: a claim with no free slot (asking only for
	// runs ahead) does not call it.
	claimFallbackSQL = `
SELECT * FROM kagzi.claim($1::text, $2::text[], $3::text[], $4::text[], $5::text, $6::bigint, `
	claimFallbackEndSQL = `,
	$8::uuid[], $9::timestamptz[], $10::boolean[], $11::timestamptz[], $12::boolean[])
WHERE (SELECT flow FROM gate) AND `
)

// claimLimitedTypesSQL: a row without a run for each of the claimer's types that has
// flow limits in the claim's snapshot ('limited' in the workflow id's column), then
// UNION ALL: ClaimReport.Limited. The runs of the others were claimed without limits,
// whichever way the claim went (a claim goes the way of limits for all its types when
// one has them).
const claimLimitedTypesSQL = `SELECT NULL, $1, 'limited', l.workflow_type, NULL, NULL, NULL, NULL, NULL, NULL,
	NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL
FROM kagzi.flow_limits l WHERE l.namespace = $1 AND l.workflow_type = ANY ($2::text[])
UNION ALL`

// Claimer is who claims: a worker of a namespace, the workflow types it registered
// (with the version of each), and its lease. Cursors holds the last key the worker
// visited in each type's concurrency-key queues: ClaimRuns reads and advances it.
type Claimer struct {
	Namespace string
	Types     []string
	Versions  []string
	WorkerID  string
	Lease     time.Duration
	Cursors   map[string]string
	// Floors are where the claims start reading each type's runs (nil: at the start);
	// KeyFloors where they start reading each type's queues of concurrency keys.
	Floors    *Floors
	KeyFloors *Floors
	// Finishing are the worker's runs that hold a type slot or a key's place and whose
	// workflow functions returned: their ends are being written, and the claim does
	// not count them against the limits.
	Finishing [][16]byte
	// KeyScans holds the types whose next claim walks the ring of keys with a skip scan
	// of the key queue: their last claim found many runs queued from the key floor on
	// (nil: none; ClaimRuns keeps it when it is not nil).
	KeyScans map[string]bool
	// KeysFreed holds the types of which the worker heard that a key's place was
	// freed since its last claim that left slots free: for those, a claim whose visit
	// of the keys' ring found no room walks further (the freed key may lie beyond the
	// keys a claim visits). A claim that came back short clears it.
	KeysFreed map[string]bool
	// Durable makes the claim wait for its WAL flush when it commits (see
	// claimSetupSQL).
	Durable bool
	// Ahead is how many runs a claim may take beyond its limit when it takes the
	// short way (types without limits and without queued keyed runs): the worker
	// starts them as its slots free. A claim under a limit (a concurrency or rate
	// limit, a concurrency key) never does: a run claimed is counted started there.
	// ClaimReport.Asked tells how many the claim asked for.
	Ahead int
	// Limited holds the types whose runs the last claim of each claimed holding a
	// slot of the type's concurrency limit (nil: none; ClaimRuns keeps it when it is
	// not nil): the next claim locks them in its setup and takes claimLimitedSQL's
	// way. A type whose limit was removed since is locked once more for nothing; one
	// limited since goes kagzi.claim's way until then.
	Limited map[string]bool
}

// KeyFreed reports whether the time of a wake notification (its part after the
// topic) says that a key's place was freed, and returns the time's milliseconds.
func KeyFreed(extra string) (ms int64, freed bool, err error) {
	freed = strings.HasSuffix(extra, "k")
	ms, err = strconv.ParseInt(strings.TrimRight(extra, "kl"), 10, 64)
	return ms, freed, err
}

// LimitsSet reports whether the time of a wake notification says that the type's
// limits were set (setFlowLimits): a worker hands back the runs of the type it claimed
// ahead and has not started, claimed before the limits applied.
func LimitsSet(extra string) bool { return strings.HasSuffix(extra, "l") }

// ClaimReport is what a claim tells its worker besides the runs it claimed.
type ClaimReport struct {
	// KeysPassed counts the concurrency keys the claim passed over because other
	// claims held them: a held key's next run may have room that the holder did not
	// take (its worker registered another version, or its room ran out first), and
	// nothing will announce it again. A caller left with free slots claims again
	// shortly.
	KeysPassed int
	// RateNext is when the soonest rate window that held runs back from a claim that
	// came back short admits again (zero: none held any back). Nothing announces it: a
	// caller left with free slots claims again then.
	RateNext time.Time
	// Asked is how many runs the claim asked for: its limit, and Claimer.Ahead more
	// when it took the short way (see claimSQL). A claim that got fewer read every
	// claimable run of its types (or met held keys, rate windows: the fields above).
	Asked int
	// Short tells that the claim took claimSQL's short way, which Claimer.Ahead
	// applies to (claimLimitedSQL's does not).
	Short bool
	// Limited holds the claimer's types that had flow limits when the claim read them
	// (nil: none): the claim's runs of the others were claimed without limits.
	Limited map[string]bool
	// Token is the claim's token (see Fence), also when the claim failed: a claim
	// that failed once it was sent may have committed all the same, its runs leased
	// under the token to a worker that does not know it holds them (LostClaimRuns
	// finds them).
	Token uuid.UUID
	// Unreleased, when the claim failed after it committed (its runs' steps could not
	// be loaded) and its runs could not be handed back either, are their fences: the
	// caller hands them back later (ReleaseRuns).
	Unreleased []Fence
}

// claimedStepsSQL loads the recorded steps of runs the caller has just claimed ($1).
// It runs after the claim committed, so it sees every step the previous owner
// recorded: a fenced step write holds a lock on the run that the claim's SKIP LOCKED
// skips, so it either committed before the claim or records nothing.
const claimedStepsSQL = `
SELECT run_id, step_key, name, position, kind, status, output, error, attempts, wake_at
FROM kagzi.steps WHERE run_id = ANY($1)`

// claimSetupSQL is genericPlanSQL, and a tcp_user_timeout of the lease for the claim's
// transaction: a claim whose result is larger than the socket buffers (runs with large
// inputs) blocks sending it while its client reads nothing, and a client process that
// was stopped (SIGSTOP, a paused VM) reads nothing until it resumes. The transaction
// held its locks all that time (a limited type's: every other worker's claims of the
// type waited), and PostgreSQL has no timeout for a blocked write to the client. With
// the socket option, the kernel gives up on the connection once its data has gone
// unacknowledged for the lease, the backend ends and the transaction rolls back: the
// runs were never claimed. No effect over a Unix socket.
//
// It also makes the claim commit without waiting for its WAL to reach disk
// (synchronous_commit off; a sixth of a busy claim loop's time went to those
// flushes), and passes the claim's token ($1) to the claim's update (the setting
// kagzi.lease_token, read by claimUpdateSQL and kagzi.claim_runs). A claim is no user
// data: a fenced write made under it commits synchronously, which flushes the claim's
// WAL first, so nothing recorded under a claim outlives the claim. A claim lost in a
// crash of PostgreSQL leaves its runs as they were, to be claimed again at once; its
// worker's execution may go on until its next write, which the token rejects (see
// Fence), as a takeover's would be. A durable claim (Claimer.Durable) waits for its
// flush as any commit does.
func claimSetupSQL(lease time.Duration, durable bool) string {
	commit := `off`
	if durable {
		commit = `on`
	}
	return genericPlanSQL + `, set_config('tcp_user_timeout', '` +
		strconv.FormatInt(max(lease.Milliseconds(), 0), 10) + `', true), set_config('synchronous_commit', '` + commit + `', true),
	set_config('kagzi.lease_token', $1::text, true)`
}

// ClaimRuns claims up to limit runs for the worker and loads their recorded steps:
// one round trip, and a second one when a claimed run can have steps (a run resumed
// after a sleep, a retry, a crash or a hand-back, or a fork). The claim has committed
// by then: when the steps cannot be loaded, the claimed runs are handed back at once
// (or, if that fails too, when their lease passes) and the error returned.
//
// The report tells what else the caller must know to claim again at the right time.
func ClaimRuns(ctx context.Context, db DBTX, c Claimer, limit int) (claimed []ClaimedRun, report ClaimReport, err error) {
	cursors := make([]string, len(c.Types))
	for i, t := range c.Types {
		cursors[i] = c.Cursors[t]
	}
	var floors, keyFloors []*time.Time
	if c.Floors != nil {
		floors = c.Floors.read(c.Types)
	}
	if c.KeyFloors != nil {
		keyFloors = c.KeyFloors.read(c.Types)
	}
	walk, scans := make([]bool, len(c.Types)), make([]bool, len(c.Types))
	for i, t := range c.Types {
		walk[i], scans[i] = c.KeysFreed[t], c.KeyScans[t]
	}
	// The claim's token: drawn for this claim, sent in its setup statement (a db that
	// cannot pipeline runs the claim alone, without one: its runs get none).
	var token uuid.UUID
	var locked []string
	if _, ok := db.(batcher); ok {
		token = uuid.New()
		for _, t := range c.Types {
			if c.Limited[t] {
				locked = append(locked, t)
			}
		}
	}
	setup, setupArgs, sql := claimSetupSQL(c.Lease, c.Durable), []any{token.String()}, claimSQL
	ahead := max(c.Ahead, 0)
	args := []any{c.Namespace, pgArray(c.Types), pgArray(c.Versions), pgArray(cursors), c.WorkerID,
		c.Lease.Milliseconds(), limit + ahead, pgArray(c.Finishing), pgArray(floors), pgArray(walk), pgArray(keyFloors),
		pgArray(scans), limit}
	if len(locked) > 0 {
		setup += claimLocksSQL
		setupArgs = append(setupArgs, c.Namespace, pgArray(c.Types), pgArray(locked))
		sql = claimLimitedSQL
		ahead = 0
		args[6], args[12] = limit, pgArray(locked)
	}
	report.Asked = limit
	rows, err := queryAfterWith(ctx, db, setup, setupArgs, sql, args...)
	if err != nil {
		return nil, ClaimReport{Token: token}, err
	}
	var resumed [][16]byte
	// Most claims under load fill their slots: room for them all, up to a bound, so
	// that the slice does not grow by copying (a claimed run is a wide struct), and
	// one more, where each row without a run (after the runs) is scanned and dropped.
	claimed = make([]ClaimedRun, 0, min(limit+ahead, 256)+1)
	// The nullable columns scan into values, not pointers: a pointer target costs an
	// allocation per column per run (pgx allocates what it points to).
	var (
		id                               pgtype.UUID
		workflowID, version, key         pgtype.Text
		attempt, takeovers               pgtype.Int4
		epoch                            pgtype.Int8
		cancelRequested, hasSteps, holds pgtype.Bool
		createdAt, dbNow, availableAt    pgtype.Timestamptz
	)
	for rows.Next() {
		// Scanned in place: a run scanned into a variable of its own escaped to the heap
		// (an allocation of the wide struct per run).
		claimed = append(claimed, ClaimedRun{})
		r := &claimed[len(claimed)-1]
		if err := rows.Scan(&id, &r.Namespace, &workflowID, &r.WorkflowType, &version, &r.Input, &attempt,
			&epoch, &cancelRequested, &r.Deadline, &createdAt, &dbNow, &availableAt, &r.Carrier, &hasSteps,
			&takeovers, &key, &holds); err != nil {
			rows.Close()
			return nil, ClaimReport{Token: token}, err
		}
		if !id.Valid { // a type's next key cursor, its next floors, its keys passed over, a rate's hold
			switch {
			case workflowID.String == "limited": // a type with limits (claimLimitedTypesSQL)
				if report.Limited == nil {
					report.Limited = map[string]bool{}
				}
				report.Limited[r.WorkflowType] = true
				claimed = claimed[:len(claimed)-1]
				continue
			case workflowID.String == "short" && len(locked) == 0: // the claim took claimSQL's short way (claimKeyFloorsSQL)
				report.Asked, report.Short = limit+ahead, true
			}
			if attempt.Valid {
				report.KeysPassed += int(attempt.Int32)
			}
			if r.Deadline != nil && (report.RateNext.IsZero() || r.Deadline.Before(report.RateNext)) {
				report.RateNext = *r.Deadline
			}
			if key.Valid {
				c.Cursors[r.WorkflowType] = key.String
			}
			if availableAt.Valid && c.Floors != nil {
				c.Floors.advance(r.WorkflowType, availableAt.Time)
			}
			if createdAt.Valid && c.KeyFloors != nil {
				c.KeyFloors.advance(r.WorkflowType, createdAt.Time)
			}
			if createdAt.Valid && c.KeyScans != nil {
				c.KeyScans[r.WorkflowType] = holds.Bool
			}
			claimed = claimed[:len(claimed)-1]
			continue
		}
		r.RunID, r.WorkflowID, r.Token = id.Bytes, workflowID.String, token
		r.Attempt, r.Epoch, r.Takeovers = int(attempt.Int32), epoch.Int64, int(takeovers.Int32)
		r.CancelRequested = cancelRequested.Bool
		r.Version = version.String // "" when NULL
		r.CreatedAt, r.DBNow, r.AvailableAt = createdAt.Time, dbNow.Time, availableAt.Time
		r.ConcurrencyKey = key.String
		r.HoldsSlot = holds.Valid && holds.Bool
		if c.Limited != nil && r.HoldsSlot != c.Limited[r.WorkflowType] {
			if r.HoldsSlot {
				c.Limited[r.WorkflowType] = true
			} else {
				delete(c.Limited, r.WorkflowType)
			}
		}
		if hasSteps.Bool {
			resumed = append(resumed, r.RunID)
		}
	}
	rows.Close() // after the commit: Err tells whether it failed
	if err := rows.Err(); err != nil {
		return nil, ClaimReport{Token: token}, err
	}
	if len(resumed) == 0 {
		return claimed, report, nil
	}
	if err := loadSteps(ctx, db, claimed, resumed); err != nil {
		held := make([]Fence, len(claimed))
		for i, c := range claimed {
			held[i] = c.Fence
		}
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		report := ClaimReport{Token: token}
		rerr := ReleaseRuns(rctx, db, held)
		if rerr != nil {
			report.Unreleased = held // the claim committed: its runs are leased until handed back
		}
		return nil, report, errors.Join(err, rerr)
	}
	return claimed, report, nil
}

// loadSteps fills in the recorded steps of the claimed runs named in ids.
func loadSteps(ctx context.Context, db DBTX, claimed []ClaimedRun, ids [][16]byte) error {
	byID := make(map[uuid.UUID]*ClaimedRun, len(claimed))
	for i := range claimed {
		byID[claimed[i].RunID] = &claimed[i]
	}
	rows, err := queryAfter(ctx, db, KeyedPlansSQL, claimedStepsSQL, ids)
	if err != nil {
		return err
	}
	defer rows.Close()
	for rows.Next() {
		var runID uuid.UUID
		var key string
		var s StepRecord
		if err := rows.Scan(&runID, &key, &s.Name, &s.Position, &s.Kind, &s.Status, &s.Output, &s.Error, &s.Attempts, &s.WakeAt); err != nil {
			return err
		}
		if c := byID[runID]; c != nil {
			if c.Steps == nil {
				c.Steps = map[string]StepRecord{}
			}
			c.Steps[key] = s
		}
	}
	return rows.Err()
}

// NextWake returns when the earliest unfinished run of the worker's types becomes
// claimable (a delayed start, a wake time, a lease that others hold), or nil if there
// is none. The worker sets a timer for it instead of polling.
//
// It reads each type's runs from the claimer's floor, as the claim does; a run below
// a floor is found by the floor's probe instead (ProbeBelowFloors).
//
// It runs with its generic plan (genericPlanSQL): Postgres planned the statement
// anew at every call, which took 2.7 ms (its execution 0.17): a worker asks after
// every claim that leaves slots free, tens of times a second under a light load.
func NextWake(ctx context.Context, db DBTX, c Claimer) (*time.Time, error) {
	floors := c.Floors.current(c.Types)
	var t *time.Time
	rows, err := queryAfter(ctx, db, genericPlanSQL, nextWakeSQL, c.Namespace, c.Types, c.WorkerID, c.Versions, floors)
	err = firstRow{rows: rows, err: err}.Scan(&t)
	return t, err
}

const nextWakeSQL = `
SELECT least(
	(SELECT min(x.available_at) FROM unnest($2::text[], $4::text[], $5::timestamptz[]) AS t(workflow_type, version, floor),
	 LATERAL (
		SELECT r.available_at FROM kagzi.runs r
		WHERE r.namespace = $1 AND r.workflow_type = t.workflow_type
		  AND r.status IN ('PENDING', 'RUNNING', 'SLEEPING') AND r.available_at IS NOT NULL
		  AND r.available_at >= coalesce(t.floor, '-infinity')
		  AND (r.flow_key IS NULL OR r.started_at IS NOT NULL)
		  AND (r.status <> 'RUNNING' OR r.locked_by IS DISTINCT FROM $3)
		  AND (r.version IS NULL OR r.version = t.version)
		  -- A claimable run that a concurrency or rate limit holds back is not a time to
		  -- claim at: a holder that stops notifies, and a rate window's time is below.
		  AND (r.available_at > now() OR NOT EXISTS (SELECT 1 FROM kagzi.flow_limits l
		      WHERE l.namespace = $1 AND l.workflow_type = r.workflow_type
		        AND (l.concurrency IS NOT NULL OR l.rate IS NOT NULL)))
		ORDER BY r.available_at
		LIMIT 1) x),
	-- The end of a lapsed type slot holder's grace (slotGraceSQL): the claims count it
	-- until then, and its slot is free after, which nothing announces.
	(SELECT min(h.available_at) + ` + slotGraceSQL + ` FROM unnest($2::text[]) AS t(workflow_type), LATERAL (
		SELECT h.available_at FROM kagzi.runs h
		WHERE h.namespace = $1 AND h.workflow_type = t.workflow_type AND h.holds_type_slot AND h.status = 'RUNNING'
		  AND h.available_at > now() - ` + slotGraceSQL + ` AND h.available_at <= now()
		ORDER BY h.available_at LIMIT 1) h),
	-- The first future start in the concurrency keys' queues (runs_key_due).
	(SELECT min(d.available_at) FROM unnest($2::text[]) AS t(workflow_type), LATERAL (
		SELECT q.available_at FROM kagzi.runs q
		WHERE q.namespace = $1 AND q.workflow_type = t.workflow_type
		  AND q.flow_key IS NOT NULL AND q.started_at IS NULL AND q.status = 'PENDING' AND q.priority >= 0
		  AND q.available_at > now()
		ORDER BY q.available_at LIMIT 1) d),
	-- When a full rate window admits again (a window that already admits holds
	-- nothing back, so a time past is none).
	(SELECT min(n) FROM (
		SELECT kagzi.flow_rate_next(l.namespace, l.workflow_type, '', l.rate, l.rate_period_ms) AS n
		FROM kagzi.flow_limits l WHERE l.namespace = $1 AND l.workflow_type = ANY($2) AND l.rate IS NOT NULL
		UNION ALL
		SELECT kagzi.flow_rate_next(w.namespace, w.workflow_type, w.flow_key, l.key_rate, l.key_rate_period_ms)
		FROM kagzi.flow_rates w JOIN kagzi.flow_limits l USING (namespace, workflow_type)
		WHERE w.namespace = $1 AND w.workflow_type = ANY($2) AND w.flow_key <> '' AND l.key_rate IS NOT NULL
	) rates WHERE n > now()))`

// LostClaim is a claim whose answer the worker did not get: it may have committed.
type LostClaim struct {
	Namespace string
	Types     []string
	WorkerID  string
	Token     uuid.UUID
	// From and To bound, by the worker's clock, when the claim's leases end: the claim
	// sets each run's available_at to the lease's end (LostClaimRuns widens the range
	// by a lease on each side, for the difference of the clocks).
	From, To time.Time
	Lease    time.Duration
}

// LostClaimRuns returns the fences of the runs a lost claim leased, still RUNNING
// under its token: a worker hands them back (ReleaseRuns) rather than leave them to
// wait for their leases, and to be counted taken over when they pass (a lost claim
// of a run that another claim's answer lost too counted as many takeovers, until the
// run failed with RECOVERY_EXHAUSTED without ever running). One range of the
// claimable index, by the leases' ends.
func LostClaimRuns(ctx context.Context, db DBTX, l LostClaim) ([]Fence, error) {
	rows, err := db.Query(ctx, `SELECT r.run_id, r.lease_epoch, r.lease_token FROM kagzi.runs r
		WHERE r.namespace = $1 AND r.workflow_type = ANY ($2::text[]) AND r.status = 'RUNNING'
		  AND r.available_at BETWEEN $3 AND $4 AND r.locked_by = $5 AND r.lease_token = $6`,
		l.Namespace, l.Types, l.From.Add(-l.Lease), l.To.Add(l.Lease), l.WorkerID, l.Token)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(row pgx.CollectableRow) (Fence, error) {
		var f Fence
		var token pgtype.UUID
		err := row.Scan(&f.RunID, &f.Epoch, &token)
		f.Token = token.Bytes
		return f, err
	})
}
