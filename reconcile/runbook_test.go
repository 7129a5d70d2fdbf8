package reconcile_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/payouts/payouts/reconcile"
)

// TestEveryCheckHasARunbookSection: a finding's check names the section
// of docs/operations.md an operator reads (`<a id="CHECK">`, heading
// "CHECK (INV-nn)"), for every check the reconciler can report.
func TestEveryCheckHasARunbookSection(t *testing.T) {
	ops, err := os.ReadFile(filepath.Join("..", "docs", "operations.md"))
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range reconcile.Checks() {
		anchor := `<a id="` + c + `"></a>`
		heading := "### " + c + " (" + reconcile.InvariantOf(c) + ")"
		if !strings.Contains(string(ops), anchor+"\n"+heading) {
			t.Errorf("docs/operations.md has no runbook section for %s: want %q then %q", c, anchor, heading)
		}
	}
}
