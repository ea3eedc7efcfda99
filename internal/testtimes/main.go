// Command testtimes reads `go test -json` and prints what a plain `go test`
// prints (each package's result line; a failed test's output), keeping the
// JSON in a file; given such files instead, it prints the slowest tests
// and packages. make test's main go test runs through it (scripts/test.sh),
// and make test-times prints the slowest from its file:
//
//	go test -json ./... 2>&1 | go run ./internal/testtimes -save go-test.json
//	go run ./internal/testtimes -top 25 go-test.json
package main

import (
	"bufio"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"
	"time"
)

func main() {
	save := flag.String("save", "", "filter: the file to keep the JSON events in")
	top := flag.Int("top", 0, "print the N slowest tests (and packages) of the files given")
	flag.Parse()
	var err error
	if *top > 0 {
		err = printSlowest(os.Stdout, *top, flag.Args())
	} else {
		err = filterFile(os.Stdin, os.Stdout, *save)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "testtimes:", err)
		os.Exit(1)
	}
}

// event is one line of `go test -json` (cmd/test2json).
type event struct {
	Time    time.Time
	Action  string
	Package string
	Test    string
	Output  string
	Elapsed float64
}

func filterFile(in io.Reader, out io.Writer, save string) error {
	var keep io.Writer = io.Discard
	if save != "" {
		f, err := os.Create(save) // #nosec G304 -- a path make test names
		if err != nil {
			return err
		}
		defer func() { _ = f.Close() }()
		w := bufio.NewWriter(f)
		defer func() { _ = w.Flush() }()
		keep = w
	}
	return filter(in, out, keep)
}

// filter copies in's events to keep and prints what plain go test would:
// package-level output (its "ok"/"FAIL" lines, a build failure, a panic
// outside any test) and a failed test's output, not a passing test's.
// A line that is not an event is printed as it is.
func filter(in io.Reader, out, keep io.Writer) error {
	buffered := map[string][]string{} // package + test → its output so far
	order := map[string][]string{}    // package → its tests with output, in order
	flush := func(pkg, test string) {
		for _, l := range buffered[pkg+" "+test] {
			_, _ = io.WriteString(out, l)
		}
		delete(buffered, pkg+" "+test)
	}
	sc := bufio.NewScanner(in)
	sc.Buffer(make([]byte, 64*1024), 16*1024*1024)
	for sc.Scan() {
		line := sc.Bytes()
		var e event
		if len(line) == 0 || line[0] != '{' || json.Unmarshal(line, &e) != nil || e.Action == "" {
			_, _ = fmt.Fprintf(out, "%s\n", line)
			continue
		}
		_, _ = fmt.Fprintf(keep, "%s\n", line)
		switch {
		case e.Action == "build-output": // a build failure's lines
			_, _ = io.WriteString(out, e.Output)
		case e.Action == "output" && e.Test == "":
			if e.Output != "PASS\n" && !strings.HasPrefix(e.Output, "=== ") {
				_, _ = io.WriteString(out, e.Output)
			}
		case e.Action == "output":
			if strings.HasPrefix(e.Output, "=== ") { // RUN, PAUSE, CONT, NAME
				continue
			}
			k := e.Package + " " + e.Test
			if _, ok := buffered[k]; !ok {
				order[e.Package] = append(order[e.Package], e.Test)
			}
			buffered[k] = append(buffered[k], e.Output)
		case e.Test != "" && e.Action == "fail":
			flush(e.Package, e.Test)
		case e.Test != "" && (e.Action == "pass" || e.Action == "skip"):
			delete(buffered, e.Package+" "+e.Test)
		case e.Test == "" && e.Action == "fail":
			// The binary failed outside a test's end (a panic, a
			// timeout): what its running tests printed is the story.
			for _, t := range order[e.Package] {
				flush(e.Package, t)
			}
		}
		if e.Test == "" && (e.Action == "pass" || e.Action == "fail" || e.Action == "skip") {
			for _, t := range order[e.Package] {
				delete(buffered, e.Package+" "+t)
			}
			delete(order, e.Package)
		}
	}
	return sc.Err()
}

// timing is a test's or a package's time.
type timing struct {
	name    string
	elapsed time.Duration
	failed  bool
}

// printSlowest prints the n slowest top-level tests and the 10 slowest
// packages of the JSON files.
func printSlowest(out io.Writer, n int, files []string) error {
	if len(files) == 0 {
		return errors.New("-top needs the JSON files (make test keeps one)")
	}
	var tests, pkgs []timing
	for _, file := range files {
		f, err := os.Open(file) // #nosec G304 -- a file the caller names
		if err != nil {
			return err
		}
		// A test's time is from its start (or its resumption after
		// t.Parallel) to its end: a test whose parallel subtests run
		// after its function returned reports an Elapsed of 0.
		started := map[string]time.Time{}
		sc := bufio.NewScanner(f)
		sc.Buffer(make([]byte, 64*1024), 16*1024*1024)
		for sc.Scan() {
			var e event
			if json.Unmarshal(sc.Bytes(), &e) != nil {
				continue
			}
			if e.Action == "run" || e.Action == "cont" {
				started[e.Package+" "+e.Test] = e.Time
			}
			if e.Action != "pass" && e.Action != "fail" {
				continue
			}
			t := timing{elapsed: time.Duration(e.Elapsed * float64(time.Second)), failed: e.Action == "fail"}
			if s, ok := started[e.Package+" "+e.Test]; ok && !s.IsZero() && e.Time.Sub(s) > t.elapsed {
				t.elapsed = e.Time.Sub(s)
			}
			switch {
			case e.Test == "":
				t.name = short(e.Package)
				pkgs = append(pkgs, t)
			case !strings.Contains(e.Test, "/"):
				t.name = short(e.Package) + " " + e.Test
				tests = append(tests, t)
			}
		}
		_ = f.Close()
		if err := sc.Err(); err != nil {
			return err
		}
	}
	write := func(title string, ts []timing, max int) {
		sort.SliceStable(ts, func(i, j int) bool { return ts[i].elapsed > ts[j].elapsed })
		_, _ = fmt.Fprintf(out, "%s\n", title)
		for _, t := range ts[:min(max, len(ts))] {
			mark := ""
			if t.failed {
				mark = " (failed)"
			}
			_, _ = fmt.Fprintf(out, "%9.1fs  %s%s\n", t.elapsed.Seconds(), t.name, mark)
		}
	}
	write(fmt.Sprintf("the %d slowest tests (of %d; a parallel test's time from its start after t.Parallel):", min(n, len(tests)), len(tests)), tests, n)
	write("the 10 slowest packages (each test binary's wall time):", pkgs, 10)
	return nil
}

// short is a package's path without the module's prefix.
func short(pkg string) string {
	if pkg == "github.com/sluicemq/sluice" {
		return "sluice"
	}
	return strings.TrimPrefix(pkg, "github.com/sluicemq/sluice/")
}
