package kagzi_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"sort"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/kagzi/kagzi"
)

// The flow-control exactness tests: worker processes (see runCrashWorker) execute
// runs whose step bodies write their execution intervals to a ledger table, by the
// database's clock, while the test kills processes with SIGKILL; then the ledger is
// checked against the limits.

// flowInput is the input of the ledgered workflows: the run's concurrency key (for
// the ledger), how long each body works, and whether it sleeps durably between two
// bodies (so that a run keeps its key's place while SLEEPING).
type flowInput struct {
	Key   string `json:"key,omitempty"`
	MS    int    `json:"ms"`
	Sleep bool   `json:"sleep,omitempty"`
}

const ledgerSQL = `
CREATE TABLE ledger (
	id       bigserial PRIMARY KEY,
	run_id   uuid NOT NULL,
	step     text NOT NULL,
	flow_key text,
	pid      int NOT NULL,
	began    timestamptz NOT NULL DEFAULT clock_timestamp(),
	ended    timestamptz
);
-- Every claim of a run (a new lease epoch), timed as the rate limiter times it.
CREATE TABLE claims (run_id uuid, workflow_type text, flow_key text, first boolean,
	at timestamptz NOT NULL DEFAULT clock_timestamp());
CREATE FUNCTION record_claim() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
	INSERT INTO claims (run_id, workflow_type, flow_key, first)
	VALUES (NEW.run_id, NEW.workflow_type, NEW.flow_key, OLD.started_at IS NULL);
	RETURN NEW;
END $$;
CREATE TRIGGER record_claim AFTER UPDATE OF lease_epoch ON kagzi.runs FOR EACH ROW
	WHEN (NEW.lease_epoch <> OLD.lease_epoch AND NEW.status = 'RUNNING' AND NEW.available_at > now())
	EXECUTE FUNCTION record_claim();` // a claim leases the run; a reap moves the epoch and ends the lease

// ledgeredWorkflow defines a workflow type whose bodies record their intervals.
func ledgeredWorkflow(pool *pgxpool.Pool, name string) *kagzi.Workflow[flowInput, int] {
	return kagzi.Define(name, func(ctx *kagzi.Context, in flowInput) (int, error) {
		work := func(step string) error {
			_, err := kagzi.Step(ctx, step, func(c context.Context) (int, error) {
				var id int64
				if err := pool.QueryRow(c, `INSERT INTO ledger (run_id, step, flow_key, pid) VALUES ($1, $2, nullif($3, ''), $4)
					RETURNING id`, ctx.RunID(), step, in.Key, os.Getpid()).Scan(&id); err != nil {
					return 0, err
				}
				select {
				case <-time.After(time.Duration(in.MS) * time.Millisecond):
				case <-c.Done(): // the lease was lost: the body stops here
				}
				_, err := pool.Exec(context.WithoutCancel(c), `UPDATE ledger SET ended = clock_timestamp() WHERE id = $1`, id)
				if c.Err() != nil {
					return 0, c.Err()
				}
				return 0, err
			})
			return err
		}
		if err := work("first"); err != nil {
			return 0, err
		}
		if in.Sleep {
			if err := ctx.Sleep("nap", 30*time.Millisecond); err != nil {
				return 0, err
			}
			if err := work("second"); err != nil {
				return 0, err
			}
		}
		return 1, nil
	})
}

// flowProcs runs worker processes and kills them.
type flowProcs struct {
	t      *testing.T
	url    string
	pool   *pgxpool.Pool
	procs  []*exec.Cmd
	kills  int
	killed map[int]time.Time // pid → the database's clock once it was reaped
}

func (p *flowProcs) start() {
	p.procs = append(p.procs, startWorkerProcessEnv(p.t, p.url, crashSlotsEnv+"=4"))
}

// kill SIGKILLs the oldest process and notes when it was dead (the database's clock,
// read after the process was reaped): see closeKilled.
func (p *flowProcs) kill() { p.killAt(0) }

