package sluice

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// retryAfterError is a Transient failure that says when to come back: a
// dependency's "not before" — an HTTP 429's or 503's Retry-After, a rate
// limiter's reset. The retry-tier stage sends the copy to the nearest tier
// that waits at least After (see retrytiers.New), instead of the next tier
// of the ladder. RetryAfter builds one, RetryAfterOf reads it back.
type retryAfterError struct {
	// After is the least time the dependency asked for before the next
	// attempt.
	After time.Duration
	// Err is the failure.
	Err error
}

// Error returns "<err> (retry after <After>)".
func (e *retryAfterError) Error() string {
	if e.Err == nil {
		return fmt.Sprintf("retry after %s", e.After)
	}
	return fmt.Sprintf("%s (retry after %s)", e.Err.Error(), e.After)
}

// Unwrap returns Err.
func (e *retryAfterError) Unwrap() error { return e.Err }

// RetryAfter marks err as Transient and asks its retry to wait at least
// after: the retry-tier stage parks the copy in the nearest tier that waits
// that long (the shortest whose delay is at least after, also one before
// the next of the ladder), spending the attempts of the tiers it skips; when
// no tier waits that long, the longest, after which the budget is spent.
// Nil stays nil; a negative after counts as 0.
//
//	if resp.StatusCode == http.StatusTooManyRequests {
//		d, _ := sluice.ParseRetryAfter(resp.Header.Get("Retry-After"), time.Now())
//		return sluice.RetryAfter(errRateLimited, d)
//	}
func RetryAfter(err error, after time.Duration) error {
	if err == nil {
		return nil
	}
	return Transient(&retryAfterError{After: max(after, 0), Err: err})
}

// RetryAfterOf returns the wait the first failure RetryAfter built in err's
// chain asks for, and whether there is one.
func RetryAfterOf(err error) (time.Duration, bool) {
	if e, ok := errors.AsType[*retryAfterError](err); ok {
		return e.After, true
	}
	return 0, false
}

// retryAfterMax bounds what ParseRetryAfter returns: a day, more than any
// retry ladder waits (a longer value is a server's mistake or a hostile
// one, and the stage sends such a copy to its longest tier anyway).
const retryAfterMax = 24 * time.Hour

// ParseRetryAfter reads an HTTP Retry-After header's value (RFC 9110,
// section 10.2.3): a number of seconds, or an HTTP date, taken relative to
// now. It returns the wait, at most 24 hours (a longer one is a server's
// mistake or a hostile one; a date in the past is 0), and false for a value
// that is neither.
func ParseRetryAfter(value string, now time.Time) (time.Duration, bool) {
	value = strings.TrimSpace(value)
	if value == "" {
		return 0, false
	}
	if strings.Trim(value, "0123456789") == "" { // delay-seconds: 1*DIGIT
		secs, err := strconv.ParseUint(value, 10, 64)
		if err != nil || secs >= uint64(retryAfterMax/time.Second) { // only too many digits fail
			return retryAfterMax, true
		}
		return time.Duration(secs) * time.Second, true
	}
	// The three date formats a recipient must accept (RFC 9110, 5.6.7).
	for _, layout := range []string{"Mon, 02 Jan 2006 15:04:05 GMT", time.RFC850, time.ANSIC} {
		t, err := time.Parse(layout, value)
		if err != nil {
			continue
		}
		return min(max(t.Sub(now), 0), retryAfterMax), true
	}
	return 0, false
}
