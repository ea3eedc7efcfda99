// Command sluice is the operator's tool for Sluice's queues on RabbitMQ:
// inspect, replay and archive a poison queue, plan or apply a consumer
// queue's topology, move an existing queue onto it, and see a stuck
// transactional outbox. See docs/cli.md.
//
//	sluice dlq stats   --queue orders.poison
//	sluice dlq inspect --queue orders.poison --class invariant --limit 5
//	sluice dlq replay  --queue orders.poison --class exhausted --rate 20 --dry-run
//	sluice dlq archive --queue orders.poison --class poison --to poison-2026-11-30.jsonl
//	sluice topology plan --queue orders --tiers 30s,5m,30m --quorum --delivery-limit 20
//	sluice topology migrate bind --from orders-old --queue orders --quorum --binding events=order.created
//	sluice outbox stats --db "$PG" --table orders.sluice_outbox
//
// Exit codes: 0 done, 1 error, 2 usage.
package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"os"
	"os/user"
	"runtime/debug"
	"strings"

	"github.com/spf13/cobra"

	"github.com/sluicemq/sluice/cmd/internal/localenv"
	"github.com/sluicemq/sluice/dlq"
	"github.com/sluicemq/sluice/internal/diag"
	"github.com/sluicemq/sluice/rabbitmq"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

// usageError is a mistake in the command line: exit code 2.
type usageError struct{ error }

// run executes the command line and returns the exit code. Everything it
// prints passes a diag.Terminal: message contents (a queue named in a
// header, a tampered archive's target, a reason) are escaped where they are
// printed, and what reaches the terminal has no control character but
// newlines and tabs even where that was forgotten.
func run(args []string, stdout, stderr io.Writer) int {
	out, errOut := diag.NewTerminal(stdout), diag.NewTerminal(stderr)
	defer func() { _, _ = out.Flush(), errOut.Flush() }()
	return execute(args, out, errOut)
}

func execute(args []string, stdout, stderr io.Writer) int {
	root := newRoot(stdout)
	root.SetArgs(args)
	root.SetOut(stdout)
	root.SetErr(stderr)
	cmd, err := root.ExecuteC()
	if err == nil {
		return 0
	}
	if errors.Is(err, context.Canceled) {
		fmt.Fprintln(stderr, "sluice: interrupted: what was done before is in the audit log (and, with --outcomes, the outcome records); run the command again to go on")
		return 1
	}
	fmt.Fprintln(stderr, "sluice:", diag.Redact(err.Error()))
	var ue usageError
	if errors.As(err, &ue) {
		path := "sluice"
		if cmd != nil {
			path = cmd.CommandPath()
		}
		fmt.Fprintf(stderr, "Run '%s --help' for usage.\n", path)
		return 2
	}
	return 1
}

// globals are the flags every command shares.
type globals struct {
	amqpURL  string
	operator string
	audit    string
	tlsCA    string
	tlsCert  string
	tlsKey   string
}

// tls returns the TLS configuration of the flags, or nil when none is set
// (an amqps:// URL then uses the system's roots).
func (g *globals) tls() (*tls.Config, error) {
	if g.tlsCA == "" && g.tlsCert == "" && g.tlsKey == "" {
		return nil, nil
	}
	cfg := &tls.Config{MinVersion: tls.VersionTLS12}
	if g.tlsCA != "" {
		pem, err := os.ReadFile(g.tlsCA)
		if err != nil {
			return nil, usageError{fmt.Errorf("--tls-ca: %w", err)}
		}
		cfg.RootCAs = x509.NewCertPool()
		if !cfg.RootCAs.AppendCertsFromPEM(pem) {
			return nil, usageError{fmt.Errorf("--tls-ca %s: no PEM certificate in it", g.tlsCA)}
		}
	}
	if (g.tlsCert == "") != (g.tlsKey == "") {
		return nil, usageError{errors.New("--tls-cert and --tls-key go together")}
	}
	if g.tlsCert != "" {
		pair, err := tls.LoadX509KeyPair(g.tlsCert, g.tlsKey)
		if err != nil {
			return nil, usageError{fmt.Errorf("--tls-cert/--tls-key: %w", err)}
		}
		cfg.Certificates = []tls.Certificate{pair}
	}
	return cfg, nil
}

