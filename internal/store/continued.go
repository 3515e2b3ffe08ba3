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

// ContinueWrite ends a run its worker holds and starts the next run of its workflow
// id (continue-as-new).
type ContinueWrite struct {
	Fence
	// Client is the worker's client (see FinishWrite.Client).
	Client uuid.UUID
	// Next is the new run's id, Input its input (encoded), Version its workflow version
	// (nil: the newest a live worker registered, else none until a claim pins it).
	Next    uuid.UUID
	Input   []byte
	Version *string
}

// continueEnd ends the run COMPLETED (no output) naming the next run, or CANCELLED
// when a cancel was requested first, and returns what the next run inherits. It
// notifies other clients' waiters of the end (see remoteWaitersSQL).
var continueEnd = named(`
WITH upd AS (
	UPDATE kagzi.runs r SET
		status = CASE WHEN r.cancel_requested THEN 'CANCELLED' ELSE 'COMPLETED' END,
		output = NULL, error = NULL, finished_at = now(), locked_by = NULL, updated_at = now(),
		continued_as_run_id = CASE WHEN r.cancel_requested THEN NULL ELSE @next::uuid END
	WHERE r.run_id = @run_id AND r.lease_epoch = @epoch AND r.lease_token IS NOT DISTINCT FROM @token AND r.status = 'RUNNING'
	  AND `+slotHeldRSQL+`
	RETURNING r.run_id, r.status, r.namespace, r.workflow_id, r.workflow_type, r.deadline_at, r.priority,
		r.flow_key, r.attributes, r.id_reuse_never, r.parent_run_id, r.parent_step_key, r.trace_carrier,
		r.schedule_id, r.schedule_tick
)
SELECT status, namespace, workflow_id, workflow_type, deadline_at, priority, flow_key, attributes, id_reuse_never,
	parent_run_id, parent_step_key, trace_carrier, schedule_id, schedule_tick,
	coalesce(CASE WHEN `+remoteWaitersSQL("upd.namespace", "@client_id::uuid")+`
		THEN pg_notify('`+Channel+`', 'd|' || run_id || '|' || status)::text END, '')
FROM upd`,
	arg("run_id", "uuid", func(w *ContinueWrite) uuid.UUID { return w.RunID }),
	arg("epoch", "bigint", func(w *ContinueWrite) int64 { return w.Epoch }),
	arg("token", "uuid", func(w *ContinueWrite) pgtype.UUID { return w.token() }),
	arg("next", "uuid", func(w *ContinueWrite) uuid.UUID { return w.Next }),
	arg("client_id", "uuid", func(w *ContinueWrite) uuid.UUID { return w.Client }))

// continued is what the next run inherits from the run that continued as new.
type continued struct {
	Namespace, WorkflowID, WorkflowType string
	Deadline                            *time.Time
	Priority                            int
	FlowKey                             *string
	Attributes                          []byte
	ReuseNever                          bool
	ParentRunID                         *uuid.UUID
	ParentStepKey                       *string
	Carrier                             []byte
	ScheduleID                          *string
	ScheduleTick                        *time.Time
	Input                               []byte
	Version                             *string
	Next, From                          uuid.UUID
}

