package bench

// rabbitmqPrefetch and rabbitmqConsumers are the rabbitmq package's
// defaults — BrokerConfig.Prefetch's (and ConsumerConfig's), 16, and the
// consumers a Broker with WatermillSubscriber starts, 4 — which the
// benchmarks size their pools by and report.
const (
	rabbitmqPrefetch  = 16
	rabbitmqConsumers = 4
)
