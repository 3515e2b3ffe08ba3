package kagzi

import (
	"context"
	"errors"
	"fmt"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/kagzi/kagzi/internal/store"
)

// BulkSkipReason says why a bulk operation left a run it matched unchanged.
type BulkSkipReason string

// Reasons of BulkResult.Skipped.
const (
	// BulkSkipFinished: the run is COMPLETED or FAILED, and a finished run cannot be
	// cancelled (Cancel returns ErrRunFinished for it).
	BulkSkipFinished BulkSkipReason = "FINISHED"
	// BulkSkipAlreadyCancelled: the run is CANCELLED, or RUNNING with its cancel
	// already requested.
	BulkSkipAlreadyCancelled BulkSkipReason = "ALREADY_CANCELLED"
	// BulkSkipNotRerunnable: the run is neither FAILED nor CANCELLED (Rerun returns
	// ErrInvalidArgument for it).
	BulkSkipNotRerunnable BulkSkipReason = "NOT_RERUNNABLE"
	// BulkSkipWorkflowIDTaken: another active run holds the run's workflow id (Rerun
	// returns ErrAlreadyExists), possibly one the same operation reran: of several
	// matched runs of one workflow id, only the newest is rerun.
	BulkSkipWorkflowIDTaken BulkSkipReason = "WORKFLOW_ID_TAKEN"
	// BulkSkipGone: the run was deleted (pruned by retention) after it matched.
	BulkSkipGone BulkSkipReason = "GONE"
)

// MaxBulkRunIDs is the most run ids a BulkResult lists in ChangedRunIDs.
const MaxBulkRunIDs = 1000

// bulkBatch is how many runs one statement of a bulk operation changes.
const bulkBatch = 500

// BulkResult is what CancelRuns or RerunRuns did. Matched = Changed + the sum of
// Skipped.
type BulkResult struct {
	// Matched counts the runs the filter matched.
	Matched int `json:"matched"`
	// Changed counts the runs the operation changed: cancelled (or, for a RUNNING
	// run, asked to cancel), or made PENDING again.
	Changed int `json:"changed"`
	// Skipped counts the matched runs left unchanged, by reason.
	Skipped map[BulkSkipReason]int `json:"skipped,omitempty"`
	// ChangedRunIDs lists the first MaxBulkRunIDs runs changed, newest first.
	ChangedRunIDs []string `json:"changed_run_ids,omitempty"`
}

func (r *BulkResult) changed(id uuid.UUID) {
	r.Changed++
	if len(r.ChangedRunIDs) < MaxBulkRunIDs {
		r.ChangedRunIDs = append(r.ChangedRunIDs, id.String())
	}
}

func (r *BulkResult) skipped(reason BulkSkipReason) {
	if r.Skipped == nil {
		r.Skipped = map[BulkSkipReason]int{}
	}
	r.Skipped[reason]++
}

// CancelRuns cancels every run of the client's namespace that f matches, as Cancel
// does each: PENDING and SLEEPING runs end CANCELLED at once, RUNNING ones are asked
// to stop and their workers end them CANCELLED; finished runs are skipped.
//
// It walks the matches as ListRuns lists them, newest first, 500 at a time, and
// changes each batch with one statement, so its cost is bounded per batch and it
// ends even while new runs arrive (those newer than its first page are not matched).
// It is safe while workers run: a run a worker is writing at that moment is
// cancelled on its own after the batch, once the worker's write committed.
// f.PageSize is ignored; f.PageToken must be empty. On an error it returns what it
// did so far with the error. f.OldestFirst is ignored too: the walk is newest first.
func (c *Client) CancelRuns(ctx context.Context, f RunFilter) (BulkResult, error) {
	if err := c.usable("CancelRuns"); err != nil {
		return BulkResult{}, err
	}
	return c.bulk(ctx, "cancel", f, func(ids []uuid.UUID) ([]store.BulkOutcome, error) {
		return store.CancelRuns(ctx, c.pool, c.ns, ids)
	}, c.cancelOne, cancelOutcome)
}

// RerunRuns reruns every FAILED or CANCELLED run of the client's namespace that f
// matches, as Rerun does each: it becomes PENDING with its attempt bumped and runs
// again from its first step that did not complete. Runs in other statuses are
// skipped, and so is a run whose workflow id another active run holds: of several
// matched runs of one workflow id, only the newest is rerun.
//
// It walks and batches the matches as CancelRuns does, with the same guarantees.
func (c *Client) RerunRuns(ctx context.Context, f RunFilter) (BulkResult, error) {
	if err := c.usable("RerunRuns"); err != nil {
		return BulkResult{}, err
	}
	return c.bulk(ctx, "rerun", f, func(ids []uuid.UUID) ([]store.BulkOutcome, error) {
		return store.RerunRuns(ctx, c.pool, c.ns, ids)
	}, c.rerunOne, rerunOutcome)
}

