// Package amqpframe reads the frames an AMQP 0-9-1 broker sends to
// amqp091-go and rewrites the one kind the client cannot survive: a
// content-header frame whose headers table breaks the client's reader
// limits (github.com/rabbitmq/amqp091-go v1.17.0, read.go: more than 8,192
// items in an array or 8,192 entries in a table, tables or arrays nested
// deeper than 32 levels, a field type it does not know, a value cut short
// inside the table). On such a frame upstream's reader fails the whole
// connection with 501 FRAME_ERROR and the broker hands the same message to
// the next connection, forever.
//
// NewConn wraps the connection's socket (amqp091-go's Config.Dial; Config
// does the wiring, TLS included, the filter above TLS so that it reads
// decrypted frames). For each such frame it replaces the headers table by
// one that holds only Key, whose value is a per-process token and the
// reason; it strips Key from every other incoming headers table, so a
// producer cannot forge it. Reason reads it back from a delivery's
// headers, believing only what this process's filter wrote.
//
// The filter streams: a frame other than a content header passes through
// the caller's buffer untouched; a content-header frame (at most
// HeaderFrameMax bytes, larger ones pass unchanged) is held whole, checked,
// and passed on byte-identical unless it is rewritten. It is correct for
// frames split at any byte.
package amqpframe
