package kagzi

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/kagzi/kagzi/internal/store"
)

// Codec transforms payloads on their way to and from PostgreSQL: compression,
// encryption, or both. Set one in Config.Codec and it applies to every payload the
// client and its workers write and read: run inputs (Start, StartChild, schedule
// inputs), run outputs, step outputs, signal payloads and event values. Error details,
// names, ids and the trace carrier are not payloads and are stored as they are.
//
// Encode receives the payload's JSON and returns any bytes; Decode must return the
// JSON that Encode was given. Both must be safe for concurrent use. Every process that
// reads or writes the namespace's runs needs the same codec (or one whose Decode still
// reads what the old one wrote, for a key rotation).
type Codec interface {
	Encode(payload []byte) ([]byte, error)
	Decode(encoded []byte) ([]byte, error)
}

// codecKey is the only key of the JSON object an encoded payload is stored as: the
// payload columns are jsonb, so an encoded payload is kept as
// {"$kagzi_codec": "<standard base64 of what Encode returned>"}.
const codecKey = "$kagzi_codec"

type codecEnvelope struct {
	Data *string `json:"$kagzi_codec"`
}

// payloads encodes and decodes a client's payloads (Config.Codec, MaxPayloadSize).
// The client embeds it, and hands it to its workers' executions.
type payloads struct {
	codec    Codec // nil: payloads stored as JSON
	maxBytes int
	logger   *slog.Logger
}

// encodePayload applies the codec to a payload's JSON and checks the size limit on
// what is stored. Its errors wrap ErrInvalidArgument and name what: "input of
// process-order", say.
func (c *payloads) encodePayload(what string, b []byte) ([]byte, error) {
	if c.codec == nil {
		if err := storableJSON(what, b); err != nil {
			return nil, err
		}
	} else {
		enc, err := c.encode(b)
		if err != nil {
			return nil, invalidArgument("%s: %v", what, err)
		}
		b = enc
	}
	if len(b) > c.maxBytes {
		if c.codec != nil {
			return nil, invalidArgument("%s is %d bytes once encoded by the codec, over the limit of %d (Config.MaxPayloadSize)",
				what, len(b), c.maxBytes)
		}
		return nil, invalidArgument("%s is %d bytes, over the limit of %d (Config.MaxPayloadSize)", what, len(b), c.maxBytes)
	}
	return b, nil
}

// encode applies the codec, if any, to a payload's JSON (no size check).
func (c *payloads) encode(b []byte) ([]byte, error) {
	if c.codec == nil {
		return b, nil
	}
	enc, err := c.codec.Encode(b)
	if err != nil {
		return nil, fmt.Errorf("kagzi: payload codec: encode: %w", err)
	}
	s := base64.StdEncoding.EncodeToString(enc)
	out, err := json.Marshal(codecEnvelope{Data: &s})
	if err != nil {
		return nil, fmt.Errorf("kagzi: payload codec: %w", err)
	}
	return out, nil
}

// decodePayload returns the JSON of a stored payload: with a codec, an encoded payload
// is decoded, and one written before the codec was configured is returned as it is.
func (c *payloads) decodePayload(b []byte) ([]byte, error) {
	if c.codec == nil || len(b) == 0 {
		return b, nil
	}
	data, ok := envelopeData(b)
	if !ok {
		return b, nil
	}
	enc, err := base64.StdEncoding.DecodeString(data)
	if err != nil {
		return nil, fmt.Errorf("kagzi: payload codec: stored payload is not base64: %w", err)
	}
	dec, err := c.codec.Decode(enc)
	if err != nil {
		return nil, fmt.Errorf("kagzi: payload codec: decode: %w", err)
	}
	if !json.Valid(dec) {
		return nil, fmt.Errorf("kagzi: payload codec: decode returned invalid JSON (%d bytes)", len(dec))
	}
	return dec, nil
}

// envelopeData returns the data of an encoded payload, which is a JSON object with the
// one key codecKey.
func envelopeData(b []byte) (string, bool) {
	t := bytes.TrimSpace(b)
	if len(t) == 0 || t[0] != '{' || !bytes.Contains(t, []byte(codecKey)) {
		return "", false
	}
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(t, &fields); err != nil || len(fields) != 1 {
		return "", false
	}
	var env codecEnvelope
	if err := json.Unmarshal(t, &env); err != nil || env.Data == nil {
		return "", false
	}
	return *env.Data, true
}

