package infra_test

import (
	"context"
	"encoding/json"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/payouts/payouts/dev/infra"
)

// TestEtcdLogsToItsFileAndStopsWithoutError: the embedded etcd writes its
// log to the file it is given, at the level asked for, and a stop that was
// asked for leaves no error there (its servers report their listeners
// closing as errors; those are the end of serving, not failures).
func TestEtcdLogsToItsFileAndStopsWithoutError(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	dir := t.TempDir()
	logFile := filepath.Join(dir, "logs", "etcd.log")
	c, err := infra.StartEtcdCluster(ctx, infra.EtcdOptions{Dir: filepath.Join(dir, "etcd"), LogFile: logFile, LogLevel: slog.LevelInfo})
	if err != nil {
		t.Fatal(err)
	}
	cli, err := c.Client()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cli.Put(ctx, "k", "v"); err != nil {
		t.Fatal(err)
	}
	cli.Close()
	c.Close()

	b, err := os.ReadFile(logFile)
	if err != nil {
		t.Fatal(err)
	}
	levels := map[string]int{}
	for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		var rec struct {
			Level string `json:"level"`
			Msg   string `json:"msg"`
		}
		if err := json.Unmarshal([]byte(line), &rec); err != nil {
			t.Fatalf("etcd.log holds a line that is not JSON: %q", line)
		}
		levels[rec.Level]++
		if rec.Level != "debug" && rec.Level != "info" && rec.Level != "warn" {
			t.Errorf("etcd.log: a clean start and stop logged at %s: %s", rec.Level, line)
		}
	}
	if levels["info"] == 0 {
		t.Fatalf("etcd.log has no info line at level info: %v", levels)
	}
	for _, want := range []string{"closed etcd server"} {
		if !strings.Contains(string(b), want) {
			t.Errorf("etcd.log lacks %q", want)
		}
	}
}
