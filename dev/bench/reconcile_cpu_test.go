package bench

import (
	"fmt"
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
	// A child that burns at least half a second of CPU: it spins until its
	// own utime+stime (fields 14 and 15 of /proc/$$/stat, in clock ticks)
	// reaches 600ms, so it does a fixed amount of CPU work however long a
	// loaded machine takes to give it that much. The loop uses only shell
	// builtins (read, set, arithmetic), so the CPU is the child's own.
	target := int64(600 * time.Millisecond * clockTicks / time.Second)
	cmd := exec.Command("sh", "-c", fmt.Sprintf(`while :; do read -r l < /proc/$$/stat; set -- $l; [ $(( ${14} + ${15} )) -ge %d ] && break; done`, target))
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
