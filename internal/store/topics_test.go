package store

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/kagzi/kagzi/internal/testdb"
	"github.com/kagzi/kagzi/internal/vocab"
)

// barPairs are (namespace, workflow type) pairs whose topics the plain "w|ns|type"
// made equal: "w|a|b|c", "w|x|y|z|w".
var barPairs = [][2]string{{"a|b", "c"}, {"a", "b|c"}, {"x|y", "z|w"}, {"x", "y|z|w"}, {"x|y|z", "w"}}

func TestWakeTopicsOfNamespacesAndTypesHoldingABarAreDistinct(t *testing.T) {
	seen := map[string][2]string{}
	for _, p := range append(barPairs, [2]string{"ñ|", "b"}, [2]string{"ñ", "|b"}) {
		topic := WakeTopic(p[0], p[1])
		if q, ok := seen[topic]; ok {
			t.Fatalf("namespace %q type %q and namespace %q type %q share the topic %q", p[0], p[1], q[0], q[1], topic)
		}
		seen[topic] = p
	}
	if got, want := WakeTopic("ñ|x", "b|c"), "w|4:ñ|x|b|c"; got != want { // the length counts bytes
		t.Fatalf("WakeTopic = %q, want %q", got, want)
	}
}

// wakeTopicOf reads one notification and returns its topic as the notifier parses
// it: the payload up to its last '|'.
func wakeTopicOf(t *testing.T, listener *pgx.Conn, what string) string {
	t.Helper()
	topic, _ := nextPayload(t, listener, what)
	return topic
}

// wakeExtraOf reads one notification and returns its part after the topic.
func wakeExtraOf(t *testing.T, listener *pgx.Conn, what string) string {
	t.Helper()
	_, extra := nextPayload(t, listener, what)
	return extra
}

// nextPayload reads one notification and splits its payload at its last '|'.
func nextPayload(t *testing.T, listener *pgx.Conn, what string) (topic, extra string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	msg, err := listener.WaitForNotification(ctx)
	if err != nil {
		t.Fatalf("%s: no notification: %v", what, err)
	}
	i := strings.LastIndexByte(msg.Payload, '|')
	if i < 0 {
		t.Fatalf("%s: payload %q has no '|'", what, msg.Payload)
	}
	return msg.Payload[:i], msg.Payload[i+1:]
}

func TestEveryWakeNotificationCarriesTheTopicWakeTopicBuilds(t *testing.T) {
	t.Parallel()
	pool, url := testdb.NewPool(t)
	ctx := context.Background()
	listener := listen(t, url)
	for _, p := range append(barPairs, [2]string{"ñ|é", "ü|b"}) {
		ns, typ := p[0], p[1]
		want := WakeTopic(ns, typ)
		check := func(what string) {
			t.Helper()
			if got := wakeTopicOf(t, listener, what); got != want {
				t.Fatalf("namespace %q type %q, %s: topic %q, want WakeTopic's %q", ns, typ, what, got, want)
			}
		}

		// A start (insertRun).
		parent := uuid.Must(uuid.NewV7())
		if _, _, err := InsertRun(ctx, pool, NewRun{RunID: parent, Namespace: ns, WorkflowID: parent.String(),
			WorkflowType: typ, Input: []byte(`1`)}); err != nil {
			t.Fatal(err)
		}
		check("InsertRun")

		// Many starts in one statement.
		if err := InsertRuns(ctx, pool, ns, typ, nil, []uuid.UUID{uuid.Must(uuid.NewV7())}, [][]byte{[]byte(`2`)},
			make([][]byte, 1), time.Time{}, nil); err != nil {
			t.Fatal(err)
		}
		check("InsertRuns")

		// A run handed back (notifyRunSQL).
		if _, err := pool.Exec(ctx, `UPDATE kagzi.runs SET status = 'RUNNING', lease_epoch = 7 WHERE run_id = $1`, parent); err != nil {
			t.Fatal(err)
		}
		if err := ReleaseRuns(ctx, pool, []Fence{{RunID: parent, Epoch: 7}}); err != nil {
			t.Fatal(err)
		}
		check("ReleaseRuns")

		// The test clock (shiftTimeSQL): both runs are of the pair, one notification.
		if _, err := ShiftTime(ctx, pool, ns, time.Second); err != nil {
			t.Fatal(err)
		}
		check("ShiftTime")

		// A child's end wakes its sleeping parent (the run_changed trigger).
		child := uuid.Must(uuid.NewV7())
		if _, _, err := InsertRun(ctx, pool, NewRun{RunID: child, Namespace: ns, WorkflowID: child.String(),
			WorkflowType: "child", Input: []byte(`3`), ParentRunID: &parent, ParentStepKey: "c#1", NotifyLater: true}); err != nil {
			t.Fatal(err)
		}
		if _, err := pool.Exec(ctx, `UPDATE kagzi.runs SET status = 'SLEEPING', available_at = now() + interval '1 hour'
			WHERE run_id = $1`, parent); err != nil {
			t.Fatal(err)
		}
		if _, err := pool.Exec(ctx, `UPDATE kagzi.runs SET status = 'COMPLETED', finished_at = now() WHERE run_id = $1`, child); err != nil {
			t.Fatal(err)
		}
		check("a child's end")
	}
}

