package store

import (
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/kagzi/kagzi/internal/vocab"
)

// scanRun scans runColumns, then the extra destinations.
func scanRun(row pgx.Row, extra ...any) (Run, error) {
	var v runValues
	if err := row.Scan(append(v.targets(), extra...)...); err != nil {
		return Run{}, err
	}
	return v.run(), nil
}

// runValues receives runColumns in values pgx decodes into directly: scanning into
// pointers, a named string type or a uuid.UUID made pgx plan wrappers and allocate
// for every column of every row (a third of a start's allocations).
type runValues struct {
	r                                             Run
	status                                        string
	runID, parentRunID, forkedFromRunID, contFrom pgtype.UUID
	contAs                                        pgtype.UUID
	attempt, leaseEpoch, takeovers, priority      int64
	availableAt, createdAt, updatedAt             pgtype.Timestamptz
	deadline, startedAt, finishedAt, scheduleTick pgtype.Timestamptz
	lockedBy, scheduleID, parentStepKey, version  pgtype.Text
	forkedFromStep, flowKey, debounceKey          pgtype.Text
}

// targets returns the scan targets of runColumns, in order.
func (v *runValues) targets() []any {
	r := &v.r
	return []any{&v.runID, &r.Namespace, &r.WorkflowID, &r.WorkflowType, &v.status, &r.Input,
		&r.Output, &r.Error, &v.attempt, &v.availableAt, &v.lockedBy, &v.leaseEpoch,
		&r.CancelRequested, &v.deadline, &v.createdAt, &v.startedAt, &v.finishedAt, &v.updatedAt,
		&v.scheduleID, &v.scheduleTick, &v.parentRunID, &v.parentStepKey,
		&v.version, &v.forkedFromRunID, &v.forkedFromStep, &v.takeovers, &r.Attributes, &v.priority, &v.flowKey,
		&v.debounceKey, &v.contFrom, &v.contAs}
}

// run returns the scanned run.
func (v *runValues) run() Run {
	r := v.r
	r.RunID, r.Status = v.runID.Bytes, vocab.RunStatus(v.status)
	r.Attempt, r.LeaseEpoch, r.Takeovers, r.Priority = int(v.attempt), v.leaseEpoch, int(v.takeovers), int(v.priority)
	r.AvailableAt, r.CreatedAt, r.UpdatedAt = v.availableAt.Time, v.createdAt.Time, v.updatedAt.Time
	r.Deadline, r.StartedAt, r.FinishedAt = timeOrNil(v.deadline), timeOrNil(v.startedAt), timeOrNil(v.finishedAt)
	r.ScheduleTick = timeOrNil(v.scheduleTick)
	r.ParentRunID, r.ForkedFromRunID = uuidOrNil(v.parentRunID), uuidOrNil(v.forkedFromRunID)
	r.ContinuedFromRunID, r.ContinuedAsRunID = uuidOrNil(v.contFrom), uuidOrNil(v.contAs)
	r.LockedBy, r.ScheduleID, r.ParentStepKey = textOrNil(v.lockedBy), textOrNil(v.scheduleID), textOrNil(v.parentStepKey)
	r.Version, r.ForkedFromStep = textOrNil(v.version), textOrNil(v.forkedFromStep)
	r.FlowKey, r.DebounceKey = textOrNil(v.flowKey), textOrNil(v.debounceKey)
	return r
}

func timeOrNil(t pgtype.Timestamptz) *time.Time {
	if !t.Valid {
		return nil
	}
	return &t.Time
}

func uuidOrNil(u pgtype.UUID) *uuid.UUID {
	if !u.Valid {
		return nil
	}
	id := uuid.UUID(u.Bytes)
	return &id
}

func textOrNil(t pgtype.Text) *string {
	if !t.Valid {
		return nil
	}
	return &t.String
}
