package store

import (
	"context"
	"time"

	"github.com/google/uuid"
	"github.com/kagzi/kagzi/internal/vocab"
)

// Step is one recorded step of a run with its attempt history, for ListSteps.
type Step struct {
	Key       string
	Name      string
	Kind      vocab.StepKind
	Status    vocab.StepStatus
	Output    []byte
	Error     []byte
	Attempts  []Attempt
	WakeAt    *time.Time
	CreatedAt time.Time
	UpdatedAt time.Time
}

// Attempt is one attempt of a step.
type Attempt struct {
	Number     int
	Status     vocab.StepStatus
	Error      []byte
	StartedAt  time.Time
	FinishedAt time.Time
}

// ListSteps reads every step of a run of the namespace, in the order they were first
// recorded, each with all its attempts. It returns ErrNotFound when the run does not
// exist in the namespace.
func ListSteps(ctx context.Context, db DBTX, namespace string, runID uuid.UUID) ([]Step, error) {
	rows, err := db.Query(ctx, `
		SELECT s.step_key, s.name, s.kind, s.status, s.output, s.error, s.wake_at, s.created_at,
			s.updated_at, s.started_at, s.finished_at, a.attempt, a.status, a.error, a.started_at, a.finished_at
		FROM kagzi.runs_all r
		LEFT JOIN kagzi.steps_all s ON s.run_id = r.run_id
		LEFT JOIN kagzi.step_attempts_all a ON a.run_id = s.run_id AND a.step_key = s.step_key
		WHERE r.namespace = $1 AND r.run_id = $2
		ORDER BY s.created_at, s.step_key, a.attempt`, namespace, runID)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	found := false
	var steps []Step
	for rows.Next() {
		found = true
		var (
			key, name            *string
			kind                 *vocab.StepKind
			status               *vocab.StepStatus
			s                    Step
			createdAt, updatedAt *time.Time
			sStarted, sFinished  *time.Time
			num                  *int
			a                    Attempt
			aStatus              *vocab.StepStatus
			aStarted, aFinished  *time.Time
		)
		if err := rows.Scan(&key, &name, &kind, &status, &s.Output, &s.Error, &s.WakeAt, &createdAt,
			&updatedAt, &sStarted, &sFinished, &num, &aStatus, &a.Error, &aStarted, &aFinished); err != nil {
			return nil, err
		}
		if key == nil {
			continue // the run has no steps
		}
		if len(steps) == 0 || steps[len(steps)-1].Key != *key {
			s.Key, s.Name, s.Kind, s.Status = *key, *name, *kind, *status
			s.CreatedAt, s.UpdatedAt = *createdAt, *updatedAt
			steps = append(steps, s)
		}
		last := &steps[len(steps)-1]
		switch {
		case num != nil:
			a.Number, a.Status, a.StartedAt, a.FinishedAt = *num, *aStatus, *aStarted, *aFinished
			last.Attempts = append(last.Attempts, a)
		case sStarted != nil && sFinished != nil:
			// A step that completed at its first attempt has no history row: its
			// own row holds that attempt.
			last.Attempts = append(last.Attempts, Attempt{Number: 1, Status: *status,
				StartedAt: *sStarted, FinishedAt: *sFinished})
		}
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	if !found {
		return nil, ErrNotFound
	}
	return steps, nil
}
