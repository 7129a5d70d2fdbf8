package cmd

import (
	"os"
	"runtime/debug"
	"testing"
)

// The long-running roles collect garbage at GOGC=roleGCPercent unless the
// environment sets GOGC; other commands keep Go's default.
func TestRolesTuneTheGarbageCollector(t *testing.T) {
	if v, set := os.LookupEnv("GOGC"); set {
		os.Unsetenv("GOGC")
		defer os.Setenv("GOGC", v)
	}
	defer debug.SetGCPercent(debug.SetGCPercent(100))
	root := NewRoot()
	for _, path := range [][]string{{"serve", "payment"}, {"serve", "rail"}, {"run", "executor"}} {
		c, _, err := root.Find(path)
		if err != nil {
			t.Fatal(err)
		}
		debug.SetGCPercent(100)
		if err := c.Parent().PersistentPreRunE(c, nil); err != nil {
			t.Fatalf("%v: %v", path, err)
		}
		if got := debug.SetGCPercent(100); got != roleGCPercent {
			t.Fatalf("%v: GOGC %d, want %d", path, got, roleGCPercent)
		}
	}
	os.Setenv("GOGC", "150")
	defer os.Unsetenv("GOGC")
	c, _, _ := root.Find([]string{"serve", "payment"})
	if err := c.Parent().PersistentPreRunE(c, nil); err != nil {
		t.Fatal(err)
	}
	if got := debug.SetGCPercent(100); got != 100 {
		t.Fatalf("with GOGC set the role changed the collector's target to %d", got)
	}
}
