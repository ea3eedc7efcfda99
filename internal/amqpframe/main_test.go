package amqpframe

import (
	"fmt"
	"os"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(emptied{m}) }

// emptied runs the tests and then, once their goroutines have ended (the
// clients' readers among them), fails unless the registry is empty: every
// connection the tests wrapped left it, closed or cut.
type emptied struct{ m *testing.M }

func (e emptied) Run() int {
	code := e.m.Run()
	if code != 0 {
		return code
	}
	if err := goleak.Find(); err != nil {
		return code // VerifyTestMain reports it
	}
	if n := registered(); n != 0 {
		fmt.Fprintf(os.Stderr, "amqpframe: the registry holds %d connections after the tests\n", n)
		return 1
	}
	return code
}