func cancelOutcome(o store.BulkOutcome) (BulkSkipReason, bool) {
	switch {
	case o.Changed:
		return "", true
	case o.Before == StatusCompleted || o.Before == StatusFailed:
		return BulkSkipFinished, false
	}
	return BulkSkipAlreadyCancelled, false
}

func rerunOutcome(o store.BulkOutcome) (BulkSkipReason, bool) {
	switch {
	case o.Changed:
		return "", true
	case o.Before == StatusFailed || o.Before == StatusCancelled:
		return BulkSkipWorkflowIDTaken, false
	}
	return BulkSkipNotRerunnable, false
}

// cancelOne cancels one run with the single-run statement, which waits for the row.
func (c *Client) cancelOne(ctx context.Context, id uuid.UUID) (store.BulkOutcome, error) {
	before, after, requested, err := store.CancelRun(ctx, c.pool, c.ns, id)
	// A RUNNING run that stays RUNNING changed unless its cancel was requested before.
	return store.BulkOutcome{RunID: id, Before: before,
		Changed: after != before || (before == StatusRunning && !requested)}, err
}

// rerunOne reruns one run with the single-run statement.
func (c *Client) rerunOne(ctx context.Context, id uuid.UUID) (store.BulkOutcome, error) {
	before, err := store.RerunRun(ctx, c.pool, c.ns, id)
	if errors.Is(err, store.ErrActiveRunExists) {
		return store.BulkOutcome{RunID: id, Before: StatusFailed}, nil
	}
	return store.BulkOutcome{RunID: id, Before: before,
		Changed: before == StatusFailed || before == StatusCancelled}, err
}

// bulk walks the runs f matches a batch at a time and applies batch to each; the
// runs batch did not return (locked, or gone) get one at a time.
func (c *Client) bulk(ctx context.Context, op string, f RunFilter,
	batch func([]uuid.UUID) ([]store.BulkOutcome, error),
	one func(context.Context, uuid.UUID) (store.BulkOutcome, error),
	judge func(store.BulkOutcome) (BulkSkipReason, bool)) (BulkResult, error) {
	var res BulkResult
	if f.PageToken != "" {
		return res, invalidArgument("%s runs: a bulk operation covers every match; PageToken must be empty", op)
	}
	f.PageSize = bulkBatch
	// Newest first, whatever f asks: the walk then moves away from the runs that
	// arrive meanwhile, and ends. (Oldest first, it walked towards them, and a steady
	// stream of starts could keep it going for ever.)
	f.OldestFirst = false
	count := func(o store.BulkOutcome) {
		if o.Before == "" {
			res.skipped(BulkSkipGone)
			return
		}
		if reason, changed := judge(o); changed {
			res.changed(o.RunID)
		} else {
			res.skipped(reason)
		}
	}
	for {
		page, err := c.listRuns(ctx, c.pool, f)
		if err != nil {
			return res, err
		}
		ids := make([]uuid.UUID, len(page.Runs))
		for i, r := range page.Runs {
			ids[i], _ = uuid.Parse(r.RunID)
		}
		res.Matched += len(ids)
		if err := c.bulkBatch(ctx, ids, batch, one, count); err != nil {
			return res, dbError(fmt.Sprintf("kagzi: %s runs", op), err)
		}
		if page.NextPageToken == "" {
			return res, nil
		}
		f.PageToken = page.NextPageToken
	}
}

// bulkBatch applies batch to ids, then one to each id the batch did not return, and
// counts their outcomes in the order of ids. A
// batch that fails on a conflict (a deadlock, a concurrent start of a workflow id)
// changed nothing: each of its runs then goes through one.
func (c *Client) bulkBatch(ctx context.Context, ids []uuid.UUID,
	batch func([]uuid.UUID) ([]store.BulkOutcome, error),
	one func(context.Context, uuid.UUID) (store.BulkOutcome, error),
	count func(store.BulkOutcome)) error {
	if len(ids) == 0 {
		return nil
	}
	outcomes, err := batch(ids)
	if err != nil && !conflict(err) {
		return err
	}
	done := make(map[uuid.UUID]store.BulkOutcome, len(outcomes))
	for _, o := range outcomes {
		done[o.RunID] = o
	}
	// In the order of ids (the walk's, newest first), whichever way each run went.
	for i, id := range ids {
		if o, ok := done[id]; ok {
			count(o)
			continue
		}
		o, err := one(ctx, id)
		switch {
		case errors.Is(err, store.ErrNotFound):
			count(store.BulkOutcome{RunID: id}) // no status: gone
		case err != nil:
			// What the batch did to the runs after this one is done all the same.
			for _, rest := range ids[i+1:] {
				if o, ok := done[rest]; ok {
					count(o)
				}
			}
			return err
		default:
			count(o)
		}
	}
	return nil
}

// conflict reports an error after which a set-based statement changed nothing and
// its runs can be retried one at a time.
func conflict(err error) bool {
	var pgErr *pgconn.PgError
	return errors.Is(err, store.ErrActiveRunExists) ||
		(errors.As(err, &pgErr) && (pgErr.Code == "40P01" || pgErr.Code == "40001"))
}
