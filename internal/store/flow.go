package store

import (
	"context"
	"errors"
	"time"

	"github.com/jackc/pgx/v5"
)

// FlowLimits are the limits of a workflow type in a namespace (kagzi.flow_limits). A
// nil field is no such limit.
type FlowLimits struct {
	Namespace      string
	WorkflowType   string
	Concurrency    *int
	KeyConcurrency *int
	Rate           *int
	RatePeriod     time.Duration
	KeyRate        *int
	KeyRatePeriod  time.Duration
	UpdatedAt      time.Time
}

const flowLimitsColumns = `namespace, workflow_type, concurrency, key_concurrency,
	rate, rate_period_ms, key_rate, key_rate_period_ms, updated_at`

func scanFlowLimits(row pgx.Row) (FlowLimits, error) {
	var l FlowLimits
	var period, keyPeriod *int64
	err := row.Scan(&l.Namespace, &l.WorkflowType, &l.Concurrency, &l.KeyConcurrency,
		&l.Rate, &period, &l.KeyRate, &keyPeriod, &l.UpdatedAt)
	if period != nil {
		l.RatePeriod = time.Duration(*period) * time.Millisecond
	}
	if keyPeriod != nil {
		l.KeyRatePeriod = time.Duration(*keyPeriod) * time.Millisecond
	}
	return l, err
}

// setFlowLimits stores a type's limits and tells its workers, whose claims read them:
// a raised limit may admit runs at once, and the runs they claimed ahead before the
// limits must not start under them (the time ends in 'l': LimitsSet). A concurrency
// limit counts the runs that hold its slots (holds_type_slot), which claims mark only
// while the type has one: the type's runs executing when it is set, claimed without
// it, are marked too (mark), so that they count as they would had the limit been
// there when they were claimed. Those whose lease passed are marked too: a worker
// frozen past its lease may still be executing one, and, marked, it is fenced
// (slotHeldSQL) instead of renewing it and recording beside the run a claim admits in
// its place.
var setFlowLimits = named(`
WITH upsert AS (
	INSERT INTO kagzi.flow_limits AS l (namespace, workflow_type, concurrency, key_concurrency,
		rate, rate_period_ms, key_rate, key_rate_period_ms)
	VALUES (@namespace, @workflow_type, @concurrency, @key_concurrency, @rate, @rate_period_ms,
		@key_rate, @key_rate_period_ms)
	ON CONFLICT (namespace, workflow_type) DO UPDATE SET
		concurrency = excluded.concurrency, key_concurrency = excluded.key_concurrency,
		rate = excluded.rate,
		rate_period_ms = excluded.rate_period_ms, key_rate = excluded.key_rate,
		key_rate_period_ms = excluded.key_rate_period_ms, updated_at = now()
	RETURNING `+flowLimitsColumns+`
), mark AS (
	UPDATE kagzi.runs r SET holds_type_slot = true
	FROM upsert u
	WHERE u.concurrency IS NOT NULL AND r.namespace = u.namespace AND r.workflow_type = u.workflow_type
	  AND r.status = 'RUNNING' AND NOT r.holds_type_slot
)
SELECT upsert.*, pg_notify('`+Channel+`', 'w|' || octet_length(namespace) || ':' || namespace || '|' || workflow_type
	|| '|' || (extract(epoch FROM now()) * 1000)::bigint || 'l')::text FROM upsert`,
	arg("namespace", "text", func(l *FlowLimits) string { return l.Namespace }),
	arg("workflow_type", "text", func(l *FlowLimits) string { return l.WorkflowType }),
	arg("concurrency", "integer", func(l *FlowLimits) *int { return l.Concurrency }),
	arg("key_concurrency", "integer", func(l *FlowLimits) *int { return l.KeyConcurrency }),
	arg("rate", "integer", func(l *FlowLimits) *int { return l.Rate }),
	arg("rate_period_ms", "bigint", func(l *FlowLimits) *int64 { return millis(l.Rate, l.RatePeriod) }),
	arg("key_rate", "integer", func(l *FlowLimits) *int { return l.KeyRate }),
	arg("key_rate_period_ms", "bigint", func(l *FlowLimits) *int64 { return millis(l.KeyRate, l.KeyRatePeriod) }),
)

// millis is the period of a rate in milliseconds, nil when the rate is.
func millis(rate *int, period time.Duration) *int64 {
	if rate == nil {
		return nil
	}
	ms := period.Milliseconds()
	return &ms
}

// SetFlowLimits stores the limits of a workflow type, replacing any before.
func SetFlowLimits(ctx context.Context, db DBTX, l FlowLimits) (FlowLimits, error) {
	var notified string
	row := db.QueryRow(ctx, setFlowLimits.sql, setFlowLimits.args(&l)...)
	var out FlowLimits
	var period, keyPeriod *int64
	err := row.Scan(&out.Namespace, &out.WorkflowType, &out.Concurrency, &out.KeyConcurrency,
		&out.Rate, &period, &out.KeyRate, &keyPeriod, &out.UpdatedAt, &notified)
	if period != nil {
		out.RatePeriod = time.Duration(*period) * time.Millisecond
	}
	if keyPeriod != nil {
		out.KeyRatePeriod = time.Duration(*keyPeriod) * time.Millisecond
	}
	return out, err
}

