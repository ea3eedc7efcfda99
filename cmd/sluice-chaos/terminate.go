package main

import (
	"context"
	"math/rand/v2"
	"net/url"
	"time"
)

// consumerURL is the PostgreSQL URL of the world's consumers: tagged with
// the world's name as application_name, so that postgres-terminate ends
// their connections and no one else's.
func (w *world) consumerURL() string {
	u, err := url.Parse(w.o.pgURL)
	if err != nil || u.Scheme == "" {
		return w.o.pgURL
	}
	q := u.Query()
	q.Set("application_name", w.name)
	u.RawQuery = q.Encode()
	return u.String()
}

// terminateBackends ends, -kills times every 0.1–0.5 s, one of the
// consumers' PostgreSQL connections that is in a transaction — running a
// statement (a claim, a handler's insert, a COMMIT) or idle between two —
// as a failover or an operator's pg_terminate_backend would.
func (w *world) terminateBackends(ctx context.Context, rng *rand.Rand) error {
	pause := func(d time.Duration) error {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(d):
			return nil
		}
	}
	for range w.o.kills {
		if err := pause(time.Duration(100+rng.IntN(400)) * time.Millisecond); err != nil {
			return err
		}
		for try := 0; try < 50; try++ { // none in a transaction at this instant: look again
			var ended []bool
			if err := w.db.SelectContext(ctx, &ended, `SELECT pg_terminate_backend(pid) FROM pg_stat_activity
				WHERE application_name = $1 AND xact_start IS NOT NULL ORDER BY random() LIMIT 1`, w.name); err != nil {
				return err
			}
			if len(ended) == 1 && ended[0] {
				w.killed++
				break
			}
			if err := pause(10 * time.Millisecond); err != nil {
				return err
			}
		}
	}
	return nil
}
