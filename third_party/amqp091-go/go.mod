module github.com/rabbitmq/amqp091-go

go 1.20

require go.uber.org/goleak v1.3.0
