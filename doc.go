/*
Package kagzi is a durable workflow engine that runs inside your Go service, with
PostgreSQL as its only coordinator.

Define a workflow as a Go function made of steps, start runs of it from anywhere (also
inside your own pgx transaction), and run workers in the same process. Every process that
embeds Kagzi claims runs, memoizes step outputs, wakes sleepers and recovers the runs of
crashed processes through plain SQL: there is no server to deploy, no broker and no leader.

The guides in the repository's docs directory (https://github.com/kagzi/kagzi/tree/main/docs)
go further than this page; every part of the API also has a runnable example below.

# Quick start

	pool, _ := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	_ = kagzi.Migrate(ctx, pool) // the embedded goose migrations, schema "kagzi"
	client, _ := kagzi.NewClient(pool, kagzi.Config{})

	var Greet = kagzi.Define("greet", func(ctx *kagzi.Context, name string) (string, error) {
		return kagzi.Step(ctx, "compose", func(context.Context) (string, error) {
			return "hello " + name, nil
		})
	})

	worker, _ := kagzi.NewWorker(client, kagzi.WorkerConfig{}, Greet)
	go worker.Run(ctx) // until ctx ends; then it drains
	run, _ := kagzi.Start(ctx, client, Greet, "world", kagzi.WithID("greet-world"))
	out, _ := run.Wait(ctx) // "hello world"

# Guarantees

 1. A started run is never lost: it finishes, fails with a recorded error, or is
    cancelled, across worker crashes, restarts, lost connections and database restarts.
    A run held by a dead process is claimed again once its lease passes.
 2. A step's output is recorded at most once per step key and, once recorded, the step
    never runs again. A step body runs at least once; it runs again only if its process
    died (or lost its lease, or its claim was lost in a crash of PostgreSQL: see
    WorkerConfig.DurableClaims) before the output was recorded.
 3. A worker whose lease was taken over records nothing more for that run: every write is
    fenced by the lease epoch and the token it claimed the run with.
 4. A schedule fires exactly once per due time, however many processes run it.
 5. Nothing crosses namespaces: every read and write of a [Client] is confined to its
    namespace.

# Determinism

A run resumes (after a sleep, a crash, a restart) by calling the workflow function again
from the top; completed steps return their recorded output without running. Code between
steps must therefore make the same calls in the same order every time: put anything that
reads the clock, random numbers, the network or the database in a step. Call [Step],
[Context.Sleep] and the other durable calls only from the workflow's own goroutine (or a
branch's, see [Go]), never inside a step's body ([ErrInsideStep]). When a run must stop
running on this worker (a long sleep, a cancel, a lost lease, a shutdown), Kagzi unwinds
the workflow goroutine with runtime.Goexit from inside Step or Sleep: deferred calls run,
but no code after that call does, so the workflow cannot swallow the suspension by
mistake. (A runtime.Goexit of your own, from testing's FailNow say, fails the attempt as a
panic does.) A replay that asks for another step than the run's history holds fails the run
([ErrNonDeterministic]); see Evolution below for changing code under runs in flight.

# Workflows and steps

[Define] registers a function under a workflow type; its input and output round-trip
through encoding/json. [Start] starts a run and returns a [Run] whose [Run.Wait] returns
the typed result; [StartTx] starts one inside the caller's transaction, [Client.StartByName]
by type name, [StartMany] many in one statement. [WithID] makes a start idempotent: a
start of a workflow id whose run is active returns that run (AlreadyExists).
[RequireWorker] refuses to start a type no live worker registered ([ErrNoWorker]).
[RunOf] and [RunOfWorkflow] give a typed handle on a run from its run id or workflow id,
so another request or process waits for the result: POST starts, GET waits.

[Step] runs a function and records its output; a replay returns the output without
calling it. Names may repeat: the key is the name plus its occurrence ("send#1",
"send#2"). [Context.Sleep] is durable: its wake time is recorded, and a sleep longer than
[WorkerConfig].MaxInProcessSleep releases the run (SLEEPING, no slot held) until then.

	user, err := kagzi.Step(ctx, "fetch-user", func(ctx context.Context) (User, error) {
		return users.Get(ctx, id)
	}, kagzi.WithStepTimeout(10*time.Second))
	if err != nil {
		return Out{}, err
	}
	if err := ctx.Sleep("cool-down", 24*time.Hour); err != nil {
		return Out{}, err
	}

[Client.GetRun], [Client.ListRuns] and [Client.ListSteps] read runs and their step
timelines; [RunFilter] selects runs by status, types, workflow id or prefix, schedule,
parent, error code and attributes, in either order. [WithAttributes] gives a run
searchable attributes, which [Context.SetAttributes] changes durably from the workflow.
[Client.Cancel] cancels a run, [Client.CancelTx] inside the caller's transaction,
[Client.CancelWorkflow] the run of a workflow id (following a chain of ContinueAsNew).
[RunStatus] lists the statuses a run goes through; docs/state-machine.md draws every
move between them.

# Failures

A step that returns an error is retried per its [Retry] policy (step option [WithRetry],
else the workflow's [WithWorkflowRetry], else [WorkerConfig].DefaultRetry, else
[DefaultRetry]: 3 attempts). Every attempt is recorded. [NonRetryable], an [*Error] with
NonRetryable, or a code the policy lists stop the retries at once; [RetryAfter] sets the
next wait. A step that fails for good returns a [*StepError] built from the record, so a
replay returns the same error: branch on [ErrorCode].

	charge := kagzi.Exponential(5).Initial(time.Second).Max(30 * time.Second).NonRetryable("card_declined")
	_, err := kagzi.Step(ctx, "charge", chargeFn, kagzi.WithRetry(charge))
	if kagzi.ErrorCode(err) == "card_declined" {
		// ask for another card
	}

[WithStepTimeout] bounds each attempt; [WithDeadline] and [WithRunTimeout] bound a whole
run, which then fails with [ErrDeadlineExceeded] whatever it is doing. A run that failed
returns a [*WorkflowError] from Wait (errors.Is [ErrWorkflowFailed]). A database that
cannot be reached gives an [*UnavailableError] (errors.Is [ErrUnavailable]); starting again
with the same WithID is safe.

A [Saga] undoes what a failing workflow did: [Saga.Add] registers a compensation after
each step that needs one, and [Saga.Compensate] runs them in reverse order, each as a
memoized step ("compensate/<name>") with its own retry policy, and returns a [*SagaError]
for the workflow to fail with. A compensation that fails for good fails the run with
[CodeCompensationFailed] ([ErrCompensationFailed]); a cancelled run does not compensate.

	saga := kagzi.NewSaga(ctx)
	flight, err := kagzi.Step(ctx, "book-flight", bookFlight)
	if err != nil {
		return Trip{}, saga.Compensate(err)
	}
	if err := saga.Add("cancel-flight", cancelFlight(flight), kagzi.WithRetry(kagzi.Forever())); err != nil {
		return Trip{}, err
	}

# Workers

A [Worker] claims and executes runs of the workflow types it registered. [Worker.Run]
claims until its context ends, then stops claiming, waits up to DrainTimeout for running
workflows and hands the rest back to other processes. One heartbeat statement per worker
extends the leases of all its runs; a run whose worker died is taken over once its lease
passes, and a run taken over more than [WorkerConfig].MaxTakeovers times fails
([ErrRecoveryExhausted]). Every worker registers itself ([Client.ListWorkers]);
[Client.Health] reports the database, the schema version and this process's workers, for
probes.

	ctx, stop := signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
	defer stop()
	w, _ := kagzi.NewWorker(client, kagzi.WorkerConfig{MaxConcurrent: 50}, ProcessOrder)
	err := w.Run(ctx) // nil after a graceful drain

# Schedules

[Client.CreateSchedule] starts a workflow at every tick of a cron expression, in a time
zone. Every worker fires the due schedules of its namespace and PostgreSQL makes each tick
fire exactly once. [Schedule].MaxCatchup says which missed ticks fire after downtime,
[Schedule].Overlap what a tick does while an earlier run is active;
[Schedule.NextFireTimes] tells the coming ticks.

	_, err := client.CreateSchedule(ctx, kagzi.Schedule{
		ID: "daily-report", WorkflowType: "generate-report",
		Cron: "0 6 * * *", TimeZone: "America/New_York",
	})

# Composition

[Go] and [Map] run branches of a workflow concurrently, their steps keyed by call position,
so a replay runs only what had not completed; [Race] records the first success of several
functions. [StartChild] starts a child workflow (memoized) and [ChildRun.Get] waits for it
without holding a slot. [WaitSignal] waits durably for a [Client.Signal] ([SignalKey]
makes a retried signal count once); [Context.SetEvent]
publishes a value that callers read with [GetEvent] or wait for with [WaitEvent].

	approval, err := kagzi.WaitSignal[Approval](ctx, "approval", 72*time.Hour)
	// elsewhere: client.Signal(ctx, runID, "approval", Approval{By: "ada"})

# Evolution

[WithVersion] versions a definition: a worker claims only the versions it registered, so
old and new workers share a deploy. [Context.Patched] lets one function serve runs that
started before and after a change. [Client.Rerun] runs a failed or cancelled run again from
its failed step, [Client.Fork] starts a copy of a run from one of its steps. Finished runs
are pruned after [Config].Retention.

	if ctx.Patched("insure-parcels") {
		// the new step, for runs that reach this point under the new code
	}

# Observability

[Config].Hooks observe starts, executions, step attempts, sleeps, signals and claims; the
kagziotel package implements [Hooks] with OpenTelemetry traces (one trace per run, from the
request that started it) and metrics. Embed [NopHooks] to write your own. [Config].Logger
receives Kagzi's logs; payloads are never logged. [Config].Codec compresses or encrypts
every payload before it reaches PostgreSQL ([Codec]).

# Testing

The kagzitest package runs workflows in your tests against a real, freshly migrated
database, with a fake clock (a 30-day sleep takes milliseconds) and steps stubbed, failed
or crashed by name:

	env := kagzitest.New(t, Onboarding)
	env.StubStep("send-email", func(ctx context.Context, attempt int) (any, error) { return "sent", nil })
	out, err := kagzitest.Run(env, Onboarding, User{ID: "u1"})
*/
package kagzi
