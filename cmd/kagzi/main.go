// Command kagzi is the operators' tool for Kagzi: it migrates the schema, lists and
// shows runs with their step timelines, cancels runs, lists workers, manages cron
// schedules and flow-control limits, checks health, and serves the read-only admin gRPC
// API and the operator console (ui).
//
//	kagzi migrate [up|status]
//	kagzi runs list [--status S,...] [--workflow-type T,...] [--workflow-id ID] [--workflow-id-prefix P] [--schedule ID]
//		[--parent RUN_ID | --root-only] [--error-code C] [--attr K=V]... [--oldest-first] [--payloads]
//		[--limit N] [--page-token T] [--all]
//	kagzi runs show RUN_ID | --workflow-id ID
//	kagzi runs cancel RUN_ID
//	kagzi runs retry RUN_ID
//	kagzi runs fork RUN_ID STEP_KEY [--input JSON]
//	kagzi workers list [--status S,...] [--type T] [--limit N] [--page-token T]
//	kagzi schedules list [--type T] [--paused|--active] [--limit N] [--page-token T]
//	kagzi schedules show|pause|resume|trigger SCHEDULE_ID
//	kagzi limits list | get TYPE | delete TYPE
//	kagzi limits set TYPE [--concurrency N] [--key-concurrency N] [--rate N --rate-period D] [--key-rate N --key-rate-period D]
//	kagzi health
//	kagzi serve-admin [--addr HOST:PORT] [--all-namespaces | --namespaces A,B] [--tls-cert F --tls-key F] [--client-ca F] [--insecure]
//	kagzi ui [--addr HOST:PORT] [--actions] [--hide-payloads] [--all-namespaces | --namespaces A,B] [--tls-cert F --tls-key F] [--insecure]
//	kagzi version
//
// Every command takes --dsn (default: $KAGZI_DATABASE_URL, then $DATABASE_URL),
// --namespace / -n (default: $KAGZI_NAMESPACE, then "default") and --json, which
// prints JSON instead of human tables. Flags may come before or after arguments.
//
// Exit status: 0 on success, 1 when the command failed (a run that does not exist, a
// database error, an unhealthy report from kagzi health), 2 for a usage error: an
// unknown command or flag, or a flag value found wrong without asking the database (a
// bad --status, --parent, --page-token, --limit or time; see refusedUnasked).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"slices"
	"strings"
	"syscall"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/kagzi/kagzi"
)

const usage = `kagzi - operate Kagzi durable workflows

Usage:
  kagzi migrate [up|status]             apply the schema migrations (default: up), or show the version
  kagzi runs list [filters]             list runs, newest first
        --status S,...  --workflow-type T,...  --workflow-id ID  --workflow-id-prefix P  --schedule ID
        --parent RUN_ID | --root-only  --error-code CODE  --attr KEY=VALUE (repeatable; VALUE is JSON or a string)
        --created-after T  --created-before T  --oldest-first  --payloads (input and output, with --json)
        --limit N  --page-token T  --all
  kagzi runs show RUN_ID                show a run and its step timeline (attempts, errors)
  kagzi runs show --workflow-id ID      ... of a workflow id (its active run, else its newest)
  kagzi runs cancel RUN_ID              cancel a run
  kagzi runs rerun RUN_ID               rerun a FAILED or CANCELLED run from its failed step (alias: retry)
  kagzi runs fork RUN_ID STEP_KEY       start a copy of a run from one of its steps [--input JSON]
  kagzi workers list [filters]          list the worker registry
        --status S,...  --workflow-type T  --limit N  --page-token T
  kagzi schedules list [filters]        list cron schedules
        --workflow-type T  --paused | --active  --limit N  --page-token T
  kagzi schedules show ID               show a schedule
  kagzi schedules pause ID              stop a schedule from firing
  kagzi schedules resume ID             resume it (no back-fill of missed ticks)
  kagzi schedules trigger ID            fire one extra run of it now
  kagzi limits list                     list the flow-control limits of the namespace's workflow types
  kagzi limits get TYPE                 show a workflow type's limits
  kagzi limits set TYPE [limits]        set (replace) a type's limits; they apply from every worker's next claim
        --concurrency N  --key-concurrency N  --rate N --rate-period D  --key-rate N --key-rate-period D
  kagzi limits delete TYPE              remove a type's limits
  kagzi health                          check the database, the schema and work no live worker can take
                                        (exit status 1 when unhealthy)
  kagzi serve-admin [options]           serve the read-only admin gRPC API (kagzi.v1.AdminService)
        --addr HOST:PORT (default 127.0.0.1:50051)
        --all-namespaces | --namespaces A,B   namespaces served besides --namespace
        --tls-cert FILE --tls-key FILE        serve TLS
        --client-ca FILE                      accept client certificates signed by this CA (mTLS)
        bearer token: $KAGZI_ADMIN_TOKEN (or --token)
        --insecure                            allow an address other than loopback without a token or TLS
        (an address other than 127.0.0.0/8, ::1 or localhost, e.g. :50051, needs a token or TLS)
  kagzi ui [options]                    serve the operator console (a web UI) in a browser
        --addr HOST:PORT (default 127.0.0.1:8080)
        --actions                             allow cancel, rerun, fork, signal, schedules, bulk (each recorded)
        --hide-payloads                       show inputs, outputs and signal payloads only by size
        --all-namespaces | --namespaces A,B   namespaces served besides --namespace
        --tls-cert FILE --tls-key FILE        serve HTTPS
        token: $KAGZI_UI_TOKEN (or --token), the Basic password (the user name is recorded) or a Bearer token
        --insecure                            allow an address other than loopback without a token
  kagzi version                         print the versions

(--type is accepted for --workflow-type.)

Flags of every command:
  --dsn URL          PostgreSQL URL (default $KAGZI_DATABASE_URL, then $DATABASE_URL)
  -n, --namespace NS namespace (default $KAGZI_NAMESPACE, then "default")
  --json             print JSON instead of tables
`

