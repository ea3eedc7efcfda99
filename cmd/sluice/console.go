package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/signal"
	"strings"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/spf13/cobra"

	"github.com/sluicemq/sluice/cmd/internal/localenv"
	"github.com/sluicemq/sluice/console"
	"github.com/sluicemq/sluice/dlq"
	"github.com/sluicemq/sluice/internal/diag"
	"github.com/sluicemq/sluice/sluicesql"
)

func newConsole(g *globals, out io.Writer) *cobra.Command {
	var addr, prefix, tokenFile, keyFile, archiveFile, outboxDB, mgmtURL string
	var ladder ladderFlags
	var queues, outboxTables []string
	var lf loopFlags
	var readOnly bool
	cmd := &cobra.Command{
		Use:   "console",
		Short: "Serve the operator console: the queues, the failure groups, replay with canary → ramp → stop, the outbox, the audit trail",
		Long: "Serves the console (package console) on --addr, over the queue families of each --queue, the outcome\n" +
			"records (--outcomes: replay is offered with them), the outbox tables (--outbox-db, --outbox-table)\n" +
			"and the audit log (--audit). Loopback only unless --token-file is given: off loopback it refuses to\n" +
			"start without one. Every action asks for a confirmation after a dry run, and is audited.",
		Args: noArgs,
		RunE: func(command *cobra.Command, _ []string) error {
			if len(queues) == 0 {
				return usageError{errors.New("--queue is required (repeat it for several)")}
			}
			ladder.given = command.Flags().Changed("tiers")
			if _, err := parseTiers(ladder.tiers); err != nil {
				return err
			}
			cfg := console.Config{Prefix: prefix, ReadOnly: readOnly, AuditFile: g.audit}
			if tokenFile != "" {
				b, err := os.ReadFile(tokenFile)
				if err != nil {
					return usageError{fmt.Errorf("--token-file: %w", err)}
				}
				if cfg.Token = strings.TrimSpace(string(b)); len(cfg.Token) < 16 {
					return usageError{errors.New("--token-file: the token must be at least 16 characters")}
				}
			}
			if err := console.CheckAddr(addr, cfg.Token != ""); err != nil {
				return usageError{fmt.Errorf("%w (--token-file sets the token)", err)}
			}
			if !readOnly {
				if err := g.checkWrite(); err != nil {
					return err
				}
			}
			var err error
			if cfg.Queues, err = consoleQueues(g, &ladder, queues, mgmtURL, out); err != nil {
				return err
			}
			cfg.Dial = func() (*amqp.Connection, error) { return connect(g) }
			if mgmtURL != "" {
				cfg.Depth = managementDepth(mgmtURL, g.url())
			}
			operator := g.operator
			cfg.Operator = func(*http.Request) string { return operator + " (console)" }
			if cfg.Signer, err = signerFlag(keyFile); err != nil {
				return err
			}
			if !readOnly {
				pub, err := newPublisher(g)
				if err != nil {
					return err
				}
				defer func() { _ = pub.Close() }()
				cfg.Publisher = pub
			}
			if lf.outcomes != "" {
				store, closeStore, err := openOutcomes(command.Context(), lf.outcomes, lf.table, !readOnly)
				if err != nil {
					return err
				}
				defer closeStore()
				cfg.Outcomes, cfg.OutcomesWhere = store, outcomesPlace(lf.outcomes, lf.table)
			}
			if outboxDB != "" {
				db, err := openPostgres(command.Context(), outboxDB)
				if err != nil {
					return fmt.Errorf("--outbox-db: %w", err)
				}
				defer func() { _ = db.Close() }()
				cfg.Outboxes = map[string]console.Outbox{}
				for _, name := range outboxTables {
					s, err := sluicesql.NewOutbox(db, sluicesql.OutboxConfig{Table: name})
					if err != nil {
						return usageError{fmt.Errorf("--outbox-table %s: %w", diag.Printable(name, 128), err)}
					}
					cfg.Outboxes[name] = console.SQLOutbox(s)
				}
			}
			if archiveFile != "" {
				cfg.Archive = func() (dlq.ArchiveSink, error) { return dlq.OpenFileSink(archiveFile) }
			}
			c, err := console.New(cfg)
			if err != nil {
				return err
			}
			defer func() { _ = c.Close() }()
			ln, err := net.Listen("tcp", addr)
			if err != nil {
				return err
			}
			srv := &http.Server{Handler: c, ReadHeaderTimeout: 10 * time.Second}
			ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
			defer stop()
			go func() {
				<-ctx.Done()
				sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				defer cancel()
				_ = srv.Shutdown(sctx)
			}()
			fmt.Fprintf(out, "sluice console on http://%s%s/\n", ln.Addr(), cfg.Prefix)
			if err := srv.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
				return err
			}
			return nil
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&addr, "addr", "127.0.0.1:8080", "listen address; off loopback it needs --token-file")
	fl.StringVar(&prefix, "prefix", "", "path prefix the console is served under, e.g. /sluice")
	fl.StringSliceVar(&queues, "queue", nil, "a consumer queue (repeat, or separate with commas): its tiers and poison queue are shown and acted on")
	fl.StringVar(&ladder.tiers, "tiers", "30s,5m,30m", "the retry tiers' delays as the topology was declared (with --management-url: read from the broker unless given)")
	fl.StringVar(&tokenFile, "token-file", localenv.Get("SLUICE_CONSOLE_TOKEN_FILE", ""), "a file holding the token every request must carry (a sign-in form sets a cookie); env SLUICE_CONSOLE_TOKEN_FILE")
	fl.BoolVar(&readOnly, "read-only", false, "refuse every action: look, move nothing")
	fl.StringVar(&keyFile, "signing-key-file", localenv.Get("SLUICE_SIGNING_KEY_FILE", ""), "the consumers' signing key (as dlq replay)")
	fl.StringVar(&mgmtURL, "management-url", localenv.Get("SLUICE_MANAGEMENT_URL", ""), "RabbitMQ's management API, e.g. http://broker:15672: the overview shows unacked messages and arrival rates (env SLUICE_MANAGEMENT_URL)")
	fl.StringVar(&archiveFile, "archive-file", "", "offer archive, appending to this JSON-lines file (as dlq archive --file)")
	fl.StringVar(&outboxDB, "outbox-db", localenv.Get("SLUICE_OUTBOX_DB_URL", ""), "PostgreSQL URL of the outbox's database (env SLUICE_OUTBOX_DB_URL)")
	fl.StringSliceVar(&outboxTables, "outbox-table", []string{"sluice_outbox"}, "the outbox tables shown")
	outcomeFlags(fl, &lf.outcomes, &lf.table, "the consumers' replay stage writes (replay is offered with it)")
	return cmd
}

