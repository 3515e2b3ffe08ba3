package kagzi

import (
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/google/uuid"
)

// WorkerConfig configures a Worker. Zero fields take the defaults given.
type WorkerConfig struct {
	// ID names the worker in run leases (RunInfo.LockedBy). Default
	// "hostname/pid/random", unique per Worker. A fixed ID (a pod's name) must be
	// unique among running workers: a second running worker of the same client with
	// it is refused (Run returns ErrAlreadyExists); one in another process takes the
	// first one's runs when it registers, as after that one's death, and logs a
	// warning if that one was alive.
	ID string
	// MaxConcurrent is how many runs the worker executes at once, at most MaxLimit.
	// Default 10. A slot costs a goroutine (whose stack, up to 32 KB, stays while it
	// is idle) and nothing in the database; a worker claims up to its free slots in one
	// statement, so more slots make fewer, larger claims for runs that are short: a
	// burn-down of 1-step runs on a 2-core box went 1.2-1.4× faster with 300 slots than
	// with 100 (docs/performance.md).
	MaxConcurrent int
	// ClaimAhead is how many runs a claim may take beyond the free slots, to start
	// as slots free: with short runs, a claim finds free only the slots that ended
	// during the claim before, and many small claims cost the database more than
	// fewer large ones. A claim takes ahead at most as many runs as slots were freed
	// during the claim before (none while runs are long), and only runs of types
	// without flow limits. A run waiting for a slot is leased to the worker (RUNNING,
	// its lease renewed); it goes back to its place in the queue after 250 ms without
	// a slot, when the worker stops, or when its type's limits are set (SetLimits).
	// At most MaxConcurrent runs execute at once whatever this is. Default
	// MaxConcurrent; negative: none; at most MaxLimit.
	ClaimAhead int
	// LeaseDuration is how long a claim holds a run without a heartbeat. A run whose
	// worker stalls (or whose process died without its liveness lock being seen: see
	// ReapInterval) is claimed again once its lease passes. Default 10s; 100ms..24h.
	LeaseDuration time.Duration
	// HeartbeatInterval is how often the worker extends the leases of all its runs
	// in one statement. Default LeaseDuration/3; it must be shorter than LeaseDuration,
	// and 1ms or more.
	HeartbeatInterval time.Duration
	// PollInterval is how often an idle worker looks for work when no notification
	// arrives (a fallback: new runs, wake times and leases normally wake it through
	// LISTEN/NOTIFY and timers). Default 5s, or 1s when the client has no direct
	// connection (Config.DisableDirectConn): polling is then how it learns of runs
	// started or woken by other processes. 1ms or more.
	PollInterval time.Duration
	// DrainTimeout is how long Run waits, after its context is done, for running
	// workflows to finish before handing their runs back. Default 10s.
	DrainTimeout time.Duration
	// MaxInProcessSleep is the longest sleep that waits in process, holding its slot;
	// longer sleeps release the run until its wake time. Default 200ms.
	MaxInProcessSleep time.Duration
	// DisableScheduler keeps this worker out of firing cron schedules (see
	// CreateSchedule). By default every worker takes part; the database makes sure
	// each tick fires once however many do.
	DisableScheduler bool
	// Clock tells the scheduler the time. Default time.Now; tests inject their own
	// (with an injected clock the scheduler looks for due ticks every 100ms).
	Clock func() time.Time
	// DisableEagerStart makes the worker decline eager starts. By default a Start in
	// this worker's process, of a type it executes, when it has a free slot, inserts
	// the run already claimed for it, and the worker executes it at once, without the
	// notification and the claim in between (the run is leased and fenced as any other;
	// see docs/workers-in-production.md). Declined, such runs wait PENDING for a claim
	// by any worker, as they do when no slot is free.
	DisableEagerStart bool
	// DurableClaims makes the worker's claims wait until they are on disk before it
	// executes their runs. By default a claim commits without waiting for its WAL
	// flush (the claim loop of a busy worker waited for those flushes a sixth of its
	// time): nothing written under a claim can outlive it, since every such write waits
	// for its own flush, which puts the claim on disk first. What the default gives up:
	// a claim made in the last moments before a crash of PostgreSQL may be lost, its
	// runs claimed again after the restart while the lost claim's execution goes on
	// until its next write (which records nothing, see docs/workers-in-production.md),
	// so a step begun under it may run twice, as after a takeover.
	DurableClaims bool
	// ReapInterval is how often the worker looks for workers of its namespace whose
	// process died (their liveness lock was released with their connection) and makes
	// their runs claimable at once, instead of when their leases pass; the worker holds
	// its own liveness lock on its client's direct connection, the one it LISTENs on,
	// which all the client's workers share (see docs/workers-in-production.md).
	// Default DefaultReapInterval; negative: no liveness lock and no reaping (leases
	// alone govern). A client without a direct connection (Config.DisableDirectConn)
	// holds no liveness locks, whatever ReapInterval says. While no other worker of the
	// namespace reported runs in hand at its last heartbeat and this one has seen no
	// work (no claimed run, no notification of one) for a HeartbeatInterval, it looks
	// every IdleReapFactor × ReapInterval instead: an idle process's looks cost the
	// database a quarter of the statements. A positive ReapInterval is 10ms or more.
	ReapInterval time.Duration
	// DefaultRetry is the retry policy of the worker's steps and runs whose workflow
	// and step name none. Default: the library's DefaultRetry.
	DefaultRetry Retry
	// PruneInterval is how often the worker prunes finished runs past the client's
	// Retention (a few batches of 500 each time), moves those finished more than the
	// client's ArchiveAfter ago into the history, and drops the history's partitions
	// past the retention. Default 1 minute; 1ms or more.
	PruneInterval time.Duration
	// Labels are free-form facts about the worker (region, deployment, ...) recorded
	// in the worker registry. Keys are names (1-255 bytes of UTF-8 without control
	// characters); values are UTF-8 text without NUL characters.
	Labels map[string]string
	// Logger receives the worker's logs. Default: the client's logger.
	Logger *slog.Logger
	// MaxTakeovers is how many times a run may be taken over after its worker lost
	// the lease (the process died, froze or lost its database; RunInfo.Takeovers
	// counts them) before it is suspected of killing its process (os.Exit, an
	// out-of-memory kill, a crash in cgo), which would otherwise have it taken over
	// for ever. Every run executing in a process that dies is taken over, so the count
	// cannot tell that run from its neighbours. A run claimed with MaxTakeovers
	// takeovers or more therefore runs alone in the worker that claims it: the worker
	// holds it (leased) until nothing else executes in it, then runs it, claiming
	// nothing and taking no eager start meanwhile, and the run records so (a record
	// "kagzi#alone" among its steps). Taken over from that execution, having killed
	// its process alone, the run fails, without running again, with
	// CodeRecoveryExhausted (errors.Is ErrRecoveryExhausted); its neighbours, each
	// alone in its turn, complete, and a run that ran alone without dying runs as any
	// other until its next takeover. Hand-backs of a graceful shutdown are not
	// takeovers. Default DefaultMaxTakeovers; negative: no limit.
	//
	// A worker has one such run in flight at most (one executing for ten windows, see
	// below, no longer counts): the others its claims return go back to the queue for
	// other workers (parked for a window when the worker is busy, which spends their
	// type's rate limit again), except a descendant of one executing, which runs
	// beside it: a parent that waits in a branch for a child that kills its process
	// therefore fails with it. A step goroutine abandoned at its timeout counts as
	// executing until it returns.
	// Nothing waits for ever on such a run. A worker holding one claims nothing while
	// it waits for its runs to end, for at most three leases (at least 5 s); past
	// that, it claims again and starts the held run beside its runs (not recorded
	// alone). A run alone for that long (it may wait for children only this worker
	// would claim) is recorded as no longer alone, and the worker claims again. A run
	// whose step kills its process only after that window is failed when taken over
	// more than 2×MaxTakeovers+1 times in all; so is a run alone whose process froze
	// past its lease or lost its database. Alone means alone in its worker: other
	// workers of the same process go on, and a run one of them kills is not told
	// apart. Give code that can crash its process (cgo, unbounded memory) workers in
	// a process of its own.
	MaxTakeovers int
}

