package bench

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// clockTicks is USER_HZ, the unit of /proc/<pid>/stat times (100 on Linux).
const clockTicks = 100

// procCPU is the CPU seconds (user + system) pid has used, and its parent.
func procCPU(pid int) (seconds float64, ppid int, ok bool) {
	b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
	if err != nil {
		return 0, 0, false
	}
	// The command name is in parentheses and may hold spaces: fields
	// start after the last ')'.
	s := string(b)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	if len(f) < 13 {
		return 0, 0, false
	}
	ppid, _ = strconv.Atoi(f[1])
	utime, _ := strconv.ParseFloat(f[11], 64)
	stime, _ := strconv.ParseFloat(f[12], 64)
	return (utime + stime) / clockTicks, ppid, true
}

// cpuByRole is the CPU seconds each of the stack's processes has used so
// far; "postgres" sums the postmaster and its live children (backends).
func cpuByRole(pids map[string]int) map[string]float64 {
	out := map[string]float64{}
	for role, pid := range pids {
		if s, _, ok := procCPU(pid); ok {
			out[role] = s
		}
	}
	pm := pids["postgres"]
	if pm == 0 {
		return out
	}
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if s, ppid, ok := procCPU(pid); ok && ppid == pm {
			out["postgres"] += s
		}
	}
	return out
}

// cpuDelta is after - before, rounded to the clock tick.
func cpuDelta(before, after map[string]float64) map[string]float64 {
	out := map[string]float64{}
	for k, v := range after {
		if d := v - before[k]; d > 0 {
			out[k] = float64(int64(d*clockTicks+0.5)) / clockTicks
		}
	}
	return out
}
