// Package dlq is what an operator does with a poison queue, under sluice
// dlq and the console: read it without losing or reordering anything,
// select messages by their diagnosis (Filter, Message.Group), replay them
// with confirms — at once, or in a closed loop that watches the consumers'
// outcomes (canary, ramp, stop on re-poison) — archive them durably and
// restore them, discard them, and record an audit line for each run.
//
// Open a poison queue on a broker connection and act on it:
//
//	q := dlq.Open(conn, "orders.poison", dlq.Config{Publisher: pub, Operator: "alice"})
//	stats, err := q.Stats(ctx, dlq.Filter{}, 0)
//	res, err := q.Replay(ctx, dlq.ReplayConfig{Filter: dlq.Filter{Classes: []string{"exhausted"}}})
//
// Restore publishes an archive (OpenFileSource, OpenTableSource) back.
// Every wait on the broker or a store is bounded (10 s each). On a
// connection rabbitmq.Dial opened, a wait on the broker is bounded by its
// progress: 10 s without a frame but heartbeats, 5 minutes in all, so a
// large message's transfer over a slow link is not cut; on any other
// (amqp.Dial's), by 10 s in all.
//
// The package links no database driver: an archive table and the outcome
// records are the caller's pools and stores (the CLI opens its own with
// sluicesql/postgres), so mounting the console registers none in the host
// program.
package dlq