// maxLease is the longest WorkerConfig.LeaseDuration.
const maxLease = 24 * time.Hour

// DefaultMaxTakeovers is WorkerConfig.MaxTakeovers when none is given.
const DefaultMaxTakeovers = 5

// resolve fills in the defaults of the zero fields and checks the configuration.
func (cfg *WorkerConfig) resolve(client *Client) error {
	if cfg.ID == "" {
		host, _ := os.Hostname()
		cfg.ID = host + "/" + strconv.Itoa(os.Getpid()) + "/" + uuid.NewString()[:8]
	}
	if err := validName("worker id", cfg.ID); err != nil {
		return err
	}
	if cfg.MaxConcurrent == 0 {
		cfg.MaxConcurrent = 10
	}
	if cfg.ClaimAhead == 0 {
		cfg.ClaimAhead = cfg.MaxConcurrent
	}
	if cfg.LeaseDuration == 0 {
		cfg.LeaseDuration = 10 * time.Second
	}
	if cfg.HeartbeatInterval == 0 {
		cfg.HeartbeatInterval = cfg.LeaseDuration / 3
	}
	if cfg.PollInterval == 0 {
		cfg.PollInterval = 5 * time.Second
		if !client.notifier.Connects() {
			cfg.PollInterval = time.Second
		}
	}
	if cfg.DrainTimeout == 0 {
		cfg.DrainTimeout = 10 * time.Second
	}
	if cfg.MaxInProcessSleep == 0 {
		cfg.MaxInProcessSleep = 200 * time.Millisecond
	}
	if cfg.Logger == nil {
		cfg.Logger = client.logger
	}
	if cfg.Clock == nil {
		cfg.Clock = time.Now
	}
	if cfg.PruneInterval == 0 {
		cfg.PruneInterval = time.Minute
	}
	if cfg.MaxTakeovers == 0 {
		cfg.MaxTakeovers = DefaultMaxTakeovers
	}
	if cfg.ReapInterval == 0 {
		cfg.ReapInterval = DefaultReapInterval
	}
	for k, v := range cfg.Labels {
		if err := validName("label key", k); err != nil {
			return err
		}
		if !utf8.ValidString(v) || strings.ContainsRune(v, 0) {
			return invalidArgument("label %q: its value is not UTF-8 text without NUL characters", k)
		}
	}
	switch {
	case cfg.ReapInterval > 0 && cfg.ReapInterval < 10*time.Millisecond:
		return invalidArgument("ReapInterval %v is below 10ms", cfg.ReapInterval)
	case cfg.MaxConcurrent < 0 || cfg.MaxConcurrent > MaxLimit:
		return invalidArgument("MaxConcurrent %d is not within 0..%d", cfg.MaxConcurrent, MaxLimit)
	case cfg.ClaimAhead > MaxLimit:
		return invalidArgument("ClaimAhead %d is above %d", cfg.ClaimAhead, MaxLimit)
	case cfg.LeaseDuration < 100*time.Millisecond || cfg.LeaseDuration > maxLease:
		// Above maxLease the claim's tcp_user_timeout (milliseconds, an int) overflows.
		return invalidArgument("LeaseDuration %v is not within 100ms..%v", cfg.LeaseDuration, maxLease)
	case (cfg.PollInterval > 0 && cfg.PollInterval < time.Millisecond) ||
		(cfg.PruneInterval > 0 && cfg.PruneInterval < time.Millisecond) ||
		(cfg.HeartbeatInterval > 0 && cfg.HeartbeatInterval < time.Millisecond):
		// Each is a statement per interval: a nanosecond one is a busy loop.
		return invalidArgument("PollInterval %v, PruneInterval %v and HeartbeatInterval %v must each be 1ms or more",
			cfg.PollInterval, cfg.PruneInterval, cfg.HeartbeatInterval)
	case cfg.HeartbeatInterval <= 0 || cfg.HeartbeatInterval >= cfg.LeaseDuration:
		return invalidArgument("HeartbeatInterval %v must be positive and shorter than LeaseDuration %v",
			cfg.HeartbeatInterval, cfg.LeaseDuration)
	case cfg.PollInterval < 0 || cfg.DrainTimeout < 0 || cfg.MaxInProcessSleep < 0 || cfg.PruneInterval < 0:
		return invalidArgument("negative PollInterval, DrainTimeout, MaxInProcessSleep or PruneInterval")
	case cfg.DefaultRetry.Err() != nil:
		return fmt.Errorf("DefaultRetry: %w", cfg.DefaultRetry.Err())
	}
	return nil
}
