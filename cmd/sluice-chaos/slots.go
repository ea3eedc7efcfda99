package main

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"time"
)

// slot keeps one consumer process running, restarting it when it dies.
type slot struct {
	mu       sync.Mutex
	cmd      *exec.Cmd
	stopping bool
	restarts int
	crashes  map[string]int
	counts   map[string]int // the consumers' "count <name> <n>" lines
	done     chan struct{}
}

func (w *world) startSlot(crashProb float64) *slot {
	// Each process lists the nodes from a different one: the first
	// process starts on the first node, the second on the second, …
	urls := w.conn.URLs
	if w.conn.URL != "" {
		urls = []string{w.conn.URL}
	}
	first := len(w.procs) % len(urls)
	urls = append(urls[first:len(urls):len(urls)], urls[:first]...)
	args := []string{"consumer", "--amqp-url", strings.Join(urls, ","), fmt.Sprintf("--quorum=%t", w.quorum), "--postgres-url", w.consumerURL(), "--queue", w.topo.Config().Queue,
		"--schema", w.name, "--tiers", w.o.tiers, "--consumers", fmt.Sprint(w.o.consumers), "--subscriber", w.o.subscriber,
		"--crash-prob", fmt.Sprint(crashProb), "--crash-points", strings.Join(killCrashPoints, ",")}
	if w.traces != nil {
		args = append(args, "--trace")
	}
	return w.spawn(append(args, w.slotArgs...))
}

// spawn keeps one process of this program running with args, restarting it
// when it dies, until the slot's stop.
func (w *world) spawn(args []string) *slot {
	s := &slot{crashes: map[string]int{}, counts: map[string]int{}, done: make(chan struct{})}
	proc := len(w.procs) + 1 // the slot's number, for the trace lines
	go func() {
		defer close(s.done)
		for first := true; ; first = false {
			s.mu.Lock()
			if s.stopping {
				s.mu.Unlock()
				return
			}
			if !first {
				s.restarts++
			}
			cmd := exec.CommandContext(context.Background(), os.Args[0], args...) // stopped by stop(), not by a context
			stderr, _ := cmd.StderrPipe()
			if err := cmd.Start(); err != nil {
				s.mu.Unlock()
				time.Sleep(200 * time.Millisecond)
				continue
			}
			s.cmd = cmd
			s.mu.Unlock()
			sc := bufio.NewScanner(stderr)
			for sc.Scan() {
				if point, ok := strings.CutPrefix(sc.Text(), "crash "); ok {
					s.mu.Lock()
					s.crashes[point]++
					s.mu.Unlock()
				} else if name, n, ok := countLine(sc.Text()); ok {
					s.mu.Lock()
					s.counts[name] += n
					s.mu.Unlock()
				} else if rest, ok := strings.CutPrefix(sc.Text(), "trace "); ok {
					id, what, _ := strings.Cut(rest, " ")
					w.traces.add(id, fmt.Sprintf("process %d: %s", proc, what))
				}
			}
			_ = cmd.Wait()
		}
	}()
	return s
}

func (s *slot) kill() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd == nil || s.cmd.Process == nil {
		return false
	}
	return s.cmd.Process.Signal(syscall.SIGKILL) == nil
}

func (s *slot) stop() {
	s.mu.Lock()
	s.stopping = true
	if s.cmd != nil && s.cmd.Process != nil {
		_ = s.cmd.Process.Signal(syscall.SIGTERM)
	}
	s.mu.Unlock()
	select {
	case <-s.done:
	case <-time.After(20 * time.Second):
		s.kill()
		<-s.done
	}
}
