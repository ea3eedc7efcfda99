// Sluice patch (third_party/amqp091-go/README.md): a message's headers table
// that this reader refuses to parse is reported on the delivery instead of
// failing the frame, so one message can no longer close the connection.

package amqp091

import (
	"bytes"
	"fmt"
	"io"
)

// limitError is ErrSyntax naming the limit a field broke: errors.Is(err,
// ErrSyntax) holds, and its message says which limit.
type limitError struct{ reason string }

func (e *limitError) Error() string { return e.reason }

func (e *limitError) Is(target error) bool { return target == ErrSyntax }

var (
	errTooDeep = &limitError{fmt.Sprintf("tables or arrays nested deeper than %d levels (the client's limit)", maxFieldDepth)}
	errArray   = &limitError{fmt.Sprintf("an array of more than %d items (the client's limit)", maxContainerElements)}
	errTable   = &limitError{fmt.Sprintf("a table of more than %d entries (the client's limit)", maxContainerElements)}
)

func errFieldType(typ byte) error {
	return &limitError{fmt.Sprintf("unknown field type %q", typ)}
}

// readHeaders reads the headers table of a content header. The table is a
// long string, read whole first: only an error reading it (the frame is
// short) is returned as err, failing the frame. An error parsing its
// contents — a limit of readFieldDepth, a field type it does not know, a
// truncated entry — leaves the frame's other properties readable: it is
// returned as headersErr, with a nil table, naming the top-level header it
// was found in. Beyond maxContainerElements headers it goes on counting,
// keeping none, to say how many there are.
func readHeaders(r io.Reader) (table Table, headersErr, err error) {
	raw, err := readLongstr(r)
	if err != nil {
		return nil, nil, err
	}
	nested := bytes.NewBufferString(raw)
	table = make(Table)
	n := 0
	for nested.Len() > 0 {
		key, err := readShortstr(nested)
		if err != nil {
			return nil, fmt.Errorf("headers not parsed: after %d headers: %w", n, err), nil
		}
		value, err := readFieldDepth(nested, 0)
		if err != nil {
			return nil, fmt.Errorf("headers not parsed: header %q: %w", key, err), nil
		}
		n++
		if n <= maxContainerElements {
			table[key] = value
		} else {
			table = nil
		}
	}
	if n > maxContainerElements {
		return nil, fmt.Errorf("headers not parsed: %d headers, more than %d (the client's limit)", n, maxContainerElements), nil
	}
	return table, nil, nil
}