// pageSize checks a --limit: 1..1000, as its help says (the library would read 0
// as its default of 50, and refuse more than 1000 as a failed command).
func pageSize(n int) (int, error) {
	if n < 1 || n > 1000 {
		return 0, usagef("--limit %d is not within 1..1000", n)
	}
	return n, nil
}

// usageError is a mistake in the command line: exit status 2.
type usageError struct{ msg string }

func (e *usageError) Error() string { return e.msg }

func usagef(format string, args ...any) error {
	return &usageError{msg: fmt.Sprintf(format, args...)}
}

// common holds the flags every command takes.
type common struct {
	dsn       string
	namespace string
	json      bool
}

func (c *common) register(fs *flag.FlagSet) {
	fs.StringVar(&c.dsn, "dsn", c.dsn, "PostgreSQL URL")
	fs.StringVar(&c.namespace, "namespace", c.namespace, "namespace")
	fs.StringVar(&c.namespace, "n", c.namespace, "namespace (shorthand)")
	fs.BoolVar(&c.json, "json", c.json, "print JSON")
}

// app is one invocation of the tool.
type app struct {
	common
	stdout, stderr io.Writer
	getenv         func(string) string
}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr, os.Getenv)
	stop()
	os.Exit(code)
}

// run executes the command line args and returns the exit status.
func run(ctx context.Context, args []string, stdout, stderr io.Writer, getenv func(string) string) int {
	a := &app{stdout: stdout, stderr: stderr, getenv: getenv}
	a.namespace = getenv("KAGZI_NAMESPACE")
	if a.namespace == "" {
		a.namespace = kagzi.DefaultNamespace
	}
	err := a.dispatch(ctx, args)
	var ue *usageError
	switch {
	case err == nil:
		return 0
	case errors.Is(err, flag.ErrHelp):
		return 0
	case errors.As(err, &ue):
		fmt.Fprintf(stderr, "kagzi: %v\n\nRun 'kagzi help' for usage.\n", err)
		return 2
	default:
		fmt.Fprintf(stderr, "kagzi: %s\n", strings.TrimPrefix(err.Error(), "kagzi: "))
		return 1
	}
}

func (a *app) dispatch(ctx context.Context, args []string) error {
	// Flags before the command.
	fs := a.flagSet("kagzi")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			fmt.Fprint(a.stdout, usage)
			return err
		}
		return usagef("%v", err)
	}
	args = fs.Args()
	if len(args) == 0 {
		fmt.Fprint(a.stderr, usage)
		return usagef("no command")
	}
	cmd, args := args[0], args[1:]
	sub := ""
	if len(args) > 0 && !strings.HasPrefix(args[0], "-") {
		sub = args[0]
	} else if i := slices.IndexFunc(args, func(a string) bool { return slices.Contains(subcommands[cmd], a) }); i > 0 {
		// Flags before the subcommand ("runs --json list"): flags may come anywhere.
		sub = args[i]
		args = append([]string{sub}, slices.Delete(slices.Clone(args), i, i+1)...)
	}
	switch cmd {
	case "help", "-h", "--help":
		fmt.Fprint(a.stdout, usage)
		return nil
	case "version":
		return a.version(args)
	case "migrate":
		if sub != "" {
			args = args[1:]
		}
		return a.migrate(ctx, sub, args)
	case "runs":
		args = dropFirst(args, sub)
		switch sub {
		case "list":
			return a.runsList(ctx, args)
		case "show":
			return a.runsShow(ctx, args)
		case "cancel":
			return a.runsCancel(ctx, args)
		case "rerun", "retry":
			return a.runsRerun(ctx, args)
		case "fork":
			return a.runsFork(ctx, args)
		}
		return usagef("runs: want list, show, cancel, rerun or fork, got %q", sub)
	case "workers":
		args = dropFirst(args, sub)
		if sub == "list" {
			return a.workersList(ctx, args)
		}
		return usagef("workers: want list, got %q", sub)
	case "schedules":
		args = dropFirst(args, sub)
		switch sub {
		case "list":
			return a.schedulesList(ctx, args)
		case "show", "pause", "resume", "trigger":
			return a.scheduleAction(ctx, sub, args)
		}
		return usagef("schedules: want list, show, pause, resume or trigger, got %q", sub)
	case "limits":
		return a.limits(ctx, sub, dropFirst(args, sub))
	case "health":
		return a.health(ctx, args)
	case "serve-admin":
		return a.serveAdmin(ctx, args)
	case "ui":
		return a.serveUI(ctx, args)
	}
	return usagef("unknown command %q", cmd)
}