// killPid kills the process pid, as kill does.
func (p *flowProcs) killPid(pid int) {
	i := slices.IndexFunc(p.procs, func(c *exec.Cmd) bool { return c.Process.Pid == pid })
	if i < 0 {
		p.t.Fatalf("no process %d", pid)
	}
	p.killAt(i)
}

func (p *flowProcs) killAt(i int) {
	cmd := p.procs[i]
	p.procs = slices.Delete(p.procs, i, i+1)
	_ = cmd.Process.Signal(syscall.SIGKILL)
	_ = cmd.Wait()
	var at time.Time
	if err := p.pool.QueryRow(context.Background(), `SELECT clock_timestamp()`).Scan(&at); err != nil {
		p.t.Fatal(err)
	}
	if p.killed == nil {
		p.killed = map[int]time.Time{}
	}
	p.killed[cmd.Process.Pid] = at
	p.kills++
}

// closeKilled ends the ledger intervals the killed processes left open at their
// death. (A body's INSERT sent just before the kill may commit after it: its row
// then begins after the death, and is given no length.)
func (p *flowProcs) closeKilled() {
	for pid, at := range p.killed {
		if _, err := p.pool.Exec(context.Background(), `UPDATE ledger SET ended = greatest(began, $2)
			WHERE pid = $1 AND ended IS NULL`, pid, at); err != nil {
			p.t.Fatal(err)
		}
	}
	if n := countRows(p.t, p.pool, `SELECT count(*) FROM ledger WHERE ended IS NULL`); n != 0 {
		p.t.Fatalf("%d ledger intervals of live processes never ended", n)
	}
}

// churn starts n processes, then kills and replaces one every interval until all runs
// of the test completed, at most kills times.
func (p *flowProcs) churn(runs, n, kills int, interval time.Duration) {
	for range n {
		p.start()
	}
	last := time.Now()
	waitAllCompleted(p.t, p.pool, runs, func() {
		if p.kills < kills && time.Since(last) > interval {
			p.kill()
			p.start()
			last = time.Now()
		}
	})
	p.closeKilled()
}

type interval struct {
	run        string
	key        string
	began, end time.Time
}

