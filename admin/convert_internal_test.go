package kagziadmin

import (
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/kagzi/kagzi"
)

// rootConstants reads the string constants of type typeName declared in the Go
// files of dir (not its tests): every value the root package can store or report.
func rootConstants(t *testing.T, dir, typeName string) []string {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(dir, "*.go"))
	if err != nil {
		t.Fatal(err)
	}
	var vals []string
	for _, name := range files {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(token.NewFileSet(), name, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		for _, decl := range f.Decls {
			gd, ok := decl.(*ast.GenDecl)
			if !ok || gd.Tok != token.CONST {
				continue
			}
			for _, spec := range gd.Specs {
				vs := spec.(*ast.ValueSpec)
				if id, ok := vs.Type.(*ast.Ident); !ok || id.Name != typeName {
					continue
				}
				for _, v := range vs.Values {
					if lit, ok := v.(*ast.BasicLit); ok && lit.Kind == token.STRING {
						s, _ := strconv.Unquote(lit.Value)
						vals = append(vals, s)
					}
				}
			}
		}
	}
	return vals
}

func TestEveryStepKindAndStatusOfTheRootPackageMapsToASpecificEnumValue(t *testing.T) {
	var kinds, statuses []string
	for _, dir := range []string{"..", filepath.Join("..", "internal", "vocab")} {
		kinds = append(kinds, rootConstants(t, dir, "StepKind")...)
		statuses = append(statuses, rootConstants(t, dir, "StepStatus")...)
	}
	// The vocabulary's seven kinds and BRANCH (parallel.go); its six statuses.
	if len(kinds) < 8 || len(statuses) < 6 {
		t.Fatalf("found kinds %v and statuses %v: too few, is the source where the test looks?", kinds, statuses)
	}
	seenKind := map[string]bool{}
	for _, k := range kinds {
		if stepKinds[kagzi.StepKind(k)] == 0 {
			t.Errorf("step kind %s maps to STEP_KIND_UNSPECIFIED", k)
		}
		seenKind[stepKinds[kagzi.StepKind(k)].String()] = true
	}
	if len(seenKind) != len(kinds) {
		t.Errorf("%d step kinds map to %d enum values", len(kinds), len(seenKind))
	}
	seenStatus := map[string]bool{}
	for _, s := range statuses {
		if stepStatuses[kagzi.StepStatus(s)] == 0 {
			t.Errorf("step status %s maps to STEP_STATUS_UNSPECIFIED", s)
		}
		seenStatus[stepStatuses[kagzi.StepStatus(s)].String()] = true
	}
	if len(seenStatus) != len(statuses) {
		t.Errorf("%d step statuses map to %d enum values", len(statuses), len(seenStatus))
	}
}
