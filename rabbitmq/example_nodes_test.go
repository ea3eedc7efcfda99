package rabbitmq_test

import (
	"fmt"
	"time"

	"github.com/sluicemq/sluice/internal/testenv"
	"github.com/sluicemq/sluice/rabbitmq"
)

// A cluster's nodes in Connection.URLs are tried in turn: a node that is
// down costs one refused connection. When none answers, the error names
// each node, without its password.
func ExampleDial_nodes() {
	conn, err := rabbitmq.Dial(rabbitmq.Connection{
		URLs: []string{"amqp://app:s3cret@127.0.0.1:1/", testenv.AMQPURL},
	}, "")
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("connected through the second node:", !conn.IsClosed())
	_ = conn.Close()

	_, err = rabbitmq.Dial(rabbitmq.Connection{
		URLs:        []string{"amqp://app:s3cret@127.0.0.1:1/", "amqp://app:s3cret@127.0.0.1:2/"},
		DialTimeout: time.Second,
	}, "")
	fmt.Println(err)
	// Output:
	// connected through the second node: true
	// rabbitmq: no node of 2 answered: rabbitmq: connecting to amqp://app:xxxxx@127.0.0.1:1/: dial tcp 127.0.0.1:1: connect: connection refused
	// rabbitmq: connecting to amqp://app:xxxxx@127.0.0.1:2/: dial tcp 127.0.0.1:2: connect: connection refused
}
