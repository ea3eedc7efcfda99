package amqpframe

import (
	"testing"
)

// BenchmarkFilter is the filter's cost per delivery (method, content
// header with six headers, 1 KiB body), read 4 KiB at a time as
// amqp091-go's bufio.Reader does.
func BenchmarkFilter(b *testing.B) {
	headers := table{{"_watermill_message_uuid", "0b9f3a4e-6c1d-4b1e-9a57-3f0e2c9d8b71"}, {"sluice_event_id", "evt-0123456789"},
		{"sluice_event_type", "order.created"}, {"sluice_attempt", "1"}, {"traceparent", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"},
		{"x-schema-version", int32(3)}}.contents()
	var stream []byte
	for i := range 100 {
		stream = append(stream, deliver(uint64(i), headers, string(make([]byte, 1024)))...)
	}
	p := make([]byte, 4096)
	b.SetBytes(int64(len(stream)) / 100)
	b.ReportAllocs()
	for b.Loop() {
		f := &filter{}
		r := &chunks{b: stream, cut: len(stream)}
		for {
			if _, err := f.read(r, p); err != nil {
				break
			}
		}
	}
}
