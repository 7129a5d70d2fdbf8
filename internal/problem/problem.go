// Package problem is the one error type every server returns and every
// client gets back: a stable code, an HTTP status, and a message safe to
// show a caller, rendered as RFC 9457 application/problem+json. Internal
// causes are kept for the log and never sent.
package problem

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"sort"
	"strings"
	"unicode/utf8"

	"github.com/jackc/pgx/v5/pgconn"
)

// Code is a stable machine-readable error code (DESIGN §4).
type Code string

// The stable codes. Clients switch on these, never on messages.
const (
	InvalidRequest    Code = "invalid_request"
	Unauthorized      Code = "unauthorized"
	Forbidden         Code = "forbidden"
	NotFound          Code = "not_found"
	Conflict          Code = "conflict"
	FencedOut         Code = "fenced_out"
	NotHeld           Code = "not_held"
	SessionExpired    Code = "session_expired"
	LockHeld          Code = "lock_held"
	InvalidTransition Code = "invalid_transition"
	InsufficientFunds Code = "insufficient_funds"
	SubmissionExists  Code = "submission_exists"
	Unavailable       Code = "unavailable"
	Internal          Code = "internal"
	NotSessionOwner   Code = "not_session_owner"
)

// status is the single table from code to HTTP status.
var status = map[Code]int{
	InvalidRequest:    http.StatusBadRequest,
	Unauthorized:      http.StatusUnauthorized,
	Forbidden:         http.StatusForbidden,
	NotFound:          http.StatusNotFound,
	Conflict:          http.StatusConflict,
	FencedOut:         http.StatusConflict,
	NotHeld:           http.StatusConflict,
	SessionExpired:    http.StatusNotFound,
	LockHeld:          http.StatusConflict,
	InvalidTransition: http.StatusConflict,
	InsufficientFunds: http.StatusConflict,
	SubmissionExists:  http.StatusConflict,
	Unavailable:       http.StatusServiceUnavailable,
	Internal:          http.StatusInternalServerError,
	NotSessionOwner:   http.StatusForbidden,
}

var titles = map[Code]string{
	InvalidRequest:    "Invalid request",
	Unauthorized:      "Unauthorized",
	Forbidden:         "Forbidden",
	NotFound:          "Not found",
	Conflict:          "Conflict",
	FencedOut:         "Fenced out",
	NotHeld:           "Lock not held",
	SessionExpired:    "Session expired",
	LockHeld:          "Lock held",
	InvalidTransition: "Invalid transition",
	InsufficientFunds: "Insufficient funds",
	SubmissionExists:  "Submission exists",
	Unavailable:       "Unavailable",
	Internal:          "Internal error",
	NotSessionOwner:   "Not the session's owner",
}

// Codes lists every stable code.
func Codes() []Code {
	out := make([]Code, 0, len(status))
	for c := range status {
		out = append(out, c)
	}
	sort.Slice(out, func(i, j int) bool { return out[i] < out[j] })
	return out
}

// Status is the HTTP status for code (500 for an unknown code).
func Status(code Code) int {
	if s, ok := status[code]; ok {
		return s
	}
	return http.StatusInternalServerError
}

// Error is the project's error. Fields other than cause are sent to callers.
type Error struct {
	Code    Code
	Message string
	// Fenced-out details (DESIGN §4): the lock key, the token presented and
	// the fence stored at the guard.
	Key            string
	PresentedToken int64
	StoredToken    int64
	// Extensions are further problem members (e.g. the existing submission
	// for submission_exists, the holder for lock_held).
	Extensions map[string]json.RawMessage
	// HTTPStatus is the status the error arrived with (client side) or will
	// be sent with (0: from Code).
	HTTPStatus int

	cause error
}

func (e *Error) Error() string {
	if e.cause != nil {
		return fmt.Sprintf("%s: %s: %v", e.Code, e.Message, e.cause)
	}
	if e.Message == "" {
		return string(e.Code)
	}
	return fmt.Sprintf("%s: %s", e.Code, e.Message)
}

