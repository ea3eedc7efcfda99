package middleware_test

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"syscall"
	"testing"

	"github.com/lib/pq"
	"github.com/stretchr/testify/require"

	"github.com/sluicemq/sluice/middleware"
)

type timeoutErr struct{}

func (timeoutErr) Error() string   { return "i/o timeout" }
func (timeoutErr) Timeout() bool   { return true }
func (timeoutErr) Temporary() bool { return true }

type stateErr string

func (e stateErr) Error() string    { return "sql error " + string(e) }
func (e stateErr) SQLState() string { return string(e) }

func jsonSyntaxErr() error {
	var v map[string]any
	return json.Unmarshal([]byte(`{"a":`), &v)
}

func jsonTypeErr() error {
	var v struct{ N int }
	return json.Unmarshal([]byte(`{"N":"x"}`), &v)
}

var errBusiness = errors.New("order already shipped")

func TestClassifierDefaults(t *testing.T) {
	t.Parallel()
	wrap := func(err error) error { return fmt.Errorf("reserving stock: %w", err) }
	tests := []struct {
		name string
		err  error
		want middleware.Class
	}{
		{"nil", nil, middleware.Unclassified},
		{"deadline", context.DeadlineExceeded, middleware.ClassTransient},
		{"canceled wrapped", wrap(context.Canceled), middleware.ClassTransient},
		{"net timeout", &net.OpError{Op: "read", Err: timeoutErr{}}, middleware.ClassTransient},
		{"os deadline", wrap(os.ErrDeadlineExceeded), middleware.ClassTransient},
		{"conn refused", &net.OpError{Op: "dial", Err: os.NewSyscallError("connect", syscall.ECONNREFUSED)}, middleware.ClassTransient},
		{"conn reset", wrap(syscall.ECONNRESET), middleware.ClassTransient},
		{"broken pipe", wrap(syscall.EPIPE), middleware.ClassTransient},
		{"bad conn", wrap(driver.ErrBadConn), middleware.ClassTransient},
		{"conn done", sql.ErrConnDone, middleware.ClassTransient},
		{"sqlstate 08006", wrap(stateErr("08006")), middleware.ClassTransient},
		{"sqlstate 53300", stateErr("53300"), middleware.ClassTransient},
		{"sqlstate 40001", stateErr("40001"), middleware.ClassTransient},
		{"sqlstate 40P01", wrap(stateErr("40P01")), middleware.ClassTransient},
		{"sqlstate 57P01", stateErr("57P01"), middleware.ClassTransient},
		{"pq serialization", wrap(&pq.Error{Code: "40001"}), middleware.ClassTransient},
		{"pq unique violation", &pq.Error{Code: "23505"}, middleware.ClassPoison}, // integrity: same failure on every retry
		{"sqlstate 23505", stateErr("23505"), middleware.ClassPoison},
		{"sqlstate 23P01 exclusion", stateErr("23P01"), middleware.ClassPoison},
		{"sqlstate 55P03 lock timeout", stateErr("55P03"), middleware.ClassTransient},
		{"json syntax", wrap(jsonSyntaxErr()), middleware.ClassPoison},
		{"json type", jsonTypeErr(), middleware.ClassPoison},
		{"panic", &middleware.PanicError{Value: "boom"}, middleware.ClassInvariant},
		{"unknown", errBusiness, middleware.ClassTransient},
		{"explicit reject", middleware.Reject(errBusiness), middleware.ClassRejected},
		{"explicit reject wrapped", wrap(middleware.Reject(errBusiness)), middleware.ClassRejected},
		{"explicit poison beats transient rule", middleware.Poison(context.DeadlineExceeded), middleware.ClassPoison},
		{"explicit transient beats json rule", middleware.Transient(jsonSyntaxErr()), middleware.ClassTransient},
		{"outermost failure wins", middleware.Invariant(middleware.Transient(errBusiness)), middleware.ClassInvariant},
		{"joined", errors.Join(errBusiness, middleware.Poison(errBusiness)), middleware.ClassPoison},
	}
	c := middleware.DefaultClassifier()
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			require.Equal(t, tt.want, c.Classify(tt.err), "error: %v", tt.err)
		})
	}
}

func TestClassifierRules(t *testing.T) {
	t.Parallel()
	errNotFound := errors.New("order not found")
	c, err := middleware.NewClassifier(middleware.ClassifierConfig{
		Rules: []middleware.Rule{
			middleware.RuleIs(errNotFound, middleware.ClassInvariant),
			middleware.RuleAs[stateErr](middleware.ClassRejected),
			func(error) (middleware.Class, bool) { return middleware.Class(99), true }, // invalid: skipped
		},
		Default: middleware.ClassPoison,
	})
	require.NoError(t, err)

	require.Equal(t, middleware.ClassInvariant, c.Classify(fmt.Errorf("load: %w", errNotFound)))
	require.Equal(t, middleware.ClassRejected, c.Classify(stateErr("40001")), "user rules run before default rules")
	require.Equal(t, middleware.ClassTransient, c.Classify(middleware.Transient(errNotFound)), "explicit wrappers run before user rules")
	require.Equal(t, middleware.ClassTransient, c.Classify(context.DeadlineExceeded), "default rules still apply")
	require.Equal(t, middleware.ClassPoison, c.Classify(errBusiness), "configured default")
}

func TestNewClassifierValidates(t *testing.T) {
	t.Parallel()
	for _, def := range []middleware.Class{middleware.ClassRejected, middleware.ClassExhausted, middleware.Class(42)} {
		_, err := middleware.NewClassifier(middleware.ClassifierConfig{Default: def})
		require.ErrorContains(t, err, "ClassifierConfig.Default")
	}
	_, err := middleware.NewClassifier(middleware.ClassifierConfig{Rules: []middleware.Rule{nil}})
	require.ErrorContains(t, err, "ClassifierConfig.Rules[0]")
}

func TestFailureWrappers(t *testing.T) {
	t.Parallel()
	require.NoError(t, middleware.Transient(nil))
	require.NoError(t, middleware.Reject(nil))
	require.NoError(t, middleware.Poison(nil))
	require.NoError(t, middleware.Invariant(nil))

	err := middleware.Reject(errBusiness)
	require.ErrorIs(t, err, errBusiness)
	require.Equal(t, "rejected: order already shipped", err.Error())
	f, ok := errors.AsType[*middleware.Failure](err)
	require.True(t, ok)
	require.Equal(t, middleware.ClassRejected, f.Class)
	require.Equal(t, middleware.Unclassified, middleware.ClassOf(errBusiness))
}

func TestParseClass(t *testing.T) {
	t.Parallel()
	for c := middleware.ClassTransient; c <= middleware.ClassExhausted; c++ {
		got, err := middleware.ParseClass(c.String())
		require.NoError(t, err)
		require.Equal(t, c, got)
	}
	_, err := middleware.ParseClass("fatal")
	require.ErrorIs(t, err, middleware.ErrUnknownClass)
	require.Equal(t, "class(42)", middleware.Class(42).String())
}
