package demo

import (
	"fmt"
	"io"
	"strings"
	"sync"
	"time"

	pc "github.com/payouts/payouts/payment/paymentclient"
)

// stateOrder is the order states are shown in: a payout's journey.
var stateOrder = []pc.State{pc.Pending, pc.Claimed, pc.RailSubmitted, pc.RailAcked, pc.RailAmbiguous, pc.Posted, pc.Failed, pc.Abandoned}

// display writes the story. On a terminal the progress line is redrawn in
// place; otherwise a progress line is printed only when the counts change,
// at most once a second, so a log file stays readable.
type display struct {
	mu       sync.Mutex
	w        io.Writer
	terminal bool
	start    time.Time
	open     bool // a redrawn progress line is on screen
	last     string
	lastAt   time.Time
}

func newDisplay(w io.Writer, terminal bool) *display {
	return &display{w: w, terminal: terminal, start: time.Now()}
}

// clearLine ends a redrawn progress line before ordinary output.
func (d *display) clearLine() {
	if d.open {
		fmt.Fprint(d.w, "\r\033[K")
		d.open = false
	}
}

// Printf writes one line of the story.
func (d *display) Printf(format string, args ...any) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.clearLine()
	fmt.Fprintf(d.w, format+"\n", args...)
}

// Step announces a chapter of the story.
func (d *display) Step(n int, title string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.clearLine()
	fmt.Fprintf(d.w, "\n== %d. %s\n", n, title)
}

// formatCounts renders payout counts by state, in journey order.
func formatCounts(c map[pc.State]int) string {
	var parts []string
	total := 0
	for _, s := range stateOrder {
		total += c[s]
		if c[s] > 0 {
			parts = append(parts, fmt.Sprintf("%s %d", s, c[s]))
		}
	}
	if len(parts) == 0 {
		return "no payouts"
	}
	return fmt.Sprintf("%d payouts: %s", total, strings.Join(parts, ", "))
}

// Progress shows the current counts by state.
func (d *display) Progress(c map[pc.State]int) {
	d.mu.Lock()
	defer d.mu.Unlock()
	line := fmt.Sprintf("[%5.1fs] %s", time.Since(d.start).Seconds(), formatCounts(c))
	if d.terminal {
		fmt.Fprint(d.w, "\r\033[K"+line)
		d.open = true
		return
	}
	counts := formatCounts(c)
	if counts == d.last || time.Since(d.lastAt) < time.Second {
		return
	}
	d.last, d.lastAt = counts, time.Now()
	fmt.Fprintln(d.w, "  "+line)
}

// Done ends the progress line, printing the final counts once.
func (d *display) Done(c map[pc.State]int) {
	d.mu.Lock()
	defer d.mu.Unlock()
	wasOpen := d.open
	d.clearLine()
	counts := formatCounts(c)
	if counts == d.last && !wasOpen && !d.terminal {
		return // already on screen
	}
	d.last, d.lastAt = counts, time.Now()
	fmt.Fprintf(d.w, "  [%5.1fs] %s\n", time.Since(d.start).Seconds(), d.last)
}
