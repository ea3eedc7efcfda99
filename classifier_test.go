package sluice_test

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"syscall"
	"testing"

	"github.com/lib/pq"
	"github.com/stretchr/testify/require"

	"github.com/sluicemq/sluice"
	"github.com/sluicemq/sluice/sluicesql"
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
		want sluice.Class
	}{
		{"nil", nil, sluice.Unclassified},
		{"deadline", context.DeadlineExceeded, sluice.ClassTransient},
		{"canceled wrapped", wrap(context.Canceled), sluice.ClassTransient},
		{"net timeout", &net.OpError{Op: "read", Err: timeoutErr{}}, sluice.ClassTransient},
		{"os deadline", wrap(os.ErrDeadlineExceeded), sluice.ClassTransient},
		{"conn refused", &net.OpError{Op: "dial", Err: os.NewSyscallError("connect", syscall.ECONNREFUSED)}, sluice.ClassTransient},
		{"conn reset", wrap(syscall.ECONNRESET), sluice.ClassTransient},
		{"broken pipe", wrap(syscall.EPIPE), sluice.ClassTransient},
		{"bad conn", wrap(driver.ErrBadConn), sluice.ClassTransient},
		{"conn done", sql.ErrConnDone, sluice.ClassTransient},
		{"sqlstate 08006", wrap(stateErr("08006")), sluice.ClassTransient},
		{"sqlstate 53300", stateErr("53300"), sluice.ClassTransient},
		{"sqlstate 40001", stateErr("40001"), sluice.ClassTransient},
		{"sqlstate 40P01", wrap(stateErr("40P01")), sluice.ClassTransient},
		{"sqlstate 57P01", stateErr("57P01"), sluice.ClassTransient},
		{"pq serialization", wrap(&pq.Error{Code: "40001"}), sluice.ClassTransient},
		{"pq unique violation", &pq.Error{Code: "23505"}, sluice.ClassPoison}, // integrity: same failure on every retry
		{"sqlstate 23505", stateErr("23505"), sluice.ClassPoison},
		{"sqlstate 23P01 exclusion", stateErr("23P01"), sluice.ClassPoison},
		{"sqlstate 55P03 lock timeout", stateErr("55P03"), sluice.ClassTransient},
		{"json syntax", wrap(jsonSyntaxErr()), sluice.ClassPoison},
		{"json type", jsonTypeErr(), sluice.ClassPoison},
		{"panic", &sluice.PanicError{Value: "boom"}, sluice.ClassInvariant},
		{"unknown", errBusiness, sluice.ClassTransient},
		{"explicit reject", sluice.Reject(errBusiness), sluice.ClassRejected},
		{"explicit reject wrapped", wrap(sluice.Reject(errBusiness)), sluice.ClassRejected},
		{"explicit poison beats transient rule", sluice.Poison(context.DeadlineExceeded), sluice.ClassPoison},
		{"explicit transient beats json rule", sluice.Transient(jsonSyntaxErr()), sluice.ClassTransient},
		{"outermost failure wins", sluice.Invariant(sluice.Transient(errBusiness)), sluice.ClassInvariant},
		{"joined", errors.Join(errBusiness, sluice.Poison(errBusiness)), sluice.ClassPoison},
	}
	c := sluice.DefaultClassifier()
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
	c, err := sluice.NewClassifier(sluice.ClassifierConfig{
		Rules: []sluice.Rule{
			sluice.RuleIs(errNotFound, sluice.ClassInvariant),
			sluice.RuleAs[stateErr](sluice.ClassRejected),
			func(error) (sluice.Class, bool) { return sluice.Class(99), true }, // invalid: skipped
		},
		Default: sluice.ClassPoison,
	})
	require.NoError(t, err)

	require.Equal(t, sluice.ClassInvariant, c.Classify(fmt.Errorf("load: %w", errNotFound)))
	require.Equal(t, sluice.ClassRejected, c.Classify(stateErr("40001")), "user rules run before default rules")
	require.Equal(t, sluice.ClassTransient, c.Classify(sluice.Transient(errNotFound)), "explicit wrappers run before user rules")
	require.Equal(t, sluice.ClassTransient, c.Classify(context.DeadlineExceeded), "default rules still apply")
	require.Equal(t, sluice.ClassPoison, c.Classify(errBusiness), "configured default")
}

func TestNewClassifierValidates(t *testing.T) {
	t.Parallel()
	for _, def := range []sluice.Class{sluice.ClassRejected, sluice.ClassExhausted, sluice.Class(42)} {
		_, err := sluice.NewClassifier(sluice.ClassifierConfig{Default: def})
		require.ErrorContains(t, err, "ClassifierConfig.Default")
	}
	_, err := sluice.NewClassifier(sluice.ClassifierConfig{Rules: []sluice.Rule{nil}})
	require.ErrorContains(t, err, "ClassifierConfig.Rules[0]")
}