// continueStart inserts the next run: PENDING at once (ordered by its priority), with
// the workflow id, type, deadline, priority, concurrency key, attributes, id reuse
// policy, parent link and schedule (and tick) of the run it continues, and notifies
// the type's workers. (A schedule's overlap policy counts its runs that are active:
// a run it fired that continued as new is still that tick's.) A
// run of a concurrency key takes over the place the run it continues held (started_at
// set: a holder of the key, claimed without queueing again), in the transaction that
// ends that run, so no other run of the key slips in between.
var continueStart = named(`
WITH ins AS (
	INSERT INTO kagzi.runs (run_id, namespace, workflow_id, workflow_type, status, input, available_at,
		id_reuse_never, deadline_at, version, priority, flow_key, attributes, parent_run_id, parent_step_key,
		trace_carrier, continued_from_run_id, started_at, schedule_id, schedule_tick)
	SELECT @next, @namespace, @workflow_id, @workflow_type, 'PENDING', @input,
		least(now() - @priority * interval '1 second', @deadline), @reuse_never, @deadline,
		coalesce(@version::text, (`+newestVersionSQL+`)), @priority, @flow_key, @attributes::jsonb,
		@parent_run_id::uuid, @parent_step_key::text, @carrier::jsonb, @from,
		CASE WHEN @flow_key::text IS NOT NULL THEN now() END, @schedule_id::text, @schedule_tick::timestamptz
	RETURNING namespace, created_at, run_id, workflow_type, available_at, deadline_at
), listed AS (
	`+runsCreatedSQL+` FROM ins
), moved AS (
	-- Signals the run had not taken yet are the next run's.
	UPDATE kagzi.signals SET run_id = @next WHERE run_id = @from AND consumed_by IS NULL
)
SELECT pg_notify('`+Channel+`', 'w|' || octet_length(namespace) || ':' || namespace || '|' || workflow_type || '|'
	|| (extract(epoch FROM available_at) * 1000)::bigint)::text
	|| coalesce(`+notifyDeadlineSQL("namespace", "deadline_at")+`, '')
FROM ins`,
	arg("next", "uuid", func(c *continued) uuid.UUID { return c.Next }),
	arg("namespace", "text", func(c *continued) string { return c.Namespace }),
	arg("workflow_id", "text", func(c *continued) string { return c.WorkflowID }),
	arg("workflow_type", "text", func(c *continued) string { return c.WorkflowType }),
	arg("input", "jsonb", func(c *continued) []byte { return c.Input }),
	arg("priority", "integer", func(c *continued) int { return c.Priority }),
	arg("deadline", "timestamptz", func(c *continued) *time.Time { return c.Deadline }),
	arg("reuse_never", "boolean", func(c *continued) bool { return c.ReuseNever }),
	arg("version", "text", func(c *continued) *string { return c.Version }),
	arg("flow_key", "text", func(c *continued) *string { return c.FlowKey }),
	arg("attributes", "jsonb", func(c *continued) []byte { return c.Attributes }),
	arg("parent_run_id", "uuid", func(c *continued) *uuid.UUID { return c.ParentRunID }),
	arg("parent_step_key", "text", func(c *continued) *string { return c.ParentStepKey }),
	arg("carrier", "jsonb", func(c *continued) []byte { return c.Carrier }),
	arg("from", "uuid", func(c *continued) uuid.UUID { return c.From }),
	arg("schedule_id", "text", func(c *continued) *string { return c.ScheduleID }),
	arg("schedule_tick", "timestamptz", func(c *continued) *time.Time { return c.ScheduleTick }))

// ContinueRun ends a run its worker holds and starts the next run of its workflow id
// in one transaction (see continueEnd and continueStart): both commit, or neither. A
// cancel requested before it wins: the run ends CANCELLED and no run starts. It
// returns the status the run ended with, or ErrLeaseLost. The transaction locks the
// run: if it stays idle for longer than idle (the worker's process stopped between
// its two statements), PostgreSQL ends it (see InTx), and the run can be taken over.
func ContinueRun(ctx context.Context, db Beginner, idle time.Duration, w ContinueWrite) (vocab.RunStatus, error) {
	var status vocab.RunStatus
	err := InTx(ctx, db, idle, func(tx pgx.Tx) error {
		c := continued{Next: w.Next, From: w.RunID, Input: w.Input, Version: w.Version}
		var notified string
		err := tx.QueryRow(ctx, continueEnd.sql, continueEnd.args(&w)...).Scan(&status, &c.Namespace, &c.WorkflowID,
			&c.WorkflowType, &c.Deadline, &c.Priority, &c.FlowKey, &c.Attributes, &c.ReuseNever, &c.ParentRunID,
			&c.ParentStepKey, &c.Carrier, &c.ScheduleID, &c.ScheduleTick, &notified)
		if errors.Is(err, pgx.ErrNoRows) {
			return ErrLeaseLost
		}
		if err != nil || status != vocab.StatusCompleted {
			return err
		}
		var ignored *string
		return tx.QueryRow(ctx, continueStart.sql, continueStart.args(&c)...).Scan(&ignored)
	})
	return status, err
}
