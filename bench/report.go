package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"math"
	"os"
	"os/exec"
	"runtime"
	"runtime/debug"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// figure is a row of the table.
type figure struct {
	key    string
	label  string
	higher bool // higher is better
	prec   int  // decimals
}

func figures(p params) []figure {
	return []figure{
		{"burn1", fmt.Sprintf("1-step runs/s, burn-down of %d", p.n), true, 0},
		{"burn1rt", "  DB round trips per 1-step run (create + execute)", false, 2},
		{"burn3", fmt.Sprintf("3-step workflows/s, burn-down of %d", p.n), true, 0},
		{"burn3rt", "  DB round trips per 3-step workflow (create + execute)", false, 2},
		{"opendone", fmt.Sprintf("1-step runs/s completed while %d starters start runs back to back", p.starters), true, 0},
		{"openstart", "  runs/s started meanwhile", true, 0},
		{"steady", fmt.Sprintf("1-step runs/s, %d closed-loop starters (start, wait for the result)", p.starters), true, 0},
		{"steady50", "  start → result p50 under that load, ms", false, 2},
		{"steady99", "  start → result p99 under that load, ms", false, 2},
		{"first50", "start → first step p50, ms (sequential)", false, 2},
		{"first99", "start → first step p99, ms", false, 2},
		{"firstmax", "start → first step max, ms", false, 2},
		{"result50", "start → result p50, ms (3 steps; River: 1 job)", false, 2},
		{"result99", "start → result p99, ms", false, 2},
		{"resultmax", "start → result max, ms", false, 2},
		{"sleepall", fmt.Sprintf("%d runs sleeping %s, %d slots: all done after, s", p.sleepers, p.sleep, p.sleepSlots), false, 2},
		{"lag50", "  wake lag p50, ms", false, 1},
		{"lag99", "  wake lag p99, ms", false, 1},
		{"steprt", "DB round trips per new step", false, 2},
		{"stepms", "per-step overhead, sequential, ms", false, 3},
		{"idle", "idle statements/s per process, no work", false, 2},
	}
}

type cell struct {
	v    float64
	ok   bool
	note string
	err  string
}

type results struct {
	cols                  []string
	desc                  []string
	loadBefore, loadAfter string
	took                  time.Duration
	cells                 map[string]map[string]cell // column → figure key → value
	sections              []string                   // Markdown printed after the tables (the vacuum workload's)
}

func newResults() *results { return &results{cells: map[string]map[string]cell{}} }

func (r *results) set(col, key string, v float64, note string) {
	if r.cells[col] == nil {
		r.cells[col] = map[string]cell{}
	}
	r.cells[col][key] = cell{v: v, ok: true, note: note}
}

func (r *results) fail(col, workload string, err error) {
	if r.cells[col] == nil {
		r.cells[col] = map[string]cell{}
	}
	r.cells[col]["error:"+workload] = cell{err: err.Error()}
}

func (r *results) get(col, key string) cell { return r.cells[col][key] }

func printReport(ctx context.Context, w io.Writer, p params, r *results) {
	fmt.Fprintf(w, "## Kagzi vs DBOS Transact Go vs River, same PostgreSQL, same process\n\n")
	fmt.Fprintf(w, "machine: %s; Go %s; PostgreSQL %s\n", machine(), runtime.Version(), postgresVersion(ctx))
	fmt.Fprintf(w, "load average before: %s; after: %s; the run took %s\n", r.loadBefore, r.loadAfter, r.took.Round(time.Second))
	fmt.Fprintf(w, "modules: %s; kagzi tree: %s\n", versions(), tree())
	fmt.Fprintf(w, "sizes: burn-down %d runs (timeout %s); steady %s with %d starters; latency up to %d samples (budget %s); "+
		"%d sleepers × %s on %d slots; per-step %d steps × %d; idle %s; %d slots; %d connections per pool\n\n",
		p.n, p.burnTimeout, p.steadyFor, p.starters, p.latencySamples, p.latencyBudget,
		p.sleepers, p.sleep, p.sleepSlots, p.steps, p.stepReps, p.idleFor, p.slots, p.conns)

	for _, d := range r.desc {
		fmt.Fprintf(w, "- %s\n", d)
	}
	fmt.Fprintln(w)

	figs := append(figures(p), flowFigures()...)
	var notes []string
	noteRef := map[string]int{}
	ref := func(n string) string {
		if n == "" {
			return ""
		}
		i, ok := noteRef[n]
		if !ok {
			notes = append(notes, n)
			i = len(notes)
			noteRef[n] = i
		}
		return fmt.Sprintf(" [%d]", i)
	}

	// Figures.
	fmt.Fprintf(w, "| figure | %s |\n", strings.Join(r.cols, " | "))
	fmt.Fprintf(w, "| --- |%s\n", strings.Repeat(" ---: |", len(r.cols)))
	for _, f := range figs {
		row := []string{f.label}
		any := false
		for _, c := range r.cols {
			x := r.get(c, f.key)
			if !x.ok {
				row = append(row, "—")
				continue
			}
			any = true
			row = append(row, num(x.v, f.prec)+ref(x.note))
		}
		if any {
			fmt.Fprintf(w, "| %s |\n", strings.Join(row, " | "))
		}
	}

	// Ratios.
	var peers []string
	for _, c := range r.cols {
		if c != colKagzi {
			peers = append(peers, c)
		}
	}
	if _, ok := r.cells[colKagzi]; ok && len(peers) > 0 {
		fmt.Fprintf(w, "\nKagzi / peer (the same rows; ↑ higher is better for Kagzi, ↓ lower is better):\n\n")
		fmt.Fprintf(w, "| figure | %s |\n", strings.Join(peers, " | "))
		fmt.Fprintf(w, "| --- |%s\n", strings.Repeat(" ---: |", len(peers)))
		for _, f := range figs {
			k := r.get(colKagzi, f.key)
			if !k.ok {
				continue
			}
			arrow := "↓"
			if f.higher {
				arrow = "↑"
			}
			row := []string{strings.TrimSpace(f.label) + " " + arrow}
			any := false
			for _, c := range peers {
				x := r.get(c, f.key)
				if !x.ok || x.v == 0 {
					row = append(row, "—")
					continue
				}
				any = true
				row = append(row, ratio(k.v/x.v))
			}
			if any {
				fmt.Fprintf(w, "| %s |\n", strings.Join(row, " | "))
			}
		}
	}

	// Errors and notes.
	for _, c := range r.cols {
		for k, x := range r.cells[c] {
			if strings.HasPrefix(k, "error:") {
				notes = append(notes, fmt.Sprintf("%s, %s: failed: %s", c, strings.TrimPrefix(k, "error:"), x.err))
			}
		}
	}
	if len(notes) > 0 {
		fmt.Fprintln(w)
		for i, n := range notes {
			fmt.Fprintf(w, "[%d] %s\n", i+1, n)
		}
	}
	for _, s := range r.sections {
		fmt.Fprintf(w, "\n%s", s)
	}
}