// mgmtQueueDepth is what the management API says of one queue.
type mgmtQueueDepth struct {
	Ready     int `json:"messages_ready"`
	Unacked   int `json:"messages_unacknowledged"`
	Consumers int `json:"consumers"`
	Stats     struct {
		Publish struct {
			Rate float64 `json:"rate"`
		} `json:"publish_details"`
	} `json:"message_stats"`
}

// managementDepth reads a queue's depth, consumers and arrival rate from
// RabbitMQ's management API (the AMQP URL's credentials and vhost), for
// console.Config.Depth. A queue nothing was ever published to has no
// message_stats: its arrival is 0.
func managementDepth(mgmtURL, amqpURL string) func(context.Context, string) (console.Depth, error) {
	return func(ctx context.Context, queue string) (console.Depth, error) {
		var q mgmtQueueDepth
		err := mgmtGetContext(ctx, mgmtURL, amqpURL, func(vhost string) string {
			return "/api/queues/" + url.PathEscape(vhost) + "/" + url.PathEscape(queue) +
				"?columns=messages_ready,messages_unacknowledged,consumers,message_stats.publish_details.rate"
		}, "the queue", &q)
		if err != nil {
			return console.Depth{}, err
		}
		return console.Depth{Ready: q.Ready, Unacked: q.Unacked, Consumers: q.Consumers, UnackedKnown: true,
			Arrival: q.Stats.Publish.Rate, ArrivalKnown: true}, nil
	}
}