// markTypeHolders marks the type's executing runs that hold no slot of its concurrency
// limit as holders, while it has one: setFlowLimits's mark again, for the runs of
// claims and eager starts that were under way while it committed (they read no limit).
var markTypeHolders = named(`
UPDATE kagzi.runs r SET holds_type_slot = true
FROM kagzi.flow_limits l
WHERE l.namespace = @namespace AND l.workflow_type = @workflow_type AND l.concurrency IS NOT NULL
  AND r.namespace = l.namespace AND r.workflow_type = l.workflow_type
  AND r.status = 'RUNNING' AND NOT r.holds_type_slot`,
	arg("namespace", "text", func(l *FlowLimits) string { return l.Namespace }),
	arg("workflow_type", "text", func(l *FlowLimits) string { return l.WorkflowType }),
)

// transactionsUnderWay lists the virtual transaction ids of the database's other
// transactions now, leaving out those idle in their transaction for over a second
// (a session's forgotten BEGIN is no claim in flight). A session of another role
// shows no state to an unprivileged one (NULL): it is waited for.
const transactionsUnderWay = `
SELECT coalesce(array_agg(l.virtualxid), '{}') FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
WHERE l.locktype = 'virtualxid' AND l.granted AND l.pid <> pg_backend_pid()
  AND a.datname = current_database()
  AND NOT coalesce(a.state = 'idle in transaction' AND a.state_change < statement_timestamp() - interval '1 second', false)`

// MarkLateTypeHolders waits for the transactions under way when it is called to end
// (for at most wait) and then marks the type's executing runs that hold no slot of its
// concurrency limit: called once SetFlowLimits has committed, it catches the runs of
// the claims and eager starts that read no limit because they began before it.
func MarkLateTypeHolders(ctx context.Context, db DBTX, namespace, workflowType string, wait time.Duration) error {
	var vxids []string
	if err := db.QueryRow(ctx, transactionsUnderWay).Scan(&vxids); err != nil {
		return err
	}
	deadline := time.Now().Add(wait)
	for len(vxids) > 0 && time.Now().Before(deadline) {
		if err := db.QueryRow(ctx, `SELECT coalesce(array_agg(virtualxid), '{}') FROM pg_locks
			WHERE locktype = 'virtualxid' AND granted AND virtualxid = ANY($1)`, vxids).Scan(&vxids); err != nil {
			return err
		}
		if len(vxids) > 0 {
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(5 * time.Millisecond):
			}
		}
	}
	l := FlowLimits{Namespace: namespace, WorkflowType: workflowType}
	_, err := db.Exec(ctx, markTypeHolders.sql, markTypeHolders.args(&l)...)
	return err
}

// GetFlowLimits reads the limits of a workflow type, or ErrNotFound.
func GetFlowLimits(ctx context.Context, db DBTX, namespace, workflowType string) (FlowLimits, error) {
	l, err := scanFlowLimits(db.QueryRow(ctx, `SELECT `+flowLimitsColumns+` FROM kagzi.flow_limits
		WHERE namespace = $1 AND workflow_type = $2`, namespace, workflowType))
	if errors.Is(err, pgx.ErrNoRows) {
		return l, ErrNotFound
	}
	return l, err
}

// LimitedTypes returns those of the namespace's workflow types given that have
// limits (a row of kagzi.flow_limits: every row has at least one).
func LimitedTypes(ctx context.Context, db DBTX, namespace string, types []string) ([]string, error) {
	rows, err := db.Query(ctx, `SELECT workflow_type FROM kagzi.flow_limits
		WHERE namespace = $1 AND workflow_type = ANY ($2::text[])`, namespace, types)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, pgx.RowTo[string])
}

// ListFlowLimits lists the limits of the namespace's workflow types, by type.
func ListFlowLimits(ctx context.Context, db DBTX, namespace string) ([]FlowLimits, error) {
	rows, err := db.Query(ctx, `SELECT `+flowLimitsColumns+` FROM kagzi.flow_limits WHERE namespace = $1
		ORDER BY workflow_type`, namespace)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(row pgx.CollectableRow) (FlowLimits, error) { return scanFlowLimits(row) })
}

