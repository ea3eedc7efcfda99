package main

// rabbitmqPrefetch and rabbitmqConsumers are the rabbitmq package's
// defaults — BrokerConfig.Prefetch's, 16, and the consumers a Broker with
// WatermillSubscriber starts, 4 — which the scenarios size their pools by.
const (
	rabbitmqPrefetch  = 16
	rabbitmqConsumers = 4
)
