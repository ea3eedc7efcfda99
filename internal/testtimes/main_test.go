package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// Events as `go test -json` writes them (cmd/test2json): a package whose
// passing test logged, a failing test, a test running when its binary
// panicked, and a line that is no event (a build error on stderr).
const events = `{"Action":"start","Package":"p/a"}
{"Action":"run","Package":"p/a","Test":"TestQuiet"}
{"Action":"output","Package":"p/a","Test":"TestQuiet","Output":"=== RUN   TestQuiet\n"}
{"Action":"output","Package":"p/a","Test":"TestQuiet","Output":"    a_test.go:9: a log line of a passing test\n"}
{"Action":"output","Package":"p/a","Test":"TestQuiet","Output":"--- PASS: TestQuiet (2.50s)\n"}
{"Action":"pass","Package":"p/a","Test":"TestQuiet","Elapsed":2.5}
{"Action":"run","Package":"p/a","Test":"TestBroken"}
{"Action":"output","Package":"p/a","Test":"TestBroken","Output":"=== RUN   TestBroken\n"}
{"Action":"output","Package":"p/a","Test":"TestBroken","Output":"    a_test.go:20: want 2, got 1\n"}
{"Action":"output","Package":"p/a","Test":"TestBroken","Output":"--- FAIL: TestBroken (7.00s)\n"}
{"Action":"fail","Package":"p/a","Test":"TestBroken","Elapsed":7}
{"Action":"output","Package":"p/a","Output":"FAIL\n"}
{"Action":"output","Package":"p/a","Output":"FAIL\tp/a\t9.6s\n"}
{"Action":"fail","Package":"p/a","Elapsed":9.6}
{"Action":"output","Package":"p/b","Test":"TestHangs","Output":"=== RUN   TestHangs\n"}
{"Action":"output","Package":"p/b","Test":"TestHangs","Output":"    b_test.go:5: waiting for the broker\n"}
{"Action":"output","Package":"p/b","Output":"panic: test timed out after 20m0s\n"}
{"Action":"output","Package":"p/b","Output":"FAIL\tp/b\t1200.0s\n"}
{"Action":"fail","Package":"p/b","Elapsed":1200}
{"Action":"output","Package":"p/c","Output":"ok  \tp/c\t0.5s\n"}
{"Action":"pass","Package":"p/c","Elapsed":0.5}
{"Time":"2026-12-05T04:39:41Z","Action":"run","Package":"p/c","Test":"TestSuite"}
{"Time":"2026-12-05T04:39:41Z","Action":"pause","Package":"p/c","Test":"TestSuite"}
{"Time":"2026-12-05T04:39:54Z","Action":"cont","Package":"p/c","Test":"TestSuite"}
{"Time":"2026-12-05T04:40:06Z","Action":"pass","Package":"p/c","Test":"TestSuite","Elapsed":0}
{"ImportPath":"p/e [p/e.test]","Action":"build-output","Output":"# p/e [p/e.test]\n"}
{"ImportPath":"p/e [p/e.test]","Action":"build-output","Output":"./x.go:2:12: undefined: y\n"}
{"ImportPath":"p/e [p/e.test]","Action":"build-fail"}
{"Action":"output","Package":"p/e","Output":"FAIL\tp/e [build failed]\n"}
{"Action":"fail","Package":"p/e","Elapsed":0,"FailedBuild":"p/e [p/e.test]"}
# p/d
d.go:3:1: syntax error
`

// The filter prints what a plain go test prints, and keeps every event.
func TestTheFilterPrintsWhatPlainGoTestPrints(t *testing.T) {
	var out, kept bytes.Buffer
	if err := filter(strings.NewReader(events), &out, &kept); err != nil {
		t.Fatal(err)
	}
	want := `    a_test.go:20: want 2, got 1
--- FAIL: TestBroken (7.00s)
FAIL
FAIL	p/a	9.6s
panic: test timed out after 20m0s
FAIL	p/b	1200.0s
    b_test.go:5: waiting for the broker
ok  	p/c	0.5s
# p/e [p/e.test]
./x.go:2:12: undefined: y
FAIL	p/e [build failed]
# p/d
d.go:3:1: syntax error
`
	if out.String() != want {
		t.Errorf("printed:\n%s\nwant:\n%s", out.String(), want)
	}
	if n := strings.Count(kept.String(), "\n"); n != 30 {
		t.Errorf("kept %d events, want 30", n)
	}
}

// -top lists the slowest top-level tests and packages, a failure marked; a
// test whose parallel subtests ran after its function returned (Elapsed 0)
// counts from its resumption to its end.
func TestTopListsTheSlowest(t *testing.T) {
	file := filepath.Join(t.TempDir(), "go-test.json")
	if err := os.WriteFile(file, []byte(events), 0o600); err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	if err := printSlowest(&out, 2, []string{file}); err != nil {
		t.Fatal(err)
	}
	want := `the 2 slowest tests (of 3; a parallel test's time from its start after t.Parallel):
     12.0s  p/c TestSuite
      7.0s  p/a TestBroken (failed)
the 10 slowest packages (each test binary's wall time):
   1200.0s  p/b (failed)
      9.6s  p/a (failed)
      0.5s  p/c
      0.0s  p/e (failed)
`
	if out.String() != want {
		t.Errorf("printed:\n%s\nwant:\n%s", out.String(), want)
	}
}
