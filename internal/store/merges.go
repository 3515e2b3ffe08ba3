package store

import (
	"time"

	"github.com/kagzi/kagzi/internal/committer"
)

// KeyedPlansSQL is sent before the set-based statements (the committers' batches
// that hold one, the claim, the load of claimed runs' steps, the heartbeat, the
// hand-back) in the same implicit transaction. They reach runs (and steps) by
// primary key, one lookup per run in their arrays, but a plan made while kagzi.runs
// is small, or before it was first analyzed, would rather scan the table (or every
// active run through runs_one_active_per_workflow_id) and join, and Postgres keeps a
// connection's generic plan until the table is analyzed again: with 20,000 runs in
// the table, such a plan made each claim and each end of 200 runs take 160-300 ms
// instead of 1-3. Without sequential and bitmap scans, and with their status tests
// wrapped in coalesce (status = 'RUNNING' would let the planner scan
// runs_one_active_per_workflow_id whole), the primary key is the only way left;
// TestSetBasedStatementsReachRunsByKeyWhateverTheTablesStatistics checks the plans.
const KeyedPlansSQL = `SELECT set_config('enable_seqscan', 'off', true), set_config('enable_bitmapscan', 'off', true)`

// Merges are the set-based forms of the statements a worker's executions write most
// (a step record, a run's end, a suspension): when several of them share a commit, the committer
// sends them as one statement that takes one array per parameter. Each returns, per
// request, its 1-based index and then the columns of the single-row statement, so the
// callers read their results as if they had run alone.
//
// The single-row statements stay for the lone write: sending a lone step record as
// recordStepsSQL with one-element arrays made each step of a sequential workflow
// about 80 µs slower (BenchmarkSequentialSteps: 0.43 ms against 0.35 ms a step), so
// each statement here and its single-row twin must keep the same fencing.
var Merges = map[string]committer.Merge{
	recordStepSQL: mergeRecordSteps,
	finishRunSQL:  mergeFinishRuns,
	suspendSQL:    mergeSuspends,
}

// recordStepsSQL is recordStepSQL for many step records: the fence is per run (one
// row lock for the records of a run's parallel branches), and a record whose run is
// not held under its epoch, or whose step is already completed, records nothing.
const recordStepsSQL = `
WITH i AS (
	SELECT * FROM unnest($1::uuid[], $2::bigint[], $3::text[], $4::text[], $5::text[], $6::jsonb[], $7::jsonb[],
		$8::timestamptz[], $9::timestamptz[], $10::text[], $11::integer[])
		WITH ORDINALITY AS i(run_id, epoch, step_key, name, status, output, error, started_at, finished_at,
			step_status, position, ord)
), owner AS (
	SELECT run_id, lease_epoch FROM kagzi.runs
	WHERE run_id IN (SELECT run_id FROM i) AND coalesce(status, '') = 'RUNNING' -- see KeyedPlansSQL
	FOR KEY SHARE
), step AS (
	INSERT INTO kagzi.steps AS s (run_id, step_key, name, kind, status, output, error, attempts, position,
		started_at, finished_at)
	SELECT i.run_id, i.step_key, i.name, 'STEP', i.step_status, i.output, i.error, 1, i.position,
		i.started_at, i.finished_at
	FROM i JOIN owner o ON o.run_id = i.run_id AND o.lease_epoch = i.epoch
	ON CONFLICT (run_id, step_key) DO UPDATE SET
		status = excluded.status, output = excluded.output, error = excluded.error,
		attempts = s.attempts + 1, started_at = excluded.started_at, finished_at = excluded.finished_at,
		updated_at = now()
	WHERE s.status <> 'COMPLETED'
	RETURNING s.run_id, s.step_key, s.attempts
), attempt AS (
	INSERT INTO kagzi.step_attempts (run_id, step_key, attempt, status, error, started_at, finished_at)
	SELECT i.run_id, i.step_key, st.attempts, i.status, i.error, i.started_at, i.finished_at
	FROM step st JOIN i ON i.run_id = st.run_id AND i.step_key = st.step_key
	WHERE NOT (st.attempts = 1 AND i.status = 'COMPLETED')
)
SELECT i.ord, (o.run_id IS NOT NULL)::integer, st.attempts, NULL::text
FROM i
LEFT JOIN owner o ON o.run_id = i.run_id AND o.lease_epoch = i.epoch
LEFT JOIN step st ON st.run_id = i.run_id AND st.step_key = i.step_key`

func mergeRecordSteps(args [][]any) (string, []any) {
	n := len(args)
	var (
		runIDs     = make([][16]byte, n)
		epochs     = make([]int64, n)
		keys       = make([]string, n)
		names      = make([]string, n)
		statuses   = make([]string, n)
		outputs    = make([][]byte, n)
		errs       = make([][]byte, n)
		started    = make([]time.Time, n)
		finished   = make([]time.Time, n)
		stepStatus = make([]string, n)
		positions  = make([]int, n)
	)
	for i, a := range args {
		runIDs[i], epochs[i], keys[i], names[i] = a[0].([16]byte), a[1].(int64), a[2].(string), a[3].(string)
		statuses[i], outputs[i], errs[i] = a[4].(string), a[5].([]byte), a[6].([]byte)
		started[i], finished[i], stepStatus[i], positions[i] = a[7].(time.Time), a[8].(time.Time), a[9].(string), a[10].(int)
	}
	return recordStepsSQL, []any{runIDs, epochs, keys, names, statuses, outputs, errs, started, finished, stepStatus, positions}
}

