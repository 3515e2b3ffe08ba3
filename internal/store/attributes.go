package store

import (
	"context"
)

// AttributesWrite changes a run's searchable attributes from its workflow and records
// the step that did it.
type AttributesWrite struct {
	Fence
	StepKey  string
	Name     string
	Position int
	// Change is the call's argument, recorded as the step's output.
	Change []byte
	// Set is a JSON object of the keys to set; Remove the keys to remove.
	Set    []byte
	Remove []string
	// MaxBytes bounds the attributes once changed, as PostgreSQL prints the jsonb.
	MaxBytes int
}

// setAttributes changes a run's attributes (keys removed, then keys set) under its
// fence, unless the result would exceed @max_bytes, and records the step that did
// it, in one statement. A run left with no key has NULL attributes. It returns
// whether the fence held (owned) and whether the attributes were changed (fit).
//
// cur locks the run's row under the fence (as any UPDATE of it would: a claim, which
// skips locked rows, waits for none), so the merge starts from the row's newest
// version and the UPDATE that follows finds it unchanged.
var setAttributes = named(`
WITH cur AS (
	SELECT run_id, (coalesce(attributes, '{}'::jsonb) - @remove::text[]) || @set::jsonb AS merged
	FROM kagzi.runs
	WHERE run_id = @run_id AND lease_epoch = @epoch AND lease_token IS NOT DISTINCT FROM @token AND status = 'RUNNING'
	  AND `+slotHeldSQL+`
	FOR NO KEY UPDATE
), upd AS (
	UPDATE kagzi.runs r SET attributes = nullif(c.merged, '{}'::jsonb), updated_at = now()
	FROM cur c
	WHERE r.run_id = c.run_id AND octet_length(c.merged::text) <= @max_bytes
	RETURNING r.run_id
), step AS (
	INSERT INTO kagzi.steps (run_id, step_key, name, kind, status, output, attempts, position)
	SELECT run_id, @step_key, @name, 'ATTRIBUTES', 'COMPLETED', @change::jsonb, 1, @position FROM upd
	ON CONFLICT (run_id, step_key) DO NOTHING
)
SELECT (SELECT count(*) FROM cur), (SELECT count(*) FROM upd)`,
	append(fenceArgs[*AttributesWrite](),
		arg("step_key", "text", func(w *AttributesWrite) string { return w.StepKey }),
		arg("name", "text", func(w *AttributesWrite) string { return w.Name }),
		arg("position", "integer", func(w *AttributesWrite) int { return w.Position }),
		arg("change", "jsonb", func(w *AttributesWrite) []byte { return w.Change }),
		arg("set", "jsonb", func(w *AttributesWrite) []byte { return w.Set }),
		arg("remove", "text[]", func(w *AttributesWrite) []string {
			if w.Remove == nil {
				return []string{} // jsonb - NULL is NULL
			}
			return w.Remove
		}),
		arg("max_bytes", "integer", func(w *AttributesWrite) int { return w.MaxBytes }))...)

// SetAttributes changes a run's attributes; see setAttributes. It returns
// ErrLeaseLost when the fence no longer holds, and fit = false (nothing written)
// when the attributes would exceed MaxBytes.
func SetAttributes(ctx context.Context, db DBTX, w AttributesWrite) (fit bool, err error) {
	var owned, updated int
	if err := db.QueryRow(ctx, setAttributes.sql, setAttributes.args(&w)...).Scan(&owned, &updated); err != nil {
		return false, err
	}
	if owned == 0 {
		return false, ErrLeaseLost
	}
	return updated > 0, nil
}
