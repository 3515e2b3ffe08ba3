package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// The vacuum workload (issue 22 §3): a steady open-loop rate of 1-step runs (River: 1
// job) while something pins the database's xmin horizon, so that vacuum cannot
// reclaim the rows that the queue rewrites. Three phases: before (the baseline), pin,
// after (the pin released). Per window it records runs completed, pickup latency
// (start committed → first step begins), start → done, and the dead tuples and size
// of the system's tables; the report aggregates the windows per bucket (a minute).

// vacuumParams are the vacuum workload's flags.
type vacuumParams struct {
	rate                int           // runs started per second
	pin                 string        // idle: an idle-in-transaction session holding an XID; rr: four REPEATABLE READ readers
	before, pinFor, aft time.Duration // phase lengths
	window              time.Duration // live figures (stderr) and database samples
	bucket              time.Duration // rows of the report
	every               time.Duration // VACUUM of the system's tables (the server runs with autovacuum off); 0: never
	rrScan              time.Duration // how often each REPEATABLE READ reader scans the tables
	eager               bool          // Kagzi: start from the worker's own client (eager starts)
	explain             string        // file for the claim's nested plans (auto_explain) per bucket
	flow                string        // Kagzi: "type" (a type concurrency limit of the slots), "keys" (key limit 1 over keys keys) or ""
	keys                int           // concurrency keys with flow "keys"
}

// vacuumTarget is what the harness needs from a system.
type vacuumTarget struct {
	name   string
	db     *database
	obs    *pgxpool.Pool // untraced: statistics, VACUUM, probes
	schema string        // the schema of the system's tables
	table  string        // the queue's table (kagzi.runs, river_job)
	index  string        // the index the claim/fetch reads (its size is reported)
	// start starts one run and returns its id once the start committed.
	start func(ctx context.Context) (string, error)
	// probe is a plain statement equivalent to the claim's scan (run in EXPLAIN
	// ANALYZE inside a transaction rolled back); probeArgs its arguments.
	probe     string
	probeArgs func(ctx context.Context) []any
	// nested, if set, writes the plans of the real claim's statements to w.
	nested func(ctx context.Context, w io.Writer) error
}

// vacEntry is one run: when its start was called and committed, its first step began
// and its end was written.
type vacEntry struct{ called, committed, first, done time.Time }

type vacWindow struct {
	started, completed, late int
	pickup, e2e, startLat    []time.Duration
	db                       vacDB
	load                     string
	probeBuf                 int64   // shared buffers (hit + read) of the claim probe
	probeMS                  float64 // its execution time
	probed                   bool
}

// vacDB is a sample of the system's tables' statistics.
type vacDB struct {
	ok                     bool
	dead, live             int64
	size, tableSize, index int64 // bytes: every table of the schema with indexes and TOAST; the queue table alone; the claim index
	upd, hotUpd            int64 // cumulative, queue table
	wal                    int64 // pg_current_wal_lsn, bytes (server-wide)
	horizonAge             int64 // age of the oldest backend xmin on the server
	otherPins              int64 // backends of other databases holding an XID or snapshot for over a minute
	vacuumMS               float64
}

type vacTracker struct {
	mu   sync.Mutex
	t0   time.Time
	win  time.Duration
	m    map[string]*vacEntry
	wins []*vacWindow
}

func newVacTracker(t0 time.Time, win time.Duration) *vacTracker {
	return &vacTracker{t0: t0, win: win, m: map[string]*vacEntry{}}
}

func (t *vacTracker) window(at time.Time) *vacWindow {
	i := int(at.Sub(t.t0) / t.win)
	i = max(i, 0)
	for len(t.wins) <= i {
		t.wins = append(t.wins, &vacWindow{})
	}
	return t.wins[i]
}

func (t *vacTracker) entry(id string) *vacEntry {
	e := t.m[id]
	if e == nil {
		e = &vacEntry{}
		t.m[id] = e
	}
	return e
}

