package sluice

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"strings"

	"github.com/sluicemq/sluice/internal/sqlstate"
)

// unmatchedDefault is ClassifierConfig.Default's default: Transient, so an
// unknown error is retried and bounded by the retry budget rather than
// dropped or poisoned at once.
const unmatchedDefault = ClassTransient

// Rule classifies the errors it recognises and reports false for the others.
// Rules must return a valid class; an invalid one is skipped.
type Rule func(err error) (Class, bool)

// RuleIs classifies errors for which errors.Is(err, target) holds.
func RuleIs(target error, c Class) Rule {
	return func(err error) (Class, bool) { return c, errors.Is(err, target) }
}

// RuleAs classifies errors with an E in their chain (errors.AsType).
func RuleAs[E error](c Class) Rule {
	return func(err error) (Class, bool) {
		_, ok := errors.AsType[E](err)
		return c, ok
	}
}

// ClassifierConfig configures a Classifier. The zero value is the default
// classifier.
type ClassifierConfig struct {
	// Rules are tried in order after explicit Failure wrappers and before the
	// default rules; the first that recognises the error wins.
	Rules []Rule
	// Default is the class of errors that no rule recognises. Must be
	// ClassTransient, ClassPoison or ClassInvariant. Default ClassTransient:
	// an unknown error is retried and bounded by the retry budget rather
	// than dropped or poisoned at once.
	Default Class
}

// Classifier decides the Class of a handler error: an explicit Failure in the
// chain wins, then the configured rules, then the default rules, then Default.
// It is immutable and safe for concurrent use.
type Classifier struct {
	rules []Rule
	def   Class
}

// NewClassifier validates cfg and returns a Classifier.
func NewClassifier(cfg ClassifierConfig) (*Classifier, error) {
	def := cfg.Default
	if def == Unclassified {
		def = unmatchedDefault
	}
	switch def {
	case ClassTransient, ClassPoison, ClassInvariant:
	default:
		return nil, fmt.Errorf("middleware: ClassifierConfig.Default must be transient, poison or invariant, got %s", def)
	}
	for i, r := range cfg.Rules {
		if r == nil {
			return nil, fmt.Errorf("middleware: ClassifierConfig.Rules[%d] is nil", i)
		}
	}
	return &Classifier{rules: append([]Rule(nil), cfg.Rules...), def: def}, nil
}

// DefaultClassifier returns the classifier of the zero ClassifierConfig.
func DefaultClassifier() *Classifier { return &Classifier{def: unmatchedDefault} }

// Classify returns the class of err; Unclassified for nil, for a delivery
// held back by the brake (ErrHeld) and for one given back by a shutdown
// (ErrShutdown), on which no stage acts.
func (c *Classifier) Classify(err error) Class {
	if err == nil || errors.Is(err, ErrHeld) || errors.Is(err, ErrShutdown) {
		return Unclassified
	}
	if cl := ClassOf(err); cl.Valid() {
		return cl
	}
	for _, r := range c.rules {
		if cl, ok := r(err); ok && cl.Valid() {
			return cl
		}
	}
	if cl, ok := defaultClass(err); ok {
		return cl
	}
	return c.def
}

// defaultClass holds the default rules documented on Classifier, in
// docs/failure-classes.md. A stage's own dependency failure comes first: a
// DependencyError is the dependency's whatever its SQLSTATE (the inbox table
// missing is class 42), so it is Transient and the brake can act on it.
func defaultClass(err error) (Class, bool) {
	if errors.Is(err, ErrDependency) || isTransient(err) {
		return ClassTransient, true
	}
	if integrityViolation(err) || handlerBug(err) {
		return ClassPoison, true
	}
	if _, ok := errors.AsType[*json.SyntaxError](err); ok {
		return ClassPoison, true
	}
	if _, ok := errors.AsType[*json.UnmarshalTypeError](err); ok {
		return ClassPoison, true
	}
	if _, ok := errors.AsType[*PanicError](err); ok {
		return ClassInvariant, true
	}
	return Unclassified, false
}

func isTransient(err error) bool {
	switch {
	case Unreachable(err), errors.Is(err, context.DeadlineExceeded), errors.Is(err, context.Canceled):
		return true
	}
	if ne, ok := errors.AsType[net.Error](err); ok && ne.Timeout() {
		return true
	}
	if state, ok := sqlstate.Of(err); ok {
		return transientSQLState(state)
	}
	return false
}

// integrityViolation reports SQLSTATE class 23, integrity constraint
// violations (23505 unique, 23503 foreign key, 23502 not null, 23514 check,
// 23P01 exclusion): the same statement fails the same way on every retry.
func integrityViolation(err error) bool {
	state, ok := sqlstate.Of(err)
	return ok && strings.HasPrefix(state, "23")
}

// handlerBug reports SQLSTATE class 42, syntax error or access rule
// violation (42703 undefined column, 42P01 undefined table, 42601 syntax
// error; MySQL's 42S22, 42S02, 42000): a bug in the handler's statements,
// which fail the same way on every retry until the handler is fixed.
func handlerBug(err error) bool {
	state, ok := sqlstate.Of(err)
	return ok && strings.HasPrefix(state, "42")
}

// transientSQLState reports the SQLSTATEs worth retrying: those of an
// unreachable database (sqlstate.Unreachable), serialization failure
// (40001), deadlock (40P01) and lock not available (55P03, a lock_timeout
// such as the inbox's claim wait).
func transientSQLState(state string) bool {
	switch state {
	case "40001", "40P01", "55P03":
		return true
	}
	return sqlstate.Unreachable(state)
}
