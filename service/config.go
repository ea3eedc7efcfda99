package service

import (
	"cmp"
	"errors"
	"fmt"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jmoiron/sqlx"

	"github.com/sluicemq/sluice"
	"github.com/sluicemq/sluice/internal/inherit"
	"github.com/sluicemq/sluice/outbox"
	"github.com/sluicemq/sluice/sluicesql"
)

// Defaults of Config, stated on its fields.
const (
	// inboxRetentionDefault is how long an inbox record is kept: a
	// redelivery after it is pruned runs the handler again.
	inboxRetentionDefault = 14 * 24 * time.Hour
	// replayWindowDefault is how long after processing a message may
	// still come back (replayed from a poison queue, republished by an
	// operator) and must be recognised as a duplicate.
	replayWindowDefault = 7 * 24 * time.Hour
	// outcomeRetentionDefault is how long a replay outcome is kept for
	// sluice dlq report.
	outcomeRetentionDefault = 30 * 24 * time.Hour
	// pruneIntervalDefault is the time between two pruning runs.
	pruneIntervalDefault = 10 * time.Minute
	// drainTimeoutDefault bounds the relay's drain when the router closes.
	drainTimeoutDefault = 10 * time.Second
	// healthTimeoutDefault bounds each check of a health report.
	healthTimeoutDefault = 2 * time.Second
)

// Config configures New.
type Config struct {
	// DB is the database of Sluice's tables (the inbox, the outbox, the
	// replay outcomes) and of the handlers' own writes: PostgreSQL or
	// SQLite, as sluicesql takes it. Required unless Stores is set.
	DB *sqlx.DB
	// Schema is the PostgreSQL schema of Sluice's tables (the inbox, the
	// outbox, the replay outcomes): required on PostgreSQL, a decision
	// rather than a default. Two services sharing a database must not
	// share these tables — the inbox keys each event by handler name, and
	// one service's "inventory" handler would take the other's events for
	// duplicates — so give each its own ("inventory", say); "public" keeps
	// them where the connection's search_path puts them by default.
	// Migrate creates the schema when it does not exist. SQLite has none:
	// leave it empty.
	Schema string
	// Stores replaces DB and Schema: Sluice's tables as you named them
	// (sluicesql.New).
	Stores *sluicesql.Stores
	// Router is the Watermill router the handlers are added to. The
	// service starts its relay and pruners when the router runs (a router
	// plugin) and drains and stops them when it closes. Required.
	Router *message.Router
	// Publisher publishes what handlers produce, from the outbox (the
	// relay's): one that returns once the broker holds the message —
	// rabbitmq's Broker.Publisher(), the embedded default's
	// PubSub().Publisher(). Required to Add a PublishingHandler; without
	// it the service runs no relay.
	Publisher message.Publisher
	// Relay tunes the outbox relay (outbox.RelayConfig: the relay's own
	// settings; the store and the publisher are the service's). Its Env
	// defaults to the service's, field by field.
	Relay outbox.RelayConfig

	// Env is given once to every stage of every handler (router.Stages.Env,
	// a handler's own fields winning), to the relay (Relay.Env), the pruners
	// and the broker publisher's instruments. Its MeterProvider receives
	// every stage's metrics, the relay's, the pruner's and the broker
	// publisher's: give promexport.New's to serve them to Prometheus (default
	// the global OpenTelemetry provider); its TracerProvider, the Trace
	// stage's and the brake's spans (default the global provider); its
	// Logger, each fate decided, the relay's and the pruners' errors (default
	// the router's logger); its Signer proves that Sluice wrote a delivery's
	// control headers (docs/architecture.md, "Trust boundary"; default none);
	// its Classifier is every stage's (default sluice.DefaultClassifier());
	// its PublishTimeout, PublishBackoff and StoreTimeout bound the stages'
	// and the relay's publishes and store calls (default each one's own).
	sluice.Env

	// InboxRetention is how long an inbox record is kept before the pruner
	// deletes it; it must cover each handler's retry ladder plus
	// ReplayWindow (Add checks). Default 14 days.
	InboxRetention time.Duration
	// ReplayWindow is how long after processing a message may still come
	// back. Default 7 days.
	ReplayWindow time.Duration
	// OutcomeRetention is how long a replay outcome is kept. Default
	// 30 days.
	OutcomeRetention time.Duration
	// PruneInterval is the time between two pruning runs (each deletes in
	// batches of 1,000 rows). Default
	// 10 min.
	PruneInterval time.Duration
	// DrainTimeout bounds the relay's drain when the router closes: the
	// rows the handlers committed are published until none is due or this
	// passes; what is left waits for the next start. Default
	// 10 s.
	DrainTimeout time.Duration
	// HealthTimeout bounds each check of a health report (the database's
	// ping, the outbox's counts). Default 2 s.
	HealthTimeout time.Duration
}

// withDefaults returns a copy of c with its defaults filled.
func (c Config) withDefaults() Config {
	c.InboxRetention = cmp.Or(c.InboxRetention, inboxRetentionDefault)
	c.ReplayWindow = cmp.Or(c.ReplayWindow, replayWindowDefault)
	c.OutcomeRetention = cmp.Or(c.OutcomeRetention, outcomeRetentionDefault)
	c.PruneInterval = cmp.Or(c.PruneInterval, pruneIntervalDefault)
	c.DrainTimeout = cmp.Or(c.DrainTimeout, drainTimeoutDefault)
	c.HealthTimeout = cmp.Or(c.HealthTimeout, healthTimeoutDefault)
	if c.Router != nil {
		c.Logger = cmp.Or(c.Logger, c.Router.Logger())
	}
	c.Relay.Env = inherit.Env(c.Relay.Env, c.Env)
	return c
}

// validate checks a Config with its defaults filled.
func (c Config) validate() error {
	for _, d := range []struct {
		name string
		v    time.Duration
	}{{"InboxRetention", c.InboxRetention}, {"ReplayWindow", c.ReplayWindow}, {"OutcomeRetention", c.OutcomeRetention},
		{"PruneInterval", c.PruneInterval}, {"DrainTimeout", c.DrainTimeout}, {"HealthTimeout", c.HealthTimeout}} {
		if d.v < 0 {
			return fmt.Errorf("service: Config.%s must not be negative, got %s", d.name, d.v)
		}
	}
	switch {
	case c.Router == nil:
		return errors.New("service: Config.Router is required")
	case c.Router.IsRunning():
		return errors.New("service: Config.Router is running: build the service before the router runs (it starts the relay and the pruners when it does)")
	case c.Stores == nil && c.DB == nil:
		return errors.New("service: Config.DB is required (or Config.Stores)")
	case c.Stores == nil && c.Schema == "" && (c.DB.DriverName() == "postgres" || c.DB.DriverName() == "pgx"):
		return errors.New(`service: Config.Schema is required on PostgreSQL: the schema of this service's Sluice tables (inbox, outbox, replay outcomes), ` +
			`which Migrate creates. Give each service sharing the database its own (Schema: "inventory"): in one schema, two services' handlers ` +
			`of the same name share one inbox and take each other's events for duplicates. Schema: "public" keeps the tables in the default schema`)
	case c.Stores != nil && (c.DB != nil || c.Schema != ""):
		return errors.New("service: Config.Stores replaces Config.DB and Config.Schema: give one or the other")
	}
	return nil
}
