package rail

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/payouts/payouts/internal/obs"
	"github.com/payouts/payouts/internal/problem"
	"github.com/payouts/payouts/rail/railclient"
)

// stateRail is a rail stub with a state file on a loopback port and a
// client that pays and looks up (the proxy) and one that reads the report
// (an operator); stop ends it and waits.
func stateRail(t *testing.T, path string) (c stateClients, s *Server, stop func()) {
	t.Helper()
	s, url, stop := serveRail(t, Config{SettlementWindow: time.Minute, StateFile: path})
	var err error
	if c.Client, err = railclient.New(url, proxyToken); err != nil {
		t.Fatal(err)
	}
	if c.op, err = railclient.New(url, operatorToken); err != nil {
		t.Fatal(err)
	}
	return c, s, stop
}

// stateClients pays and looks up as the proxy; SettlementReport is the
// operator's.
type stateClients struct {
	*railclient.Client
	op *railclient.Client
}

func (c stateClients) SettlementReport(ctx context.Context) ([]railclient.Payment, error) {
	return c.op.SettlementReport(ctx)
}

func stateLines(t *testing.T, path string) []string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return strings.Split(strings.TrimSuffix(string(b), "\n"), "\n")
}

// A rail stub with a state file restarted on it still has every payment it
// made, duplicates and declines included, in the order made, and pays on
// under rail references it never used before.
func TestStateFileKeepsPaymentsAcrossRestarts(t *testing.T) {
	t.Parallel()
	ctx := ctxFor(t)
	path := filepath.Join(t.TempDir(), "payments.jsonl")
	c, _, stop := stateRail(t, path)
	var made []railclient.Payment
	declined := req("ref-d")
	declined.BeneficiaryRef = "DECLINE-1"
	for _, r := range []railclient.PaymentRequest{req("ref-a"), req("ref-a"), declined} {
		p, err := c.Pay(ctx, r)
		if err != nil {
			t.Fatal(err)
		}
		made = append(made, p)
	}
	stop()
	if info, err := os.Stat(path); err != nil || info.Mode().Perm() != 0o600 {
		t.Fatalf("state file: %v, mode %v; want 0600", err, info.Mode().Perm())
	}

	c2, _, _ := stateRail(t, path)
	rep, err := c2.SettlementReport(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(rep) != 3 || rep[0] != made[0] || rep[1] != made[1] || rep[2] != made[2] {
		t.Fatalf("after a restart the report is %+v, want the three payments made before it: %+v", rep, made)
	}
	look, err := c2.Find(ctx, "ref-a")
	if err != nil || len(look.Items) != 2 || look.Items[0].RailRef != made[0].RailRef || look.Items[1].RailRef != made[1].RailRef {
		t.Fatalf("lookup of the duplicated reference after a restart: %+v %v", look, err)
	}
	if look.Final {
		t.Error("a lookup right after the restart is final: an attempt may have been in flight when the stub stopped")
	}
	next, err := c2.Pay(ctx, req("ref-b"))
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range made {
		if next.RailRef == p.RailRef {
			t.Fatalf("the restarted stub reused rail reference %s", p.RailRef)
		}
	}
	if n := len(stateLines(t, path)); n != 4 {
		t.Errorf("state file has %d lines after four payments, want 4", n)
	}
}

// A last line without its newline is a write cut short: it is dropped and
// the file cut back, and the next payment starts on a line of its own.
func TestStateFileDropsAnIncompleteLastLine(t *testing.T) {
	t.Parallel()
	ctx := ctxFor(t)
	path := filepath.Join(t.TempDir(), "payments.jsonl")
	good, _ := json.Marshal(railclient.Payment{RailRef: "rl-old-00000001", ClientRef: "ref-old", Amount: 7, Currency: "EUR",
		BeneficiaryRef: "ben-1", Status: railclient.StatusSettled, At: time.Now().UTC().Format(time.RFC3339Nano)})
	if err := os.WriteFile(path, append(append(good, '\n'), `{"rail_ref":"rl-old-0000`...), 0o600); err != nil {
		t.Fatal(err)
	}
	c, _, _ := stateRail(t, path)
	rep, err := c.SettlementReport(ctx)
	if err != nil || len(rep) != 1 || rep[0].ClientRef != "ref-old" {
		t.Fatalf("report %+v %v, want the one complete payment", rep, err)
	}
	if _, err := c.Pay(ctx, req("ref-new")); err != nil {
		t.Fatal(err)
	}
	lines := stateLines(t, path)
	if len(lines) != 2 || lines[0] != string(good) || !strings.Contains(lines[1], `"ref-new"`) {
		t.Fatalf("state file after the cut and one payment:\n%s", strings.Join(lines, "\n"))
	}
}

// A line that is not a payment anywhere else means the file is not this
// stub's, or was damaged: the stub refuses to start rather than forget.
func TestStateFileRefusesAForeignFile(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "payments.jsonl")
	if err := os.WriteFile(path, []byte("{\"not\":\"a payment\"}\n{}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err := New(Config{Addr: "127.0.0.1:0", Logger: obs.NewLogger(io.Discard, slog.LevelInfo, "rail"), StateFile: path})
	if err == nil || !strings.Contains(err.Error(), "line 1 is not a payment") {
		t.Fatalf("New on a file of other lines: %v, want an error naming line 1", err)
	}
	if _, err := New(Config{Addr: "127.0.0.1:0", StateFile: filepath.Join(t.TempDir(), "no-such-dir", "p.jsonl")}); err == nil {
		t.Fatal("New with a state file in a missing directory: no error")
	}
}

// A payment the state file cannot take is not made: the caller is told
// nothing was paid, and neither a lookup nor the report shows it.
func TestStateFileWriteFailureMakesNoPayment(t *testing.T) {
	t.Parallel()
	ctx := ctxFor(t)
	path := filepath.Join(t.TempDir(), "payments.jsonl")
	c, s, _ := stateRail(t, path)
	if _, err := c.Pay(ctx, req("ref-ok")); err != nil {
		t.Fatal(err)
	}
	ro, err := os.Open(path) // read-only: every write fails
	if err != nil {
		t.Fatal(err)
	}
	s.mu.Lock()
	rw := s.journal.f
	s.journal.f = ro
	s.mu.Unlock()
	_, err = c.Pay(ctx, req("ref-lost"))
	s.mu.Lock()
	s.journal.f = rw
	s.mu.Unlock()
	ro.Close()
	if !problem.Has(err, problem.Unavailable) {
		t.Fatalf("pay with the state file failing: %v, want unavailable", err)
	}
	if look, err := c.Find(ctx, "ref-lost"); err != nil || len(look.Items) != 0 {
		t.Fatalf("lookup of the payment that could not be recorded: %+v %v", look, err)
	}
	if rep, err := c.SettlementReport(ctx); err != nil || len(rep) != 1 {
		t.Fatalf("report %+v %v, want only the recorded payment", rep, err)
	}
	if _, err := c.Pay(ctx, req("ref-after")); err != nil {
		t.Fatalf("pay once the state file takes writes again: %v", err)
	}
	b, _ := os.ReadFile(path)
	if n := bytes.Count(b, []byte("\n")); n != 2 || bytes.Contains(b, []byte("ref-lost")) {
		t.Fatalf("state file:\n%s\nwant the two recorded payments only", b)
	}
}

// A payment still being processed once the state file is closed (a handler
// past the server's shutdown grace) is refused, not made in memory only:
// the next start would not know it, and could answer a lookup for it with
// nothing, final.
func TestPaymentAfterTheStateFileClosedIsNotMade(t *testing.T) {
	t.Parallel()
	ctx := ctxFor(t)
	path := filepath.Join(t.TempDir(), "payments.jsonl")
	c, s, _ := stateRail(t, path)
	if _, err := c.Pay(ctx, req("ref-before")); err != nil {
		t.Fatal(err)
	}
	if err := s.closeJournal(); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Pay(ctx, req("ref-after")); !problem.Has(err, problem.Unavailable) {
		t.Fatalf("pay after the state file closed: %v, want unavailable (nothing paid)", err)
	}
	if l, err := c.Find(ctx, "ref-after"); err != nil || len(l.Items) != 0 {
		t.Fatalf("lookup of the refused payment: %+v %v, want no payment", l, err)
	}
	if got := stateLines(t, path); len(got) != 1 {
		t.Fatalf("state file holds %d payments, want the 1 made before it closed", len(got))
	}
}

// A state file is written by one stub at a time: a second stub started on
// the file of a running one refuses to start, naming the file, where
// before both appended at their own offsets and wrote over each other's
// payments (the next start then refused the damaged file). Once the first
// has stopped, the file is free again.
func TestStateFileHasOneWriter(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "payments.jsonl")
	c, _, stop := stateRail(t, path)
	if _, err := c.Pay(ctxFor(t), req("ref-one-writer")); err != nil {
		t.Fatal(err)
	}
	_, err := New(Config{Addr: "127.0.0.1:0", Logger: obs.NewLogger(io.Discard, slog.LevelInfo, "rail"), StateFile: path})
	if err == nil || !strings.Contains(err.Error(), "in use by another rail stub") {
		t.Fatalf("a second stub on a running stub's state file: %v, want a refusal naming it", err)
	}
	stop()
	c2, _, _ := stateRail(t, path)
	if got, err := c2.SettlementReport(ctxFor(t)); err != nil || len(got) != 1 {
		t.Fatalf("the file after the first stub stopped: %+v %v, want its one payment", got, err)
	}
}
