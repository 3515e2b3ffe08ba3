package store

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"
)

// QueueStat is the state of the unfinished runs of one workflow type.
type QueueStat struct {
	WorkflowType string
	// Ready counts runs claimable now: PENDING or SLEEPING runs whose time has come,
	// and RUNNING runs whose lease expired.
	Ready int64
	// Running counts runs held under a live lease.
	Running int64
	// Waiting counts runs whose time has not come (a delayed start, a sleep, a
	// backoff, a signal or child wait).
	Waiting int64
	// OldestReady is how long the oldest ready run has been claimable (0: none).
	OldestReady time.Duration
}

// queueStatsSQL reads the unfinished runs of the namespace through the partial indexes
// that hold them (inRunsClaimableSQL, inRunsKeyDueSQL), one row per workflow type. A
// ready run has been claimable since its available_at, or since its creation when that
// is later (a priority, or a start time already past, sets available_at before it).
const queueStatsSQL = `
SELECT workflow_type,
	count(*) FILTER (WHERE available_at <= now()),
	count(*) FILTER (WHERE status = 'RUNNING' AND available_at > now()),
	count(*) FILTER (WHERE status <> 'RUNNING' AND available_at > now()),
	coalesce((extract(epoch FROM now() - min(greatest(available_at, created_at)) FILTER (WHERE available_at <= now())) * 1000000)::bigint, 0)
FROM (
	SELECT r.workflow_type, r.status, r.available_at, r.created_at FROM kagzi.runs r
	WHERE r.namespace = $1 AND ` + inRunsClaimableSQL + `
	UNION ALL
	SELECT r.workflow_type, r.status, r.available_at, r.created_at FROM kagzi.runs r
	WHERE r.namespace = $1 AND ` + inRunsKeyDueSQL + `
) r
GROUP BY workflow_type
ORDER BY workflow_type`

// QueueStats reports the unfinished runs of the namespace by workflow type.
func QueueStats(ctx context.Context, db DBTX, namespace string) ([]QueueStat, error) {
	rows, err := db.Query(ctx, queueStatsSQL, namespace)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(row pgx.CollectableRow) (QueueStat, error) {
		var s QueueStat
		var oldestMicros int64
		err := row.Scan(&s.WorkflowType, &s.Ready, &s.Running, &s.Waiting, &oldestMicros)
		s.OldestReady = time.Duration(oldestMicros) * time.Microsecond
		return s, err
	})
}
