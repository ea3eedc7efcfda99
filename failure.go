package sluice

import (
	"errors"
	"fmt"
)

// Class is what a failed delivery means, and so what Sluice does with it.
// The zero value is Unclassified: no class is known yet.
type Class uint8

const (
	// Unclassified is the zero Class: ClassOf returns it for errors that carry
	// no Failure, and Classifier.Classify for a nil error.
	Unclassified Class = iota
	// ClassTransient means the delivery may succeed later (a timeout, a refused
	// connection, a serialization failure). Retried within a budget.
	ClassTransient
	// ClassRejected means an expected business outcome (the state does not allow
	// the action). The handler's writes are committed and the message is acked.
	ClassRejected
	// ClassPoison means the message itself is bad (malformed JSON, a missing id).
	// Never retried; isolated in the poison queue.
	ClassPoison
	// ClassInvariant means a fact the system relies on is violated (an order that
	// must exist does not; a panic). Isolated and alerted.
	ClassInvariant
	// ClassExhausted means the retry budget of a transient failure is spent;
	// produced by retrytiers. Goes to the poison queue.
	ClassExhausted
)

var classNames = [...]string{
	Unclassified:   "unclassified",
	ClassTransient: "transient",
	ClassRejected:  "rejected",
	ClassPoison:    "poison",
	ClassInvariant: "invariant",
	ClassExhausted: "exhausted",
}

// String returns the lower-case name of the class ("transient", "poison", ...),
// the form used in metadata, metrics and logs.
func (c Class) String() string {
	if int(c) < len(classNames) {
		return classNames[c]
	}
	return fmt.Sprintf("class(%d)", uint8(c))
}

// Valid reports whether c is one of the five failure classes.
func (c Class) Valid() bool { return c >= ClassTransient && c <= ClassExhausted }

// ErrUnknownClass is returned by ParseClass for a name that is not a class.
var ErrUnknownClass = errors.New("unknown failure class")

// ParseClass is the inverse of Class.String for the five failure classes.
func ParseClass(s string) (Class, error) {
	for c := ClassTransient; c <= ClassExhausted; c++ {
		if classNames[c] == s {
			return c, nil
		}
	}
	return Unclassified, fmt.Errorf("%w: %q (want transient, rejected, poison, invariant or exhausted)", ErrUnknownClass, s)
}

// Failure is an error with a Class. Handlers create one with Transient,
// Reject, Poison or Invariant; the Classify middleware turns every other
// error into one. It unwraps to Err, so errors.Is and errors.As see through it.
type Failure struct {
	Class Class
	Err   error
}

// Error returns "<class>: <err>".
func (f *Failure) Error() string {
	if f.Err == nil {
		return f.Class.String()
	}
	return f.Class.String() + ": " + f.Err.Error()
}

// Unwrap returns the wrapped error.
func (f *Failure) Unwrap() error { return f.Err }

// NewFailure wraps err in a Failure of class c. A nil err gives nil, so
// `return middleware.NewFailure(c, err)` is safe on the success path.
func NewFailure(c Class, err error) error {
	if err == nil {
		return nil
	}
	return &Failure{Class: c, Err: err}
}

// Transient marks err as worth retrying later. Nil stays nil.
func Transient(err error) error { return NewFailure(ClassTransient, err) }

// Reject marks err as an expected business rejection: the handler's writes
// are committed and the message is acked, never retried or poisoned. Nil
// stays nil.
func Reject(err error) error { return NewFailure(ClassRejected, err) }

// Poison marks the message as bad: it is isolated at once, never retried.
// Nil stays nil.
func Poison(err error) error { return NewFailure(ClassPoison, err) }

// Invariant marks a violated contract fact: the message is isolated and a
// person investigates. Nil stays nil.
func Invariant(err error) error { return NewFailure(ClassInvariant, err) }

// ErrHeld marks a delivery given back to its queue unprocessed, without
// spending an attempt or a retry tier: the brake returns it (wrapped) while
// it is engaged. The Classifier gives it no class, so every stage passes it
// through untouched; the router nacks the delivery and the subscriber
// requeues it.
var ErrHeld = errors.New("sluice: delivery held back by the brake")

// ErrSetAside marks a held delivery (it matches ErrHeld) that is not to be
// returned to its queue: the brake's failed probe delivery. The retry stage
// sets it aside — a copy of it, its attempt unchanged, published with
// confirm to the first retry tier, then the original acked — so however
// long an outage lasts, its probes spend no attempt and no return counting
// toward a quorum queue's x-delivery-limit. Without a retry stage it is
// nacked, as ErrHeld.
var ErrSetAside = fmt.Errorf("%w, set aside in a retry tier", ErrHeld)

// ErrShutdown marks a delivery given back to its queue unprocessed because
// the consumer is shutting down: the shutdown grace ran out while its
// handler was still at work (middleware.ShutdownGrace, on by default in
// router.Add). A shutdown is not a failure of the message: like ErrHeld,
// the Classifier gives it no class, so no attempt, tier or poison queue is
// spent on it; the router nacks it and the broker redelivers it.
var ErrShutdown = errors.New("sluice: the consumer shut down before the delivery was handled")

// ClassOf returns the class of the outermost Failure in err's chain, or
// Unclassified when there is none. It does not apply any Classifier rules.
func ClassOf(err error) Class {
	if f, ok := errors.AsType[*Failure](err); ok {
		return f.Class
	}
	return Unclassified
}
