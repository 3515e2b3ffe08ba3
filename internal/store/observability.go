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
	// and RUNNING runs whose lease expired, less those Held.
	Ready int64
	// Held counts runs whose time has come that a concurrency limit holds back: of a
	// key at its key limit, or beyond the room of their type's limit.
	Held int64
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
//
// Of a type with a concurrency limit (or a key limit), the due runs a claim could
// take now are the runs of runs_claimable (of no key, or of a key that started: they
// hold their key's place) and, of each key's queue, as many as the key has room for,
// all within the room of the type's limit; the rest are held. Rate limits are not
// counted: a rate window admits its runs within its period.
const queueStatsSQL = `
WITH h AS MATERIALIZED (
	-- Materialized, ahead of the grouping: joined laterally to the grouped stats, the
	-- planner charged each of its estimated groups the whole table and the estimate
	-- passed jit_above_cost (JIT took seconds a scrape).
	SELECT l.workflow_type, l.concurrency, a.plain, a.keyed, a.holders
	FROM kagzi.flow_limits l
	CROSS JOIN LATERAL (SELECT
		(SELECT count(*) FROM kagzi.runs r WHERE r.namespace = $1 AND r.workflow_type = l.workflow_type
			AND ` + inRunsClaimableSQL + ` AND r.available_at <= ` + readNowSQL + `) AS plain,
		(SELECT coalesce(sum(least(k.n, CASE WHEN l.key_concurrency IS NULL THEN k.n
				ELSE greatest(l.key_concurrency - (SELECT count(*) FROM kagzi.runs h
					WHERE h.namespace = $1 AND h.workflow_type = l.workflow_type AND h.flow_key = k.flow_key
					  AND h.flow_key IS NOT NULL AND h.started_at IS NOT NULL
					  AND h.status IN ('PENDING', 'RUNNING', 'SLEEPING')), 0) END)), 0)
			FROM (SELECT r.flow_key, count(*) AS n FROM kagzi.runs r WHERE r.namespace = $1
				AND r.workflow_type = l.workflow_type AND ` + inRunsKeyDueSQL + ` AND r.available_at <= ` + readNowSQL + `
				GROUP BY r.flow_key) k) AS keyed,
		(SELECT count(*) FROM kagzi.runs h WHERE h.namespace = $1 AND h.workflow_type = l.workflow_type
			AND h.holds_type_slot AND h.status = 'RUNNING' AND h.available_at > ` + readNowSQL + ` - ` + slotGraceSQL + `) AS holders
	) a
	WHERE l.namespace = $1 AND (l.concurrency IS NOT NULL OR l.key_concurrency IS NOT NULL)
), s AS (
	SELECT workflow_type,
		count(*) FILTER (WHERE available_at <= ` + readNowSQL + `) AS ready,
		count(*) FILTER (WHERE status = 'RUNNING' AND available_at > ` + readNowSQL + `) AS running,
		count(*) FILTER (WHERE status <> 'RUNNING' AND available_at > ` + readNowSQL + `) AS waiting,
		coalesce((extract(epoch FROM ` + readNowSQL + ` - min(greatest(available_at, created_at))
			FILTER (WHERE available_at <= ` + readNowSQL + `)) * 1000000)::bigint, 0) AS oldest
	FROM (
		SELECT r.workflow_type, r.status, r.available_at, r.created_at FROM kagzi.runs r
		WHERE r.namespace = $1 AND ` + inRunsClaimableSQL + `
		UNION ALL
		SELECT r.workflow_type, r.status, r.available_at, r.created_at FROM kagzi.runs r
		WHERE r.namespace = $1 AND ` + inRunsKeyDueSQL + `
	) r
	GROUP BY workflow_type
), held AS (
	SELECT s.workflow_type, coalesce(greatest(s.ready - least(h.plain + h.keyed,
		CASE WHEN h.concurrency IS NULL THEN s.ready ELSE greatest(h.concurrency - h.holders, 0) END), 0), 0) AS n
	FROM s LEFT JOIN h ON h.workflow_type = s.workflow_type
)
SELECT s.workflow_type, s.ready - held.n, s.running, s.waiting,
	CASE WHEN s.ready > held.n THEN s.oldest ELSE 0 END, held.n
FROM s JOIN held ON held.workflow_type = s.workflow_type
ORDER BY s.workflow_type`

// QueueStats reports the unfinished runs of the namespace by workflow type.
func QueueStats(ctx context.Context, db DBTX, namespace string) ([]QueueStat, error) {
	rows, err := db.Query(ctx, queueStatsSQL, namespace)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(row pgx.CollectableRow) (QueueStat, error) {
		var s QueueStat
		var oldestMicros int64
		err := row.Scan(&s.WorkflowType, &s.Ready, &s.Running, &s.Waiting, &oldestMicros, &s.Held)
		s.OldestReady = time.Duration(oldestMicros) * time.Microsecond
		return s, err
	})
}
