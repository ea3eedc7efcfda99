package sluice_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"testing"

	"github.com/sluicemq/sluice"
)

// FuzzClassifier builds errors of arbitrary text, wrapping and joining from
// the fuzz input: Classify always returns a valid class, an explicit wrapper
// always wins, and Classify agrees with ClassOf on explicit failures.
func FuzzClassifier(f *testing.F) {
	f.Add("connection refused", uint8(0), uint8(0))
	f.Add(`{"a":`, uint8(3), uint8(1))
	f.Add("order o-1 must exist", uint8(7), uint8(2))
	f.Fuzz(func(t *testing.T, text string, shape, wrap uint8) {
		err := errors.New(text)
		switch shape % 6 {
		case 1:
			err = fmt.Errorf("handler: %w", context.DeadlineExceeded)
		case 2:
			var v map[string]any
			if jerr := json.Unmarshal([]byte(text), &v); jerr != nil {
				err = jerr
			}
		case 3:
			err = errors.Join(err, context.Canceled)
		case 4:
			err = &sluice.PanicError{Value: text}
		}
		want := sluice.Unclassified
		if w := sluice.Class(wrap % 7); w.Valid() {
			err = sluice.NewFailure(w, err)
			want = w
		}
		for range shape / 6 % 4 {
			err = fmt.Errorf("layer: %w", err)
		}
		got := sluice.DefaultClassifier().Classify(err)
		if !got.Valid() {
			t.Fatalf("Classify(%v) = %v, not a class", err, got)
		}
		if want != sluice.Unclassified && got != want {
			t.Fatalf("explicit %v lost: got %v", want, got)
		}
		if c := sluice.ClassOf(err); c.Valid() && c != got {
			t.Fatalf("ClassOf %v but Classify %v", c, got)
		}
	})
}