// unmarshalPayload decodes a stored payload into v. Its error does not quote the
// payload (see unmarshalQuiet).
func (c *payloads) unmarshalPayload(b []byte, v any) error {
	dec, err := c.decodePayload(b)
	if err != nil {
		return err
	}
	return unmarshalQuiet(dec, v)
}

// unmarshalQuiet is json.Unmarshal whose error does not quote what it decodes: the
// decode errors of payloads end up in run and step errors, which are stored as they
// are and which hooks and spans see, while payloads are not theirs to see (and the
// codec keeps them out of the tables). The standard library's errors quote values:
// encoding/json's type errors name a number's, time.Time's parse errors quote the
// text, strconv's too. Those are replaced by what did not fit where, wrapping the
// decoder's error for errors.As in the process; an error of your own UnmarshalJSON
// keeps its text (it is yours to keep clean, as the errors your workflows return).
func unmarshalQuiet(b []byte, v any) error {
	err := json.Unmarshal(b, v)
	if err == nil {
		return nil
	}
	var te *json.UnmarshalTypeError
	var se *json.SyntaxError
	var pe *time.ParseError
	var ne *strconv.NumError
	switch {
	case errors.As(err, &te):
		kind, _, _ := strings.Cut(te.Value, " ") // "number -5": the kind only
		msg := fmt.Sprintf("a JSON %s does not fit %s", kind, te.Type)
		if te.Field != "" {
			msg += " (field " + te.Field + ")"
		}
		return &payloadError{msg: msg, err: err}
	case errors.As(err, &se):
		return &payloadError{msg: fmt.Sprintf("not valid JSON (at byte %d)", se.Offset), err: err}
	case errors.As(err, &pe):
		return &payloadError{msg: "a time that does not parse as " + pe.Layout, err: err}
	case errors.As(err, &ne):
		return &payloadError{msg: "a number that does not parse (" + ne.Func + ": " + ne.Err.Error() + ")", err: err}
	}
	return err
}

// payloadError is unmarshalQuiet's error.
type payloadError struct {
	msg string
	err error
}

func (e *payloadError) Error() string { return e.msg }
func (e *payloadError) Unwrap() error { return e.err }

// readPayload is decodePayload for reads that report payloads (RunInfo, StepInfo,
// ScheduleInfo): a payload the codec cannot decode is returned as stored.
func (c *payloads) readPayload(b []byte) []byte {
	if c.codec == nil {
		return b
	}
	dec, err := c.decodePayload(b)
	if err != nil {
		c.logger.Warn("kagzi: a stored payload does not decode with the client's codec; it is returned as stored",
			"error", err)
		return b
	}
	return dec
}

// decodeRunInfo decodes the input and output of a run read.
func (c *Client) decodeRunInfo(info RunInfo) RunInfo {
	info.Input, info.Output = c.readPayload(info.Input), c.readPayload(info.Output)
	return info
}

// decodeScheduleInfo decodes the input of a schedule read.
func (c *Client) decodeScheduleInfo(info *ScheduleInfo) *ScheduleInfo {
	if info != nil {
		info.Input = c.readPayload(info.Input)
	}
	return info
}

// inputCodecError is the error of a run whose stored input the codec cannot decode:
// it fails the run at once (INVALID_INPUT).
func inputCodecError(run *store.ClaimedRun, err error) error {
	return &detailError{detail: ErrorDetail{Code: CodeInvalidInput, NonRetryable: true, Subject: run.WorkflowType,
		Message: fmt.Sprintf("input of run %s cannot be read: %v", run.RunID, err)}}
}

