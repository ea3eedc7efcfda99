package sluice_test

import (
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/sluicemq/sluice"
)

// A dependency answers 429 with Retry-After: the handler's failure says
// when to come back, and the retry-tier stage parks the copy in the nearest
// tier that waits at least that long.
func ExampleRetryAfter() {
	resp := &http.Response{StatusCode: http.StatusTooManyRequests, Header: http.Header{"Retry-After": {"120"}}}
	handle := func() error {
		if resp.StatusCode == http.StatusTooManyRequests {
			d, _ := sluice.ParseRetryAfter(resp.Header.Get("Retry-After"), time.Now())
			return sluice.RetryAfter(errors.New("pricing service: 429 Too Many Requests"), d)
		}
		return nil
	}
	err := handle()
	after, _ := sluice.RetryAfterOf(err)
	fmt.Println(sluice.ClassOf(err), after)
	// Output: transient 2m0s
}