// settle records what an entry's times allow, once each.
func (t *vacTracker) settle(id string, e *vacEntry) {
	if e.committed.IsZero() {
		return
	}
	if !e.done.IsZero() && !e.first.IsZero() {
		w := t.window(e.done)
		w.completed++
		w.e2e = append(w.e2e, e.done.Sub(e.called))
		delete(t.m, id)
	}
}

func (t *vacTracker) committed(id string, called, at time.Time) {
	t.mu.Lock()
	defer t.mu.Unlock()
	e := t.entry(id)
	e.called, e.committed = called, at
	w := t.window(called)
	w.started++
	w.startLat = append(w.startLat, at.Sub(called))
	if !e.first.IsZero() { // the first step began before Start returned
		t.window(e.first).pickup = append(t.window(e.first).pickup, max(e.first.Sub(at), 0))
	}
	t.settle(id, e)
}

func (t *vacTracker) first(id string, at time.Time) {
	t.mu.Lock()
	defer t.mu.Unlock()
	e := t.entry(id)
	if !e.first.IsZero() {
		return
	}
	e.first = at
	if !e.committed.IsZero() {
		w := t.window(at)
		w.pickup = append(w.pickup, max(at.Sub(e.committed), 0))
	}
	t.settle(id, e)
}

func (t *vacTracker) done(id string, at time.Time) {
	t.mu.Lock()
	defer t.mu.Unlock()
	e := t.entry(id)
	e.done = at
	t.settle(id, e)
}

func (t *vacTracker) late() {
	t.mu.Lock()
	t.window(time.Now()).late++
	t.mu.Unlock()
}

// vacuumResult is one system's windows.
type vacuumResult struct {
	vp    vacuumParams
	wins  []*vacWindow
	notes []string
}

// runVacuumLoad runs the three phases against a target whose worker runs already.
func runVacuumLoad(ctx context.Context, vp vacuumParams, tg *vacuumTarget, tr *vacTracker, say func(string, ...any)) (*vacuumResult, error) {
	total := vp.before + vp.pinFor + vp.aft
	t0 := tr.t0
	end := t0.Add(total)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	var firstErr error
	var once sync.Once
	fail := func(err error) {
		if err != nil && ctx.Err() == nil {
			once.Do(func() { firstErr = err; cancel() })
		}
	}

	// Open-loop starts at the fixed rate: due starts go to a queue that 64 starters
	// take from; a start that finds the queue full is counted late and dropped.
	jobs := make(chan time.Time, max(vp.rate, 100))
	for range 64 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range jobs {
				called := time.Now()
				id, err := tg.start(ctx)
				if err != nil {
					fail(err)
					return
				}
				tr.committed(id, called, time.Now())
			}
		}()
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		defer close(jobs)
		tick := time.NewTicker(2 * time.Millisecond)
		defer tick.Stop()
		sent := 0
		for {
			select {
			case <-ctx.Done():
				return
			case now := <-tick.C:
				if now.After(end) {
					return
				}
				due := int(now.Sub(t0).Seconds() * float64(vp.rate))
				for ; sent < due; sent++ {
					select {
					case jobs <- now:
					default:
						tr.late()
					}
				}
			}
		}
	}()

	// The pin.
	wg.Add(1)
	go func() {
		defer wg.Done()
		select {
		case <-ctx.Done():
			return
		case <-time.After(time.Until(t0.Add(vp.before))):
		}
		say("pin (%s) for %s", vp.pin, vp.pinFor)
		fail(pinHorizon(ctx, vp, tg, t0.Add(vp.before+vp.pinFor), say))
		say("pin released")
	}()

	// VACUUM of the system's tables, as an eager autovacuum would.
	var lastVacuum atomic.Int64 // µs
	if vp.every > 0 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			tick := time.NewTicker(vp.every)
			defer tick.Stop()
			for {
				select {
				case <-ctx.Done():
					return
				case now := <-tick.C:
					if now.After(end) {
						return
					}
					tables, err := schemaTables(ctx, tg.obs, tg.schema)
					if err != nil {
						fail(err)
						return
					}
					v0 := time.Now()
					if _, err := tg.obs.Exec(ctx, "VACUUM "+strings.Join(tables, ", ")); err != nil {
						fail(fmt.Errorf("vacuum: %w", err))
						return
					}
					lastVacuum.Store(time.Since(v0).Microseconds())
				}
			}
		}()
	}

	var explainOut io.Writer
	if vp.explain != "" && tg.nested != nil {
		f, err := os.OpenFile(vp.explain, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
		if err != nil {
			return nil, err
		}
		defer f.Close()
		explainOut = f
	}

	// Samples at each window's end.
	nwin := int((total + vp.window - 1) / vp.window)
	for i := 0; i < nwin; i++ {
		at := t0.Add(time.Duration(i+1) * vp.window)
		select {
		case <-ctx.Done():
		case <-time.After(time.Until(at)):
		}
		if ctx.Err() != nil {
			break
		}
		s, err := sampleDB(ctx, tg)
		if err != nil {
			fail(err)
			break
		}
		s.vacuumMS = float64(lastVacuum.Load()) / 1000
		buf, pms, perr := probeClaim(ctx, tg)
		tr.mu.Lock()
		w := tr.window(at.Add(-time.Millisecond))
		w.db, w.load = s, loadavg()
		if perr == nil {
			w.probeBuf, w.probeMS, w.probed = buf, pms, true
		}
		line := windowLine(vp, i, w)
		tr.mu.Unlock()
		if perr != nil {
			say("  probe: %v", perr)
		}
		say("%s", line)
		if explainOut != nil && (i+1)%int(max(vp.bucket/vp.window, 1)) == 0 {
			fmt.Fprintf(explainOut, "\n===== %s, window %d (%s), %s =====\n", tg.name, i, phaseOf(vp, time.Duration(i)*vp.window), time.Now().Format(time.TimeOnly))
			if err := tg.nested(ctx, explainOut); err != nil {
				fmt.Fprintf(explainOut, "error: %v\n", err)
			}
		}
	}
	cancel()
	wg.Wait()
	if firstErr != nil {
		return nil, firstErr
	}
	time.Sleep(500 * time.Millisecond) // the last ends' hooks and events
	tr.mu.Lock()
	defer tr.mu.Unlock()
	res := &vacuumResult{vp: vp, wins: append([]*vacWindow(nil), tr.wins[:min(nwin, len(tr.wins))]...)}
	return res, nil
}

