package kagzi

import (
	"errors"
	"testing"
	"time"
)

// These tests need no database: they exercise the policy values alone.

func TestRetryInitialGreaterThanExplicitMaxIsInvalidInEitherOrder(t *testing.T) {
	for name, r := range map[string]Retry{
		"Initial then Max": Exponential(3).Initial(2 * time.Second).Max(time.Second),
		"Max then Initial": Exponential(3).Max(time.Second).Initial(2 * time.Second),
		"Linear then Max":  Linear(3, 2*time.Second).Max(time.Second),
		"default Initial":  Exponential(3).Max(500 * time.Millisecond), // 1s initial > 0.5s max
	} {
		if err := r.Err(); !errors.Is(err, ErrInvalidArgument) {
			t.Errorf("%s (%v): Err() = %v, want an error wrapping ErrInvalidArgument", name, r, err)
		}
	}
}

func TestRetryInitialNotAboveExplicitMaxStaysValid(t *testing.T) {
	for name, r := range map[string]Retry{
		"equal":            Exponential(3).Initial(time.Second).Max(time.Second),
		"below":            Exponential(3).Max(30 * time.Second).Initial(time.Second),
		"Max raised later": Exponential(3).Initial(2 * time.Second).Max(time.Second).Max(3 * time.Second),
	} {
		if err := r.Err(); err != nil {
			t.Errorf("%s (%v): Err() = %v, want nil", name, r, err)
		}
	}
}

func TestRetryInitialAboveTheDefaultCapWithoutMaxRaisesTheCap(t *testing.T) {
	r := Exponential(3).Initial(10 * time.Minute).Jitter(0)
	if err := r.Err(); err != nil {
		t.Fatalf("Err() = %v, want nil", err)
	}
	for attempt := 1; attempt <= 2; attempt++ {
		if d, ok := r.next(attempt, &ErrorDetail{}); !ok || d != 10*time.Minute {
			t.Fatalf("wait after attempt %d = %v, %v; want 10m (the cap rises to the initial interval)", attempt, d, ok)
		}
	}
	// Lowering the initial interval again brings the default 5 minute cap back.
	r = r.Initial(4 * time.Minute)
	if d, _ := r.next(2, &ErrorDetail{}); d != 5*time.Minute {
		t.Fatalf("wait after attempt 2 = %v, want the default 5m cap", d)
	}
}

func TestLinearWaitsItsIntervalEvenAboveTheDefaultCap(t *testing.T) {
	for _, d := range []time.Duration{100 * time.Millisecond, 5 * time.Minute, time.Hour} {
		r := Linear(4, d)
		if err := r.Err(); err != nil {
			t.Fatalf("Linear(4, %v).Err() = %v, want nil", d, err)
		}
		for attempt := 1; attempt <= 3; attempt++ {
			if got, ok := r.next(attempt, &ErrorDetail{}); !ok || got != d {
				t.Fatalf("Linear(4, %v): wait after attempt %d = %v, %v; want %v", d, attempt, got, ok, d)
			}
		}
		if _, ok := r.next(4, &ErrorDetail{}); ok {
			t.Fatalf("Linear(4, %v) retried after the 4th attempt", d)
		}
	}
}

func TestAWaitPastWhatADurationHoldsIsTheLongestWaitNotNone(t *testing.T) {
	for name, r := range map[string]Retry{
		"Linear at MaxInt64":           Linear(3, time.Duration(1<<63-1)),
		"jittered up past MaxInt64":    Exponential(3).Initial(1 << 62).Max(time.Duration(1<<63 - 1)).Jitter(1),
		"exponential past the maximum": Exponential(5).Initial(1 << 62).Max(time.Duration(1<<63 - 1)),
	} {
		if err := r.Err(); err != nil {
			t.Fatalf("%s: Err() = %v", name, err)
		}
		for range 20 { // jitter draws
			if d, ok := r.next(2, &ErrorDetail{}); !ok || d <= 0 {
				t.Fatalf("%s: wait after attempt 2 = %v, %v; want a long positive wait", name, d, ok)
			}
		}
	}
}
