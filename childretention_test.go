package kagzi_test

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/kagzi/kagzi"
)

var (
	retainedChild = kagzi.Define("retained-child", func(ctx *kagzi.Context, n int) (int, error) {
		if err := ctx.Sleep("period", 700*time.Millisecond); err != nil {
			return n, err
		}
		if n < 0 || n >= 6 {
			return n, nil
		}
		return n, kagzi.ContinueAsNew(ctx, n+1)
	})
	// The parent waits on a child that continues as new while its first runs pass
	// the retention.
	waitsOnAChain = kagzi.Define("waits-on-a-chain", func(ctx *kagzi.Context, _ int) (string, error) {
		ch, err := kagzi.StartChild(ctx, "c", retainedChild, 0)
		if err != nil {
			return "", err
		}
		n, err := ch.Get()
		return fmt.Sprintf("child ended with %d", n), err
	})
	// The parent asks for its child's result only after the child's record is gone.
	asksTooLate = kagzi.Define("asks-too-late", func(ctx *kagzi.Context, _ int) (string, error) {
		ch, err := kagzi.StartChild(ctx, "c", retainedChild, -1) // ends after one period
		if err != nil {
			return "", err
		}
		if err := ctx.Sleep("long", 6*time.Second); err != nil {
			return "", err
		}
		if _, err := ch.Get(); !errors.Is(err, kagzi.ErrNotFound) {
			return "", fmt.Errorf("Get of a child whose record is gone: %v, want ErrNotFound", err)
		}
		return "the child's record is gone", nil
	})
)

// A parent's ChildRun.Get of a child whose first run the retention removed reads the
// result of the child's chain by its workflow id, and of a child whose whole record is
// gone returns ErrNotFound to the workflow (found from outside: both parents stayed
// RUNNING for ever, retrying "not found" once a second, and could not be cancelled).
func TestAChildRunGetAfterTheRetentionRemovedTheChildsRecordEnds(t *testing.T) {
	e := newEnv(t)
	c, err := kagzi.NewClient(e.pool, kagzi.Config{Logger: quietLogger(), Retention: 2 * time.Second, ArchiveAfter: -1})
	if err != nil {
		t.Fatal(err)
	}
	cfg := fastWorker()
	cfg.PruneInterval = 200 * time.Millisecond
	runWorker(t, c, cfg, retainedChild, waitsOnAChain, asksTooLate)
	ctx := waitCtx(t)
	chain, err := kagzi.Start(ctx, c, waitsOnAChain, 0)
	if err != nil {
		t.Fatal(err)
	}
	late, err := kagzi.Start(ctx, c, asksTooLate, 0)
	if err != nil {
		t.Fatal(err)
	}
	if out, err := chain.Wait(ctx); err != nil || out != "child ended with 6" {
		t.Fatalf("the parent of a continued child: %q, %v; want the chain's last result", out, err)
	}
	if out, err := late.Wait(ctx); err != nil || out != "the child's record is gone" {
		t.Fatalf("the parent asking too late: %q, %v", out, err)
	}
}
