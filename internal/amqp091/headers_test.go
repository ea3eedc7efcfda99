// Sluice patch: tests of readHeaders (third_party/amqp091-go/README.md).

package amqp091

import (
	"bytes"
	"errors"
	"fmt"
	"strings"
	"testing"
)

func deepTable(levels int) Table {
	t := Table{"leaf": "x"}
	for i := 1; i < levels; i++ {
		t = Table{"n": t}
	}
	return t
}

// A headers table the reader refuses is reported on the frame, with its
// other properties and the next frame read as usual: one message no longer
// fails the connection.
func TestHeaderFrameWithUnparseableHeaders(t *testing.T) {
	many := Table{}
	for i := 0; i < 10000; i++ {
		many[fmt.Sprintf("h%05d", i)] = int32(i)
	}
	for _, tt := range []struct {
		name    string
		headers Table
		want    string
	}{
		{"array", Table{"ok": "v", "big": make([]any, 9000)}, `header "big": an array of more than 8192 items`},
		{"deep", Table{"deep": deepTable(40)}, `header "deep": tables or arrays nested deeper than 32 levels`},
		{"many", many, "10000 headers, more than 8192"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			var buf bytes.Buffer
			hf := &headerFrame{ChannelId: 1, ClassId: 60, Size: 3, Properties: properties{
				Headers: tt.headers, MessageId: "m-1", ContentType: "text/plain", AppId: "app",
			}}
			if err := hf.write(&buf); err != nil {
				t.Fatal(err)
			}
			if err := (&bodyFrame{ChannelId: 1, Body: []byte("abc")}).write(&buf); err != nil {
				t.Fatal(err)
			}
			r := &reader{r: &buf}
			f, err := r.ReadFrame()
			if err != nil {
				t.Fatalf("ReadFrame: %v", err)
			}
			got := f.(*headerFrame).Properties
			if got.headersErr == nil || !strings.Contains(got.headersErr.Error(), tt.want) {
				t.Fatalf("headersErr = %v, want it to contain %q", got.headersErr, tt.want)
			}
			if got.Headers != nil || got.MessageId != "m-1" || got.ContentType != "text/plain" || got.AppId != "app" {
				t.Fatalf("properties = %+v", got)
			}
			b, err := r.ReadFrame()
			if err != nil || string(b.(*bodyFrame).Body) != "abc" {
				t.Fatalf("next frame: %v, %v", b, err)
			}
		})
	}
}

// At the limits the headers are read as before.
func TestHeaderFrameAtTheLimits(t *testing.T) {
	var buf bytes.Buffer
	hf := &headerFrame{ChannelId: 1, ClassId: 60, Properties: properties{
		Headers: Table{"arr": make([]any, maxContainerElements), "deep": deepTable(maxFieldDepth)},
	}}
	if err := hf.write(&buf); err != nil {
		t.Fatal(err)
	}
	f, err := (&reader{r: &buf}).ReadFrame()
	if err != nil {
		t.Fatal(err)
	}
	got := f.(*headerFrame).Properties
	if got.headersErr != nil || len(got.Headers["arr"].([]any)) != maxContainerElements {
		t.Fatalf("headersErr = %v", got.headersErr)
	}
}

// The limits still fail other tables (a method's arguments), as ErrSyntax.
func TestLimitErrorIsErrSyntax(t *testing.T) {
	var buf bytes.Buffer
	if err := writeTable(&buf, Table{"a": make([]any, maxContainerElements+1)}); err != nil {
		t.Fatal(err)
	}
	_, err := readTable(&buf)
	if !errors.Is(err, ErrSyntax) || !strings.Contains(err.Error(), "more than 8192 items") {
		t.Fatalf("err = %v", err)
	}
}
