package kagzi_test

import (
	"bytes"
	"compress/flate"
	"context"
	"crypto/aes"
	"crypto/cipher"
	"crypto/rand"
	"encoding/json"
	"errors"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/kagzi/kagzi"
)

// aesCodec is an example payload codec: AES-256-GCM with a random nonce per payload.
type aesCodec struct{ aead cipher.AEAD }

func newAESCodec(t *testing.T) aesCodec {
	t.Helper()
	key := make([]byte, 32)
	if _, err := rand.Read(key); err != nil {
		t.Fatal(err)
	}
	block, err := aes.NewCipher(key)
	if err != nil {
		t.Fatal(err)
	}
	aead, err := cipher.NewGCM(block)
	if err != nil {
		t.Fatal(err)
	}
	return aesCodec{aead}
}

func (c aesCodec) Encode(b []byte) ([]byte, error) {
	nonce := make([]byte, c.aead.NonceSize())
	if _, err := rand.Read(nonce); err != nil {
		return nil, err
	}
	return c.aead.Seal(nonce, nonce, b, nil), nil
}

func (c aesCodec) Decode(b []byte) ([]byte, error) {
	n := c.aead.NonceSize()
	if len(b) < n {
		return nil, errors.New("ciphertext too short")
	}
	return c.aead.Open(nil, b[:n], b[n:], nil)
}

// flateCodec compresses payloads.
type flateCodec struct{}

func (flateCodec) Encode(b []byte) ([]byte, error) {
	var buf bytes.Buffer
	w, _ := flate.NewWriter(&buf, flate.BestCompression)
	if _, err := w.Write(b); err != nil {
		return nil, err
	}
	err := w.Close()
	return buf.Bytes(), err
}

func (flateCodec) Decode(b []byte) ([]byte, error) {
	return io.ReadAll(flate.NewReader(bytes.NewReader(b)))
}

type secretDoc struct{ Secret string }

var codecChild = kagzi.Define("codec-child", func(ctx *kagzi.Context, in secretDoc) (secretDoc, error) {
	// Sleep, so that the parent waits for the child asleep, not in a race with its end.
	if err := ctx.Sleep("nap", 300*time.Millisecond); err != nil {
		return secretDoc{}, err
	}
	return secretDoc{Secret: in.Secret + "/child-out"}, nil
})

var codecParent = kagzi.Define("codec-parent", func(ctx *kagzi.Context, in secretDoc) (secretDoc, error) {
	s, err := kagzi.Step(ctx, "read", func(context.Context) (secretDoc, error) {
		return secretDoc{Secret: in.Secret + "/step"}, nil
	})
	if err != nil {
		return secretDoc{}, err
	}
	if err := ctx.SetEvent("progress", secretDoc{Secret: in.Secret + "/event"}); err != nil {
		return secretDoc{}, err
	}
	sig, err := kagzi.WaitSignal[secretDoc](ctx, "approve", 0)
	if err != nil {
		return secretDoc{}, err
	}
	child, err := kagzi.StartChild(ctx, "child", codecChild, secretDoc{Secret: in.Secret + "/child-in"})
	if err != nil {
		return secretDoc{}, err
	}
	c, err := child.Get()
	if err != nil {
		return secretDoc{}, err
	}
	// A durable sleep: the run resumes on a new claim, which decodes every output it replays.
	if err := ctx.Sleep("nap", 300*time.Millisecond); err != nil {
		return secretDoc{}, err
	}
	return secretDoc{Secret: s.Secret + "|" + sig.Secret + "|" + c.Secret}, nil
})

// tablesContaining counts the rows of Kagzi's tables whose text contains s.
func tablesContaining(t *testing.T, pool *pgxpool.Pool, s string) map[string]int {
	t.Helper()
	found := map[string]int{}
	for _, table := range []string{"runs", "steps", "step_attempts", "signals", "events", "schedules"} {
		if n := countRows(t, pool, `SELECT count(*) FROM kagzi.`+table+` t WHERE t::text LIKE '%' || $1 || '%'`, s); n > 0 {
			found[table] = n
		}
	}
	return found
}

