package ui_test

import (
	"context"
	"net/http"
	"net/url"
	"strings"
	"testing"

	"github.com/kagzi/kagzi"
	"github.com/kagzi/kagzi/ui"
)

// Found by an outside audit of the console: each was a 500, a misleading refusal, an
// action audited for a request that was at fault, or links that left the console.

func TestAuditPageTokensOutOfRangeAreBadRequestsNotServerErrors(t *testing.T) {
	e := newEnv(t)
	b := serve(t, ui.Handler(e.client, ui.Options{Logger: quiet()}))
	// An id past int4 (the audit ids are bigint): a page, older than it.
	if status, body := b.get("n/default/audit?page=MjE0NzQ4MzY0OA"); status != http.StatusOK {
		t.Errorf("audit page older than id 2147483648: %d, want 200\n%s", status, body)
	}
	// "0" and "-1" are no ids of the console's links.
	for _, token := range []string{"MA", "LTE"} {
		if status, body := b.get("n/default/audit?page=" + token); status != http.StatusBadRequest {
			t.Errorf("audit page %q: %d, want 400\n%s", token, status, body)
		}
	}
}

func TestAFormOverTheConsolesCapIsRefusedAsTooLargeNotAsAMissingCSRFToken(t *testing.T) {
	e := newEnv(t)
	id := startIdle(t, e.client, 1)[0]
	b := serve(t, ui.Handler(e.client, ui.Options{Actions: true, Authorize: allowAll, Logger: quiet()}))
	_, page := b.get("n/default/runs/" + id)
	form := url.Values{"csrf": {csrf(t, page)}, "name": {"go"}, "payload": {`"` + strings.Repeat("x", 3<<20) + `"`}}
	status, _, body := b.post("n/default/runs/"+id+"/signal", form)
	if status != http.StatusRequestEntityTooLarge || !strings.Contains(body, "larger than 2 MiB") {
		t.Fatalf("a 3 MB signal form: %d, want 413 saying the form is too large\n%s", status, body)
	}
}

func TestABulkActionWithAFilterTheListingRefusesIsABadRequestAndRecordsNothing(t *testing.T) {
	e := newEnv(t)
	ids := startIdle(t, e.client, 2)
	b := serve(t, ui.Handler(e.client, ui.Options{Actions: true, Authorize: allowAll, Logger: quiet()}))
	_, confirm := b.get("n/default/bulk?action=cancel&type=idle")
	status, _, body := b.post("n/default/bulk", url.Values{"csrf": {csrf(t, confirm)}, "action": {"cancel"}, "parent": {"xx"}})
	if status != http.StatusBadRequest {
		t.Fatalf("a bulk cancel whose parent is not a run id: %d, want 400\n%s", status, body)
	}
	var n int
	if err := e.pool.QueryRow(context.Background(), `SELECT count(*) FROM kagzi.console_audit`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 0 {
		t.Fatalf("%d audit rows for a refused request, want none", n)
	}
	for _, id := range ids {
		if s := statusOf(t, e.client, id); s != kagzi.StatusPending {
			t.Fatalf("run %s is %s after a refused bulk cancel", id, s)
		}
	}
}

func TestPagesOfANamespaceWithASlashLinkBackToTheConsoleUnderItsPrefix(t *testing.T) {
	e := newEnv(t)
	namespaces := func(ns string) (*kagzi.Client, error) {
		return kagzi.NewClient(e.pool, kagzi.Config{Namespace: ns, Logger: quiet()})
	}
	b := serve(t, ui.Handler(e.client, ui.Options{Namespaces: namespaces, Authorize: allowAll, Logger: quiet()}))
	status, page := b.get("n/a%2Fb/runs")
	if status != http.StatusOK {
		t.Fatalf("runs of namespace a/b: %d\n%s", status, page)
	}
	// /console/n/a%2Fb/runs: "../../" from /console/n/a%2Fb/ is /console/ (the
	// decoded path's extra "/" made it "../../../", above the console).
	if !strings.Contains(page, `<base href="../../">`) {
		t.Fatalf("the page's base does not lead back to /console/:\n%s", page)
	}
}

func TestSwitchingToAnEmptyNamespaceNameIsABadRequestThatSaysSo(t *testing.T) {
	e := newEnv(t)
	b := serve(t, ui.Handler(e.client, ui.Options{Logger: quiet()}))
	for _, path := range []string{"ns", "ns?name=", "ns?name=%20%20"} {
		if status, body := b.get(path); status != http.StatusBadRequest || !strings.Contains(body, "name a namespace") {
			t.Errorf("GET %s: %d, want 400 asking for a namespace\n%s", path, status, body)
		}
	}
	// A name still switches.
	if status, body := b.get("ns?name=default"); status != http.StatusSeeOther {
		t.Errorf("GET ns?name=default: %d, want a redirect to the namespace\n%s", status, body)
	}
}

func TestARequestForANamespaceAuthorizeRefusesMakesNoClient(t *testing.T) {
	e := newEnv(t)
	made := 0
	b := serve(t, ui.Handler(e.client, ui.Options{Logger: quiet(),
		Namespaces: func(ns string) (*kagzi.Client, error) {
			made++
			return kagzi.NewClient(e.pool, kagzi.Config{Namespace: ns, Logger: quiet()})
		},
		Authorize: func(r *http.Request, a ui.Access) (string, bool) { return "t", a.Namespace == "default" || a.Namespace == "other" }}))
	for i := range 20 {
		if status, body := b.get("n/refused" + string(rune('a'+i)) + "/"); status != http.StatusForbidden {
			t.Fatalf("a refused namespace: %d, want 403\n%s", status, body)
		}
	}
	if made != 0 {
		t.Fatalf("%d clients made for refused requests, want none", made)
	}
	if status, body := b.get("n/other/"); status != http.StatusOK || made != 1 {
		t.Fatalf("an allowed namespace: %d with %d clients made, want 200 and one\n%s", status, made, body)
	}
}
