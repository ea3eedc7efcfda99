package rabbitmq

import (
	"errors"
	"fmt"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/sluicemq/sluice/internal/diag"
)

// frameOverhead is what a frame adds to its payload: type, channel, size
// (7 bytes) and the frame-end octet. A frame's payload may be at most the
// negotiated frame_max less this: RabbitMQ closes the connection with
// FRAME_ERROR (501) for a larger one.
const frameOverhead = 8

// contentHeaderFixed is the content header's payload before its
// properties: class id, weight, body size, property flags.
const contentHeaderFixed = 2 + 2 + 8 + 2

// FrameSizeError is a publishing whose AMQP content header — its
// properties and headers, which AMQP carries in one frame, unlike the body
// — does not fit in one frame of the connection's negotiated frame_max. The
// Publisher returns it (inside a *sluice.UnpublishableError) without
// publishing: the broker would close the whole connection (FRAME_ERROR),
// failing every other message in flight on it. Its text names the largest
// header and sizes, never a value.
type FrameSizeError struct {
	// Size is the content header's encoded payload, in bytes.
	Size int
	// Max is the most a frame's payload may carry: frame_max less 8.
	Max int
	// Largest is the name of the largest header (at most 64 bytes of it,
	// printable), LargestSize its encoded size.
	Largest     string
	LargestSize int
}

func (e *FrameSizeError) Error() string {
	s := fmt.Sprintf("rabbitmq: the AMQP content header (properties and headers) is %d bytes, over the %d a frame carries (negotiated frame_max)", e.Size, e.Max)
	if e.Largest != "" {
		s += fmt.Sprintf("; the largest header is %q, %d bytes", e.Largest, e.LargestSize)
	}
	return s
}

// Excess is how many bytes the content header must lose to fit.
func (e *FrameSizeError) Excess() int { return e.Size - e.Max }

// errHeaderEncoding is a header amqp091 cannot encode (a nested table's key
// over 255 bytes, a value of a type AMQP has no field for): amqp091 would
// fail it after writing the publish's method frame, which desynchronises
// the connection.
var errHeaderEncoding = errors.New("rabbitmq: a header AMQP cannot encode")

// checkFrame returns a *FrameSizeError when pub's content header does not
// fit a frame of frameMax bytes (0: unlimited), or an error matching
// errHeaderEncoding when amqp091 cannot encode it.
func checkFrame(pub amqp.Publishing, frameMax int) error {
	size, err := contentHeaderSize(pub)
	if err != nil {
		return err
	}
	if frameMax <= 0 || size <= frameMax-frameOverhead {
		return nil
	}
	e := &FrameSizeError{Size: size, Max: frameMax - frameOverhead}
	for k, v := range pub.Headers {
		n, _ := fieldSize(v)
		n += 1 + len(k)
		if n > e.LargestSize || n == e.LargestSize && k < e.Largest {
			e.Largest, e.LargestSize = k, n
		}
	}
	e.Largest = diag.Printable(e.Largest, 64)
	return e
}

// contentHeaderSize is the payload of pub's content header frame as
// amqp091's headerFrame.write encodes it.
func contentHeaderSize(pub amqp.Publishing) (int, error) {
	size := contentHeaderFixed
	for _, s := range [...]string{pub.ContentType, pub.ContentEncoding, pub.CorrelationId, pub.ReplyTo,
		pub.Expiration, pub.MessageId, pub.Type, pub.UserId, pub.AppId} {
		if s == "" {
			continue
		}
		if len(s) > shortStringMaxLength {
			return 0, fmt.Errorf("%w: a property of %d bytes", errHeaderEncoding, len(s))
		}
		size += 1 + len(s)
	}
	if len(pub.Headers) > 0 {
		n, err := tableSize(pub.Headers)
		if err != nil {
			return 0, err
		}
		size += n
	}
	if pub.DeliveryMode > 0 {
		size++
	}
	if pub.Priority > 0 {
		size++
	}
	if !pub.Timestamp.IsZero() {
		size += 8
	}
	return size, nil
}

// tableSize is the encoded size of t: a long string of its fields.
func tableSize(t amqp.Table) (int, error) {
	size := 4
	for k, v := range t {
		if len(k) > shortStringMaxLength {
			return 0, fmt.Errorf("%w: a table key of %d bytes", errHeaderEncoding, len(k))
		}
		n, err := fieldSize(v)
		if err != nil {
			return 0, err
		}
		size += 1 + len(k) + n
	}
	return size, nil
}

// fieldSize is the encoded size of a field value, its type octet included
// (amqp091's writeField).
func fieldSize(v any) (int, error) {
	switch x := v.(type) {
	case nil:
		return 1, nil
	case bool, byte, int8:
		return 2, nil
	case int16, uint16:
		return 3, nil
	case int, int32, uint32, float32:
		return 5, nil
	case amqp.Decimal:
		return 6, nil
	case int64, float64, time.Time:
		return 9, nil
	case string:
		return 5 + len(x), nil
	case []byte:
		return 5 + len(x), nil
	case []any:
		size := 5
		for _, e := range x {
			n, err := fieldSize(e)
			if err != nil {
				return 0, err
			}
			size += n
		}
		return size, nil
	case amqp.Table:
		n, err := tableSize(x)
		return 1 + n, err
	}
	return 0, fmt.Errorf("%w: a value of type %T", errHeaderEncoding, v)
}
