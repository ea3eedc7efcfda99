package sluice_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/sluicemq/sluice/internal/testenv"
)

// libraryUser writes a module of a service that requires Sluice (through a
// replace to this tree) with mainGo as its main package, and returns a
// function that runs the go command in it, failing t on an error.
func libraryUser(t *testing.T, mainGo string) func(args ...string) string {
	t.Helper()
	root, err := filepath.Abs(".")
	require.NoError(t, err)
	dir := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(dir, "go.mod"), []byte(`module example.com/service

go 1.26.0

require github.com/sluicemq/sluice v0.0.0

replace github.com/sluicemq/sluice => `+root+"\n"), 0o600))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "main.go"), []byte(mainGo), 0o600))
	return func(args ...string) string {
		cmd := exec.Command("go", args...)
		cmd.Dir = dir
		// Offline, from the module cache this module's own build filled; the
		// service's go.sum written from it.
		cmd.Env = append(os.Environ(), "GOWORK=off", "GOFLAGS=-mod=mod", "GOPROXY=off", "GOSUMDB=off")
		out, err := cmd.CombinedOutput()
		require.NoError(t, err, "go %s:\n%s", strings.Join(args, " "), out)
		return string(out)
	}
}

// A service outside Sluice's module uses every rabbitmq function and
// method whose signature holds the AMQP client's types, naming them through
// rabbitmq/amqp091 — and runs it on the broker: a failed Dial matches
// amqp.ErrCredentials, as Dial's doc says; NotifyClose takes a chan
// *amqp.Error; Topology.Declare takes the *amqp.Connection; the
// Marshaler reads an amqp.Delivery. Before, these types were those of
// internal/amqp091, which no program outside the module can import: the
// program did not compile.
func TestAServiceOutsideTheModuleNamesTheAMQPClientsTypes(t *testing.T) {
	if testing.Short() {
		t.Skip("builds a module")
	}
	t.Parallel()
	queue := testenv.Name("outside")
	testenv.DeleteQueuesAtEnd(t, queue, queue+".retry.30s", queue+".retry.5m", queue+".retry.30m", queue+".poison")
	run := libraryUser(t, serviceUsingTheClient)
	wrong := strings.Replace(testenv.AMQPURL, "guest:guest@", "guest:wrong@", 1)
	require.NotEqual(t, testenv.AMQPURL, wrong, "the test URL has guest's credentials")
	out := run("run", ".", testenv.AMQPURL, wrong, queue)
	require.Equal(t, "bad credentials: errors.Is(err, amqp.ErrCredentials)\ndeclared 5 queues, 0 left to do\nread {\"n\":1} with header n=1\nclosed: <nil> false\n", out)
}

const serviceUsingTheClient = `package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/sluicemq/sluice/rabbitmq"
	amqp "github.com/rabbitmq/amqp091-go"
)

func main() {
	url, wrong, queue := os.Args[1], os.Args[2], os.Args[3]
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	var dial func(rabbitmq.Connection, string) (*amqp.Connection, error) = rabbitmq.Dial
	if _, err := dial(rabbitmq.Connection{URL: wrong}, ""); errors.Is(err, amqp.ErrCredentials) {
		fmt.Println("bad credentials: errors.Is(err, amqp.ErrCredentials)")
	} else {
		panic(fmt.Sprint("want ErrCredentials, got ", err))
	}
	conn, err := rabbitmq.Dial(rabbitmq.Connection{URL: url}, "")
	if err != nil {
		panic(err)
	}
	closed := conn.NotifyClose(make(chan *amqp.Error, 1))

	topo, err := rabbitmq.NewTopology(rabbitmq.TopologyConfig{Queue: queue})
	if err != nil {
		panic(err)
	}
	var declare func(context.Context, *amqp.Connection) ([]string, error) = topo.Declare
	if _, err := declare(ctx, conn); err != nil {
		panic(err)
	}
	todo, err := declare(ctx, conn)
	if err != nil {
		panic(err)
	}
	fmt.Printf("declared %d queues, %d left to do\n", len(topo.Plan().Queues), len(todo))

	ch, err := conn.Channel()
	if err != nil {
		panic(err)
	}
	if err := ch.PublishWithContext(ctx, "", queue, true, false, amqp.Publishing{
		Headers: amqp.Table{"n": int32(1)}, Body: []byte(` + "`" + `{"n":1}` + "`" + `), DeliveryMode: amqp.Persistent,
	}); err != nil {
		panic(err)
	}
	var d amqp.Delivery
	for ok := false; !ok; {
		if d, ok, err = ch.Get(queue, false); err != nil {
			panic(err)
		}
	}
	var unmarshal func(amqp.Delivery) (*message.Message, error) = rabbitmq.Marshaler{}.Unmarshal
	msg, err := unmarshal(d)
	if err != nil {
		panic(err)
	}
	fmt.Printf("read %s with header n=%s\n", msg.Payload, msg.Metadata.Get("n"))
	if err := d.Ack(false); err != nil {
		panic(err)
	}
	if err := conn.Close(); err != nil {
		panic(err)
	}
	select {
	case e, open := <-closed: // a close asked for: no *amqp.Error, the channel closed
		fmt.Printf("closed: %v %v\n", e, open)
	case <-ctx.Done():
		panic("no close")
	}
}
`
