package main

import (
	"context"
	"fmt"
	"io"

	"github.com/spf13/cobra"

	"github.com/sluicemq/sluice/broker"
	"github.com/sluicemq/sluice/rabbitmq"
)

func newTopology(g *globals, out io.Writer) *cobra.Command {
	var queue, tiers, poisonQueue, partitionKey, exchange string
	var quorum bool
	var limit, jitterQueues, partitions int
	var jitter float64
	build := func() (*rabbitmq.Topology, error) {
		if queue == "" {
			return nil, usageError{fmt.Errorf("--queue is required")}
		}
		delays, err := parseTiers(tiers)
		if err != nil {
			return nil, err
		}
		topo, err := rabbitmq.NewTopology(rabbitmq.TopologyConfig{Queue: queue, TierDelays: delays, PoisonQueue: poisonQueue, Quorum: quorum, DeliveryLimit: limit,
			TierJitter: broker.Jitter{Fraction: jitter, Queues: jitterQueues}, Partitions: partitions, PartitionKey: partitionKey, Exchange: exchange})
		if err != nil {
			return nil, usageError{err}
		}
		return topo, nil
	}
	cmd := &cobra.Command{Use: "topology", Short: "Plan or apply the queues of a consumer queue: main, retry tiers, poison (or its partitions)"}
	pf := cmd.PersistentFlags()
	pf.StringVar(&queue, "queue", "", "the consumer's queue (required)")
	pf.StringVar(&tiers, "tiers", "30s,5m,30m", "retry tier delays, in order")
	pf.StringVar(&poisonQueue, "poison-queue", "", "the poison queue (default <queue>.poison)")
	pf.BoolVar(&quorum, "quorum", false, "quorum queues instead of classic ones")
	pf.Float64Var(&jitter, "tier-jitter", 0, "spread each tier's copies over queues of their own waiting from its delay down to delay × (1 − this), so an outage's copies do not come back at once (0: none; at most 0.5); the application's TopologyConfig.TierJitter")
	pf.IntVar(&jitterQueues, "tier-jitter-queues", 0, "queues per tier with --tier-jitter (default 4)")
	pf.IntVar(&partitions, "partitions", 0, "spread the queue over this many partition queues <queue>.p<i>, each with single active consumer and tiers of its own, behind a consistent-hash exchange (order per key across instances; needs the plugin rabbitmq_consistent_hash_exchange; 0: none, at most 1024)")
	pf.StringVar(&partitionKey, "partition-key", "", "with --partitions: the header whose value the exchange hashes (its hash-header), which producers set")
	pf.StringVar(&exchange, "exchange", "", "with --partitions: the consistent-hash exchange (default <queue>)")
	pf.IntVar(&limit, "delivery-limit", 0, "quorum x-delivery-limit of the queue: dead-letter to the poison queue after this many failed deliveries (0: none declared, the broker's default: none on RabbitMQ 3.x, 20 on 4.x)")

	plan := &cobra.Command{
		Use:   "plan",
		Short: "Print the queues with their arguments, and the same as rabbitmqctl set_policy lines",
		Args:  noArgs,
		RunE: func(*cobra.Command, []string) error {
			topo, err := build()
			if err != nil {
				return err
			}
			cfg, plan := topo.Config(), topo.Plan()
			if parts := topo.Partitions(); len(parts) > 0 {
				fmt.Fprintf(out, "# exchange (producers publish to it with the header %s; one value always reaches one partition)\n", cfg.PartitionKey)
				fmt.Fprintf(out, "%s %s %s\n", cfg.Exchange, cfg.ExchangeType, plan.ExchangeArguments)
				fmt.Fprintf(out, "\n# %d partitions: queue, weight on the hash ring (each declared with x-single-active-consumer: one consumer at a time receives it)\n", len(parts))
				for _, q := range plan.Queues {
					if q.BindingKey != "" {
						fmt.Fprintf(out, "%s %s\n", q.Name, q.BindingKey)
					}
				}
				fmt.Fprintln(out)
			}
			fmt.Fprintf(out, "# queues (declared durable by `sluice topology apply`)\n")
			for _, q := range plan.Queues {
				fmt.Fprintf(out, "%s %s\n", q.Name, q.Arguments)
			}
			fmt.Fprintf(out, "\n# or, arguments by policy:\n")
			for _, l := range plan.Policies {
				fmt.Fprintln(out, l)
			}
			return nil
		},
	}
	apply := &cobra.Command{
		Use:   "apply",
		Short: "Declare the queues (idempotent; a queue with other arguments is an error naming the argument)",
		Args:  noArgs,
		RunE: func(*cobra.Command, []string) error {
			topo, err := build()
			if err != nil {
				return err
			}
			conn, err := connect(g)
			if err != nil {
				return err
			}
			defer func() { _ = conn.Close() }()
			todo, err := topo.Declare(context.Background(), conn)
			if err != nil {
				return err
			}
			if cfg := topo.Config(); cfg.Exchange != "" {
				fmt.Fprintf(out, "declared exchange %s (%s)\n", cfg.Exchange, cfg.ExchangeType)
			}
			for _, q := range topo.Plan().Queues {
				fmt.Fprintf(out, "declared %s\n", q.Name)
			}
			for _, l := range todo { // an existing queue a declaration cannot change
				fmt.Fprintf(out, "\nto do: %s\n", l)
			}
			return nil
		},
	}
	cmd.AddCommand(plan, apply, newMigrate(g, out, build))
	return cmd
}
