package console_test

import (
	"net/http"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/sluicemq/sluice/console"
	"github.com/sluicemq/sluice/rabbitmq"
	"github.com/sluicemq/sluice/replay/ledger"
)

// mountTheConsole is docs/console.md's "mount it in your service", compiled
// (internal/readme checks the snippet is here).
func mountTheConsole(mux *http.ServeMux, conn rabbitmq.Connection, publisher *rabbitmq.Publisher, tiers []string, outcomes ledger.Ledger) error {
	c, err := console.New(console.Config{
		Prefix:    "/sluice",
		Dial:      func() (*amqp.Connection, error) { return rabbitmq.Dial(conn, "") },
		Publisher: publisher, // a *rabbitmq.Publisher: replayed copies are confirmed
		Queues:    []console.Queue{{Name: "orders", Tiers: tiers, Poison: "orders.poison"}},
		Outcomes:  outcomes, // the service's replay store (sluicesql.Outcomes on its *sqlx.DB)
		AuditFile: "/var/log/sluice-audit.jsonl",
		Operator:  func(r *http.Request) string { return userFrom(r) },
	})
	if err != nil {
		return err
	}
	mux.Handle("/sluice/", yourAuth(c))
	defer c.Close() // stops the replays it started
	return nil
}

// userFrom and yourAuth stand for the host service's own authentication.
func userFrom(r *http.Request) string { return r.Header.Get("X-User") }

func yourAuth(h http.Handler) http.Handler { return h }

var _ = mountTheConsole
