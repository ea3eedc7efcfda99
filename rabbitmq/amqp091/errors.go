package amqp091

import patched "github.com/sluicemq/sluice/internal/amqp091"

// The error values are the patched client's own (the same pointers), so
// errors.Is(err, ErrCredentials) holds for an error of Sluice's API.

var (
	// ErrDeliveryNotInitialized is returned when a zero Delivery is acked,
	// nacked or rejected: it has no acknowledger.
	ErrDeliveryNotInitialized = patched.ErrDeliveryNotInitialized
)

var (
	// DefaultReconnectionConfig is the default reconnection config settings.
	DefaultReconnectionConfig *ReconnectionConfig = patched.DefaultReconnectionConfig
)

var (
	// ErrClosed is returned when the channel or connection is not open
	ErrClosed *Error = patched.ErrClosed
	// ErrChannelMax is returned when Connection.Channel has been called enough
	// times that all channel IDs have been exhausted in the client or the
	// server.
	ErrChannelMax *Error = patched.ErrChannelMax
	// ErrSASL is returned from Dial when the authentication mechanism could not
	// be negotiated.
	ErrSASL *Error = patched.ErrSASL
	// ErrCredentials is returned when the authenticated client is not authorized
	// to any vhost.
	ErrCredentials *Error = patched.ErrCredentials
	// ErrVhost is returned when the authenticated user is not permitted to
	// access the requested Vhost.
	ErrVhost *Error = patched.ErrVhost
	// ErrSyntax is hard protocol error, indicating an unsupported protocol,
	// implementation or encoding.
	ErrSyntax *Error = patched.ErrSyntax
	// ErrFrame is returned when the protocol frame cannot be read from the
	// server, indicating an unsupported protocol or unsupported frame type.
	ErrFrame *Error = patched.ErrFrame
	// ErrFrameTooLarge is returned when the server sends a frame whose
	// declared size exceeds the frame_max negotiated during connection.tune.
	ErrFrameTooLarge *Error = patched.ErrFrameTooLarge
	// ErrCommandInvalid is returned when the server sends an unexpected response
	// to this requested message type. This indicates a bug in this client.
	ErrCommandInvalid *Error = patched.ErrCommandInvalid
	// ErrUnexpectedFrame is returned when something other than a method or
	// heartbeat frame is delivered to the Connection, indicating a bug in the
	// client.
	ErrUnexpectedFrame *Error = patched.ErrUnexpectedFrame
	// ErrFieldType is returned when writing a message containing a Go type unsupported by AMQP.
	ErrFieldType *Error = patched.ErrFieldType
)