// Unwrap returns the internal cause.
func (e *Error) Unwrap() error { return e.cause }

// Is matches another *Error by code, so errors.Is(err, problem.New(problem.FencedOut, ""))
// and sentinel errors of the same code compare equal.
func (e *Error) Is(target error) bool {
	var t *Error
	if errors.As(target, &t) {
		return t.Code == e.Code
	}
	return false
}

// Status is the HTTP status this error is sent with.
func (e *Error) Status() int {
	if e.HTTPStatus != 0 {
		return e.HTTPStatus
	}
	return Status(e.Code)
}

// New makes an error with a caller-safe message.
func New(code Code, format string, args ...any) *Error {
	return &Error{Code: code, Message: message(format, args)}
}

// Wrap makes an error whose cause is logged but never sent.
func Wrap(code Code, cause error, format string, args ...any) *Error {
	return &Error{Code: code, Message: message(format, args), cause: cause}
}

// Echo limits: a message quotes what the caller sent (an id, a query
// value, a parse error that repeats its input), and a caller can send a
// megabyte. Each string or error argument longer than MaxEchoArg bytes is
// cut there, and the whole message at MaxMessage bytes, each cut marked
// with how much was left out.
const (
	MaxEchoArg = 200
	MaxMessage = 2048
)

func message(format string, args []any) string {
	clipped := args
	for i, a := range args {
		var long string
		switch v := a.(type) {
		case string:
			long = v
		case error:
			long = v.Error()
		}
		if len(long) <= MaxEchoArg {
			continue
		}
		if &clipped[0] == &args[0] {
			clipped = slices.Clone(args) // the caller's slice stays as it was
		}
		clipped[i] = clip(long, MaxEchoArg)
	}
	return clip(fmt.Sprintf(format, clipped...), MaxMessage)
}

// Echo is s as a problem may repeat it: cut at MaxEchoArg bytes, the cut
// marked (for input echoed outside a message, such as a field name).
func Echo(s string) string { return clip(s, MaxEchoArg) }

// clip cuts s to at most n bytes on a UTF-8 boundary and says how many
// bytes it left out.
func clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	cut := n
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return fmt.Sprintf("%s…[%d more bytes]", s[:cut], len(s)-cut)
}

// Fenced makes a fenced_out error carrying the key and both tokens.
func Fenced(key string, presented, stored int64, format string, args ...any) *Error {
	e := New(FencedOut, format, args...)
	e.Key, e.PresentedToken, e.StoredToken = key, presented, stored
	return e
}

// TokenRegressionMember marks a fenced_out answer whose refusal was also a
// token_regression (the presented token equals the stored fence but comes
// from another holder: a token was issued twice, INV-04), so that a caller
// can tell it from an ordinary stale holder.
const TokenRegressionMember = "token_regression"

// IsTokenRegression reports whether err is a fenced_out answer marked
// TokenRegressionMember.
func IsTokenRegression(err error) bool {
	var e *Error
	var marked bool
	return errors.As(err, &e) && e.Code == FencedOut && e.Extension(TokenRegressionMember, &marked) && marked
}

// With adds an extension member (marshalled now; a value that cannot be
// marshalled is dropped).
func (e *Error) With(name string, v any) *Error {
	b, err := json.Marshal(v)
	if err != nil {
		return e
	}
	if e.Extensions == nil {
		e.Extensions = map[string]json.RawMessage{}
	}
	e.Extensions[name] = b
	return e
}

// Extension decodes extension member name into v; false when absent.
func (e *Error) Extension(name string, v any) bool {
	raw, ok := e.Extensions[name]
	if !ok {
		return false
	}
	return json.Unmarshal(raw, v) == nil
}

// CodeOf returns the code of err as From gives it: its *Error's code,
// unavailable for deadlines, cancellations and unreachable databases,
// internal for anything else (and "" for nil).
func CodeOf(err error) Code {
	if err == nil {
		return ""
	}
	return From(err).Code
}