func TestAnEncryptingCodecLeavesNoPlaintextInTheTables(t *testing.T) {
	e := newEnv(t)
	ctx := waitCtx(t)
	c, err := kagzi.NewClient(e.pool, kagzi.Config{Logger: quietLogger(), Codec: newAESCodec(t)})
	if err != nil {
		t.Fatal(err)
	}
	runWorker(t, c, fastWorker(), codecParent, codecChild)
	const secret = "TOP-SECRET-4711"
	run, err := kagzi.Start(ctx, c, codecParent, secretDoc{Secret: secret})
	if err != nil {
		t.Fatal(err)
	}
	ev, err := kagzi.WaitEvent[secretDoc](ctx, c, run.RunID, "progress", 20*time.Second)
	if err != nil || ev.Secret != secret+"/event" {
		t.Fatalf("event %+v, %v", ev, err)
	}
	// Signal once the run sleeps for it: a signal racing with the wait's suspension is
	// another test's matter.
	eventually(t, "the run to wait for its signal", func() bool {
		return runStatus(t, c, run.RunID) == kagzi.StatusSleeping
	})
	if err := c.Signal(ctx, run.RunID, "approve", secretDoc{Secret: secret + "/signal"}); err != nil {
		t.Fatal(err)
	}
	out, err := run.Wait(ctx)
	want := secret + "/step|" + secret + "/signal|" + secret + "/child-in/child-out"
	if err != nil || out.Secret != want {
		dumpRuns(t, c)
		t.Fatalf("got %+v, %v; want %q", out, err, want)
	}
	if _, err := c.CreateSchedule(ctx, kagzi.Schedule{ID: "secret-schedule", WorkflowType: "codec-parent",
		Cron: "@daily", Input: secretDoc{Secret: secret + "/schedule"}, Paused: true}); err != nil {
		t.Fatal(err)
	}

	if found := tablesContaining(t, e.pool, secret); len(found) > 0 {
		t.Fatalf("plaintext found in the tables: %v", found)
	}
	if found := tablesContaining(t, e.pool, "$kagzi_codec"); found["runs"] < 2 || found["steps"] < 3 ||
		found["signals"] != 1 || found["events"] != 1 || found["schedules"] != 1 {
		t.Fatalf("encoded payloads by table: %v", found)
	}

	// Reads through the client decode.
	info, err := c.GetRun(ctx, run.RunID)
	if err != nil || !strings.Contains(string(info.Input), secret) || !strings.Contains(string(info.Output), want) {
		t.Fatalf("GetRun: %s → %s, %v", info.Input, info.Output, err)
	}
	steps, err := c.ListSteps(ctx, run.RunID)
	if err != nil {
		t.Fatal(err)
	}
	var read secretDoc
	if err := json.Unmarshal(steps[0].Output, &read); err != nil || read.Secret != secret+"/step" {
		t.Fatalf("step %s output %s: %v", steps[0].Key, steps[0].Output, err)
	}
	sc, err := c.GetSchedule(ctx, "secret-schedule")
	if err != nil || !strings.Contains(string(sc.Input), secret+"/schedule") {
		t.Fatalf("schedule input %s, %v", sc.Input, err)
	}
	// A client without the codec sees the stored form only.
	plain := newClient(t, e.pool, "")
	raw, err := plain.GetRun(ctx, run.RunID)
	if err != nil || strings.Contains(string(raw.Input), secret) || !strings.Contains(string(raw.Input), "$kagzi_codec") {
		t.Fatalf("GetRun without the codec: %s, %v", raw.Input, err)
	}
}

