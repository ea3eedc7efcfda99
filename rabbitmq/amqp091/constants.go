package amqp091

import patched "github.com/sluicemq/sluice/internal/amqp091"

const (
	// FrameSizeUnlimited is a canonical value to use in Config.FrameSize to intentionally
	// request unlimited frame size. Note that the server has to agree in Tune.
	FrameSizeUnlimited = patched.FrameSizeUnlimited
)

const (
	// StateOpen represents a connection or channel that is active and open.
	StateOpen LifeCycleState = patched.StateOpen
	// StateReconnecting represents a connection or channel that is actively undergoing automatic recovery.
	StateReconnecting LifeCycleState = patched.StateReconnecting
	// StateClosing represents a connection or channel that is in the process of closing down.
	StateClosing LifeCycleState = patched.StateClosing
	// StateClosed represents a connection or channel that is fully closed and shut down.
	StateClosed LifeCycleState = patched.StateClosed
)

// The kinds of TopologyRecoveryEntity.
const (
	TopologyEntityExchange        TopologyRecoveryEntityType = patched.TopologyEntityExchange
	TopologyEntityQueue           TopologyRecoveryEntityType = patched.TopologyEntityQueue
	TopologyEntityQueueBinding    TopologyRecoveryEntityType = patched.TopologyEntityQueueBinding
	TopologyEntityExchangeBinding TopologyRecoveryEntityType = patched.TopologyEntityExchangeBinding
	TopologyEntityConsumer        TopologyRecoveryEntityType = patched.TopologyEntityConsumer
)

const (
	// DefaultMaxRetryCount is the default maximum number of retries for recovery.
	DefaultMaxRetryCount = patched.DefaultMaxRetryCount
	// DefaultRetryInterval is the default interval between retries for recovery.
	DefaultRetryInterval = patched.DefaultRetryInterval
)

const (
	// TopologyRecoveryAllEnabled recovers all tracked topology: exchanges, queues,
	// bindings, exchange-to-exchange bindings, and active consumers.
	TopologyRecoveryAllEnabled TopologyRecoveryMode = patched.TopologyRecoveryAllEnabled
	// TopologyRecoveryOnlyTransient recovers only connection-scoped (transient)
	// entities: queues declared as exclusive and/or auto-delete (which includes
	// server-named queues), auto-delete exchanges, and any bindings that reference
	// one of those transient entities. Active consumers are still re-subscribed,
	// because consumer subscriptions are always lost on reconnect regardless of
	// queue durability.
	TopologyRecoveryOnlyTransient TopologyRecoveryMode = patched.TopologyRecoveryOnlyTransient
	// TopologyRecoveryDisabled disables topology recovery completely. Neither
	// entities nor consumers are recovered. Connection and channel recovery still
	// occur if otherwise enabled.
	TopologyRecoveryDisabled TopologyRecoveryMode = patched.TopologyRecoveryDisabled
)

// Error codes that can be sent from the server during a connection or
// channel exception or used by the client to indicate a class of error like
// ErrCredentials.  The text of the error is likely more interesting than
// these constants.
const (
	ContentTooLarge    = patched.ContentTooLarge
	NoRoute            = patched.NoRoute
	NoConsumers        = patched.NoConsumers
	ConnectionForced   = patched.ConnectionForced
	InvalidPath        = patched.InvalidPath
	AccessRefused      = patched.AccessRefused
	NotFound           = patched.NotFound
	ResourceLocked     = patched.ResourceLocked
	PreconditionFailed = patched.PreconditionFailed
	FrameError         = patched.FrameError
	SyntaxError        = patched.SyntaxError
	CommandInvalid     = patched.CommandInvalid
	ChannelError       = patched.ChannelError
	UnexpectedFrame    = patched.UnexpectedFrame
	ResourceError      = patched.ResourceError
	NotAllowed         = patched.NotAllowed
	NotImplemented     = patched.NotImplemented
	InternalError      = patched.InternalError
)

