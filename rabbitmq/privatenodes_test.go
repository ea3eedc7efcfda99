package rabbitmq_test

import (
	"crypto/x509"
	"fmt"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/sluicemq/sluice/internal/testenv"
)

// The tests that need a node of their own share two private nodes, each
// started by the first test that asks for it and stopped by TestMain:
// five nodes, one a test, booted at once beside the package's other tests
// before, 10 to 28 s each at make test's load.
//
//   - plainNode is StartPrivateRabbitMQ's node, no plugins: for
//     TestPartitionedWithoutThePlugin's "absent", and for
//     TestPublisherBlockedConnectionIsBounded, which raises a memory alarm
//     and so has the node to itself (exclusiveNode).
//   - configuredNode has a TLS listener (testenv.TestCA), max_message_size
//     1 MiB and rabbitmq_consistent_hash_exchange: for TestTLS,
//     TestAMessageTheBrokerClosesTheChannelOnIsRefused and
//     TestPartitionedWithoutThePlugin's "enabled". None of them changes
//     the node's settings.
var plainNode, configuredNode sharedNode

type sharedNode struct {
	once sync.Once
	use  sync.RWMutex // held for writing by a test that disturbs the node
	n    *testenv.PrivateRabbitMQ
	pool *x509.CertPool // the roots that verify its TLS listener, if any
	err  error
}

// plainNodeFor returns plainNode, shared with other tests until t ends.
func plainNodeFor(t *testing.T) *testenv.PrivateRabbitMQ {
	t.Helper()
	return plainNode.get(t, false, func(*testing.T) testenv.PrivateRabbitMQOptions { return testenv.PrivateRabbitMQOptions{} })
}

// exclusiveNode returns plainNode, held by t alone until t ends (t's
// cleanups registered after this call run first).
func exclusiveNode(t *testing.T) *testenv.PrivateRabbitMQ {
	t.Helper()
	return plainNode.get(t, true, func(*testing.T) testenv.PrivateRabbitMQOptions { return testenv.PrivateRabbitMQOptions{} })
}

// configuredNodeFor returns configuredNode, shared until t ends, and the
// roots that verify its TLS listener.
func configuredNodeFor(t *testing.T) (*testenv.PrivateRabbitMQ, *x509.CertPool) {
	t.Helper()
	n := configuredNode.get(t, false, func(t *testing.T) testenv.PrivateRabbitMQOptions {
		files, pool := testenv.TestCA(t)
		configuredNode.pool = pool
		return testenv.PrivateRabbitMQOptions{
			TLS:     &files,
			Config:  "max_message_size = 1048576\n",
			Plugins: []string{"rabbitmq_consistent_hash_exchange"},
		}
	})
	return n, configuredNode.pool
}

func (s *sharedNode) get(t *testing.T, exclusive bool, options func(*testing.T) testenv.PrivateRabbitMQOptions) *testenv.PrivateRabbitMQ {
	t.Helper()
	s.once.Do(func() {
		start := time.Now()
		s.n, s.err = testenv.StartRabbitMQ(options(t))
		if s.err == nil {
			t.Logf("private node started in %s (started %d time(s): %v refused)", time.Since(start).Round(time.Millisecond), s.n.Boot.Attempts, s.n.Boot.Refused)
		}
	})
	require.NoError(t, s.err, "starting a private node")
	if exclusive {
		s.use.Lock()
		t.Cleanup(s.use.Unlock)
	} else {
		s.use.RLock()
		t.Cleanup(s.use.RUnlock)
	}
	return s.n
}

// closePrivateNodes stops the shared nodes the tests started.
func closePrivateNodes() {
	for _, s := range []*sharedNode{&plainNode, &configuredNode} {
		if s.n != nil {
			if err := s.n.Close(); err != nil {
				fmt.Fprintln(os.Stderr, err)
			}
		}
	}
}
