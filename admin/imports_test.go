package kagziadmin_test

import (
	"os/exec"
	"strings"
	"testing"
)

// TestCoreImportGraphHasNoGRPC checks that the kagzi package never depends on gRPC or
// protobuf: only this package (and the CLI) do.
func TestCoreImportGraphHasNoGRPC(t *testing.T) {
	t.Parallel()
	// go test puts its own toolchain first on the PATH of the test.
	out, err := exec.Command("go", "list", "-deps", "github.com/kagzi/kagzi").CombinedOutput()
	if err != nil {
		t.Fatalf("go list -deps: %v\n%s", err, out)
	}
	deps := strings.Fields(string(out))
	if len(deps) < 10 {
		t.Fatalf("go list -deps listed too little: %q", out)
	}
	for _, dep := range deps {
		if strings.HasPrefix(dep, "google.golang.org/grpc") || strings.HasPrefix(dep, "google.golang.org/protobuf") ||
			strings.HasPrefix(dep, "github.com/kagzi/kagzi/admin") {
			t.Errorf("the core package depends on %s", dep)
		}
	}
}
