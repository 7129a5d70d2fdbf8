package cmd

import (
	"os"
	"runtime/debug"
	"testing"

	"github.com/spf13/cobra"
)

// The long-running roles, and the lock benchmark that runs the lock service
// in its own process, collect garbage at GOGC=roleGCPercent unless the
// environment sets GOGC; other commands keep Go's default.
func TestRolesTuneTheGarbageCollector(t *testing.T) {
	if v, set := os.LookupEnv("GOGC"); set {
		os.Unsetenv("GOGC")
		defer os.Setenv("GOGC", v)
	}
	defer debug.SetGCPercent(debug.SetGCPercent(100))
	root := NewRoot()
	for _, path := range [][]string{{"serve", "payment"}, {"serve", "rail"}, {"run", "executor"}, {"bench", "lock"}} {
		c, _, err := root.Find(path)
		if err != nil {
			t.Fatal(err)
		}
		debug.SetGCPercent(100)
		if err := hook(c)(c, nil); err != nil {
			t.Fatalf("%v: %v", path, err)
		}
		if got := debug.SetGCPercent(100); got != roleGCPercent {
			t.Fatalf("%v: GOGC %d, want %d", path, got, roleGCPercent)
		}
	}
	os.Setenv("GOGC", "150")
	defer os.Unsetenv("GOGC")
	c, _, _ := root.Find([]string{"serve", "payment"})
	if err := hook(c)(c, nil); err != nil {
		t.Fatal(err)
	}
	if got := debug.SetGCPercent(100); got != 100 {
		t.Fatalf("with GOGC set the role changed the collector's target to %d", got)
	}
	os.Unsetenv("GOGC")
	for _, path := range [][]string{{"bench", "e2e"}, {"status"}} {
		c, _, err := root.Find(path)
		if err != nil {
			t.Fatal(err)
		}
		if err := hook(c)(c, nil); err != nil {
			t.Fatalf("%v: %v", path, err)
		}
		if got := debug.SetGCPercent(100); got != 100 {
			t.Fatalf("%v: GOGC %d, want Go's default", path, got)
		}
	}
}

// hook is the persistent hook cobra runs before c: the nearest one.
func hook(c *cobra.Command) func(*cobra.Command, []string) error {
	for ; c != nil; c = c.Parent() {
		if c.PersistentPreRunE != nil {
			return c.PersistentPreRunE
		}
	}
	return func(*cobra.Command, []string) error { return nil }
}