// NoVerdict reports whether err says nothing of the request itself: no
// problem answer at all (a transport error, a deadline), a 5xx, or a
// problem coded unavailable or internal (a proxy's 429 or 503 in front of
// the server among them). Anything else is the server's verdict on the
// request: retrying it unchanged gets the same answer.
func NoVerdict(err error) bool {
	var e *Error
	return !errors.As(err, &e) || e.Status() >= 500 || e.Code == Unavailable || e.Code == Internal
}

// Has reports whether err is a problem with the given code.
func Has(err error, code Code) bool {
	var e *Error
	return errors.As(err, &e) && e.Code == code
}

// RefusedToken reports a 401 or 403 answer: the server does not accept the
// caller's credential, and asking again will not change that.
func RefusedToken(err error) bool { return Has(err, Unauthorized) || Has(err, Forbidden) }

// From converts any error to an *Error suitable to send: an *Error as is, a
// deadline or a cancellation as unavailable, anything else as internal with
// the cause kept.
func From(err error) *Error {
	var e *Error
	if errors.As(err, &e) {
		return e
	}
	if errors.Is(err, context.DeadlineExceeded) {
		return Wrap(Unavailable, err, "the request did not complete in time")
	}
	// Cancelled: the caller went away (or the server is stopping) before
	// the work was done; nothing about the request was wrong.
	if errors.Is(err, context.Canceled) {
		return Wrap(Unavailable, err, "the request was cancelled before it completed")
	}
	// No connection to the database could be made: nothing was read or
	// written, and retrying later is the answer.
	var ce *pgconn.ConnectError
	if errors.As(err, &ce) {
		return Wrap(Unavailable, err, "the database is not reachable; nothing was done; retry later")
	}
	// The connection was lost while the request used it: the database went
	// down or ended the session. A write in flight may or may not have
	// committed; reading it back, or retrying, is the answer.
	if connectionLost(err) {
		return Wrap(Unavailable, err, "a connection the request used was lost (the database went down or ended the session): what it was writing may or may not have taken effect; read it back, or retry")
	}
	return Wrap(Internal, err, "internal error")
}

// connectionLost reports whether err says the database connection went
// away under a statement: an answer cut short (the server process died),
// or the server ending the session (SQLSTATE class 08, connection
// exception; 57P01..57P03, shut down or not accepting connections).
func connectionLost(err error) bool {
	if errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, net.ErrClosed) {
		return true
	}
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		return strings.HasPrefix(pe.Code, "08") || pe.Code == "57P01" || pe.Code == "57P02" || pe.Code == "57P03"
	}
	return false
}

// ContentType is the RFC 9457 media type.
const ContentType = "application/problem+json"

// body is the wire form.
type body struct {
	Type           string `json:"type"`
	Title          string `json:"title"`
	Status         int    `json:"status"`
	Detail         string `json:"detail,omitempty"`
	Instance       string `json:"instance,omitempty"`
	Code           Code   `json:"code"`
	Key            string `json:"key,omitempty"`
	PresentedToken *int64 `json:"presented_token,omitempty"`
	StoredToken    *int64 `json:"stored_token,omitempty"`
}

var reserved = map[string]bool{"type": true, "title": true, "status": true, "detail": true, "instance": true,
	"code": true, "key": true, "presented_token": true, "stored_token": true}

// MarshalJSON renders the problem body.
func (e *Error) MarshalJSON() ([]byte, error) {
	b := body{
		Type:   "https://payouts.dev/problems/" + string(e.Code),
		Title:  titles[e.Code],
		Status: e.Status(),
		Detail: e.Message,
		Code:   e.Code,
		Key:    e.Key,
	}
	if b.Title == "" {
		b.Title = string(e.Code)
	}
	if e.Code == FencedOut {
		b.PresentedToken, b.StoredToken = &e.PresentedToken, &e.StoredToken
	}
	base, err := json.Marshal(b)
	if err != nil || len(e.Extensions) == 0 {
		return base, err
	}
	m := map[string]json.RawMessage{}
	if err := json.Unmarshal(base, &m); err != nil {
		return nil, err
	}
	for k, v := range e.Extensions {
		if !reserved[k] {
			m[k] = v
		}
	}
	return json.Marshal(m)
}

