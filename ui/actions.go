package ui

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"unicode/utf8"

	"github.com/google/uuid"

	"github.com/kagzi/kagzi"
	"github.com/kagzi/kagzi/internal/store"
)

// actionFunc takes an action and returns where to send the browser (relative to
// the console's root), or a page to render instead.
type actionFunc func(q *req, a Action) (to string, err error)

// post registers an action: the Action is the path's {action} (or the form's, for
// bulk actions), which Authorize must allow, and the form must carry the session's
// CSRF token.
func (c *console) post(pattern string, f actionFunc) {
	c.mux.HandleFunc(pattern, func(w http.ResponseWriter, r *http.Request) {
		r.Body = http.MaxBytesReader(w, r.Body, maxFormBytes)
		if err := r.ParseForm(); err != nil {
			// Read here, so that a form over the cap says so rather than looking like
			// a form without its CSRF token (the cap leaves it empty).
			var tooBig *http.MaxBytesError
			if errors.As(err, &tooBig) {
				err = fmt.Errorf("%w: the form is larger than %d MiB", errTooLarge, maxFormBytes>>20)
			} else {
				err = badRequest("unreadable form: %v", err)
			}
			c.fail(w, r, nil, err)
			return
		}
		a := Action(r.PathValue("action"))
		if a == "" {
			a = Action("bulk-" + r.PostFormValue("action"))
		}
		if !knownActions[a] {
			c.fail(w, r, nil, badRequest("unknown action %q", a))
			return
		}
		q, err := c.open(w, r, a)
		if err == nil {
			err = c.checkCSRF(r)
		}
		if err != nil {
			c.fail(w, r, q, err)
			return
		}
		to, err := f(q, a)
		switch {
		case err != nil:
			c.fail(w, r, q, err)
		case to != "":
			redirect(w, r, to)
		}
	})
}

// maxFormBytes bounds an action's form (a signal's payload is the largest part).
const maxFormBytes = 2 << 20

// errTooLarge is a form over maxFormBytes.
var errTooLarge = errors.New("request too large")

var knownActions = map[Action]bool{ActionCancel: true, ActionRerun: true, ActionFork: true, ActionSignal: true,
	ActionPauseSchedule: true, ActionResumeSchedule: true, ActionTrigger: true, ActionBulkCancel: true, ActionBulkRerun: true}

func badRequest(format string, args ...any) error {
	return fmt.Errorf("%w: %s", kagzi.ErrInvalidArgument, fmt.Sprintf(format, args...))
}

// audited records an action in kagzi.console_audit before it runs (so that one cut
// short still shows), runs it, and completes the record with its outcome. An action
// that cannot be recorded does not run.
func (c *console) audited(q *req, a Action, target string, runIDs []string, detail map[string]any,
	do func() (moreRunIDs []string, count int64, result map[string]any, err error)) error {
	ctx := q.r.Context()
	// Text PostgreSQL cannot store (a NUL, bytes that are not UTF-8) is the request's
	// fault (or the Authorize hook's name for the caller): refused before anything is
	// recorded or done.
	if err := storableText(map[string]any{"caller": q.who, "target": target, "detail": detail}); err != nil {
		return err
	}
	entry := store.AuditEntry{Namespace: q.ns, Who: q.who, Action: string(a), Target: target,
		RunIDs: uuids(runIDs), RunCount: int64(len(runIDs))}
	entry.Detail = jsonObject(detail)
	id, err := store.BeginAudit(ctx, q.pool, entry)
	if err != nil {
		return fmt.Errorf("recording the action in the audit log: %w", err)
	}
	q.auditID = id
	more, n, result, actErr := do()
	outcome := "ok"
	if actErr != nil {
		outcome = actErr.Error()
	}
	var ids []uuid.UUID
	if more != nil {
		ids = append(uuids(runIDs), uuids(more)...)
	}
	res := jsonObject(result)
	// The action is done: record its outcome even if the request was cancelled meanwhile.
	if err := store.EndAudit(context.WithoutCancel(ctx), q.pool, id, outcome, ids, max(n, int64(len(ids))), res); err != nil {
		c.opts.Logger.Error("kagzi console: recording an action's outcome", "audit_id", id, "error", err)
	}
	return actErr
}

// storableText refuses a string in v (in maps and slices too) that PostgreSQL cannot
// store as text: with a NUL, or not UTF-8.
func storableText(v any) error {
	switch x := v.(type) {
	case string:
		if !utf8.ValidString(x) || strings.ContainsRune(x, 0) {
			return badRequest("%q is not text the console can record (a NUL byte, or not UTF-8)", x)
		}
	case []string:
		for _, s := range x {
			if err := storableText(s); err != nil {
				return err
			}
		}
	case []any:
		for _, e := range x {
			if err := storableText(e); err != nil {
				return err
			}
		}
	case map[string]any:
		for k, e := range x {
			if err := storableText(k); err != nil {
				return err
			}
			if err := storableText(e); err != nil {
				return err
			}
		}
	case url.Values:
		for k, e := range x {
			if err := storableText(k); err != nil {
				return err
			}
			if err := storableText(e); err != nil {
				return err
			}
		}
	}
	return nil
}

