package kagzi_test

import (
	"context"
	"fmt"

	"github.com/kagzi/kagzi"
)

func ExampleRunFilter() {
	client, cleanup := exampleSetup()
	defer cleanup()
	ctx := context.Background()
	for _, id := range []string{"order-1", "invoice-1", "order-2"} {
		_, _ = client.StartByName(ctx, "process-order", Order{}, kagzi.WithID(id))
	}

	// Oldest first, by workflow id prefix; input and output are left out unless asked for.
	page, _ := client.ListRuns(ctx, kagzi.RunFilter{
		WorkflowIDPrefix: "order-",
		WorkflowTypes:    []string{"process-order", "refund-order"},
		RootOnly:         true, // no child runs
		OldestFirst:      true,
	})
	for _, r := range page.Runs {
		fmt.Println(r.WorkflowID, r.Input == nil)
	}
	// Output:
	// order-1 true
	// order-2 true
}

// Refuse a request's filter before acting on it: Err reads nothing.
func ExampleRunFilter_Err() {
	f := kagzi.RunFilter{ParentRunID: "not-a-run-id"}
	if err := f.Err(); err != nil {
		fmt.Println(err)
	}
	// Output:
	// kagzi: invalid argument: run id "not-a-run-id" is not a UUID
}
