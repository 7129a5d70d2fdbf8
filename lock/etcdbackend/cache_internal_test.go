package etcdbackend

import (
	"testing"
	"time"
)

// TestEndedHereOnlyForThisProcessesDeletion: the watch skips its read of a
// deleted lock key's open marker only when this process's own transaction
// deleted that grant's key at exactly that revision; a failed or errored
// end, another revision, or a grant this process never ended all leave the
// deletion to the read (and the expiry write when the marker was there).
func TestEndedHereOnlyForThisProcessesDeletion(t *testing.T) {
	var c cache
	if c.endedHere(7, 70) {
		t.Error("a grant this process never ended counted as ended here")
	}
	c.beginEnd(8)(0) // the end failed its compare, or erred
	if c.endedHere(8, 80) {
		t.Error("a failed end counted as the deletion")
	}
	c.beginEnd(9)(90)
	if c.endedHere(9, 91) {
		t.Error("an end at revision 90 counted as the deletion at 91")
	}
	c.beginEnd(10)(100)
	if !c.endedHere(10, 100) {
		t.Error("this process's end at revision 100 not recognised")
	}
	if c.endedHere(10, 100) {
		t.Error("an entry answered twice; it is consumed by the deletion it names")
	}

	// The watch can see the deletion before the end's caller has its
	// answer: it waits for that answer.
	answer := c.beginEnd(11)
	got := make(chan bool)
	go func() { got <- c.endedHere(11, 110) }()
	select {
	case v := <-got:
		t.Fatalf("endedHere answered %v before the end did", v)
	case <-time.After(50 * time.Millisecond):
	}
	answer(110)
	if !<-got {
		t.Error("an end answered while the watch waited not recognised")
	}

	// A second end of one grant while the first is in flight is not
	// registered: the first's outcome decides.
	first := c.beginEnd(12)
	c.beginEnd(12)(120)
	first(0)
	if c.endedHere(12, 120) {
		t.Error("the unregistered second end counted")
	}
}

// TestEndsAreBounded: ends the watch never asks about (it was down, or the
// key was not deleted) are pruned once they are a minute old.
func TestEndsAreBounded(t *testing.T) {
	var c cache
	for i := range int64(cacheMinPrune - 1) {
		c.beginEnd(i)(i + 1)
	}
	c.mu.Lock()
	for _, e := range c.ends {
		e.begun = e.begun.Add(-2 * time.Minute)
	}
	c.mu.Unlock()
	c.beginEnd(cacheMinPrune)(cacheMinPrune + 1)
	c.mu.Lock()
	n := len(c.ends)
	c.mu.Unlock()
	if n != 1 {
		t.Errorf("%d ends kept after pruning; want 1 (the fresh one)", n)
	}
}