// subcommands are the words each command takes as its subcommand.
var subcommands = map[string][]string{
	"migrate":   {"up", "status", "down"},
	"runs":      {"list", "show", "cancel", "rerun", "retry", "fork"},
	"workers":   {"list"},
	"schedules": {"list", "show", "pause", "resume", "trigger"},
	"limits":    {"set", "get", "show", "list", "delete"},
}

func dropFirst(args []string, sub string) []string {
	if sub != "" {
		return args[1:]
	}
	return args
}

// workflowTypeFlag defines --workflow-type, with --type as its short alias.
func workflowTypeFlag(fs *flag.FlagSet, usage string) *string {
	typ := new(string)
	fs.StringVar(typ, "workflow-type", "", usage)
	fs.StringVar(typ, "type", "", "alias of --workflow-type")
	return typ
}

// flagSet returns a flag set with the common flags; its errors are returned, not
// printed and exited on.
func (a *app) flagSet(name string) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	a.register(fs)
	return fs
}

// parse parses flags and positional arguments in any order and checks the number of
// positional arguments is within min..max.
func (a *app) parse(fs *flag.FlagSet, args []string, minArgs, maxArgs int) ([]string, error) {
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				fmt.Fprint(a.stdout, usage)
				return nil, err
			}
			return nil, usagef("%s: %v", fs.Name(), err)
		}
		args = fs.Args()
		if len(args) == 0 {
			break
		}
		pos = append(pos, args[0])
		args = args[1:]
	}
	if len(pos) < minArgs || len(pos) > maxArgs {
		switch {
		case maxArgs == 0:
			return nil, usagef("%s takes no arguments, got %q", fs.Name(), pos)
		case minArgs == maxArgs:
			return nil, usagef("%s takes %d argument(s), got %d", fs.Name(), minArgs, len(pos))
		}
		return nil, usagef("%s takes %d to %d arguments, got %d", fs.Name(), minArgs, maxArgs, len(pos))
	}
	return pos, nil
}

// dsnURL returns the database URL: --dsn, else $KAGZI_DATABASE_URL, else $DATABASE_URL.
func (a *app) dsnURL() (string, error) {
	if a.dsn != "" {
		return a.dsn, nil
	}
	for _, v := range []string{"KAGZI_DATABASE_URL", "DATABASE_URL"} {
		if u := a.getenv(v); u != "" {
			return u, nil
		}
	}
	return "", errors.New("no database: pass --dsn or set KAGZI_DATABASE_URL (or DATABASE_URL)")
}

// connect opens a pool on the database and a client in the namespace.
func (a *app) connect(ctx context.Context) (*pgxpool.Pool, *kagzi.Client, error) {
	u, err := a.dsnURL()
	if err != nil {
		return nil, nil, err
	}
	if a.namespace == "" {
		// Given empty (-n "$UNSET"): not quietly the default namespace.
		return nil, nil, usagef("empty namespace: leave --namespace out for %q", kagzi.DefaultNamespace)
	}
	pool, err := pgxpool.New(ctx, u)
	if err != nil {
		return nil, nil, fmt.Errorf("database: %w", err)
	}
	client, err := kagzi.NewClient(pool, kagzi.Config{Namespace: a.namespace, Logger: a.logger()})
	if err != nil {
		pool.Close()
		if errors.Is(err, kagzi.ErrInvalidArgument) { // a namespace that is no valid name
			return nil, nil, usagef("%s", strings.TrimPrefix(err.Error(), "kagzi: "))
		}
		return nil, nil, err
	}
	return pool, client, nil
}

// namespaceList splits a --namespaces value and refuses, as a usage error, an item
// that is no valid namespace (the library's check: a client of it cannot be made).
func (a *app) namespaceList(cmd string, pool *pgxpool.Pool, value string) ([]string, error) {
	list := splitList(value)
	for _, ns := range list {
		c, err := kagzi.NewClient(pool, kagzi.Config{Namespace: ns, Logger: a.logger()})
		if err != nil {
			return nil, usagef("%s: --namespaces: %s", cmd, strings.TrimPrefix(err.Error(), "kagzi: "))
		}
		c.Close()
	}
	return list, nil
}

// logger writes warnings and errors to stderr.
func (a *app) logger() *slog.Logger {
	return slog.New(slog.NewTextHandler(a.stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
}

func (a *app) version(args []string) error {
	if _, err := a.parse(a.flagSet("version"), args, 0, 0); err != nil {
		return err
	}
	v := map[string]string{"kagzi": kagzi.Version, "api": "kagzi.v1"}
	if a.json {
		return a.printJSON(v)
	}
	fmt.Fprintf(a.stdout, "kagzi %s (admin API %s)\n", v["kagzi"], v["api"])
	return nil
}