// pinHorizon holds the xmin horizon back until `until`.
func pinHorizon(ctx context.Context, vp vacuumParams, tg *vacuumTarget, until time.Time, say func(string, ...any)) error {
	connect := func() (*pgx.Conn, error) { return pgx.ConnectConfig(ctx, tg.db.cfg.ConnConfig.Copy()) }
	wait := func() {
		select {
		case <-ctx.Done():
		case <-time.After(time.Until(until)):
		}
	}
	switch vp.pin {
	case "idle":
		c, err := connect()
		if err != nil {
			return err
		}
		defer c.Close(context.Background())
		if _, err := c.Exec(ctx, "BEGIN"); err != nil {
			return err
		}
		var xid int64
		if err := c.QueryRow(ctx, "SELECT txid_current()").Scan(&xid); err != nil {
			return err
		}
		say("  idle in transaction with xid %d", xid)
		wait()
		_, err = c.Exec(context.Background(), "ROLLBACK")
		return err
	case "rr":
		tables, err := schemaTables(ctx, tg.obs, tg.schema)
		if err != nil {
			return err
		}
		var wg sync.WaitGroup
		errs := make([]error, 4)
		for k := range 4 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				errs[k] = func() error {
					c, err := connect()
					if err != nil {
						return err
					}
					defer c.Close(context.Background())
					if _, err := c.Exec(ctx, "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY"); err != nil {
						return err
					}
					defer func() { _, _ = c.Exec(context.Background(), "ROLLBACK") }()
					// Staggered: reader k scans first after k quarters of the period.
					next := time.Now()
					if k > 0 {
						next = next.Add(time.Duration(k) * vp.rrScan / 4)
						// The snapshot is taken by the first statement: take it now.
						if _, err := c.Exec(ctx, "SELECT 1 FROM "+tg.table+" LIMIT 1"); err != nil {
							return err
						}
					}
					for {
						select {
						case <-ctx.Done():
							return nil
						case <-time.After(time.Until(next)):
						}
						if time.Now().After(until) {
							return nil
						}
						for _, t := range tables {
							if _, err := c.Exec(ctx, "SELECT count(*) FROM "+t); err != nil {
								return err
							}
						}
						next = next.Add(vp.rrScan)
						if next.After(until) {
							wait()
							return nil
						}
					}
				}()
			}()
		}
		wg.Wait()
		return errors.Join(errs...)
	}
	return fmt.Errorf("vacuum: unknown pin %q (idle, rr)", vp.pin)
}

