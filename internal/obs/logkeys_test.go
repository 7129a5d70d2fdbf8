package obs

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// TestLogLinesHaveDistinctKeys: no log call in the project writes a key
// twice, or a key every role's logger already carries (role) or the handler
// writes (time, level, msg). A JSON line with a repeated key loses one of
// the values in every pipeline that keeps the first or the last, and a
// query on role or event must find one thing.
func TestLogLinesHaveDistinctKeys(t *testing.T) {
	consts := map[string]string{
		"KeyRole": KeyRole, "KeyRequestID": KeyRequestID, "KeyKey": KeyKey, "KeyToken": KeyToken,
		"KeyHolder": KeyHolder, "KeyPayoutID": KeyPayoutID, "KeyAccountID": KeyAccountID,
		"KeyEvent": KeyEvent, "KeyError": KeyError,
	}
	reserved := map[string]bool{KeyRole: true, "time": true, "level": true, "msg": true}
	methods := map[string]int{ // method name -> index of the first key/value argument
		"Debug": 1, "Info": 1, "Warn": 1, "Error": 1,
		"DebugContext": 2, "InfoContext": 2, "WarnContext": 2, "ErrorContext": 2,
		"Log": 3, "With": 0,
	}
	root := filepath.Join("..", "..")
	fset := token.NewFileSet()
	checked := 0
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if name := d.Name(); path != root && (strings.HasPrefix(name, ".") || name == "bin" || name == "testdata") {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, 0)
		if err != nil {
			return err
		}
		ast.Inspect(f, func(n ast.Node) bool {
			call, ok := n.(*ast.CallExpr)
			if !ok {
				return true
			}
			sel, ok := call.Fun.(*ast.SelectorExpr)
			if !ok {
				return true
			}
			first, ok := methods[sel.Sel.Name]
			if !ok || len(call.Args) <= first {
				return true
			}
			keys, ok := logKeys(call.Args[first:], consts)
			if !ok {
				return true
			}
			checked++
			seen := map[string]bool{}
			for _, k := range keys {
				if seen[k] {
					t.Errorf("%s: log call writes the key %q twice", fset.Position(call.Pos()), k)
				}
				seen[k] = true
				if reserved[k] && sel.Sel.Name != "With" {
					t.Errorf("%s: log call writes the key %q, which the logger or handler already writes", fset.Position(call.Pos()), k)
				}
			}
			return true
		})
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if checked < 50 {
		t.Fatalf("only %d log calls were read: the walk did not find the project's source", checked)
	}
}

// logKeys reads the keys of a slog key/value list whose keys are all string
// literals or obs.Key* constants; ok is false when the list has anything
// else in a key position (an Attr or a computed key), which it does not
// judge. A call with no key/value pairs at all is not a log call it knows.
func logKeys(args []ast.Expr, consts map[string]string) (keys []string, ok bool) {
	if len(args)%2 != 0 {
		return nil, false
	}
	for i := 0; i < len(args); i += 2 {
		switch a := args[i].(type) {
		case *ast.BasicLit:
			if a.Kind != token.STRING {
				return nil, false
			}
			k, err := strconv.Unquote(a.Value)
			if err != nil {
				return nil, false
			}
			keys = append(keys, k)
		case *ast.SelectorExpr:
			x, isIdent := a.X.(*ast.Ident)
			k, known := consts[a.Sel.Name]
			if !isIdent || x.Name != "obs" || !known {
				return nil, false
			}
			keys = append(keys, k)
		case *ast.Ident:
			k, known := consts[a.Name] // inside package obs
			if !known {
				return nil, false
			}
			keys = append(keys, k)
		default:
			return nil, false
		}
	}
	return keys, len(keys) > 0
}
