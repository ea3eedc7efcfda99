// Package stack lets a stage tell the stages inside it that it is there: a
// mark on the delivery's context. A stage cannot see the assembly it is in;
// one that would act on it — middleware.Classify warns when nothing outside
// it isolates a Poison failure — reads the marks of the stages outside it.
package stack

import (
	"context"

	"github.com/ThreeDotsLabs/watermill/message"
)

// Marks are the stages that marked a delivery.
type Marks uint8

// The stages that mark a delivery on its way in.
const (
	// Poison: poison.New's stage, which isolates Poison, Invariant and
	// Exhausted failures in the poison queue.
	Poison Marks = 1 << iota
	// Retry: retrytiers.New's stage, which parks Transient failures in a
	// retry tier.
	Retry
)

type marksKey struct{}

// Mark records on msg's context that the stages of m are outside the
// stages that follow. It costs a context only the first time.
func Mark(msg *message.Message, m Marks) {
	ctx := msg.Context()
	have, _ := ctx.Value(marksKey{}).(Marks)
	if have&m == m {
		return
	}
	msg.SetContext(context.WithValue(ctx, marksKey{}, have|m))
}

// Of returns the marks on ctx.
func Of(ctx context.Context) Marks {
	m, _ := ctx.Value(marksKey{}).(Marks)
	return m
}