func ledgerIntervals(t *testing.T, pool *pgxpool.Pool, sql string) []interval {
	t.Helper()
	rows, err := pool.Query(context.Background(), sql)
	if err != nil {
		t.Fatal(err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (interval, error) {
		var i interval
		return i, r.Scan(&i.run, &i.key, &i.began, &i.end)
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// maxOverlap is the most intervals open at one instant (an interval that ends when
// another begins does not overlap it).
func maxOverlap(intervals []interval) int {
	type edge struct {
		at    time.Time
		delta int
	}
	var edges []edge
	for _, i := range intervals {
		edges = append(edges, edge{i.began, 1}, edge{i.end, -1})
	}
	sort.Slice(edges, func(a, b int) bool {
		if !edges[a].at.Equal(edges[b].at) {
			return edges[a].at.Before(edges[b].at)
		}
		return edges[a].delta < edges[b].delta // ends first
	})
	open, most := 0, 0
	for _, e := range edges {
		open += e.delta
		most = max(most, open)
	}
	return most
}

// typeLimit is the concurrency limit of the type "limited" in ledgeredLimitedEnv, with a
// key limit of 1.
const typeLimit = 3

// ledgeredLimitedEnv is a database with the ledger tables and the type "limited"'s limits.
func ledgeredLimitedEnv(t *testing.T) (*env, context.Context) {
	t.Helper()
	e := newEnv(t)
	ctx := context.Background()
	if _, err := e.pool.Exec(ctx, ledgerSQL); err != nil {
		t.Fatal(err)
	}
	if _, err := e.client.SetLimits(ctx, kagzi.Limits{WorkflowType: "limited", Concurrency: typeLimit, KeyConcurrency: 1}); err != nil {
		t.Fatal(err)
	}
	return e, ctx
}

func TestFlowConcurrencyLimitsHoldExactlyAcrossKilledWorkerProcesses(t *testing.T) {
	e, ctx := ledgeredLimitedEnv(t)
	wf := ledgeredWorkflow(e.pool, "limited")
	runs := 0
	for i := range 60 {
		in := flowInput{MS: 20 + i%4*10, Sleep: i%2 == 0}
		var opts []kagzi.StartOption
		if i%5 != 0 { // 48 runs over 8 keys, 12 without a key
			in.Key = fmt.Sprint("customer-", i%8)
			opts = append(opts, kagzi.WithConcurrencyKey(in.Key))
		}
		if _, err := kagzi.Start(ctx, e.client, wf, in, opts...); err != nil {
			t.Fatal(err)
		}
		runs++
	}
	procs := &flowProcs{t: t, url: e.url, pool: e.pool}
	procs.churn(runs, 3, 3, 700*time.Millisecond)
	checkConcurrencyLedger(t, e.pool, procs, typeLimit, 48, runs)
}

// A type limited by concurrency alone: each worker's claims, once the first of them
// found the type limited, take the short way (the type locked in the claim's setup,
// its holders counted by the claim statement; store.claimLimitedSQL). The limit holds
// across processes killed with SIGKILL as kagzi.claim's does.
func TestATypeLimitAloneHoldsExactlyAcrossKilledWorkerProcesses(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	if _, err := e.pool.Exec(ctx, ledgerSQL); err != nil {
		t.Fatal(err)
	}
	if _, err := e.client.SetLimits(ctx, kagzi.Limits{WorkflowType: "limited", Concurrency: typeLimit}); err != nil {
		t.Fatal(err)
	}
	wf := ledgeredWorkflow(e.pool, "limited")
	const runs = 60
	for i := range runs {
		if _, err := kagzi.Start(ctx, e.client, wf, flowInput{MS: 40 + i%4*15, Sleep: i%2 == 0}); err != nil {
			t.Fatal(err)
		}
	}
	procs := &flowProcs{t: t, url: e.url, pool: e.pool}
	procs.churn(runs, 3, 3, 400*time.Millisecond)
	if procs.kills == 0 {
		t.Fatal("no process was killed: the test tested no crash")
	}
	checkConcurrencyLedger(t, e.pool, procs, typeLimit, 0, runs)
}

// checkConcurrencyLedger checks the ledger of the type "limited" after its runs
// completed: at most typeLimit bodies at one instant, each key's runs one at a time
// in start order (keyed of them), every run completed and no slot left held.
func checkConcurrencyLedger(t *testing.T, pool *pgxpool.Pool, procs *flowProcs, typeLimit, keyed, runs int) {
	t.Helper()
	// The type: never more than typeLimit bodies executing at one instant, across all
	// processes (a body executes while its run is RUNNING, holding a slot).
	all := ledgerIntervals(t, pool, `SELECT run_id::text, coalesce(flow_key, ''), began, ended FROM ledger`)
	if most := maxOverlap(all); most > typeLimit {
		t.Errorf("%d bodies of the type executed at one instant; the limit is %d", most, typeLimit)
	} else {
		t.Logf("at most %d of %d bodies at once over %d bodies, %d kills", most, typeLimit, len(all), procs.kills)
	}
	// Each key: one run at a time from its first body's beginning to its last body's
	// end (sleeping in between: it keeps its key's place), in start order.
	perRun := ledgerIntervals(t, pool, `
		SELECT l.run_id::text, l.flow_key, min(l.began), max(l.ended) FROM ledger l
		JOIN kagzi.runs r ON r.run_id = l.run_id
		WHERE l.flow_key IS NOT NULL GROUP BY l.run_id, l.flow_key, r.created_at ORDER BY l.flow_key, r.created_at`)
	for i := 1; i < len(perRun); i++ {
		prev, cur := perRun[i-1], perRun[i]
		if prev.key != cur.key {
			continue
		}
		if cur.began.Before(prev.end) {
			dumpKey(t, pool, cur.key)
			t.Errorf("key %s: run %s (started later) began at %v, before run %s ended at %v",
				cur.key, cur.run, cur.began, prev.run, prev.end)
		}
	}
	if len(perRun) != keyed {
		t.Errorf("%d keyed runs in the ledger, want %d", len(perRun), keyed)
	}
	if n := countRows(t, pool, `SELECT count(*) FROM kagzi.runs WHERE status = 'COMPLETED'`); n != runs {
		t.Errorf("%d of %d runs completed", n, runs)
	}
	if n := countRows(t, pool, `SELECT count(*) FROM kagzi.runs WHERE holds_type_slot AND status = 'RUNNING'`); n != 0 {
		t.Errorf("%d finished runs still hold a slot", n)
	}
}

func TestFlowLimitsHoldAcrossKilledProcessesThatClaimedTheirOwnStartsWithinTheLimits(t *testing.T) {
	e, ctx := ledgeredLimitedEnv(t)
	// Three worker processes each start 20 runs of their own, one at a time (lone
	// starts: a start whose limits have room claims its run in its insert), 16 of
	// them over 4 keys of the process, 4 without a key, and record when they are done.
	// The first process seen holding a run it claimed by its start is killed at once,
	// two more later; each is replaced by a worker that starts nothing.
	if _, err := e.pool.Exec(ctx, `CREATE TABLE starters_done (pid int)`); err != nil {
		t.Fatal(err)
	}
	const procsN, each = 3, 20
	procs := &flowProcs{t: t, url: e.url, pool: e.pool}
	for i := range procsN {
		procs.procs = append(procs.procs, startWorkerProcessEnv(t, e.url, crashSlotsEnv+"=4",
			fmt.Sprintf("%s=%d:p%d", crashFlowStartEnv, each, i)))
	}
	// The very first start finds the limits' room, so some process claims a run by its
	// start (the runs of these processes work 100 ms and more: it is seen holding it).
	var holder int
	eventually(t, "a process to hold a run it claimed by its start", func() bool {
		return e.pool.QueryRow(ctx, `SELECT l.pid FROM kagzi.runs r JOIN ledger l ON l.run_id = r.run_id AND l.ended IS NULL
			WHERE r.status = 'RUNNING' AND NOT EXISTS (SELECT 1 FROM claims c WHERE c.run_id = r.run_id)
			LIMIT 1`).Scan(&holder) == nil
	})
	procs.killPid(holder)
	procs.start()
	eventually(t, "the other processes to start their runs", func() bool {
		return countRows(t, e.pool, `SELECT count(*) FROM starters_done`) == procsN-1
	})
	runs := countRows(t, e.pool, `SELECT count(*) FROM kagzi.runs`)
	keyed := countRows(t, e.pool, `SELECT count(*) FROM kagzi.runs WHERE flow_key IS NOT NULL`)
	last := time.Now()
	waitAllCompleted(t, e.pool, runs, func() {
		if procs.kills < 3 && time.Since(last) > 500*time.Millisecond {
			procs.kill()
			procs.start()
			last = time.Now()
		}
	})
	procs.closeKilled()
	checkConcurrencyLedger(t, e.pool, procs, typeLimit, keyed, runs)
	// A run claimed by its start was never claimed by an UPDATE at epoch 1 (the
	// claims table records every other claim).
	eager := countRows(t, e.pool, `SELECT count(*) FROM kagzi.runs r
		WHERE NOT EXISTS (SELECT 1 FROM claims c WHERE c.run_id = r.run_id AND c.first)`)
	if eager == 0 {
		t.Fatalf("no run was claimed by its start: the test did not exercise starts within the limits")
	}
	t.Logf("%d of %d runs claimed by their starts, %d kills", eager, runs, procs.kills)
}

// windowMax is the most times within any half-open window [t, t+period).
func windowMax(times []time.Time, period time.Duration) int {
	slices.SortFunc(times, func(a, b time.Time) int { return a.Compare(b) })
	most, j := 0, 0
	for i := range times {
		for j < len(times) && times[j].Before(times[i].Add(period)) {
			j++
		}
		most = max(most, j-i)
	}
	return most
}

func TestFlowRateLimitsHoldExactlyAcrossKilledWorkerProcesses(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	if _, err := e.pool.Exec(ctx, ledgerSQL); err != nil {
		t.Fatal(err)
	}
	const rate, keyRate, period = 6, 2, 400 * time.Millisecond
	if _, err := e.client.SetLimits(ctx, kagzi.Limits{WorkflowType: "rated", Rate: rate, RatePeriod: period,
		KeyRate: keyRate, KeyRatePeriod: period}); err != nil {
		t.Fatal(err)
	}
	wf := ledgeredWorkflow(e.pool, "rated")
	const runs = 40
	for i := range runs {
		in := flowInput{MS: 10, Sleep: i%4 == 0}
		var opts []kagzi.StartOption
		if i%2 == 0 { // 20 runs over 2 keys, 20 without a key
			in.Key = fmt.Sprint("tenant-", i%4/2)
			opts = append(opts, kagzi.WithConcurrencyKey(in.Key))
		}
		if _, err := kagzi.Start(ctx, e.client, wf, in, opts...); err != nil {
			t.Fatal(err)
		}
	}
	procs := &flowProcs{t: t, url: e.url, pool: e.pool}
	procs.churn(runs, 3, 2, time.Second)

	var claims []time.Time
	keyFirsts := map[string][]time.Time{}
	rows, _ := e.pool.Query(ctx, `SELECT at, coalesce(flow_key, ''), first FROM claims WHERE workflow_type = 'rated'`)
	var at time.Time
	var key string
	var first bool
	if _, err := pgx.ForEachRow(rows, []any{&at, &key, &first}, func() error {
		claims = append(claims, at)
		if key != "" && first {
			keyFirsts[key] = append(keyFirsts[key], at)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	// Every claim is a run beginning to execute (a first start or a resumption): at
	// most rate of them in any window of the period.
	if most := windowMax(claims, period); most > rate {
		t.Errorf("%d runs began executing within %v; the rate limit is %d", most, period, rate)
	} else {
		t.Logf("at most %d of %d claims per %v over %d claims, %d kills", most, rate, period, len(claims), procs.kills)
	}
	for k, firsts := range keyFirsts {
		if most := windowMax(firsts, period); most > keyRate {
			t.Errorf("key %s: %d runs first started within %v; the key rate limit is %d", k, most, period, keyRate)
		}
	}
	if len(keyFirsts) != 2 || len(keyFirsts["tenant-0"]) != 10 || len(keyFirsts["tenant-1"]) != 10 {
		t.Errorf("first starts per key: %d keys, %d and %d runs; want 2 keys of 10", len(keyFirsts),
			len(keyFirsts["tenant-0"]), len(keyFirsts["tenant-1"]))
	}
}

func dumpKey(t *testing.T, pool *pgxpool.Pool, key string) {
	rows, _ := pool.Query(context.Background(), `
		SELECT 'L', l.run_id::text, l.step, l.pid::text, l.began, coalesce(l.ended, 'epoch') FROM ledger l WHERE flow_key = $1
		UNION ALL SELECT 'C', c.run_id::text, c.first::text, '', c.at, c.at FROM claims c WHERE flow_key = $1
		UNION ALL SELECT 'R', r.run_id::text, r.status, r.created_at::text, r.started_at, r.finished_at FROM kagzi.runs r WHERE flow_key = $1
		ORDER BY 5`, key)
	for rows.Next() {
		v, _ := rows.Values()
		t.Log(v...)
	}
}
