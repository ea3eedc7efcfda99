package rabbitmq_test

import (
	"fmt"

	"github.com/ThreeDotsLabs/watermill/message/router/middleware"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/sluicemq/sluice"
	"github.com/sluicemq/sluice/rabbitmq"
)

// A Marshaler that takes the event type from a producer's x-event-type
// header, else the type property, maps no correlation id, and takes the
// event id from the message_id property (an opt-in: see Mapping.EventID).
func ExampleMapping() {
	m := rabbitmq.Marshaler{Map: rabbitmq.Mapping{
		EventType:     []rabbitmq.Source{rabbitmq.Header("x-event-type"), rabbitmq.PropertyType},
		CorrelationID: []rabbitmq.Source{},                           // off
		EventID:       []rabbitmq.Source{rabbitmq.PropertyMessageID}, // opt in: read below
	}}
	msg, err := m.Unmarshal(amqp.Delivery{Acknowledger: nopAcker{},
		Type: "order.created", CorrelationId: "corr-42", MessageId: "order-1001-created"})
	if err != nil {
		panic(err)
	}
	fmt.Println(msg.Metadata.Get(sluice.EventTypeKey), msg.Metadata.Get(sluice.EventIDKey))
	fmt.Printf("%q\n", msg.Metadata.Get(middleware.CorrelationIDMetadataKey))
	// Output:
	// order.created order-1001-created
	// ""
}