// schemaTables lists the tables of the schema, qualified.
func schemaTables(ctx context.Context, obs *pgxpool.Pool, schema string) ([]string, error) {
	rows, err := obs.Query(ctx, `SELECT format('%I.%I', schemaname, relname) FROM pg_stat_user_tables WHERE schemaname = $1 ORDER BY relname`, schema)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, pgx.RowTo[string])
}

func sampleDB(ctx context.Context, tg *vacuumTarget) (vacDB, error) {
	var s vacDB
	err := tg.obs.QueryRow(ctx, `
SELECT coalesce(sum(n_dead_tup), 0)::bigint, coalesce(sum(n_live_tup), 0)::bigint,
       coalesce(sum(pg_total_relation_size(relid)), 0)::bigint,
       pg_total_relation_size($2::regclass), pg_relation_size($3::regclass),
       (SELECT n_tup_upd FROM pg_stat_user_tables WHERE relid = $2::regclass),
       (SELECT n_tup_hot_upd FROM pg_stat_user_tables WHERE relid = $2::regclass),
       (pg_current_wal_lsn() - '0/0')::bigint,
       (SELECT coalesce(max(age(backend_xmin)), 0) FROM pg_stat_activity WHERE backend_xmin IS NOT NULL)::bigint,
       (SELECT count(*) FROM pg_stat_activity WHERE datname IS DISTINCT FROM current_database()
          AND (backend_xid IS NOT NULL OR backend_xmin IS NOT NULL) AND xact_start < now() - interval '1 minute')
FROM pg_stat_user_tables WHERE schemaname = $1`, tg.schema, tg.table, tg.index).Scan(
		&s.dead, &s.live, &s.size, &s.tableSize, &s.index, &s.upd, &s.hotUpd, &s.wal, &s.horizonAge, &s.otherPins)
	s.ok = err == nil
	return s, err
}

// probeClaim runs the claim's scan under EXPLAIN (ANALYZE, BUFFERS) in a transaction
// it rolls back, and returns its shared buffers and execution time.
func probeClaim(ctx context.Context, tg *vacuumTarget) (int64, float64, error) {
	if tg.probe == "" {
		return 0, 0, errNA
	}
	tx, err := tg.obs.Begin(ctx)
	if err != nil {
		return 0, 0, err
	}
	defer func() { _ = tx.Rollback(context.Background()) }()
	var out []byte
	if err := tx.QueryRow(ctx, "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) "+tg.probe, tg.probeArgs(ctx)...).Scan(&out); err != nil {
		return 0, 0, err
	}
	var plans []struct {
		Plan struct {
			Hit  int64 `json:"Shared Hit Blocks"`
			Read int64 `json:"Shared Read Blocks"`
		} `json:"Plan"`
		Exec float64 `json:"Execution Time"`
	}
	if err := json.Unmarshal(out, &plans); err != nil || len(plans) == 0 {
		return 0, 0, fmt.Errorf("probe plan: %v", err)
	}
	return plans[0].Plan.Hit + plans[0].Plan.Read, plans[0].Exec, nil
}