func newRoot(stdout io.Writer) *cobra.Command {
	g := &globals{}
	root := &cobra.Command{
		Version:       version(),
		Use:           "sluice",
		Short:         "Inspect, replay and archive Sluice poison queues; plan and apply topology",
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return usageError{err} })
	pf := root.PersistentFlags()
	pf.StringVar(&g.amqpURL, "amqp-url", "", "RabbitMQ URL, or a cluster's node URLs comma-separated (tried in turn; a comma in a password is written %2C); default: env SLUICE_AMQP_URL, else the local broker with RabbitMQ's guest account. Its password is never printed")
	pf.StringVar(&g.operator, "operator", defaultOperator(), "who runs this, recorded in replay headers, the audit log and the outcome records; default: env SLUICE_OPERATOR, else the OS user. The commands that move or record messages refuse to run without one")
	pf.StringVar(&g.tlsCA, "tls-ca", "", "PEM file of the CA that signed the broker's certificate (amqps:// URLs); default: the system's roots")
	pf.StringVar(&g.tlsCert, "tls-cert", "", "PEM client certificate for amqps:// URLs (with --tls-key)")
	pf.StringVar(&g.tlsKey, "tls-key", "", "PEM private key of --tls-cert")
	pf.StringVar(&g.audit, "audit", localenv.Get("SLUICE_AUDIT_FILE", "sluice-audit.jsonl"), `audit log of replay and archive runs (JSON lines); "-" for stdout`)
	root.AddCommand(newDLQ(g, stdout), newTopology(g, stdout), newQueues(g, stdout), newOutbox(g, stdout), newOrder(g, stdout), newConsole(g, stdout))
	return root
}

// defaultOperator is $SLUICE_OPERATOR, else the OS user (its name in the
// user database, else $USER), else "": a container whose user has no name
// and no $USER must say who runs it (checkWrite).
func defaultOperator() string {
	if op := localenv.Get("SLUICE_OPERATOR", ""); op != "" {
		return op
	}
	if u, err := user.Current(); err == nil && u.Username != "" {
		return u.Username
	}
	return localenv.Get("USER", "")
}

// checkWrite is what a command that moves or records messages checks
// before it touches anything: an operator to record, and an audit log it
// can write.
func (g *globals) checkWrite() error {
	if strings.TrimSpace(g.operator) == "" {
		return usageError{errors.New("--operator is required: no $SLUICE_OPERATOR, and the OS user has no name (the audit log and the replay headers record who moved the messages)")}
	}
	return dlq.CheckAudit(g.audit)
}

// urls returns the broker's node URLs: the flag's, the environment's (a
// comma-separated list), or the local broker.
func (g *globals) urls() []string {
	list := g.amqpURL
	if list == "" {
		list = localenv.Get("SLUICE_AMQP_URL", localenv.AMQPURL)
	}
	urls := strings.Split(list, ",")
	for i, u := range urls {
		urls[i] = strings.TrimSpace(u)
	}
	return urls
}

// url returns the first node's URL: the management API's credentials and
// virtual host are taken from it.
func (g *globals) url() string { return g.urls()[0] }

// connection returns how to reach the broker: its node URLs and the TLS
// of the flags.
func (g *globals) connection() (rabbitmq.Connection, error) {
	tlsCfg, err := g.tls()
	if err != nil {
		return rabbitmq.Connection{}, err
	}
	if urls := g.urls(); len(urls) > 1 {
		return rabbitmq.Connection{URLs: urls, TLS: tlsCfg}, nil
	}
	return rabbitmq.Connection{URL: g.url(), TLS: tlsCfg}, nil
}

// noArgs rejects positional arguments as a usage error.
func noArgs(_ *cobra.Command, args []string) error {
	if len(args) > 0 {
		return usageError{fmt.Errorf("unexpected argument %q", args[0])}
	}
	return nil
}

// version is the module version the binary was built from (go install
// …@v0.3.0), or "(devel)" with the VCS revision for a local build.
func version() string {
	info, ok := debug.ReadBuildInfo()
	if !ok {
		return "(unknown)"
	}
	v := info.Main.Version
	for _, s := range info.Settings {
		if s.Key == "vcs.revision" && len(s.Value) >= 12 {
			v += " " + s.Value[:12]
		}
	}
	return v
}