// finishRunsSQL is finishRunSQL for many runs. Waiters in other clients, when there are
// any, are notified in batches: each notification costs the listening backend and
// process a message, and one per run was a tenth of a busy worker's CPU.
var finishRunsSQL = `
WITH i AS (
	SELECT * FROM unnest($1::uuid[], $2::bigint[], $3::text[], $4::jsonb[], $5::jsonb[],
		$6::text[], $7::text[], $8::jsonb[], $9::timestamptz[], $10::timestamptz[], $11::integer[])
		WITH ORDINALITY AS i(run_id, epoch, status, output, error,
			step_key, step_name, step_output, started_at, finished_at, position, ord)
), upd AS (
	UPDATE kagzi.runs r SET
		status = CASE WHEN r.cancel_requested THEN 'CANCELLED' ELSE i.status END,
		output = CASE WHEN r.cancel_requested THEN NULL ELSE i.output END,
		error = CASE WHEN r.cancel_requested THEN NULL ELSE i.error END,
		finished_at = now(), locked_by = NULL, updated_at = now()
	FROM i
	WHERE r.run_id = i.run_id AND r.lease_epoch = i.epoch AND coalesce(r.status, '') = 'RUNNING' -- see KeyedPlansSQL
	RETURNING i.ord, r.run_id, r.namespace, r.status
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
), notified AS (
	-- One notification per 150 runs, not one per run: a newline, then the runs'
	-- DoneTopic payloads, one per line (Postgres takes payloads under 8000 bytes).
	SELECT pg_notify('` + Channel + `', string_agg(E'\n' || 'd|' || run_id || '|' || status, ''))
	FROM (SELECT run_id, status, (row_number() OVER () - 1) / 150 AS chunk FROM upd
		WHERE ` + remoteWaitersSQL("upd.namespace", "$12::uuid") + `) u
	GROUP BY chunk
)
SELECT ord, status, (SELECT count(*) FROM notified)::text FROM upd`

func mergeFinishRuns(args [][]any) (string, []any) {
	n := len(args)
	runIDs, epochs, statuses := make([][16]byte, n), make([]int64, n), make([]string, n)
	outputs, errs := make([][]byte, n), make([][]byte, n)
	keys, names, stepOuts := make([]*string, n), make([]*string, n), make([][]byte, n)
	started, finished, positions := make([]*time.Time, n), make([]*time.Time, n), make([]*int, n)
	for i, a := range args {
		runIDs[i], epochs[i], statuses[i] = a[0].([16]byte), a[1].(int64), a[2].(string)
		outputs[i], errs[i] = a[3].([]byte), a[4].([]byte)
		keys[i], names[i], stepOuts[i] = a[5].(*string), a[6].(*string), a[7].([]byte)
		started[i], finished[i], positions[i] = a[8].(*time.Time), a[9].(*time.Time), a[10].(*int)
	}
	// The client ($12) is the same for every request: one worker's committer sends them.
	return finishRunsSQL, []any{runIDs, epochs, statuses, outputs, errs, keys, names, stepOuts, started, finished, positions,
		args[0][11]}
}

// suspendsSQL is suspendSQL for many runs: each run held under its epoch goes to
// sleep until its wake time (recording its sleep step first when the key is set).
const suspendsSQL = `
WITH i AS (
	SELECT * FROM unnest($1::uuid[], $2::bigint[], $3::text[], $4::text[], $5::timestamptz[], $6::bigint[],
		$7::integer[])
		WITH ORDINALITY AS i(run_id, epoch, step_key, name, wake_at, duration_ms, position, ord)
), owner AS (
	SELECT r.run_id, r.cancel_requested, i.ord,
		coalesce(i.wake_at, now() + i.duration_ms * interval '1 millisecond') AS wake_at
	FROM kagzi.runs r JOIN i ON r.run_id = i.run_id AND r.lease_epoch = i.epoch
	WHERE coalesce(r.status, '') = 'RUNNING' -- see KeyedPlansSQL
	FOR UPDATE OF r
), step AS (
	INSERT INTO kagzi.steps (run_id, step_key, name, kind, status, wake_at, position)
	SELECT i.run_id, i.step_key, i.name, 'SLEEP', 'COMPLETED', o.wake_at, i.position
	FROM owner o JOIN i ON i.ord = o.ord
	WHERE i.step_key <> ''
	ON CONFLICT (run_id, step_key) DO NOTHING
), upd AS (
	UPDATE kagzi.runs r SET
		status = CASE WHEN o.cancel_requested THEN 'CANCELLED' ELSE 'SLEEPING' END,
		finished_at = CASE WHEN o.cancel_requested THEN now() END,
		available_at = least(o.wake_at, r.deadline_at), locked_by = NULL, updated_at = now()
	FROM owner o
	WHERE r.run_id = o.run_id
	RETURNING o.ord, r.run_id, r.namespace, r.workflow_type, r.status, r.available_at
)
SELECT ord, status, (` + notifyRunSQL + `)::text FROM upd`

func mergeSuspends(args [][]any) (string, []any) {
	n := len(args)
	runIDs, epochs, keys, names := make([][16]byte, n), make([]int64, n), make([]string, n), make([]string, n)
	wakes, durations, positions := make([]*time.Time, n), make([]int64, n), make([]int, n)
	for i, a := range args {
		runIDs[i], epochs[i], keys[i], names[i] = a[0].([16]byte), a[1].(int64), a[2].(string), a[3].(string)
		wakes[i], durations[i], positions[i] = a[4].(*time.Time), a[5].(int64), a[6].(int)
	}
	return suspendsSQL, []any{runIDs, epochs, keys, names, wakes, durations, positions}
}
