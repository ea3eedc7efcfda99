package sluice

import (
	"errors"
	"fmt"
	"strconv"

	"github.com/ThreeDotsLabs/watermill/message"
)

// ErrInvalidAttempt is matched by the error of Attempt for a delivery whose
// AttemptKey is not a positive integer: such a message is poison.
var ErrInvalidAttempt = errors.New("sluice: invalid attempt metadata")

// Attempt returns the delivery's attempt number: 1 when AttemptKey is
// absent, N on the copy a retry tier made of attempt N-1. Every stage reads
// the attempt through it: one key, one parser.
func Attempt(msg *message.Message) (int, error) {
	v := msg.Metadata.Get(AttemptKey)
	if v == "" {
		return 1, nil
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 {
		if len(v) > 64 {
			v = v[:64] + "…"
		}
		return 0, fmt.Errorf("%w: %s=%q", ErrInvalidAttempt, AttemptKey, v)
	}
	return n, nil
}
