// Package unitctx is the delivery's unit of work as its context carries it:
// the inbox stage (package deduplication) opens it, package unitofwork reads
// it and registers its hooks. T is unitofwork.Tx; the type parameter keeps
// this package below unitofwork, which imports it.
package unitctx

import (
	"context"
	"sync"
	"sync/atomic"
)

type key struct{}

// Unit is the delivery's unit of work, and the handler's context that
// holds it: the message context with one value more, in one allocation.
type Unit[T any] struct {
	context.Context
	Tx      T
	EventID string // the delivery's sluice.EventIDKey

	// Calls counts the handler's runs in the unit (unitofwork.Reentry);
	// FirstErr is the first run's error, set before a second run can read
	// it.
	Calls    atomic.Int32
	FirstErr error

	mu       sync.Mutex // guards the hooks: a handler may write from several goroutines
	onCommit []func()
	rewrite  []func(context.Context, T) error
}

// New returns the unit of work tx of the delivery whose context is ctx.
func New[T any](ctx context.Context, tx T, eventID string) *Unit[T] {
	return &Unit[T]{Context: ctx, Tx: tx, EventID: eventID}
}

// Value returns the unit itself for its key, and the message context's
// values.
func (u *Unit[T]) Value(k any) any {
	if _, ok := k.(key); ok {
		return u
	}
	return u.Context.Value(k)
}

// Of returns the unit of work that ctx carries.
func Of[T any](ctx context.Context) (*Unit[T], bool) {
	u, ok := ctx.Value(key{}).(*Unit[T])
	return u, ok
}

// OnCommit registers f to run once the unit commits (Committed).
func (u *Unit[T]) OnCommit(f func()) {
	u.mu.Lock()
	u.onCommit = append(u.onCommit, f)
	u.mu.Unlock()
}

// OnRecordAlone registers write, which Rewrites returns.
func (u *Unit[T]) OnRecordAlone(write func(context.Context, T) error) {
	u.mu.Lock()
	u.rewrite = append(u.rewrite, write)
	u.mu.Unlock()
}

// Committed runs the OnCommit hooks, once the unit of work committed.
func (u *Unit[T]) Committed() {
	u.mu.Lock()
	hooks := u.onCommit
	u.onCommit = nil
	u.mu.Unlock()
	for _, f := range hooks {
		f()
	}
}

// Rewrites returns the writes registered by OnRecordAlone.
func (u *Unit[T]) Rewrites() []func(context.Context, T) error {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.rewrite
}