func TestFailureWrappers(t *testing.T) {
	t.Parallel()
	require.NoError(t, sluice.Transient(nil))
	require.NoError(t, sluice.Reject(nil))
	require.NoError(t, sluice.Poison(nil))
	require.NoError(t, sluice.Invariant(nil))

	err := sluice.Reject(errBusiness)
	require.ErrorIs(t, err, errBusiness)
	require.Equal(t, "rejected: order already shipped", err.Error())
	f, ok := errors.AsType[*sluice.Failure](err)
	require.True(t, ok)
	require.Equal(t, sluice.ClassRejected, f.Class)
	require.Equal(t, sluice.Unclassified, sluice.ClassOf(errBusiness))
}

func TestParseClass(t *testing.T) {
	t.Parallel()
	for c := sluice.ClassTransient; c <= sluice.ClassExhausted; c++ {
		got, err := sluice.ParseClass(c.String())
		require.NoError(t, err)
		require.Equal(t, c, got)
	}
	_, err := sluice.ParseClass("fatal")
	require.ErrorIs(t, err, sluice.ErrUnknownClass)
	require.Equal(t, "class(42)", sluice.Class(42).String())
}

// What the brake counts as an unreachable dependency the Classifier classes
// Transient by rule, not by falling through to the default: one list
// (sluice.Unreachable). Before, a host unreachable or a connection closed
// mid-conversation (io.EOF) engaged the brake yet was classed by Default —
// Poison, with Default Poison — so the brake never saw it as Transient.
func TestUnreachableErrorsAreTransientByRule(t *testing.T) {
	t.Parallel()
	c, err := sluice.NewClassifier(sluice.ClassifierConfig{Default: sluice.ClassPoison})
	require.NoError(t, err)
	for _, e := range []error{
		syscall.EHOSTUNREACH, syscall.ENETUNREACH, io.EOF, io.ErrUnexpectedEOF, syscall.ECONNREFUSED,
		&net.OpError{Op: "dial", Net: "tcp", Err: errors.New("no route")},
		fmt.Errorf("claim: %w", stateErr("53300")), fmt.Errorf("begin: %w", stateErr("57P01")), stateErr("08006"),
	} {
		require.True(t, sluice.Unreachable(e), "%v is unreachable", e)
		require.Equal(t, sluice.ClassTransient, c.Classify(e), "%v", e)
	}
	for _, e := range []error{stateErr("23505"), stateErr("40001"), errors.New("boom")} {
		require.False(t, sluice.Unreachable(e), "%v is not an unreachable dependency", e)
	}
}

// SQLSTATE class 42 is a bug in the handler's statements (an undefined
// column or table, a syntax error): the same statement fails the same way
// on every retry, so it is Poison — fix, then replay — instead of a Transient
// default that spent 35 minutes of ladder first. The same error from a
// stage's own call to its dependency (the inbox table missing) is the
// dependency's: Transient, for the brake. Explicit wrappers and user rules
// still win.
func TestClassifierClass42(t *testing.T) {
	t.Parallel()
	undefinedTable := &pq.Error{Code: "42P01", Message: `relation "inbox" does not exist`}
	dependency := &sluice.DependencyError{Op: "deduplication: claim", Err: undefinedTable}
	strict, err := sluice.NewClassifier(sluice.ClassifierConfig{Default: sluice.ClassPoison})
	require.NoError(t, err)
	for _, c := range []*sluice.Classifier{sluice.DefaultClassifier(), strict} {
		for _, e := range []error{
			&pq.Error{Code: "42703"}, fmt.Errorf("reserving: %w", undefinedTable), stateErr("42601"), stateErr("42501"),
		} {
			require.Equal(t, sluice.ClassPoison, c.Classify(e), "%v", e)
		}
		for _, e := range []error{
			dependency, fmt.Errorf("inbox: %w", dependency), errors.Join(errBusiness, dependency),
			&sluice.DependencyError{Op: "deduplication: begin", Err: errors.New("store timeout")},
			&sluice.DependencyError{Op: "deduplication: claim", Err: &pq.Error{Code: "23505"}},
		} {
			require.Equal(t, sluice.ClassTransient, c.Classify(e), "the dependency's: %v", e)
		}
		require.Equal(t, sluice.ClassPoison, c.Classify(sluice.Poison(dependency)), "explicit wrappers win")
		require.Equal(t, sluice.ClassTransient, c.Classify(sluice.Transient(undefinedTable)), "explicit wrappers win")
	}
	c, err := sluice.NewClassifier(sluice.ClassifierConfig{Rules: []sluice.Rule{
		sluice.RuleAs[*sluice.DependencyError](sluice.ClassInvariant),
		func(err error) (sluice.Class, bool) {
			state, ok := sluicesql.SQLState(err)
			return sluice.ClassRejected, ok && state == "42703"
		},
	}})
	require.NoError(t, err)
	require.Equal(t, sluice.ClassInvariant, c.Classify(dependency), "user rules run before the default rules")
	require.Equal(t, sluice.ClassRejected, c.Classify(&pq.Error{Code: "42703"}), "user rules run before the default rules")
}