// explainNested runs sql with auto_explain logging the plans of its nested statements
// (ANALYZE, BUFFERS) to w, inside a transaction it rolls back.
func explainNested(ctx context.Context, db *database, w io.Writer, setup []string, sql string, args ...any) error {
	cfg := db.cfg.ConnConfig.Copy()
	cfg.OnNotice = func(_ *pgconn.PgConn, n *pgconn.Notice) { fmt.Fprintf(w, "%s\n", n.Message) }
	c, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		return err
	}
	defer c.Close(context.Background())
	for _, s := range []string{"LOAD 'auto_explain'", "SET auto_explain.log_min_duration = 0",
		"SET auto_explain.log_nested_statements = on", "SET auto_explain.log_analyze = on",
		"SET auto_explain.log_buffers = on", "SET client_min_messages = log", "BEGIN"} {
		if _, err := c.Exec(ctx, s); err != nil {
			return err
		}
	}
	defer func() { _, _ = c.Exec(context.Background(), "ROLLBACK") }()
	for _, s := range setup {
		if _, err := c.Exec(ctx, s); err != nil {
			return err
		}
	}
	rows, err := c.Query(ctx, sql, args...)
	if err != nil {
		return err
	}
	n := 0
	for rows.Next() {
		n++
	}
	rows.Close()
	fmt.Fprintf(w, "-- %d rows\n", n)
	return rows.Err()
}

func phaseOf(vp vacuumParams, at time.Duration) string {
	switch {
	case at < vp.before:
		return "before"
	case at < vp.before+vp.pinFor:
		return "pin"
	default:
		return "after"
	}
}

func windowLine(vp vacuumParams, i int, w *vacWindow) string {
	at := time.Duration(i) * vp.window
	return fmt.Sprintf("%6s %-6s started %5.0f/s done %5.0f/s late %d | pickup p50 %6.1f p99 %6.1f max %6.1f ms | done p99 %6.1f ms | dead %d live %d size %.0f MB (table %.0f, index %.1f MB) hot %d/%d | probe %d buf %.2f ms | vacuum %.0f ms | xmin age %d, other pins %d | load %s",
		at, phaseOf(vp, at), float64(w.started)/vp.window.Seconds(), float64(w.completed)/vp.window.Seconds(), w.late,
		msf(median(w.pickup)), msf(pct(w.pickup, 99)), msf(maxOf(w.pickup)), msf(pct(w.e2e, 99)),
		w.db.dead, w.db.live, mb(w.db.size), mb(w.db.tableSize), mb(w.db.index), w.db.hotUpd, w.db.upd,
		w.probeBuf, w.probeMS, w.db.vacuumMS, w.db.horizonAge, w.db.otherPins, w.load)
}

func mb(b int64) float64 { return float64(b) / (1 << 20) }

// vacBucket is a row of the report: the windows of one phase's minute.
type vacBucket struct {
	label                    string
	started, completed, late int
	secs                     float64
	pickup, e2e, startLat    []time.Duration
	last                     *vacWindow // its last window: the database sample at its end
	first                    *vacWindow // the window before it: for WAL and update deltas
	probeBuf                 []int64
	probeMS                  []float64
	loads                    []string
	otherPins                int64
}

func (r *vacuumResult) buckets() []*vacBucket {
	vp := r.vp
	var out []*vacBucket
	byLabel := map[string]*vacBucket{}
	var prev *vacWindow
	for i, w := range r.wins {
		at := time.Duration(i) * vp.window
		ph := phaseOf(vp, at)
		var label string
		switch ph {
		case "before":
			if i == 0 && vp.before > vp.window {
				prev = w
				continue // warm-up
			}
			label = "baseline"
		case "pin":
			label = fmt.Sprintf("pin %s", ((at-vp.before)/vp.bucket+1)*vp.bucket)
		default:
			label = fmt.Sprintf("after %s", ((at-vp.before-vp.pinFor)/vp.bucket+1)*vp.bucket)
		}
		b := byLabel[label]
		if b == nil {
			b = &vacBucket{label: label, first: prev}
			byLabel[label] = b
			out = append(out, b)
		}
		b.started += w.started
		b.completed += w.completed
		b.late += w.late
		b.secs += vp.window.Seconds()
		b.pickup = append(b.pickup, w.pickup...)
		b.e2e = append(b.e2e, w.e2e...)
		b.startLat = append(b.startLat, w.startLat...)
		if w.probed {
			b.probeBuf = append(b.probeBuf, w.probeBuf)
			b.probeMS = append(b.probeMS, w.probeMS)
		}
		b.loads = append(b.loads, w.load)
		b.otherPins += w.db.otherPins
		b.last = w
		prev = w
	}
	return out
}

