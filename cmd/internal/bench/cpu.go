package bench

import (
	"bufio"
	"bytes"
	"os"
	"strconv"
	"syscall"
	"time"
)

// cpuSample is where the machine's and this process's CPU time stood at
// one moment: B1 divides what a run spent by the events it handled, to
// show what bounds it when every core is busy.
type cpuSample struct {
	at          time.Time
	busy, total uint64        // /proc/stat's jiffies of all cores: not idle or waiting on I/O, and all
	cores       int           // the cores /proc/stat lists
	self        time.Duration // this process's user + system time
	ok          bool          // the machine's figures were read (Linux)
}

// sampleCPU reads the machine's and this process's CPU time.
func sampleCPU() cpuSample {
	s := cpuSample{at: time.Now()}
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) == nil {
		s.self = time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	}
	if b, err := os.ReadFile("/proc/stat"); err == nil {
		s.busy, s.total, s.cores, s.ok = parseProcStat(b)
	}
	return s
}

// parseProcStat returns the busy and total jiffies of /proc/stat's "cpu"
// line (user, nice, system, irq, softirq and steal are busy; idle and
// iowait are not; guest time is already in user) and the cores it lists.
func parseProcStat(b []byte) (busy, total uint64, cores int, ok bool) {
	lines := bytes.Split(b, []byte("\n"))
	sc := bufio.NewScanner(bytes.NewReader(lines[0]))
	sc.Split(bufio.ScanWords)
	if !sc.Scan() || sc.Text() != "cpu" {
		return 0, 0, 0, false
	}
	for i := 0; i < 8 && sc.Scan(); i++ {
		v, err := strconv.ParseUint(sc.Text(), 10, 64)
		if err != nil {
			return 0, 0, 0, false
		}
		total += v
		if i != 3 && i != 4 { // idle, iowait
			busy += v
		}
	}
	for _, l := range lines[1:] {
		if len(l) > 3 && bytes.HasPrefix(l, []byte("cpu")) && l[3] >= '0' && l[3] <= '9' {
			cores++
		}
	}
	return busy, total, cores, total > 0 && cores > 0
}

// cpuCost is what a run spent per event: the machine's CPU time (every
// process: the broker, PostgreSQL, this one) and this process's alone, in
// microseconds, and the cores busy on average.
type cpuCost struct {
	machine, self, cores float64
	ok                   bool
}

// costSince is the CPU cost per event of n events handled since start.
func costSince(start cpuSample, n int) cpuCost {
	end := sampleCPU()
	wall := end.at.Sub(start.at)
	if n <= 0 || wall <= 0 || !start.ok || !end.ok || end.total <= start.total {
		return cpuCost{}
	}
	cores := float64(end.cores) * float64(end.busy-start.busy) / float64(end.total-start.total)
	return cpuCost{
		machine: cores * wall.Seconds() * 1e6 / float64(n),
		self:    float64(end.self-start.self) / 1e3 / float64(n),
		cores:   cores,
		ok:      true,
	}
}
