// Command sluice-chaos is Sluice's reliability harness: it runs consumers of
// the whole stack as separate processes on RabbitMQ + PostgreSQL, publishes a
// known set of events (duplicates, transient failures, malformed and
// invariant-violating ones), disrupts the run, and checks that the business
// effects are exactly the distinct valid events, the poison queue exactly the
// bad ones, and the main and tier queues empty.
//
//	go run ./cmd/sluice-chaos run                          # the short version (CI)
//	go run ./cmd/sluice-chaos run -events 20000 -kills 100  # the long one (make chaos)
//	go run ./cmd/sluice-chaos run -scenarios kill-batched  # a scenario with group commit on
//	go run ./cmd/sluice-chaos run -scenarios cluster-node-kill  # quorum queues on a private 3-node cluster
//	go run ./cmd/sluice-chaos run -scenarios ordered   # order per key through retries, kills and a private broker's restart
//	go run ./cmd/sluice-chaos run -scenarios ordered-control  # the same without Stages.Order: passes when the check fails
//
// It restarts RabbitMQ and stops PostgreSQL (as root, with rabbitmqctl and
// pg_ctlcluster): run it alone. cluster-node-kill starts a private cluster
// of its own (scripts/rabbitmq-cluster.sh, other ports and node names) and
// kills its nodes, never the shared broker's; ordered restarts a private
// node of its own (started when the harness starts). See
// docs/reliability.md.
package main

import (
	"fmt"
	"os"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: sluice-chaos run [flags] | sluice-chaos consumer [flags]")
		os.Exit(2)
	}
	var err error
	switch os.Args[1] {
	case "run":
		err = harnessMain(os.Args[2:])
	case "consumer":
		err = consumerMain(os.Args[2:])
	case "ordered-consumer":
		err = orderedConsumerMain(os.Args[2:])
	default:
		fmt.Fprintf(os.Stderr, "sluice-chaos: unknown command %q\n", os.Args[1])
		os.Exit(2)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "sluice-chaos:", err)
		os.Exit(1)
	}
}
