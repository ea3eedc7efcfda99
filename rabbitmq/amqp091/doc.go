// Package amqp091 names the AMQP 0.9.1 client Sluice's rabbitmq package
// uses, so that code outside Sluice can use what that package returns and
// takes: the *Connection of rabbitmq.Dial, the Delivery of
// Marshaler.UnmarshalDelivery, the *Error of Connection.NotifyClose, the
// ErrCredentials a failed Dial matches.
//
//	import amqp "github.com/sluicemq/sluice/rabbitmq/amqp091"
//
//	conn, err := rabbitmq.Dial(rabbitmq.DialConfig{Connection: rabbitmq.Connection{URL: url}})
//	if errors.Is(err, amqp.ErrCredentials) { ... }
//	closed := conn.NotifyClose(make(chan *amqp.Error, 1))
//
// The client is github.com/rabbitmq/amqp091-go v1.16.0 with a patch Sluice
// needs until upstream has an equivalent — a headers table the client
// cannot parse no longer closes the connection (Delivery.HeadersError,
// Return.HeadersError), and Connection.CloseDeadline's deadline bounds the
// wait for the broker's close-ok — kept in Sluice's module
// (internal/amqp091, whose README says what changed and why). Every
// identifier here is the patched client's own: its types are aliases, its
// constants and error values the same values (errors.Is matches them), its
// functions call the client's. Their documentation is upstream's
// (https://pkg.go.dev/github.com/rabbitmq/amqp091-go@v1.16.0), with these
// additions:
//   - Delivery.HeadersError, Return.HeadersError: why the headers are nil;
//   - Delivery.Upstream: the delivery as upstream's type, for
//     watermill-amqp's Marshaler (rabbitmq.Marshaler.Unmarshal);
//   - Connection.CloseDeadline: the socket is closed at the deadline.
//
// Table, Decimal, Publishing and Blocking are upstream's own types, so what
// watermill-amqp builds is published as it is. The client's Logger variable
// is not repeated here: set it with SetLogger.
//
// Safe for concurrent use as the client is (upstream's documentation).
package amqp091
