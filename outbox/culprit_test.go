package outbox_test

import (
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluicemq/sluice/broker"
	"github.com/sluicemq/sluice/internal/testenv"
	"github.com/sluicemq/sluice/outbox"

	"github.com/sluicemq/sluice/rabbitmq"
	"github.com/sluicemq/sluice/sluicesql"
)

// poisoning forwards to RabbitMQ's publisher, giving the message culprit a
// payload over the broker's max_message_size, which the broker refuses by
// closing the channel (406 PRECONDITION_FAILED) — a row written before the
// writer refused it, or with Connection.MaxMessageSize above the broker's.
// (A CC header with a string value, the other such refusal, the publisher
// now refuses before sending.)
type poisoning struct {
	pub     *rabbitmq.Publisher
	culprit string
}

func (p *poisoning) mark(msgs []*message.Message) {
	for _, m := range msgs {
		if m.UUID == p.culprit {
			m.Payload = make([]byte, overBrokerLimit)
		}
	}
}

func (p *poisoning) Publish(topic string, msgs ...*message.Message) error {
	p.mark(msgs)
	return p.pub.Publish(topic, msgs...)
}

func (p *poisoning) PublishEach(topic string, msgs ...*message.Message) []error {
	p.mark(msgs)
	return p.pub.PublishEach(topic, msgs...)
}
func (p *poisoning) Close() error { return nil }

var _ broker.EachPublisher = (*poisoning)(nil)

// brokerLimit is the private broker's max_message_size in the culprit
// test; overBrokerLimit the culprit's payload.
const (
	brokerLimit     = 1 << 20
	overBrokerLimit = 2 << 20
)

// Issue 28.4: one row the broker refuses by closing the channel does not
// hold the rows batched with it. Before, every row after the culprit failed
// as uncertain or "channel not open", was pushed back on the culprit's own
// schedule and met it again in the next batch: 499 good rows undelivered
// after minutes. Now the failed rows are tried alone: the 500 good rows are
// delivered at once, and the culprit keeps its own reason.
func TestARowTheBrokerClosesTheChannelOnDoesNotHoldItsBatch(t *testing.T) {
	t.Parallel()
	node := testenv.StartPrivateRabbitMQWith(t, testenv.PrivateRabbitMQOptions{Config: fmt.Sprintf("max_message_size = %d\n", brokerLimit)})
	s := newService(t, node.URL)
	other := testenv.Name("produced-other")
	ch, err := s.conn.Channel()
	require.NoError(t, err)
	_, err = ch.QueueDeclare(other, true, false, false, false, nil)
	require.NoError(t, err)
	_ = ch.Close()
	// The publisher believes the broker takes 64 MiB: the broker refuses.
	pub, err := rabbitmq.NewPublisher(rabbitmq.PublisherConfig{Connection: rabbitmq.Connection{URL: node.URL, MaxMessageSize: 64 << 20}})
	require.NoError(t, err)
	t.Cleanup(func() { _ = pub.Close() })
	culprit := watermill.NewUUID()
	tx, err := s.db.BeginTxx(t.Context(), nil)
	require.NoError(t, err)
	written := map[string]map[any]bool{s.produced: {}, other: {}} // the good rows' ids by topic
	msgs := func(topic string, n int) []*message.Message {
		out := make([]*message.Message, n)
		for i := range out {
			out[i] = message.NewMessage(watermill.NewUUID(), []byte(fmt.Sprint(i)))
			written[topic][out[i].UUID] = true
		}
		return out
	}
	require.NoError(t, s.outbox.Write(t.Context(), tx, s.produced, msgs(s.produced, 10)...))
	require.NoError(t, s.outbox.Write(t.Context(), tx, s.produced, message.NewMessage(culprit, nil)))
	require.NoError(t, s.outbox.Write(t.Context(), tx, s.produced, msgs(s.produced, 390)...))
	require.NoError(t, s.outbox.Write(t.Context(), tx, other, msgs(other, 100)...))
	require.NoError(t, tx.Commit())
	start := time.Now()
	s.relay(&poisoning{pub: pub, culprit: culprit}, outbox.RelayConfig{RetryMin: time.Hour, RetryMax: time.Hour, PollInterval: 10 * time.Millisecond})
	// Waited for by their ids, not by the queues' depths: a depth counts
	// copies — a row whose confirm the culprit's close cut off is
	// uncertain, tried alone and may be stored twice — and such copies
	// brought the depths to 400 and 100 while the relay was still trying
	// the first batch's rows alone and the 501st row, the last of other, in
	// the second batch (BatchSize 500), was not yet taken.
	var mu sync.Mutex
	ids := map[string]map[any]bool{s.produced: {}, other: {}}
	delivered := func() (int, int) {
		mu.Lock()
		defer mu.Unlock()
		for queue, seen := range ids {
			for _, d := range testenv.Drain(t, s.conn, queue) {
				seen[d.Headers["_watermill_message_uuid"]] = true
			}
		}
		return len(ids[s.produced]), len(ids[other])
	}
	if !assert.Eventually(t, func() bool {
		produced, others := delivered()
		return produced >= 400 && others >= 100
	}, 2*time.Minute, 10*time.Millisecond) {
		produced, others := delivered()
		require.FailNow(t, "the 500 good rows, other topics included", "%d and %d", produced, others)
	}
	t.Logf("500 good rows delivered in %s", time.Since(start))
	mu.Lock()
	require.Equal(t, written, ids, "each good row, on its topic (a copy sent twice, uncertain the first time, is the receiver's duplicate)")
	mu.Unlock()
	require.Eventually(t, func() bool { return s.count("outbox") == 1 }, time.Minute, 10*time.Millisecond, "left: %d", s.count("outbox"))
	left, err := s.outbox.List(t.Context(), sluicesql.OutboxFailing, 10)
	require.NoError(t, err)
	require.Len(t, left, 1)
	require.Equal(t, culprit, left[0].MessageID, "the culprit is set aside")
	require.Contains(t, left[0].LastError, "406", "with its own reason: %s", left[0].LastError)
	require.Contains(t, left[0].LastError, "refused the message by closing the channel (not stored)", "refused, not uncertain (issue 43): %s", left[0].LastError)
	require.NotContains(t, left[0].LastError, "may be stored")
	require.False(t, strings.Contains(left[0].LastError, "not open"), left[0].LastError)
}