// jsonObject encodes an action's detail: "{}" for none.
func jsonObject(m map[string]any) []byte {
	if len(m) == 0 {
		return []byte("{}")
	}
	b, err := json.Marshal(m)
	if err != nil {
		return []byte("{}")
	}
	return b
}

func uuids(ids []string) []uuid.UUID {
	out := make([]uuid.UUID, 0, len(ids))
	for _, s := range ids {
		if id, err := uuid.Parse(s); err == nil {
			out = append(out, id)
		}
	}
	return out
}

// runAction cancels, reruns, forks or signals the run of the path.
func (c *console) runAction(q *req, a Action) (string, error) {
	ctx, id := q.r.Context(), q.r.PathValue("id")
	if _, err := uuid.Parse(id); err != nil {
		return "", badRequest("run id %q is not a UUID", id)
	}
	to := q.base() + "runs/" + url.PathEscape(id) + "?done=" + string(a)
	var err error
	switch a {
	case ActionCancel:
		err = c.audited(q, a, id, []string{id}, nil, func() ([]string, int64, map[string]any, error) {
			return nil, 1, nil, q.client.Cancel(ctx, id)
		})
	case ActionRerun:
		err = c.audited(q, a, id, []string{id}, nil, func() ([]string, int64, map[string]any, error) {
			return nil, 1, nil, q.client.Rerun(ctx, id)
		})
	case ActionFork:
		return c.fork(q, id)
	case ActionSignal:
		err = c.signal(q, id)
	default:
		return "", badRequest("%s is not an action on a run", a)
	}
	return to, err
}

func (c *console) fork(q *req, id string) (string, error) {
	step := strings.TrimSpace(q.r.PostFormValue("step"))
	input := strings.TrimSpace(q.r.PostFormValue("input"))
	if step == "" {
		return "", badRequest("fork: choose the step to fork from")
	}
	opts := kagzi.ForkOptions{}
	if input != "" {
		if !json.Valid([]byte(input)) {
			return "", badRequest("fork: the input is not valid JSON")
		}
		opts.Input = json.RawMessage(input)
	}
	var forked string
	err := c.audited(q, ActionFork, id, []string{id}, map[string]any{"step": step, "new_input": input != ""},
		func() ([]string, int64, map[string]any, error) {
			run, err := q.client.Fork(q.r.Context(), id, step, opts)
			if err != nil {
				return nil, 1, nil, err
			}
			forked = run.RunID
			return []string{run.RunID}, 2, map[string]any{"fork": run.RunID}, nil
		})
	if err != nil {
		return "", err
	}
	return q.base() + "runs/" + url.PathEscape(forked) + "?done=fork", nil
}

func (c *console) signal(q *req, id string) error {
	name := strings.TrimSpace(q.r.PostFormValue("name"))
	body := strings.TrimSpace(q.r.PostFormValue("payload"))
	if body == "" {
		body = "null"
	}
	if !json.Valid([]byte(body)) {
		return badRequest("signal: the payload is not valid JSON")
	}
	if name == "" {
		return badRequest("signal: name the signal") // before the audit, as the payload's check
	}
	return c.audited(q, ActionSignal, id, []string{id}, map[string]any{"signal": name},
		func() ([]string, int64, map[string]any, error) {
			return nil, 1, nil, q.client.Signal(q.r.Context(), id, name, json.RawMessage(body))
		})
}

// scheduleAction pauses, resumes or triggers the schedule of the path.
func (c *console) scheduleAction(q *req, a Action) (string, error) {
	ctx, id := q.r.Context(), q.r.PathValue("id")
	if err := linkableSchedule(id); err != nil {
		return "", err
	}
	var do func() ([]string, int64, map[string]any, error)
	switch a {
	case ActionPauseSchedule:
		do = func() ([]string, int64, map[string]any, error) { return nil, 0, nil, q.client.PauseSchedule(ctx, id) }
	case ActionResumeSchedule:
		do = func() ([]string, int64, map[string]any, error) { return nil, 0, nil, q.client.ResumeSchedule(ctx, id) }
	case ActionTrigger:
		do = func() ([]string, int64, map[string]any, error) {
			run, err := q.client.TriggerSchedule(ctx, id)
			if err != nil {
				return nil, 0, nil, err
			}
			return []string{run.RunID}, 1, map[string]any{"run": run.RunID}, nil
		}
	default:
		return "", badRequest("%s is not an action on a schedule", a)
	}
	if err := c.audited(q, a, id, nil, map[string]any{"schedule": id}, do); err != nil {
		return "", err
	}
	back := q.r.PostFormValue("back")
	if back != "list" {
		return q.base() + "schedules/" + url.PathEscape(id) + "?done=" + string(a), nil
	}
	return q.base() + "schedules?done=" + string(a), nil
}

// errNoActions is the error of a bulk page the caller may not use.
var errNoActions = errors.New("bulk actions are not allowed here")
