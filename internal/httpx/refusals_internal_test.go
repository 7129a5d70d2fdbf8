package httpx

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"net/http/httptest"
	"testing"
	"time"
)

// At most one refusal is logged a second; the next line says how many
// were only counted in between.
func TestRefusalsAreLoggedAtMostOnceASecond(t *testing.T) {
	var buf bytes.Buffer
	log := slog.New(slog.NewJSONHandler(&buf, nil))
	var l refusalLog
	r := httptest.NewRequest("GET", "/v1/x", nil)
	t0 := time.Date(2026, 12, 7, 12, 0, 0, 0, time.UTC)
	for _, at := range []time.Duration{0, 100 * time.Millisecond, 500 * time.Millisecond, 999 * time.Millisecond, 1100 * time.Millisecond, 1200 * time.Millisecond, 3 * time.Second} {
		l.note(t.Context(), log, r, "/v1/x", 401, t0.Add(at))
	}
	var notLogged []float64
	for _, line := range bytes.Split(bytes.TrimSpace(buf.Bytes()), []byte("\n")) {
		var m map[string]any
		if err := json.Unmarshal(line, &m); err != nil {
			t.Fatal(err)
		}
		notLogged = append(notLogged, m["refusals_not_logged"].(float64))
	}
	if want := []float64{0, 3, 1}; len(notLogged) != len(want) || notLogged[0] != want[0] || notLogged[1] != want[1] || notLogged[2] != want[2] {
		t.Fatalf("lines with refusals_not_logged %v, want %v", notLogged, want)
	}
}
