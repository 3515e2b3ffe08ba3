package store

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/kagzi/kagzi/internal/testdb"
)

// BenchmarkRunCycle measures what Postgres spends on one 1-step run's life in the
// worker (claimed in batches of 50, ended with its step record by the merged
// statement, 50 at a time), serially on one connection with synchronous_commit off,
// so the figure is the statements' own work rather than the disk's flush latency:
// runs of no key; the same under a type concurrency limit of 100 (the type's lock and
// its holders' count in each claim, the slots the claims take and the ends free); and
// runs spread over 1,000 concurrency keys whose limit is 1 (the claim's ring of keys,
// their holders and heads; the ends that free the keys). One claimer serves the whole
// burn-down, keeping its key cursor, floors and key scans as a worker does; claim-us/run
// is the claims' share of ns/op.
func BenchmarkRunCycle(b *testing.B) {
	b.Run("plain", func(b *testing.B) { benchRunCycle(b, 0, false) })
	b.Run("type-limit", func(b *testing.B) { benchRunCycle(b, 0, true) })
	b.Run("keys=1000", func(b *testing.B) { benchRunCycle(b, 1000, false) })
}

func benchRunCycle(b *testing.B, keys int, typeLimit bool) {
	pool, _ := testdb.NewPool(b)
	ctx := context.Background()
	conn, err := pool.Acquire(ctx)
	if err != nil {
		b.Fatal(err)
	}
	defer conn.Release()
	if _, err := conn.Exec(ctx, "SET synchronous_commit = off"); err != nil {
		b.Fatal(err)
	}
	const batch = 50
	ids := make([]uuid.UUID, b.N)
	inputs := make([][]byte, b.N)
	carriers := make([][]byte, b.N)
	for i := range ids {
		ids[i], _ = uuid.NewV7()
		inputs[i] = []byte(`{"n":1}`)
	}
	if typeLimit {
		if _, err := conn.Exec(ctx, `INSERT INTO kagzi.flow_limits (namespace, workflow_type, concurrency)
			VALUES ('default', 'wf', 100)`); err != nil {
			b.Fatal(err)
		}
	}
	if keys == 0 {
		for i := 0; i < b.N; i += 1000 {
			j := min(i+1000, b.N)
			if err := InsertRuns(ctx, conn, "default", "wf", nil, ids[i:j], inputs[i:j], carriers[i:j], time.Time{}, nil); err != nil {
				b.Fatal(err)
			}
		}
	} else {
		if _, err := conn.Exec(ctx, `INSERT INTO kagzi.flow_limits (namespace, workflow_type, key_concurrency)
			VALUES ('default', 'wf', 1)`); err != nil {
			b.Fatal(err)
		}
		// Each key's runs started together, the keys one after another.
		per := max(b.N/keys, 1)
		for i := 0; i < b.N; i += per {
			j := min(i+per, b.N)
			if err := InsertManyRuns(ctx, conn, ManyRuns{Namespace: "default", WorkflowType: "wf", IDs: ids[i:j],
				Inputs: inputs[i:j], Carriers: carriers[i:j], FlowKey: fmt.Sprintf("key-%04d", i/per%keys)}); err != nil {
				b.Fatal(err)
			}
		}
	}
	if _, err := conn.Exec(ctx, "VACUUM ANALYZE kagzi.runs"); err != nil {
		b.Fatal(err)
	}
	key, name := "work#1", "work"
	pos := 1
	b.ResetTimer()
	done := 0
	var claiming time.Duration
	// One claimer for the whole burn-down, as a worker keeps its cursors and floors.
	claimer := testClaimer("wf")
	claimer.Floors, claimer.KeyFloors, claimer.KeyScans = NewFloors(), NewFloors(), map[string]bool{}
	claimer.Limited = map[string]bool{}
	for done < b.N {
		t0 := time.Now()
		claimed, _, err := ClaimRuns(ctx, conn, claimer, batch)
		claiming += time.Since(t0)
		if err != nil {
			b.Fatal(err)
		}
		if len(claimed) == 0 {
			b.Fatalf("claimed nothing with %d of %d done", done, b.N)
		}
		inputs := make([]any, len(claimed))
		now := time.Now()
		for i, c := range claimed {
			inputs[i] = &FinishWrite{Fence: c.Fence, Status: "COMPLETED", Output: []byte(`{"ok":true}`), HeldSlot: c.HoldsSlot,
				Last: &StepWrite{Key: key, Name: name, Output: []byte(`2`), StartedAt: now, FinishedAt: now, Position: pos}}
		}
		sql, merged := finishes.stmt.Build(inputs)
		rows, err := conn.Query(ctx, sql, merged...)
		if err != nil {
			b.Fatal(err)
		}
		n := 0
		for rows.Next() {
			n++
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			b.Fatal(err)
		}
		if n != len(claimed) {
			b.Fatalf("ended %d of %d", n, len(claimed))
		}
		done += n
	}
	b.ReportMetric(float64(claiming.Microseconds())/float64(b.N), "claim-us/run")
}

