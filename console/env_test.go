package console_test

import (
	"fmt"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/sluicemq/sluice"
	"github.com/sluicemq/sluice/console"
)

// otherSigner is a sluice.Signer that is not a *signing.Signer.
type otherSigner struct{}

func (otherSigner) Sign(*message.Message, string) {}

func (otherSigner) Believe(*message.Message, func(string) bool, string, ...string) []string {
	return nil
}

// The console seals archive records and signs replayed copies with the
// key of a *signing.Signer: Config.Env.Signer of another kind is refused
// by New, not dropped.
func TestNewRefusesASignerThatIsNotASigningSigner(t *testing.T) {
	t.Parallel()
	_, err := console.New(console.Config{Dial: func() (*amqp.Connection, error) { return nil, fmt.Errorf("no broker here") },
		ReadOnly: true, Env: sluice.Env{Signer: otherSigner{}}})
	require.ErrorContains(t, err, "Config.Env.Signer must be a *signing.Signer")
}
