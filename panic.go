package sluice

import "fmt"

// PanicError is a panic recovered from a handler. Error() gives the panic
// value only; Stack holds the goroutine's stack at the panic, for logs and
// the poison diagnosis.
type PanicError struct {
	Value any
	Stack []byte
}

// Error returns "panic: <value>".
func (p *PanicError) Error() string { return fmt.Sprintf("panic: %v", p.Value) }

// Unwrap returns the panic value when it was an error, so errors.Is/As can
// match a panic(err).
func (p *PanicError) Unwrap() error {
	if err, ok := p.Value.(error); ok {
		return err
	}
	return nil
}