// vacuumMarkdown is the system's table: one row per bucket.
func vacuumMarkdown(col string, r *vacuumResult) string {
	var b strings.Builder
	vp := r.vp
	fmt.Fprintf(&b, "### Vacuum-hostile: %s, %d runs/s, pin %s for %s (before %s, after %s)\n\n", col, vp.rate, vp.pin, vp.pinFor, vp.before, vp.aft)
	fmt.Fprintf(&b, "Windows of %s; VACUUM of the tables every %s (the server's autovacuum is off); pickup = start committed → first step (job) begins; "+
		"probe = the claim's scan (`%s`) under EXPLAIN (ANALYZE, BUFFERS), shared buffers and ms, last sample of the row; "+
		"dead/size/index at the row's end; WAL server-wide; xmin age = age of the oldest snapshot on the server at the row's end "+
		"(* = a session of another database held an XID or snapshot for over a minute during the row: it pins this database's horizon too).\n\n", vp.window, orDefault(vp.every, "never"), "LIMIT 100 FOR UPDATE SKIP LOCKED")
	b.WriteString("| phase | started/s | done/s | pickup p50 ms | p99 | max | start→done p99 ms | start() p99 ms | dead tuples | size MB | claim index MB | HOT upd % | probe buffers | probe ms | WAL KB/run | xmin age | load (1 min) |\n")
	b.WriteString("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |\n")
	for _, k := range r.buckets() {
		hot, wal := "—", "—"
		if k.first != nil && k.last != nil && k.last.db.ok && k.first.db.ok {
			if du := k.last.db.upd - k.first.db.upd; du > 0 {
				hot = fmt.Sprintf("%.0f", 100*float64(k.last.db.hotUpd-k.first.db.hotUpd)/float64(du))
			}
			if k.completed > 0 {
				wal = fmt.Sprintf("%.1f", float64(k.last.db.wal-k.first.db.wal)/1024/float64(k.completed))
			}
		}
		pb, pm := "—", "—"
		if n := len(k.probeBuf); n > 0 {
			pb, pm = fmt.Sprintf("%d", k.probeBuf[n-1]), fmt.Sprintf("%.2f", k.probeMS[n-1])
		}
		loads := make([]string, 0, len(k.loads))
		for _, l := range k.loads {
			if f := strings.Fields(l); len(f) > 0 {
				loads = append(loads, f[0])
			}
		}
		late := ""
		if k.late > 0 {
			late = fmt.Sprintf(" (%d late)", k.late)
		}
		xa := fmt.Sprintf("%d", k.last.db.horizonAge)
		if k.otherPins > 0 {
			xa += "*" // another database's session held the horizon during the row
		}
		fmt.Fprintf(&b, "| %s | %.0f%s | %.0f | %.1f | %.1f | %.1f | %.1f | %.1f | %d | %.0f | %.1f | %s | %s | %s | %s | %s | %s |\n",
			k.label, float64(k.started)/k.secs, late, float64(k.completed)/k.secs,
			msf(median(k.pickup)), msf(pct(k.pickup, 99)), msf(maxOf(k.pickup)), msf(pct(k.e2e, 99)), msf(pct(k.startLat, 99)),
			k.last.db.dead, mb(k.last.db.size), mb(k.last.db.index), hot, pb, pm, wal, xa, loadRange(loads))
	}
	for _, n := range r.notes {
		fmt.Fprintf(&b, "\n%s\n", n)
	}
	return b.String()
}

func loadRange(ls []string) string {
	if len(ls) == 0 {
		return "?"
	}
	s := append([]string(nil), ls...)
	f := func(x string) float64 { v, _ := strconv.ParseFloat(x, 64); return v }
	sort.Slice(s, func(i, j int) bool { return f(s[i]) < f(s[j]) })
	if s[0] == s[len(s)-1] {
		return s[0]
	}
	return s[0] + "-" + s[len(s)-1]
}