// encodeRunOutput applies the codec to a run's output, or without one checks that
// PostgreSQL can store it (storableJSON); its error fails the run at once
// (INVALID_OUTPUT). The size limit is checked by the caller, on what this returns.
func (c *payloads) encodeRunOutput(run *store.ClaimedRun, out []byte) ([]byte, error) {
	if c.codec == nil {
		if why := unstorable(out); why != "" {
			return nil, &detailError{detail: ErrorDetail{Code: CodeInvalidOutput, NonRetryable: true,
				Subject: run.WorkflowType, Message: fmt.Sprintf("output of run %s %s", run.RunID, why)}}
		}
	}
	enc, err := c.encode(out)
	if err != nil {
		return nil, &detailError{detail: ErrorDetail{Code: CodeInvalidOutput, NonRetryable: true,
			Subject: run.WorkflowType, Message: fmt.Sprintf("output of run %s: %v", run.RunID, err)}}
	}
	return enc, nil
}

// storableJSON refuses JSON that PostgreSQL's jsonb cannot hold (see unstorable).
// The error wraps ErrInvalidArgument and names what. (A codec's envelope holds base64
// only.)
func storableJSON(what string, b []byte) error {
	if why := unstorable(b); why != "" {
		return invalidArgument("%s %s", what, why)
	}
	return nil
}

// unstorable says why PostgreSQL's jsonb cannot hold valid JSON b, "" when it can: a
// string with a NUL character (the escape \u0000), or bytes that are not UTF-8
// (encoding/json lets them through in a json.RawMessage or a MarshalJSON's result).
// PostgreSQL would refuse the whole statement, aborting the transaction it was part
// of, so they are refused before anything is sent.
func unstorable(b []byte) string {
	switch {
	case jsonHasNUL(b):
		return "holds a NUL character (\\u0000 in its JSON), which PostgreSQL cannot store"
	case !utf8.Valid(b):
		return "holds bytes that are not UTF-8, which PostgreSQL cannot store"
	case jsonHasLoneSurrogate(b):
		return "holds a lone UTF-16 surrogate (a \\uD800-\\uDFFF escape not in a pair), which PostgreSQL cannot store"
	}
	return ""
}

// jsonHasLoneSurrogate reports whether valid JSON b has a \u escape of a UTF-16
// surrogate that is not a high one followed by a low one: valid JSON and valid
// UTF-8 (encoding/json writes such a string's code point as U+FFFD, but lets it
// through in a json.RawMessage), which jsonb refuses for the whole statement (found
// in review).
func jsonHasLoneSurrogate(b []byte) bool {
	for i := bytes.Index(b, []byte(`\u`)); i >= 0; {
		// An escaped backslash is "\\": count the backslashes before the u.
		k := i
		for k > 0 && b[k-1] == '\\' {
			k--
		}
		if (i-k)%2 == 0 && i+6 <= len(b) {
			if r, ok := hex4(b[i+2 : i+6]); ok && r >= 0xD800 && r <= 0xDFFF {
				if r >= 0xDC00 { // a low surrogate first
					return true
				}
				lo, ok := rune(0), false
				if i+12 <= len(b) && b[i+6] == '\\' && b[i+7] == 'u' {
					lo, ok = hex4(b[i+8 : i+12])
				}
				if !ok || lo < 0xDC00 || lo > 0xDFFF {
					return true
				}
				i += 12
				j := bytes.Index(b[i:], []byte(`\u`))
				if j < 0 {
					return false
				}
				i += j
				continue
			}
		}
		j := bytes.Index(b[i+2:], []byte(`\u`))
		if j < 0 {
			return false
		}
		i += 2 + j
	}
	return false
}

// hex4 decodes four hexadecimal digits.
func hex4(h []byte) (rune, bool) {
	var r rune
	for _, c := range h {
		switch {
		case c >= '0' && c <= '9':
			r = r<<4 | rune(c-'0')
		case c >= 'a' && c <= 'f':
			r = r<<4 | rune(c-'a'+10)
		case c >= 'A' && c <= 'F':
			r = r<<4 | rune(c-'A'+10)
		default:
			return 0, false
		}
	}
	return r, true
}

// jsonHasNUL reports whether valid JSON b has a string with a NUL character.
func jsonHasNUL(b []byte) bool {
	for i := bytes.IndexByte(b, '\\'); i >= 0 && i+1 < len(b); {
		if b[i+1] == 'u' && bytes.HasPrefix(b[i+2:], []byte("0000")) {
			return true
		}
		// Skip the escaped character; look for the next escape after it.
		j := bytes.IndexByte(b[i+2:], '\\')
		if j < 0 {
			return false
		}
		i += 2 + j
	}
	return false
}