func TestTheNotificationOfAFreedKeysPlaceSaysSoAndAStartsDoesNot(t *testing.T) {
	t.Parallel()
	pool, url := testdb.NewPool(t)
	ctx := context.Background()
	ids := []uuid.UUID{uuid.Must(uuid.NewV7()), uuid.Must(uuid.NewV7())}
	listener := listen(t, url)
	if err := InsertManyRuns(ctx, pool, ManyRuns{Namespace: "default", WorkflowType: "wf", IDs: ids,
		Inputs: [][]byte{[]byte(`1`), []byte(`2`)}, Carriers: make([][]byte, 2), FlowKey: "customer-7"}); err != nil {
		t.Fatal(err)
	}
	if ms, freed, err := KeyFreed(wakeExtraOf(t, listener, "the start")); err != nil || freed || ms == 0 {
		t.Fatalf("the start's notification: %d, freed %v, %v; want a time and no freed key", ms, freed, err)
	}
	// Both runs hold the key's place (started), as claims leave them.
	if _, err := pool.Exec(ctx, `UPDATE kagzi.runs SET status = 'RUNNING', started_at = now(), lease_epoch = 1
		WHERE run_id = ANY($1)`, ids); err != nil {
		t.Fatal(err)
	}
	// A worker's end (store.FinishRun) and a cancel (the run_changed trigger).
	if _, err := FinishRun(ctx, Direct(pool), FinishWrite{Fence: Fence{RunID: ids[0], Epoch: 1}, Status: vocab.StatusCompleted,
		Output: []byte(`1`)}); err != nil {
		t.Fatal(err)
	}
	if ms, freed, err := KeyFreed(wakeExtraOf(t, listener, "the end")); err != nil || !freed || ms == 0 {
		t.Fatalf("the end's notification: %d, freed %v, %v; want a time and a freed key", ms, freed, err)
	}
	if _, err := pool.Exec(ctx, `UPDATE kagzi.runs SET status = 'CANCELLED', finished_at = now() WHERE run_id = $1`, ids[1]); err != nil {
		t.Fatal(err)
	}
	if ms, freed, err := KeyFreed(wakeExtraOf(t, listener, "the cancel")); err != nil || !freed || ms == 0 {
		t.Fatalf("the cancel's notification: %d, freed %v, %v; want a time and a freed key", ms, freed, err)
	}
}

func TestTheNotificationOfLimitsSetSaysSoAndItsTimeStillParses(t *testing.T) {
	t.Parallel()
	pool, url := testdb.NewPool(t)
	ctx := context.Background()
	listener := listen(t, url)
	n := 3
	if _, err := SetFlowLimits(ctx, pool, FlowLimits{Namespace: "default", WorkflowType: "wf", Concurrency: &n}); err != nil {
		t.Fatal(err)
	}
	extra := wakeExtraOf(t, listener, "the limits set")
	if ms, freed, err := KeyFreed(extra); err != nil || freed || ms == 0 || !LimitsSet(extra) {
		t.Fatalf("the limits' notification %q: %d, key freed %v, limits set %v, %v; want a time and limits set",
			extra, ms, freed, LimitsSet(extra), err)
	}
	// A start's says nothing of limits.
	if err := InsertManyRuns(ctx, pool, ManyRuns{Namespace: "default", WorkflowType: "wf", IDs: []uuid.UUID{uuid.Must(uuid.NewV7())},
		Inputs: [][]byte{[]byte(`1`)}, Carriers: make([][]byte, 1)}); err != nil {
		t.Fatal(err)
	}
	if extra := wakeExtraOf(t, listener, "the start"); LimitsSet(extra) {
		t.Fatalf("a start's notification %q says limits were set", extra)
	}
}
