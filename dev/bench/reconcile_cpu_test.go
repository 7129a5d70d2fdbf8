package bench

import (
	"os"
	"os/exec"
	"syscall"
	"testing"
	"time"
)

// A process's own CPU must not include the CPU of a child it has waited
// for (the bench runs the measured reconciler as its child, and reports
// the bench process's CPU apart from it); with children it must.
func TestProcCPUCountsChildrenOnlyWhenAsked(t *testing.T) {
	self := os.Getpid()
	ownBefore, err := procCPU(self, false)
	if err != nil {
		t.Fatal(err)
	}
	allBefore, err := procCPU(self, true)
	if err != nil {
		t.Fatal(err)
	}
	// A child that burns at least half a second of CPU.
	cmd := exec.Command("sh", "-c", `end=$(( $(date +%s) + 2 )); while [ "$(date +%s)" -lt "$end" ]; do :; done`)
	if err := cmd.Run(); err != nil {
		t.Fatal(err)
	}
	ru := cmd.ProcessState.SysUsage().(*syscall.Rusage)
	child := time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	if child < 500*time.Millisecond {
		t.Fatalf("the child burnt only %s of CPU", child)
	}
	ownAfter, err := procCPU(self, false)
	if err != nil {
		t.Fatal(err)
	}
	allAfter, err := procCPU(self, true)
	if err != nil {
		t.Fatal(err)
	}
	if own := ownAfter - ownBefore; own > child/2 {
		t.Errorf("own CPU grew by %s while a child used %s: the child's CPU is counted as the parent's", own, child)
	}
	if all := allAfter - allBefore; all < child/2 {
		t.Errorf("CPU with children grew by %s while a child used %s", all, child)
	}
}
