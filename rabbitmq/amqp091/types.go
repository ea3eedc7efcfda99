package amqp091

import patched "github.com/sluicemq/sluice/internal/amqp091"

// The client's types, by their public names: each is the patched client's
// type itself (an alias), so a value from Sluice's API is one of these.
type (
	// AMQPlainAuth is similar to PlainAuth
	AMQPlainAuth = patched.AMQPlainAuth
	// Acknowledger notifies the server of successful or failed consumption of
	// deliveries via identifier found in the Delivery.DeliveryTag field.
	Acknowledger = patched.Acknowledger
	// Authentication interface provides a means for different SASL authentication
	// mechanisms to be used during connection tuning.
	Authentication = patched.Authentication
	// BindingConfig holds Queue Binding configuration settings for recovery.
	BindingConfig = patched.BindingConfig
	// Blocking is upstream amqp091-go's.
	Blocking = patched.Blocking
	// Channel represents an AMQP channel. Used as a context for valid message
	// exchange.  Errors on methods with this Channel as a receiver means this channel
	// should be discarded and a new channel established.
	Channel = patched.Channel
	// Config is used in DialConfig and Open to specify the desired tuning
	// parameters used during a connection open handshake.  The negotiated tuning
	// will be stored in the returned connection's Config field.
	Config = patched.Config
	// Confirmation notifies the acknowledgment or negative acknowledgement of a
	// publishing identified by its delivery tag.  Use NotifyPublish on the Channel
	// to consume these events.
	Confirmation = patched.Confirmation
	// Connection manages the serialization and deserialization of frames from IO
	// and dispatches the frames to the appropriate channel.  All RPC methods and
	// asynchronous Publishing, Delivery, Ack, Nack and Return messages are
	// multiplexed on this channel.  There must always be active receivers for
	// every asynchronous message on this connection.
	Connection = patched.Connection
	// ConnectionRecovery is the interface for the connection recovery.
	ConnectionRecovery = patched.ConnectionRecovery
	// Decimal is upstream amqp091-go's, so that a table read here holds the
	// values upstream's code (watermill-amqp's marshaler) expects.
	Decimal = patched.Decimal
	// DefaultConnectionRecovery is the default implementation of the connection recovery.
	DefaultConnectionRecovery = patched.DefaultConnectionRecovery
	// DefaultTopologyRecovery is the default implementation of the topology recovery.
	DefaultTopologyRecovery = patched.DefaultTopologyRecovery
	// DeferredConfirmation represents a future publisher confirm for a message. It
	// allows users to directly correlate a publishing to a confirmation. These are
	// returned from PublishWithDeferredConfirm on Channels.
	DeferredConfirmation = patched.DeferredConfirmation
	// Delivery captures the fields for a previously delivered message resident in
	// a queue to be delivered by the server to a consumer from Channel.Consume or
	// Channel.Get.
	Delivery = patched.Delivery
	// Error captures the code and reason a channel or connection has been closed
	// by the server.
	Error = patched.Error
	// ExchangeBindingConfig holds Exchange Binding configuration settings for recovery.
	ExchangeBindingConfig = patched.ExchangeBindingConfig
	// ExchangeConfig holds Exchange configuration settings for recovery.
	ExchangeConfig = patched.ExchangeConfig
	// ExternalAuth for RabbitMQ-auth-mechanism-ssl.
	ExternalAuth = patched.ExternalAuth
	// LifeCycleState defines the connection or channel state type.
	LifeCycleState = patched.LifeCycleState
	// Logging is the interface of the logger SetLogger sets.
	Logging = patched.Logging
	// NullLogger logs nothing: the default.
	NullLogger = patched.NullLogger
	// PlainAuth is a similar to Basic Auth in HTTP.
	PlainAuth = patched.PlainAuth
	// Publishing is upstream amqp091-go's, so that what watermill-amqp's
	// Marshaler builds is published by this client as it is.
	Publishing = patched.Publishing
	// QosConfig holds QoS configuration settings for recovery.
	QosConfig = patched.QosConfig
	// Queue captures the current server state of the queue on the server returned
	// from Channel.QueueDeclare or Channel.QueueInspect.
	Queue = patched.Queue
	// QueueConfig holds Queue configuration settings for recovery.
	QueueConfig = patched.QueueConfig
	// ReconnectionConfig is the configuration for the reconnection.
	ReconnectionConfig = patched.ReconnectionConfig
	// Recovery is the configuration for the recovery.
	Recovery = patched.Recovery
	// Return captures a flattened struct of fields returned by the server when a
	// Publishing is unable to be delivered either due to the `mandatory` flag set
	// and no route found, or `immediate` flag set and no free consumer.
	Return = patched.Return
	// StateChanged defines the connection or channel life cycle transitions.
	StateChanged = patched.StateChanged
	// Table stores user supplied fields of the following types:
	Table = patched.Table
	// TopologyConfiguration holds all tracked topology configurations for recovery.
	TopologyConfiguration = patched.TopologyConfiguration
	// TopologyRecovery is the interface for the topology recovery.
	TopologyRecovery = patched.TopologyRecovery
	// TopologyRecoveryEntity describes a single topology entity that failed during recovery.
	// It is passed to Recovery.OnTopologyEntityError and collected in StateChanged.SkippedTopologyEntities.
	TopologyRecoveryEntity = patched.TopologyRecoveryEntity
	// TopologyRecoveryEntityType identifies the topology recovery entity kind.
	TopologyRecoveryEntityType = patched.TopologyRecoveryEntityType
	// TopologyRecoveryMode controls which topology entities are recovered after a
	// connection or channel is re-established. The modes are mutually exclusive.
	TopologyRecoveryMode = patched.TopologyRecoveryMode
	// URI represents a parsed AMQP URI string.
	URI = patched.URI
)