// mysqlError has the shape of go-sql-driver/mysql's *MySQLError, which has
// no SQLState method: SQLState reads it by reflection.
type mysqlError struct {
	Number   uint16
	SQLState [5]byte
	Message  string
}

func (e *mysqlError) Error() string {
	return fmt.Sprintf("Error %d (%s): %s", e.Number, e.SQLState, e.Message)
}

func myErr(number uint16, state string) *mysqlError {
	e := &mysqlError{Number: number, Message: "from MariaDB"}
	copy(e.SQLState[:], state)
	return e
}

// notMySQL has the field names but not the types: it is not read.
type notMySQL struct {
	Number   int
	SQLState string
}

func (notMySQL) Error() string { return "not a MySQL error" }

// MySQL and MariaDB errors are classified as PostgreSQL's are: by their
// SQLSTATE, and by their number where the SQLSTATE says too little (HY000,
// none, or 42000 for a per-user connection limit).
func TestClassifierMySQLErrors(t *testing.T) {
	t.Parallel()
	wrap := func(err error) error { return fmt.Errorf("reserving stock: %w", err) }
	tests := []struct {
		name        string
		err         error
		state       string // "" for none
		want        sluice.Class
		unreachable bool
	}{
		{"1054 undefined column", myErr(1054, "42S22"), "42S22", sluice.ClassPoison, false},
		{"1146 undefined table", wrap(myErr(1146, "42S02")), "42S02", sluice.ClassPoison, false},
		{"1064 syntax error", myErr(1064, "42000"), "42000", sluice.ClassPoison, false},
		{"1062 duplicate key", wrap(myErr(1062, "23000")), "23000", sluice.ClassPoison, false},
		{"1452 foreign key", myErr(1452, "23000"), "23000", sluice.ClassPoison, false},
		{"1205 lock wait timeout", wrap(myErr(1205, "HY000")), "55P03", sluice.ClassTransient, false},
		{"1213 deadlock", myErr(1213, "40001"), "40001", sluice.ClassTransient, false},
		{"1213 deadlock without SQLSTATE", myErr(1213, ""), "40001", sluice.ClassTransient, false},
		{"1040 too many connections in the handshake", myErr(1040, ""), "08004", sluice.ClassTransient, true},
		{"1203 max_user_connections", myErr(1203, "42000"), "08004", sluice.ClassTransient, true},
		{"2013 server lost", myErr(2013, "HY000"), "08S01", sluice.ClassTransient, true},
		{"08S01 communication failure", myErr(1159, "08S01"), "08S01", sluice.ClassTransient, true},
		{"joined", errors.Join(errBusiness, myErr(1054, "42S22")), "42S22", sluice.ClassPoison, false},
		{"unknown HY000", myErr(1317, "HY000"), "HY000", sluice.ClassPoison, false},                           // by Default
		{"no SQLSTATE", myErr(1105, ""), "", sluice.ClassPoison, false},                                       // by Default
		{"garbage SQLSTATE", myErr(1105, "\x00\x01abc"), "", sluice.ClassPoison, false},                       // by Default
		{"wrong field types", wrap(notMySQL{Number: 1205, SQLState: "HY000"}), "", sluice.ClassPoison, false}, // by Default
		{"struct value", mysqlValue{Number: 1205, SQLState: [5]byte{'H', 'Y', '0', '0', '0'}}, "55P03", sluice.ClassTransient, false},
		{"in a dependency error", &sluice.DependencyError{Op: "claim", Err: myErr(1146, "42S02")}, "42S02", sluice.ClassTransient, false},
	}
	c, err := sluice.NewClassifier(sluice.ClassifierConfig{Default: sluice.ClassPoison})
	require.NoError(t, err)
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			state, ok := sluicesql.SQLState(tt.err)
			require.Equal(t, tt.state != "", ok)
			require.Equal(t, tt.state, state)
			require.Equal(t, tt.want, c.Classify(tt.err), "error: %v", tt.err)
			require.Equal(t, tt.unreachable, sluice.Unreachable(tt.err))
		})
	}
}

type mysqlValue struct {
	Number   uint16
	SQLState [5]byte
}

func (mysqlValue) Error() string { return "Error 1205" }

// The reflective read is bounded: it looks at the first 64 errors of a
// chain.
func TestSQLStateBoundedChain(t *testing.T) {
	t.Parallel()
	wrapped := func(n int) error {
		err := error(myErr(1054, "42S22"))
		for range n {
			err = fmt.Errorf("layer: %w", err)
		}
		return err
	}
	state, ok := sluicesql.SQLState(wrapped(63))
	require.True(t, ok)
	require.Equal(t, "42S22", state)
	_, ok = sluicesql.SQLState(wrapped(64))
	require.False(t, ok, "beyond the first 64 errors of the chain")
}
