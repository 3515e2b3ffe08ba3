package kagzi

import (
	"bytes"
	"context"
	"encoding/json"
	"maps"
	"slices"
	"strings"

	"github.com/kagzi/kagzi/internal/store"
)

// MaxAttributesSize is the most bytes a run's attributes may take as JSON text (16
// KiB): WithAttributes checks the encoding of its map, Context.SetAttributes the
// run's attributes once changed, as PostgreSQL prints them (a space after each colon
// and comma). Beyond it they are ErrInvalidArgument, and nothing is written.
const MaxAttributesSize = 16 << 10

// attributesStepName is the step name of Context.SetAttributes calls.
const attributesStepName = "attributes"

// WithAttributes gives the run searchable attributes: keys and JSON values (an order
// id, a customer, a region) that RunFilter.Attributes selects runs by and RunInfo
// shows. A nil value leaves its key out. The workflow changes them with
// Context.SetAttributes.
//
// Attributes are not payloads: the payload codec (Config.Codec) does not apply to
// them, so they are stored in clear. Keys are 1 to 255 bytes of UTF-8 without control
// characters; the whole is at most MaxAttributesSize bytes. Bad attributes make the
// start fail with ErrInvalidArgument.
func WithAttributes(attrs map[string]any) StartOption {
	return func(o *startOptions) { o.attributes = maps.Clone(attrs) }
}

// startAttributes encodes the start's attributes (nil: none).
func (o *startOptions) startAttributes() ([]byte, error) {
	set, _, err := splitAttributes("attributes", o.attributes)
	return set, err
}

// SetAttributes changes the run's searchable attributes (see WithAttributes): each
// key of attrs is set to its value, or removed when the value is nil; other keys are
// kept. The change is written at once, fenced like the run's other writes, and
// memoized as a step: a replay does not write again. An empty attrs does nothing.
//
// It returns ErrInvalidArgument (also NonRetryable) for a bad key or value, or when
// the run's attributes would exceed MaxAttributesSize; nothing is written then.
func (c *Context) SetAttributes(attrs map[string]any) error {
	if err := c.usable("SetAttributes", attributesStepName); err != nil {
		return err
	}
	set, remove, err := splitAttributes("attributes", attrs)
	if err != nil {
		return NonRetryable(err)
	}
	if set == nil && len(remove) == 0 {
		return nil
	}
	change, err := json.Marshal(attrs)
	if err != nil {
		return NonRetryable(invalidArgument("attributes do not encode as JSON: %v", err))
	}
	if err := storableJSON("attributes", change); err != nil {
		return NonRetryable(err)
	}
	key, pos, err := c.nextKey(attributesStepName, KindAttributes)
	if err != nil {
		return err
	}
	c.checkAlive()
	x := c.x
	if _, ok := x.hist.get(key); ok {
		return nil
	}
	if set == nil {
		set = []byte("{}")
	}
	c.ensureLease()
	var fit bool
	err = c.write(func(ctx context.Context, db *writer) (err error) {
		fit, err = db.setAttributes(ctx, store.AttributesWrite{Fence: x.run.Fence, StepKey: key, Name: attributesStepName,
			Position: pos, Change: change, Set: set, Remove: remove, MaxBytes: MaxAttributesSize})
		return err
	})
	if err != nil {
		return err
	}
	if !fit {
		return NonRetryable(invalidArgument("attributes of run %s would exceed %d bytes", x.run.RunID, MaxAttributesSize))
	}
	x.hist.set(key, store.StepRecord{Name: attributesStepName, Kind: KindAttributes, Status: StepCompleted, Output: change})
	return nil
}

// splitAttributes checks attrs and splits it into the JSON object of its non-nil
// values (nil when there is none) and the keys whose value is nil.
func splitAttributes(what string, attrs map[string]any) (set []byte, remove []string, err error) {
	values := make(map[string]any, len(attrs))
	for _, k := range slices.Sorted(maps.Keys(attrs)) {
		if err := validName("attribute key", k); err != nil {
			return nil, nil, err
		}
		if attrs[k] == nil {
			remove = append(remove, k)
			continue
		}
		values[k] = attrs[k]
	}
	if len(values) == 0 {
		return nil, remove, nil
	}
	if set, err = encodeAttributes(what, values); err != nil {
		return nil, nil, err
	}
	return set, remove, nil
}

// encodeAttributes encodes a JSON object of attributes (or of a filter on them) and
// checks its size.
func encodeAttributes(what string, attrs map[string]any) ([]byte, error) {
	for k := range attrs {
		if err := validName("attribute key", k); err != nil {
			return nil, err
		}
	}
	b, err := json.Marshal(attrs)
	if err != nil {
		return nil, invalidArgument("%s do not encode as JSON: %v", what, err)
	}
	if err := storableJSON(what, b); err != nil {
		return nil, err
	}
	if len(b) > MaxAttributesSize {
		return nil, invalidArgument("%s take %d bytes as JSON, more than MaxAttributesSize (%d)", what, len(b), MaxAttributesSize)
	}
	return b, nil
}

// decodeAttributes decodes a run's stored attributes (nil: none). Numbers are float64,
// as encoding/json gives them, except integers a float64 cannot hold exactly (beyond
// ±2^53: an order id of 19 digits), which stay json.Number, so that they read back as
// stored and select the run again as a RunFilter's attribute.
func decodeAttributes(b []byte) map[string]any {
	if len(b) == 0 {
		return nil
	}
	d := json.NewDecoder(bytes.NewReader(b))
	d.UseNumber()
	var m map[string]any
	if err := d.Decode(&m); err != nil {
		return map[string]any{"$undecodable": string(b)}
	}
	for k, v := range m {
		m[k] = exactNumbers(v)
	}
	return m
}

// exactNumbers replaces the json.Numbers in v by float64s, except the integers beyond
// ±2^53.
func exactNumbers(v any) any {
	switch v := v.(type) {
	case json.Number:
		if !strings.ContainsAny(string(v), ".eE") {
			if i, err := v.Int64(); err != nil || i > 1<<53 || i < -(1<<53) {
				return v // an integer a float64 would round
			}
		}
		f, _ := v.Float64()
		return f
	case map[string]any:
		for k, e := range v {
			v[k] = exactNumbers(e)
		}
	case []any:
		for i, e := range v {
			v[i] = exactNumbers(e)
		}
	}
	return v
}
