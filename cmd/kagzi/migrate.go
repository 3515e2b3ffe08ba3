package main

import (
	"context"
	"fmt"

	"github.com/kagzi/kagzi"
)

// migrate applies the schema migrations (up) or reports the schema version (status).
func (a *app) migrate(ctx context.Context, action string, args []string) error {
	if action == "" {
		action = "up"
	}
	if action != "up" && action != "status" {
		return usagef("migrate: want up or status, got %q", action)
	}
	fs := a.flagSet("migrate " + action)
	if _, err := a.parse(fs, args, 0, 0); err != nil {
		return err
	}
	pool, client, err := a.connect(ctx)
	if err != nil {
		return err
	}
	defer pool.Close()
	before := client.Health(ctx)
	if !before.DatabaseOK {
		return fmt.Errorf("database: %s", before.DatabaseError)
	}
	if action == "up" {
		if err := kagzi.Migrate(ctx, pool); err != nil {
			return err
		}
	}
	h := client.Health(ctx)
	if h.SchemaVersion == 0 && h.DatabaseError != "" && action == "up" {
		return fmt.Errorf("after migrating: %s", h.DatabaseError)
	}
	if a.json {
		out := map[string]any{"schema_version": h.SchemaVersion, "latest_schema_version": h.LatestSchemaVersion,
			"current": h.SchemaCurrent}
		if action == "up" {
			out["previous_schema_version"] = before.SchemaVersion
		}
		return a.printJSON(out)
	}
	switch {
	case h.SchemaNewer:
		fmt.Fprintf(a.stdout, "schema version %d, migrated by a later release (this one knows up to %d and works beside it)\n",
			h.SchemaVersion, h.LatestSchemaVersion)
	case action == "up" && before.SchemaVersion == h.SchemaVersion:
		fmt.Fprintf(a.stdout, "schema already current at version %d\n", h.SchemaVersion)
	case action == "up":
		fmt.Fprintf(a.stdout, "migrated schema from version %d to %d\n", before.SchemaVersion, h.SchemaVersion)
	case h.SchemaCurrent:
		fmt.Fprintf(a.stdout, "schema version %d (current)\n", h.SchemaVersion)
	case h.SchemaVersion == 0:
		fmt.Fprintf(a.stdout, "schema not migrated (latest version %d): run kagzi migrate up\n", h.LatestSchemaVersion)
	default:
		fmt.Fprintf(a.stdout, "schema version %d, latest %d: run kagzi migrate up\n", h.SchemaVersion, h.LatestSchemaVersion)
	}
	return nil
}
