package httpx

import (
	"context"
	"log/slog"
	"net/http"
	"sync"
	"time"
)

// refusalLogEvery is how often at most a server logs a request it refused
// for its credential (401, 403): each refusal is counted in the request
// metrics, and one WARN line a second, with how many went unlogged since
// the last, tells an operator who is knocking without letting a caller
// with a bad token fill the log.
const refusalLogEvery = time.Second

// refusalLog rate-limits the WARN lines of refused requests.
type refusalLog struct {
	mu         sync.Mutex
	last       time.Time
	suppressed int
}

// note logs the refused request r (status 401 or 403) unless a refusal was
// logged less than refusalLogEvery ago, in which case it only counts it.
func (l *refusalLog) note(ctx context.Context, log *slog.Logger, r *http.Request, route string, status int, now time.Time) {
	l.mu.Lock()
	if !l.last.IsZero() && now.Sub(l.last) < refusalLogEvery {
		l.suppressed++
		l.mu.Unlock()
		return
	}
	suppressed := l.suppressed
	l.last, l.suppressed = now, 0
	l.mu.Unlock()
	log.Log(ctx, slog.LevelWarn, "request refused: credential not accepted",
		"method", r.Method, "route", route, "status", status, "remote_addr", r.RemoteAddr,
		"user_agent", r.UserAgent(), "refusals_not_logged", suppressed)
}