// BenchmarkHeartbeat measures one worker's beat that extends the leases of the runs it
// holds (100 or 2,000: MaxConcurrent) in a table of 50,000 other runs; ns/op is per
// beat, and "us/held" per held run, which must not grow with the runs held (a beat
// that joined its own CTEs pair by pair took 3 s for 2,000).
func BenchmarkHeartbeat(b *testing.B) {
	for _, held := range []int{100, 2000} {
		b.Run(fmt.Sprintf("held=%d", held), func(b *testing.B) {
			pool, _ := testdb.NewPool(b)
			ctx := context.Background()
			const others = 50_000
			ids := make([]uuid.UUID, others+held)
			inputs := make([][]byte, len(ids))
			carriers := make([][]byte, len(ids))
			for i := range ids {
				ids[i], _ = uuid.NewV7()
				inputs[i] = []byte(`{}`)
			}
			for i := 0; i < len(ids); i += 5000 {
				j := min(i+5000, len(ids))
				if err := InsertRuns(ctx, pool, "default", "wf", nil, ids[i:j], inputs[i:j], carriers[i:j], time.Time{}, nil); err != nil {
					b.Fatal(err)
				}
			}
			if _, err := pool.Exec(ctx, "VACUUM ANALYZE kagzi.runs"); err != nil {
				b.Fatal(err)
			}
			var fences []Fence
			for len(fences) < held {
				claimed, _, err := ClaimRuns(ctx, pool, testClaimer("wf"), min(500, held-len(fences)))
				if err != nil {
					b.Fatal(err)
				}
				for _, c := range claimed {
					fences = append(fences, c.Fence)
				}
			}
			beat := WorkerBeat{Namespace: "default", WorkerID: "w", ActiveRuns: held}
			b.ResetTimer()
			for range b.N {
				res, err := Heartbeat(ctx, pool, beat, fences, time.Minute)
				if err != nil {
					b.Fatal(err)
				}
				if len(res) != held {
					b.Fatalf("a beat reported %d held runs, want %d", len(res), held)
				}
			}
			b.ReportMetric(float64(b.Elapsed().Microseconds())/float64(b.N*held), "us/held")
		})
	}
}

// BenchmarkNextWake measures a worker's question "when does my next run become
// claimable?", which it asks after every claim that leaves slots free: with 10,000
// runs of its type waiting for a later time. Planned anew at every call it took
// ~2.7 ms; with its generic plan, a fraction of a millisecond.
func BenchmarkNextWake(b *testing.B) {
	pool, _ := testdb.NewPool(b)
	ctx := context.Background()
	const n = 10_000
	ids := make([]uuid.UUID, n)
	inputs := make([][]byte, n)
	carriers := make([][]byte, n)
	for i := range ids {
		ids[i], _ = uuid.NewV7()
		inputs[i] = []byte(`{}`)
	}
	if err := InsertRuns(ctx, pool, "default", "wf", nil, ids, inputs, carriers, time.Now().Add(time.Hour), nil); err != nil {
		b.Fatal(err)
	}
	if _, err := pool.Exec(ctx, "VACUUM ANALYZE kagzi.runs"); err != nil {
		b.Fatal(err)
	}
	c := testClaimer("wf")
	c.Floors = NewFloors()
	b.ResetTimer()
	for range b.N {
		next, err := NextWake(ctx, pool, c)
		if err != nil {
			b.Fatal(err)
		}
		if next == nil {
			b.Fatal("no next wake with 10,000 runs due in an hour")
		}
	}
}