// Write sends err as a problem body. The caller logs internal causes.
func Write(w http.ResponseWriter, err error) {
	e := From(err)
	b, merr := json.Marshal(e)
	if merr != nil {
		b = []byte(`{"type":"about:blank","title":"Internal error","status":500,"code":"internal"}`)
	}
	w.Header().Set("Content-Type", ContentType)
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(e.Status())
	_, _ = w.Write(append(b, '\n'))
}

// Decode turns a non-2xx response back into an *Error so errors.As works
// across the process boundary. A body that is not a problem document
// becomes unauthorized, forbidden or unavailable by its status, and
// internal (an answer of no known kind) otherwise; the 400 an HTTPS
// server answers a plain-HTTP request with is invalid_request, saying to
// use https://.
func Decode(resp *http.Response) error {
	raw, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	return DecodeBody(resp.StatusCode, raw)
}

// DecodeBody is Decode for an already-read body.
func DecodeBody(statusCode int, raw []byte) error {
	if statusCode == http.StatusBadRequest && bytes.Contains(raw, plainHTTPToHTTPS) {
		// Go's HTTPS server answering a plain-HTTP request: the URL is
		// wrong, not the request, and asking again will not help.
		return &Error{Code: InvalidRequest, HTTPStatus: statusCode,
			Message: "the server speaks HTTPS: use an https:// URL (and --ca-file if its certificate is not from a CA the system trusts)"}
	}
	var b body
	if err := json.Unmarshal(raw, &b); err != nil || b.Code == "" {
		// Not a problem document: not the service's answer but something's
		// in front of it (a load balancer, another server at that
		// address). Its status says nothing about the request — a 404
		// is not "no such payout" — beyond refused credentials and being
		// unavailable; anything else is an answer of no known kind.
		code := codeForStatus(statusCode)
		if code != Unauthorized && code != Forbidden && code != Unavailable {
			code = Internal
		}
		msg := string(raw)
		if len(msg) > 200 {
			msg = msg[:200]
		}
		return &Error{Code: code, Message: fmt.Sprintf("HTTP %d: %s", statusCode, msg), HTTPStatus: statusCode}
	}
	e := &Error{Code: b.Code, Message: b.Detail, Key: b.Key, HTTPStatus: statusCode}
	if b.PresentedToken != nil {
		e.PresentedToken = *b.PresentedToken
	}
	if b.StoredToken != nil {
		e.StoredToken = *b.StoredToken
	}
	var m map[string]json.RawMessage
	if json.Unmarshal(raw, &m) == nil {
		for k, v := range m {
			if !reserved[k] {
				if e.Extensions == nil {
					e.Extensions = map[string]json.RawMessage{}
				}
				e.Extensions[k] = v
			}
		}
	}
	return e
}

// plainHTTPToHTTPS is the body of the 400 Go's net/http server answers a
// plain-HTTP request on a TLS listener with.
var plainHTTPToHTTPS = []byte("Client sent an HTTP request to an HTTPS server")

func codeForStatus(s int) Code {
	switch {
	case s == http.StatusBadRequest || s == http.StatusRequestEntityTooLarge || s == http.StatusUnprocessableEntity:
		return InvalidRequest
	case s == http.StatusUnauthorized:
		return Unauthorized
	case s == http.StatusForbidden:
		return Forbidden
	case s == http.StatusNotFound || s == http.StatusMethodNotAllowed:
		return NotFound
	case s == http.StatusConflict:
		return Conflict
	case s == http.StatusServiceUnavailable || s == http.StatusBadGateway || s == http.StatusGatewayTimeout || s == http.StatusTooManyRequests:
		return Unavailable
	default:
		return Internal
	}
}