func num(v float64, prec int) string {
	if math.IsInf(v, 0) || math.IsNaN(v) {
		return "—"
	}
	s := fmt.Sprintf("%.*f", prec, v)
	// Thousands separators for the integer part.
	intPart, frac, _ := strings.Cut(s, ".")
	neg := strings.HasPrefix(intPart, "-")
	intPart = strings.TrimPrefix(intPart, "-")
	var b strings.Builder
	for i, ch := range intPart {
		if i > 0 && (len(intPart)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(ch)
	}
	out := b.String()
	if neg {
		out = "-" + out
	}
	if frac != "" {
		out += "." + frac
	}
	return out
}

func ratio(x float64) string {
	switch {
	case x >= 100:
		return fmt.Sprintf("%.0f×", x)
	case x >= 10:
		return fmt.Sprintf("%.1f×", x)
	case x >= 0.01:
		return fmt.Sprintf("%.2f×", x)
	default:
		return fmt.Sprintf("%.4f×", x)
	}
}

func machine() string {
	model := ""
	if f, err := os.Open("/proc/cpuinfo"); err == nil {
		defer f.Close()
		s := bufio.NewScanner(f)
		for s.Scan() {
			if k, v, ok := strings.Cut(s.Text(), ":"); ok && strings.TrimSpace(k) == "model name" {
				model = strings.TrimSpace(v)
				break
			}
		}
	}
	mem := ""
	if b, err := os.ReadFile("/proc/meminfo"); err == nil {
		var kb int64
		if _, err := fmt.Sscanf(string(b), "MemTotal: %d kB", &kb); err == nil {
			mem = fmt.Sprintf(", %.0f GiB", float64(kb)/(1<<20))
		}
	}
	return fmt.Sprintf("%d cores %s%s, %s/%s", runtime.NumCPU(), model, mem, runtime.GOOS, runtime.GOARCH)
}

func postgresVersion(ctx context.Context) string {
	conn, err := pgx.Connect(ctx, serverURL())
	if err != nil {
		return "?"
	}
	defer conn.Close(context.Background())
	var v, sc string
	if err := conn.QueryRow(ctx, "SHOW server_version").Scan(&v); err != nil {
		return "?"
	}
	_ = conn.QueryRow(ctx, "SHOW synchronous_commit").Scan(&sc)
	return fmt.Sprintf("%s (synchronous_commit=%s)", v, sc)
}

func versions() string {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return "?"
	}
	want := []string{"github.com/dbos-inc/dbos-transact-golang", "github.com/riverqueue/river", "github.com/jackc/pgx/v5"}
	var out []string
	for _, m := range want {
		for _, d := range bi.Deps {
			if d.Path == m {
				out = append(out, m+" "+d.Version)
			}
		}
	}
	return strings.Join(out, ", ")
}

// loadavg returns the 1, 5 and 15 minute load averages of the machine.
func loadavg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "?"
	}
	return strings.Join(f[:3], " ")
}

// tree names the commit of the Kagzi tree the bench was built from (the parent
// directory), and how many paths outside bench/ differ from it.
func tree() string {
	head, err := exec.Command("git", "-C", "..", "log", "-1", "--format=%h %s").Output()
	if err != nil {
		return "?"
	}
	out := strings.TrimSpace(string(head))
	if st, err := exec.Command("git", "-C", "..", "status", "--porcelain").Output(); err == nil {
		n := 0
		for _, l := range strings.Split(string(st), "\n") {
			if l != "" && !strings.Contains(l, " bench/") {
				n++
			}
		}
		if n > 0 {
			out += fmt.Sprintf(" + %d uncommitted paths", n)
		}
	}
	return out
}
