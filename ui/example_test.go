package ui_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/kagzi/kagzi"
	"github.com/kagzi/kagzi/internal/testdb"
	"github.com/kagzi/kagzi/ui"
)

// Mount the console under /kagzi/ of your own mux. Reads are open to every signed-in
// user; the actions only to the operators, and each is recorded with their name.
func ExampleHandler() {
	ctx := context.Background()
	dsn, drop, err := testdb.Create(ctx) // in real code: your DSN, and kagzi.Migrate
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return
	}
	defer drop()
	pool, _ := pgxpool.New(ctx, dsn)
	defer pool.Close()
	client, _ := kagzi.NewClient(pool, kagzi.Config{Namespace: "production"})

	console := ui.Handler(client, ui.Options{
		Actions: true,
		Authorize: func(r *http.Request, a ui.Access) (who string, allowed bool) {
			user, password, ok := r.BasicAuth() // or your session, your SSO
			if !ok || password != "secret" {
				return "", false
			}
			return user, a.Action == ui.ActionRead || user == "alice"
		},
	})
	mux := http.NewServeMux()
	mux.Handle("/kagzi/", http.StripPrefix("/kagzi", console))
	srv := httptest.NewServer(mux)
	defer srv.Close()

	req, _ := http.NewRequest(http.MethodGet, srv.URL+"/kagzi/", nil)
	req.SetBasicAuth("bob", "secret")
	resp, err := http.DefaultClient.Do(req) // redirected to the namespace's overview
	if err != nil {
		fmt.Println(err)
		return
	}
	resp.Body.Close()
	fmt.Println(resp.StatusCode, resp.Request.URL.Path)
	// Output: 200 /kagzi/n/production/
}
