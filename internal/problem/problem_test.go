package problem

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5/pgconn"
)

func TestMessageClipsLongEchoedInput(t *testing.T) {
	id := strings.Repeat("é", 500_000) // 1 MB of two-byte runes
	args := []any{id, 7}
	e := New(InvalidRequest, "no payout %q (attempt %d)", args...)
	if len(e.Message) > MaxEchoArg+100 {
		t.Fatalf("message is %d bytes: the 1 MB id was echoed whole", len(e.Message))
	}
	if !utf8.ValidString(e.Message) {
		t.Fatalf("clipped message is not valid UTF-8: %q", e.Message)
	}
	if !strings.Contains(e.Message, "more bytes]") || !strings.HasSuffix(e.Message, "(attempt 7)") {
		t.Fatalf("clip not marked or the rest of the message lost: %q", e.Message)
	}
	if args[0] != id {
		t.Fatal("the caller's argument slice was changed")
	}

	w := Wrap(InvalidRequest, nil, "bad value: %v", errors.New("parsing \""+strings.Repeat("9", 10_000)+"\": out of range"))
	if len(w.Message) > MaxEchoArg+100 || !strings.Contains(w.Message, "more bytes]") {
		t.Fatalf("a long error argument was not clipped: %d bytes", len(w.Message))
	}

	// A short argument is left alone; a message built long from many
	// short arguments is cut as a whole.
	if got := New(NotFound, "no payout %q", "po-1").Message; got != `no payout "po-1"` {
		t.Fatalf("short message changed: %q", got)
	}
	many := make([]any, 100)
	for i := range many {
		many[i] = strings.Repeat("x", MaxEchoArg)
	}
	long := New(InvalidRequest, strings.Repeat("%s", 100), many...)
	if len(long.Message) > MaxMessage+40 || !strings.Contains(long.Message, "more bytes]") {
		t.Fatalf("whole message not cut: %d bytes", len(long.Message))
	}
	body, err := json.Marshal(long)
	if err != nil || len(body) > MaxMessage+400 {
		t.Fatalf("problem body is %d bytes (%v)", len(body), err)
	}
}

// TestUnreachableDatabaseIsUnavailable: a request that could not get a
// database connection did nothing and is 503 unavailable, not 500
// internal (status showed "internal error" while paydb was down).
func TestUnreachableDatabaseIsUnavailable(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close() // nothing listens there now
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, err = pgconn.Connect(ctx, "postgres://u@"+addr+"/db?connect_timeout=10")
	if err == nil {
		t.Fatal("connected to a closed port")
	}
	wrapped := fmt.Errorf("begin: %w", err)
	if e := From(wrapped); e.Code != Unavailable || e.Status() != 503 || strings.Contains(e.Message, addr) {
		t.Fatalf("unreachable database: %s %d %q, want unavailable 503 without the address", e.Code, e.Status(), e.Message)
	}
	if CodeOf(wrapped) != Unavailable {
		t.Fatalf("CodeOf: %s", CodeOf(wrapped))
	}
	if From(errors.New("boom")).Code != Internal {
		t.Fatal("an ordinary error is no longer internal")
	}
}

// A request whose work was cancelled (its caller went away, or the server
// is stopping) failed for no fault of the request or the server: 503
// unavailable, not 500 internal, which is logged as a server error and
// counted as one.
func TestACancelledRequestIsUnavailable(t *testing.T) {
	e := From(fmt.Errorf("query: %w", context.Canceled))
	if e.Code != Unavailable || e.Status() != 503 {
		t.Fatalf("a cancelled request: %s %d, want unavailable 503", e.Code, e.Status())
	}
}