// DeleteFlowLimits removes the limits of a workflow type (and its rate windows), and
// tells its workers. It returns ErrNotFound when the type had none.
func DeleteFlowLimits(ctx context.Context, db DBTX, namespace, workflowType string) error {
	var n int
	err := db.QueryRow(ctx, `
		WITH gone AS (
			DELETE FROM kagzi.flow_limits WHERE namespace = $1 AND workflow_type = $2 RETURNING 1
		), windows AS (
			DELETE FROM kagzi.flow_rates WHERE namespace = $1 AND workflow_type = $2
		)
		SELECT count(*), (SELECT pg_notify('`+Channel+`', 'w|' || octet_length($1::text) || ':' || $1 || '|' || $2
			|| '|' || (extract(epoch FROM now()) * 1000)::bigint)::text) FROM gone`, namespace, workflowType).Scan(&n, new(*string))
	if err == nil && n == 0 {
		return ErrNotFound
	}
	return err
}

// PruneFlowRates deletes the rate windows that count no start any more: a window's
// eleven slots of a tenth of its period from window_start hold starts made up to 1.1
// periods after it, each counted for a period, so a window begun more than 2.1
// periods ago counts nothing, by the period it was cut with and by its limit's now,
// whichever is longer (the next claim cuts it to the limit's: a period lengthened
// since keeps counting its starts). A period is at most a day; a window from before
// migration 00022 has no period recorded and is taken as a day's; a window whose limit
// is gone is pruned by its own. 2.2 leaves a margin.
func PruneFlowRates(ctx context.Context, db DBTX, namespace string) (int64, error) {
	tag, err := db.Exec(ctx, `DELETE FROM kagzi.flow_rates w WHERE w.namespace = $1 AND w.window_start < now() - interval '1 day'
		AND w.window_start < now() - 2.2 * interval '1 millisecond' * greatest(coalesce(w.period_ms, 86400000),
			(SELECT CASE WHEN w.flow_key = '' THEN l.rate_period_ms ELSE l.key_rate_period_ms END
			 FROM kagzi.flow_limits l WHERE l.namespace = w.namespace AND l.workflow_type = w.workflow_type))`, namespace)
	return tag.RowsAffected(), err
}

// FlowHold says what holds a PENDING run back, as far as the database can tell.
type FlowHold struct {
	// Limit names it: "concurrency" (the type's), "key-concurrency", "rate" (the
	// type's), "key-rate".
	Limit string
	// Until is when a rate window admits a start again (nil: when a holder stops).
	Until *time.Time
}

// RunHold tells what flow control holds a claimable PENDING run back by, or nil: a
// run of a concurrency key whose key is full, of a type whose concurrency limit or
// rate window is full, or of a key whose rate window is. A run of a key that started
// once (one waiting for a retry, or handed back) holds its key's place and passed its
// key's rate window: only its type's limits hold it back.
func RunHold(ctx context.Context, db DBTX, namespace string, r Run) (*FlowHold, error) {
	var limit *string
	var rateNext, keyRateNext *time.Time
	key := r.FlowKey
	if r.StartedAt != nil {
		key = nil
	}
	err := db.QueryRow(ctx, `
		SELECT CASE
			WHEN l.key_concurrency IS NOT NULL AND $3::text IS NOT NULL AND (
				SELECT count(*) FROM kagzi.runs h
				WHERE h.namespace = $1 AND h.workflow_type = $2 AND h.flow_key = $3
				  AND h.started_at IS NOT NULL AND h.status IN ('PENDING', 'RUNNING', 'SLEEPING')) >= l.key_concurrency
				THEN 'key-concurrency'
			WHEN l.concurrency IS NOT NULL AND (
				SELECT count(*) FROM kagzi.runs h
				WHERE h.namespace = $1 AND h.workflow_type = $2 AND h.holds_type_slot AND h.status = 'RUNNING'
				  AND h.available_at > now() - `+slotGraceSQL+`)
				>= l.concurrency THEN 'concurrency'
			WHEN l.rate IS NOT NULL AND kagzi.flow_rate_next($1, $2, '', l.rate, l.rate_period_ms) > now() THEN 'rate'
			WHEN l.key_rate IS NOT NULL AND $3::text IS NOT NULL
				AND kagzi.flow_rate_next($1, $2, $3, l.key_rate, l.key_rate_period_ms) > now() THEN 'key-rate'
			END,
			CASE WHEN l.rate IS NOT NULL THEN kagzi.flow_rate_next($1, $2, '', l.rate, l.rate_period_ms) END,
			CASE WHEN l.key_rate IS NOT NULL AND $3::text IS NOT NULL
				THEN kagzi.flow_rate_next($1, $2, $3, l.key_rate, l.key_rate_period_ms) END
		FROM kagzi.flow_limits l WHERE l.namespace = $1 AND l.workflow_type = $2`,
		namespace, r.WorkflowType, key).Scan(&limit, &rateNext, &keyRateNext)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return nil, nil
	case err != nil:
		return nil, err
	case limit == nil:
		return nil, nil
	}
	h := &FlowHold{Limit: *limit}
	switch h.Limit {
	case "rate":
		h.Until = rateNext
	case "key-rate":
		h.Until = keyRateNext
	}
	return h, nil
}