// DefaultExchange is the default direct exchange that binds every queue by its
// name. Applications can route to a queue using the queue name as routing key.
const (
	DefaultExchange = patched.DefaultExchange
)

// Constants for standard AMQP 0-9-1 exchange types.
const (
	ExchangeDirect  = patched.ExchangeDirect
	ExchangeFanout  = patched.ExchangeFanout
	ExchangeTopic   = patched.ExchangeTopic
	ExchangeHeaders = patched.ExchangeHeaders
)

// MIME types constants
const (
	MimeTextPlain                  = patched.MimeTextPlain
	MimeApplicationJSON            = patched.MimeApplicationJSON
	MimeApplicationOctetStream     = patched.MimeApplicationOctetStream
	MimeApplicationXML             = patched.MimeApplicationXML
	MimeTextXML                    = patched.MimeTextXML
	MimeApplicationProtobuf        = patched.MimeApplicationProtobuf
	MimeApplicationXProtobuf       = patched.MimeApplicationXProtobuf
	MimeApplicationMsgPack         = patched.MimeApplicationMsgPack
	MimeApplicationAvro            = patched.MimeApplicationAvro
	MimeApplicationCloudEventsJSON = patched.MimeApplicationCloudEventsJSON
	MimeApplicationFormURLEncoded  = patched.MimeApplicationFormURLEncoded
)

// DeliveryMode.  Transient means higher throughput but messages will not be
// restored on broker restart.  The delivery mode of publishings is unrelated
// to the durability of the queues they reside on.  Transient messages will
// not be restored to durable queues, persistent messages will be restored to
// durable queues and lost on non-durable queues during server restart.
const (
	Transient  = patched.Transient
	Persistent = patched.Persistent
)

// Expiration. These constants can be used to set a messages expiration TTL.
// They should be viewed as a clarification of the expiration functionality in
// messages and their usage is not enforced by this pkg.
const (
	// empty value means never expire
	NeverExpire = patched.NeverExpire
	// 0 means immediately expire
	ImmediatelyExpire = patched.ImmediatelyExpire
)

// Most common queue argument keys in queue declaration. For a comprehensive list
// of queue arguments, visit [RabbitMQ Queue docs].
const (
	QueueTypeArg                 = patched.QueueTypeArg
	QueueMaxLenArg               = patched.QueueMaxLenArg
	QueueMaxLenBytesArg          = patched.QueueMaxLenBytesArg
	StreamMaxLenBytesArg         = patched.StreamMaxLenBytesArg
	QueueOverflowArg             = patched.QueueOverflowArg
	QueueMessageTTLArg           = patched.QueueMessageTTLArg
	QueueTTLArg                  = patched.QueueTTLArg
	StreamMaxAgeArg              = patched.StreamMaxAgeArg
	StreamMaxSegmentSizeBytesArg = patched.StreamMaxSegmentSizeBytesArg
	// QueueVersionArg declares the Classic Queue version to use. Expects an integer, either 1 or 2.
	QueueVersionArg = patched.QueueVersionArg
	// ConsumerTimeoutArg is available in RabbitMQ 3.12+ as a queue argument.
	ConsumerTimeoutArg      = patched.ConsumerTimeoutArg
	SingleActiveConsumerArg = patched.SingleActiveConsumerArg
)

// Values for queue arguments. Use as values for queue arguments during queue declaration.
// The following argument table will create a classic queue, with max length set to 100 messages,
// and a queue TTL of 30 minutes.
const (
	QueueTypeClassic              = patched.QueueTypeClassic
	QueueTypeQuorum               = patched.QueueTypeQuorum
	QueueTypeStream               = patched.QueueTypeStream
	QueueOverflowDropHead         = patched.QueueOverflowDropHead
	QueueOverflowRejectPublish    = patched.QueueOverflowRejectPublish
	QueueOverflowRejectPublishDLX = patched.QueueOverflowRejectPublishDLX
)
