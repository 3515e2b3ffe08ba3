package main

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/kagzi/kagzi"
)

// errUnhealthy is health's error when the report is not healthy: exit status 1.
var errUnhealthy = errors.New("unhealthy")

// health prints Client.Health's report of the database, the schema and the
// namespace's pending work no live worker can take; it fails (exit status 1) when the
// report is not healthy. The command runs no worker, so the report's local workers
// are always none.
func (a *app) health(ctx context.Context, args []string) error {
	fs := a.flagSet("health")
	if _, err := a.parse(fs, args, 0, 0); err != nil {
		return err
	}
	pool, client, err := a.connect(ctx)
	if err != nil {
		return err
	}
	defer pool.Close()
	h := client.Health(ctx)
	healthy := h.Healthy()
	if a.json {
		if err := a.printJSON(struct {
			Healthy   bool   `json:"healthy"`
			Namespace string `json:"namespace"`
			*kagzi.HealthReport
		}{healthy, a.namespace, h}); err != nil {
			return err
		}
	} else {
		a.printHealth(h, healthy)
	}
	if !healthy {
		return errUnhealthy
	}
	return nil
}

func (a *app) printHealth(h *kagzi.HealthReport, healthy bool) {
	kv := newTable(a.stdout)
	status := "healthy"
	if !healthy {
		status = "UNHEALTHY"
	}
	kv.row("Status:", status)
	kv.row("Namespace:", a.namespace)
	if h.DatabaseOK {
		kv.row("Database:", "ok")
	} else {
		kv.row("Database:", "error: "+h.DatabaseError)
	}
	if h.DatabaseOK {
		schema := fmt.Sprintf("%d (latest %d)", h.SchemaVersion, h.LatestSchemaVersion)
		switch {
		case h.SchemaNewer:
			schema += ": migrated by a later release (this one works beside it)"
		case !h.SchemaCurrent:
			schema += ": run kagzi migrate up"
		}
		kv.row("Schema version:", schema)
	}
	if h.DatabaseOK && h.DatabaseError != "" {
		kv.row("Error:", h.DatabaseError)
	}
	if len(h.PendingTypesWithoutWorker) > 0 {
		kv.row("No live worker for:", strings.Join(h.PendingTypesWithoutWorker, ", ")+" (runs ready, waiting PENDING)")
	}
	kv.flush()
}