// A database connection that dies under a statement (PostgreSQL stopped
// mid-request: the answer is cut short) is 503 unavailable, as an
// unreachable one is; dev/pgtest TestLostConnectionIsUnavailable has the
// sessions a live server ends. It was 500 internal, logged as a defect.
func TestALostDatabaseConnectionIsUnavailable(t *testing.T) {
	e := From(fmt.Errorf("create payout: %w", io.ErrUnexpectedEOF))
	if e.Code != Unavailable || e.Status() != 503 {
		t.Fatalf("a connection cut short: %s %d, want unavailable 503", e.Code, e.Status())
	}
}

// TestAnAnswerThatIsNoProblemDocumentSaysNothingOfTheRequest: every role
// answers an error with a problem document. A body that is not one comes
// from something in front of the role (a load balancer's 404 page, another
// server at that address), and its status does not mean what the role's
// would: a 404 there is not "no such submission", which the executor would
// act on. Only refused credentials and unavailability keep their meaning.
func TestAnAnswerThatIsNoProblemDocumentSaysNothingOfTheRequest(t *testing.T) {
	for status, want := range map[int]Code{
		404: Internal, 405: Internal, 400: Internal, 409: Internal, 422: Internal, 302: Internal, 500: Internal,
		401: Unauthorized, 403: Forbidden, 429: Unavailable, 502: Unavailable, 503: Unavailable, 504: Unavailable,
	} {
		err := DecodeBody(status, []byte("<html><body>Not Found</body></html>"))
		var pe *Error
		if !errors.As(err, &pe) || pe.Code != want {
			t.Errorf("HTTP %d with an HTML body: %v; want code %s", status, err, want)
		}
	}
	// The role's own problem document keeps its code.
	if err := DecodeBody(404, []byte(`{"type":"about:blank","title":"not found","status":404,"code":"not_found","detail":"no submission"}`)); !Has(err, NotFound) {
		t.Errorf("a not_found problem document decoded as %v", err)
	}
}

// TestPlainHTTPToAnHTTPSServer: a client given an http:// URL of a server
// that serves HTTPS got "internal (HTTP 400): HTTP 400: Client sent an
// HTTP request to an HTTPS server.". It is invalid_request (the URL is
// wrong; asking again will not help), saying to use https://.
func TestPlainHTTPToAnHTTPSServer(t *testing.T) {
	srv := httptest.NewTLSServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	defer srv.Close()
	resp, err := http.Get(strings.Replace(srv.URL, "https://", "http://", 1))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	err = Decode(resp)
	var pe *Error
	if !errors.As(err, &pe) || pe.Code != InvalidRequest || !strings.Contains(pe.Message, "the server speaks HTTPS: use an https:// URL") {
		t.Fatalf("plain HTTP to an HTTPS server decoded as %v; want invalid_request saying to use https://", err)
	}
	// Any other 400 that is no problem document still says nothing.
	if err := DecodeBody(400, []byte("Bad Request")); !Has(err, Internal) {
		t.Errorf("a plain 400 decoded as %v; want internal", err)
	}
}

// A verdict is the server's answer about the request itself; no answer, a
// 5xx, or a proxy's 429 in front of the server says nothing of it.
func TestNoVerdict(t *testing.T) {
	for _, c := range []struct {
		name string
		err  error
		want bool
	}{
		{"transport error", errors.New("connection refused"), true},
		{"deadline", context.DeadlineExceeded, true},
		{"unavailable", New(Unavailable, "down"), true},
		{"internal", New(Internal, "boom"), true},
		{"a proxy's 429", DecodeBody(http.StatusTooManyRequests, []byte("slow down")), true},
		{"a 502 with no problem body", DecodeBody(http.StatusBadGateway, []byte("<html>")), true},
		{"conflict", New(Conflict, "no"), false},
		{"invalid transition", New(InvalidTransition, "no"), false},
		{"not found", New(NotFound, "no"), false},
		{"fenced out", Fenced("payout:a", 1, 2, "stale"), false},
	} {
		if got := NoVerdict(c.err); got != c.want {
			t.Errorf("%s: NoVerdict = %v, want %v", c.name, got, c.want)
		}
	}
}