func TestTheSizeLimitAppliesToTheEncodedPayloadWithAClearError(t *testing.T) {
	e := newEnv(t)
	ctx := waitCtx(t)
	compressed, err := kagzi.NewClient(e.pool, kagzi.Config{Logger: quietLogger(), Codec: flateCodec{}, MaxPayloadSize: 200})
	if err != nil {
		t.Fatal(err)
	}
	// 2,000 bytes of JSON that compress to a few dozen: under the limit once encoded.
	if _, err := compressed.StartByName(ctx, "big", strings.Repeat("a", 2000)); err != nil {
		t.Fatalf("compressible input: %v", err)
	}
	random := make([]byte, 600)
	_, _ = rand.Read(random)
	_, err = compressed.StartByName(ctx, "big", random) // base64 JSON of random bytes: incompressible
	mustErrorIs(t, err, kagzi.ErrInvalidArgument)
	if !strings.Contains(err.Error(), "once encoded by the codec, over the limit of 200") {
		t.Fatalf("error %q does not say what is over the limit", err)
	}
	err = compressed.Signal(ctx, "0190d3f0-0000-7000-8000-000000000000", "s", random)
	mustErrorIs(t, err, kagzi.ErrInvalidArgument)

	plain, err := kagzi.NewClient(e.pool, kagzi.Config{Logger: quietLogger(), MaxPayloadSize: 200})
	if err != nil {
		t.Fatal(err)
	}
	_, err = plain.StartByName(ctx, "big", strings.Repeat("a", 2000))
	mustErrorIs(t, err, kagzi.ErrInvalidArgument)
	if !strings.Contains(err.Error(), "input of big is 2002 bytes, over the limit of 200") {
		t.Fatalf("error %q", err)
	}
	if n := countRows(t, e.pool, `SELECT count(*) FROM kagzi.runs`); n != 1 {
		t.Fatalf("%d runs stored; only the compressible start should be", n)
	}
}

// failingCodec cannot encode or decode.
type failingCodec struct{}

func (failingCodec) Encode([]byte) ([]byte, error) { return nil, errors.New("the key store is down") }
func (failingCodec) Decode([]byte) ([]byte, error) { return nil, errors.New("the key store is down") }

func TestAPayloadTheCodecCannotDecodeFailsTheRunWithInvalidInput(t *testing.T) {
	e := newEnv(t)
	ctx := waitCtx(t)
	writer, err := kagzi.NewClient(e.pool, kagzi.Config{Logger: quietLogger(), Codec: newAESCodec(t)})
	if err != nil {
		t.Fatal(err)
	}
	reader, err := kagzi.NewClient(e.pool, kagzi.Config{Logger: quietLogger(), Codec: newAESCodec(t)}) // another key
	if err != nil {
		t.Fatal(err)
	}
	runWorker(t, reader, fastWorker(), greet)
	run, err := kagzi.Start(ctx, writer, greet, greetIn{Name: "ada"})
	if err != nil {
		t.Fatal(err)
	}
	_, err = run.Wait(ctx)
	if kagzi.ErrorCode(err) != kagzi.CodeInvalidInput || !strings.Contains(err.Error(), "payload codec") {
		t.Fatalf("got %v, want an INVALID_INPUT error from the codec", err)
	}
	broken, _ := kagzi.NewClient(e.pool, kagzi.Config{Logger: quietLogger(), Codec: failingCodec{}})
	_, err = kagzi.Start(ctx, broken, greet, greetIn{Name: "bob"})
	mustErrorIs(t, err, kagzi.ErrInvalidArgument)
	if !strings.Contains(err.Error(), "the key store is down") {
		t.Fatalf("error %q", err)
	}
}

// dumpRuns logs the client's runs and their steps, to tell why a test timed out.
func dumpRuns(t *testing.T, c *kagzi.Client) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	page, err := c.ListRuns(ctx, kagzi.RunFilter{})
	if err != nil {
		t.Logf("list runs: %v", err)
		return
	}
	for _, r := range page.Runs {
		t.Logf("run %s %s %s available %s", r.RunID, r.WorkflowType, r.Status, r.AvailableAt.Format(time.RFC3339Nano))
		steps, _ := c.ListSteps(ctx, r.RunID)
		for _, s := range steps {
			t.Logf("    step %s %s %d attempts", s.Key, s.Status, len(s.Attempts))
		}
	}
}
