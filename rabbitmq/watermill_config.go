package rabbitmq

import (
	"errors"
	"fmt"

	"github.com/ThreeDotsLabs/watermill"
	wamqp "github.com/ThreeDotsLabs/watermill-amqp/v3/pkg/amqp"
	upstream "github.com/rabbitmq/amqp091-go"

	"github.com/sluicemq/sluice/internal/amqpframe"
	"github.com/sluicemq/sluice/internal/diag"
)

// ErrQueueNotFound is matched (errors.Is) by the error of a Subscribe whose
// queue does not exist: the Consumer's subscriptions (and BrokerConfig.WatermillSubscriber's)
// consume only what was declared beforehand, and say so at Subscribe
// instead of retrying NOT_FOUND. The error names the queue.
var ErrQueueNotFound = errors.New("rabbitmq: queue not found")

// WithMarshaler returns cfg — a watermill-amqp Config an existing service
// already uses, for its subscriber or publisher — with Sluice's Marshaler,
// and everything else kept: its declarations (TopologyBuilder, Queue,
// Exchange, QueueBind), its connection, its Consume and Publish settings.
//
// watermill-amqp's DefaultMarshaler fails on any header that is not a
// string (a Spring producer's integer header, the x-death of every copy
// back from a retry tier) and its subscriber nacks with requeue at once: a
// hot loop, one log line per try, the handler never run. Sluice's Marshaler
// reads such deliveries (see Marshaler).
//
// Its connection reads through Sluice's frame filter: a delivery whose
// headers table amqp091-go cannot read (an array of more than 8,192
// items, say), which would close the connection with FRAME_ERROR again and
// again, reaches your stages with its headers dropped and
// sluice_amqp_headers_error set to the reason (docs/rabbitmq.md, "Headers the
// client cannot parse").
//
// The settings of a DefaultMarshaler in cfg (PostprocessPublishing,
// NotPersistentDeliveryMode, MessageUUIDHeaderKey) are carried into the
// Marshaler; a Marshaler is kept as it is; a nil one becomes Marshaler{}.
// Any other marshaler — watermill-amqp's CorrelatingMarshaler, one of
// yours — is refused, as is Consume.NoRequeueOnNack (a nack Sluice's stages
// return when a tier or the poison queue cannot be reached would drop the
// delivery or dead-letter it, instead of having it redelivered): the error
// names the field.
func WithMarshaler(cfg wamqp.Config) (wamqp.Config, error) {
	switch m := cfg.Marshaler.(type) {
	case nil:
		cfg.Marshaler = Marshaler{}
	case wamqp.DefaultMarshaler:
		cfg.Marshaler = Marshaler{DefaultMarshaler: m}
	case *wamqp.DefaultMarshaler:
		if m == nil {
			return cfg, errors.New("rabbitmq: WithMarshaler: Config.Marshaler is a nil *DefaultMarshaler")
		}
		cfg.Marshaler = Marshaler{DefaultMarshaler: *m}
	case Marshaler, *Marshaler:
	default:
		return cfg, fmt.Errorf("rabbitmq: WithMarshaler: Config.Marshaler is a %T: only a watermill-amqp DefaultMarshaler's settings can be carried into "+
			"Sluice's Marshaler (set Config.Marshaler to rabbitmq.Marshaler, or read non-string headers in your own)", m)
	}
	if cfg.Consume.NoRequeueOnNack {
		return cfg, errors.New("rabbitmq: WithMarshaler: Config.Consume.NoRequeueOnNack is set: a delivery Sluice's stages nack " +
			"(a retry tier or the poison queue unreachable) would be dropped or dead-lettered instead of redelivered")
	}
	return filtered(cfg)
}

// filtered returns cfg with its connection reading through Sluice's frame
// filter (internal/amqpframe): a delivery whose headers table amqp091-go
// would refuse — which closes the whole connection with FRAME_ERROR, and
// the broker hands the same message back, forever — arrives with that
// table replaced, and the Marshaler sets sluice_amqp_headers_error. The
// connection is the one cfg describes: its AmqpConfig (Dial included,
// wrapped), its TLSConfig (moved into AmqpConfig: for amqps the filter does
// the TLS handshake itself and reads above it, the URI then amqp:// to the
// same host and port).
func filtered(cfg wamqp.Config) (wamqp.Config, error) {
	var ac upstream.Config
	if cfg.Connection.AmqpConfig != nil {
		ac = *cfg.Connection.AmqpConfig
	}
	if cfg.Connection.TLSConfig != nil {
		if ac.TLSClientConfig != nil {
			return cfg, errors.New("rabbitmq: WithMarshaler: both Config.Connection.TLSConfig and Config.Connection.AmqpConfig.TLSClientConfig are set")
		}
		ac.TLSClientConfig = cfg.Connection.TLSConfig
	}
	uri, ac, err := amqpframe.Config(cfg.Connection.AmqpURI, ac)
	if err != nil {
		return cfg, fmt.Errorf("rabbitmq: WithMarshaler: Config.Connection.AmqpURI: %w", diag.RedactError(err))
	}
	cfg.Connection.AmqpURI, cfg.Connection.AmqpConfig, cfg.Connection.TLSConfig = uri, &ac, nil
	return cfg, nil
}

// declaredElsewhere is newSubscriber's TopologyBuilder: it declares
// nothing — Topology did — and checks that the queue exists (a passive
// declare), so that Subscribe on a missing queue fails naming it instead of
// retrying NOT_FOUND every 100 ms.
type declaredElsewhere struct{}

func (declaredElsewhere) BuildTopology(ch *upstream.Channel, p wamqp.BuildTopologyParams, _ wamqp.Config, _ watermill.LoggerAdapter) error {
	_, err := ch.QueueDeclarePassive(p.QueueName, true, false, false, false, nil)
	var ae *upstream.Error
	return queueMissing(p.QueueName, errors.As(err, &ae) && ae.Code == upstream.NotFound, err)
}

func (declaredElsewhere) ExchangeDeclare(*upstream.Channel, string, wamqp.Config) error { return nil }

// queueMissing is the error of the passive declare of queue: err, or
// ErrQueueNotFound naming the queue when notFound.
func queueMissing(queue string, notFound bool, err error) error {
	switch {
	case err == nil:
		return nil
	case notFound:
		return fmt.Errorf("%w: %q: declare it before subscribing (Topology.Declare, NewBroker, sluice topology apply), "+
			"or keep the declarations of your watermill-amqp Config (WithMarshaler): %w", ErrQueueNotFound, queue, err)
	}
	return fmt.Errorf("rabbitmq: checking that queue %q exists: %w", queue, diag.RedactError(err))
}
