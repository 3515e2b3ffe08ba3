package kagzi

import (
	"context"
	"time"

	"github.com/kagzi/kagzi/internal/vocab"

	"github.com/kagzi/kagzi/internal/store"
)

// WorkerStatus is a worker's state in the registry.
type WorkerStatus = vocab.WorkerStatus

// Worker statuses.
const (
	WorkerOnline   = vocab.WorkerOnline   // running and claiming
	WorkerDraining = vocab.WorkerDraining // shutting down: no new claims
	WorkerOffline  = vocab.WorkerOffline  // stopped, or silent for three heartbeat intervals (at least 5 s)
)

// WorkerInfo is a worker as the registry records it.
type WorkerInfo struct {
	ID                string            `json:"worker_id"`
	Namespace         string            `json:"namespace"`
	Hostname          string            `json:"hostname"`
	PID               int               `json:"pid"`
	Version           string            `json:"version"`
	Labels            map[string]string `json:"labels,omitempty"`
	WorkflowTypes     []string          `json:"workflow_types"`
	MaxConcurrent     int               `json:"max_concurrent"`
	HeartbeatInterval time.Duration     `json:"heartbeat_interval"`
	Status            WorkerStatus      `json:"status"`
	// ActiveRuns, CompletedTotal and FailedTotal are as of the last heartbeat.
	// ActiveRuns counts the runs the worker holds: those executing (at most
	// MaxConcurrent) and those whose function returned and whose end is still being
	// written (while the worker has a backlog, up to 8 × MaxConcurrent of them).
	ActiveRuns      int        `json:"active_runs"`
	CompletedTotal  int64      `json:"completed_total"`
	FailedTotal     int64      `json:"failed_total"`
	StartedAt       time.Time  `json:"started_at"`
	LastHeartbeatAt time.Time  `json:"last_heartbeat_at"`
	StoppedAt       *time.Time `json:"stopped_at,omitempty"`
}

func workerInfo(w store.WorkerRow) WorkerInfo {
	return WorkerInfo{ID: w.WorkerID, Namespace: w.Namespace, Hostname: w.Hostname, PID: w.PID,
		Version: w.Version, Labels: w.Labels, WorkflowTypes: w.WorkflowTypes, MaxConcurrent: w.MaxConcurrent,
		HeartbeatInterval: w.HeartbeatInterval, Status: w.Status, ActiveRuns: w.ActiveRuns,
		CompletedTotal: w.CompletedTotal, FailedTotal: w.FailedTotal, StartedAt: w.StartedAt,
		LastHeartbeatAt: w.LastHeartbeatAt, StoppedAt: w.StoppedAt}
}

// GetWorker reads a worker of the client's namespace from the registry.
func (c *Client) GetWorker(ctx context.Context, workerID string) (*WorkerInfo, error) {
	if err := c.usable("GetWorker"); err != nil {
		return nil, err
	}
	if err := validName("worker id", workerID); err != nil {
		return nil, err
	}
	w, err := store.GetWorker(ctx, c.pool, c.ns, workerID)
	if err != nil {
		return nil, readError("kagzi: get worker "+workerID, err)
	}
	info := workerInfo(w)
	return &info, nil
}

// WorkerFilter selects workers for ListWorkers. Zero fields select everything.
type WorkerFilter struct {
	Statuses []WorkerStatus
	// WorkflowType keeps the workers that registered this type.
	WorkflowType string
	// PageSize is the most workers a page holds: default 50, at most 1000.
	PageSize int
	// PageToken continues a listing: the NextPageToken of the previous page.
	PageToken string
}

// WorkerPage is one page of ListWorkers, ordered by worker id.
type WorkerPage struct {
	Workers       []WorkerInfo
	NextPageToken string
}

// ListWorkers lists the workers of the client's namespace from the registry.
// With Config.ReadPool it reads from it (a replica may lag the primary).
func (c *Client) ListWorkers(ctx context.Context, f WorkerFilter) (*WorkerPage, error) {
	if err := c.usable("ListWorkers"); err != nil {
		return nil, err
	}
	p := store.ListWorkersParams{Namespace: c.ns, WorkflowType: f.WorkflowType, Limit: f.PageSize}
	var err error
	if f.WorkflowType != "" {
		if err := validName("workflow type", f.WorkflowType); err != nil {
			return nil, err
		}
	}
	if p.Limit, err = pageSize(f.PageSize); err != nil {
		return nil, err
	}
	for _, s := range f.Statuses {
		switch s {
		case WorkerOnline, WorkerDraining, WorkerOffline:
			p.Statuses = append(p.Statuses, string(s))
		default:
			return nil, invalidArgument("unknown worker status %q", s)
		}
	}
	if f.PageToken != "" {
		id, err := decodeStringToken(f.PageToken)
		if err != nil {
			return nil, err
		}
		p.AfterID = id
	}
	want := p.Limit
	p.Limit++
	rows, err := store.ListWorkers(ctx, c.read, p)
	if err != nil {
		return nil, readError("kagzi: list workers", err)
	}
	page := &WorkerPage{}
	if len(rows) > want {
		rows = rows[:want]
		page.NextPageToken = encodeStringToken(rows[want-1].WorkerID)
	}
	for _, w := range rows {
		page.Workers = append(page.Workers, workerInfo(w))
	}
	return page, nil
}
