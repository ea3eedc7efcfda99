package testenv

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"
)

// AMQP opens a connection to the test broker, closed when t ends. A test
// fails, not skips, when RabbitMQ is not reachable: `make services` provides it.
func AMQP(t testing.TB) *amqp.Connection {
	t.Helper()
	conn, err := amqp.DialConfig(AMQPURL, amqp.Config{Dial: amqp.DefaultDial(10 * time.Second)})
	require.NoError(t, err, "RabbitMQ at %s (run `make services`)", redact(AMQPURL))
	t.Cleanup(func() { _ = conn.Close() })
	return conn
}

// Channel opens a channel on conn, closed when t ends.
func Channel(t testing.TB, conn *amqp.Connection) *amqp.Channel {
	t.Helper()
	ch, err := conn.Channel()
	require.NoError(t, err)
	t.Cleanup(func() { _ = ch.Close() })
	return ch
}

// DeleteQueuesAtEnd deletes the named queues (and exchanges, for names given
// with the "exchange:" prefix) when t ends, on a connection of its own.
func DeleteQueuesAtEnd(t testing.TB, names ...string) {
	t.Helper()
	t.Cleanup(func() { deleteQueues(t, names) })
}

// DeleteQueuesNowAndAtEnd is DeleteQueuesAtEnd for queues of a fixed name
// (the README's "inventory"), deleted first too: a run that was killed
// before its cleanup left them, with its messages.
func DeleteQueuesNowAndAtEnd(t testing.TB, names ...string) {
	t.Helper()
	deleteQueues(t, names)
	t.Cleanup(func() { deleteQueues(t, names) })
}

func deleteQueues(t testing.TB, names []string) {
	conn, err := amqp.Dial(AMQPURL)
	if err != nil {
		t.Errorf("deleting queues: %v", err)
		return
	}
	defer func() { _ = conn.Close() }()
	for _, n := range names {
		ch, err := conn.Channel()
		if err != nil {
			t.Errorf("deleting queues: %v", err)
			return
		}
		if len(n) > 9 && n[:9] == "exchange:" {
			_ = ch.ExchangeDelete(n[9:], false, false)
		} else {
			_, _ = ch.QueueDelete(n, false, false, false)
		}
		_ = ch.Close()
	}
}

// QueueDepth returns the number of ready messages in queue.
func QueueDepth(t testing.TB, conn *amqp.Connection, queue string) int {
	t.Helper()
	return inspectQueue(t, conn, queue).Messages
}

// Empty reports whether queue has no ready message, by a basic.get (a
// message it gets goes back). Where the queue's leader may have just
// changed, QueueDepth cannot say a quorum queue is empty: RabbitMQ counts 0
// when the leader its record names does not answer within 250 ms.
func Empty(t testing.TB, conn *amqp.Connection, queue string) bool {
	t.Helper()
	ch, err := conn.Channel()
	require.NoError(t, err)
	defer func() { _ = ch.Close() }() // returns the message got, if any
	_, ok, err := ch.Get(queue, false)
	require.NoError(t, err, "queue %s", queue)
	return !ok
}

// QueueDepths says how many ready messages each of queues holds ("orders
// 3, orders.poison 0"): what a failed wait for them prints.
func QueueDepths(t testing.TB, conn *amqp.Connection, queues ...string) string {
	t.Helper()
	depths := make([]string, len(queues))
	for i, q := range queues {
		depths[i] = fmt.Sprintf("%s %d", q, QueueDepth(t, conn, q))
	}
	return strings.Join(depths, ", ")
}

// QueueConsumers returns the number of consumers of queue: 0 once a
// draining consumer has cancelled, so the broker sends it nothing more.
func QueueConsumers(t testing.TB, conn *amqp.Connection, queue string) int {
	t.Helper()
	return inspectQueue(t, conn, queue).Consumers
}

func inspectQueue(t testing.TB, conn *amqp.Connection, queue string) amqp.Queue {
	t.Helper()
	ch, err := conn.Channel()
	require.NoError(t, err)
	defer func() { _ = ch.Close() }()
	q, err := ch.QueueDeclarePassive(queue, true, false, false, false, nil)
	require.NoError(t, err, "queue %s", queue)
	return q
}

// Drain takes every ready message from queue (acking them) and returns them.
func Drain(t testing.TB, conn *amqp.Connection, queue string) []amqp.Delivery {
	t.Helper()
	ch, err := conn.Channel()
	require.NoError(t, err)
	defer func() { _ = ch.Close() }()
	var out []amqp.Delivery
	for {
		d, ok, err := ch.Get(queue, true)
		require.NoError(t, err)
		if !ok {
			return out
		}
		out = append(out, d)
	}
}

// PrivateRabbitMQ is a RabbitMQ node of a test's own (or of a package's
// tests, StartRabbitMQ), for tests that stop, fill or alarm a broker, or
// need a plugin or a listener the shared one has not: the shared one is
// never disturbed.
type PrivateRabbitMQ struct {
	URL    string
	TLSURL string // amqps://, with PrivateRabbitMQOptions.TLS
	// ManagementURL is the HTTP API, with PrivateRabbitMQOptions.Management.
	ManagementURL string
	// Boot is how its start went: started again after RabbitMQ 4.0
	// refused to boot (awaitBoot), or at once.
	Boot Boot
	node string
	dir  string // its files
}

// PrivateRabbitMQOptions configure StartPrivateRabbitMQ.
type PrivateRabbitMQOptions struct {
	// TLS, when set, adds a TLS listener with these PEM files (read by the
	// node, which runs as the rabbitmq user: they are copied into its
	// directory).
	TLS *TLSFiles
	// Management enables the management plugin (its HTTP API) on a port
	// of its own.
	Management bool
	// Config is more rabbitmq.conf lines (e.g. "max_message_size = 1048576").
	Config string
	// Plugins are more plugins to enable (e.g.
	// "rabbitmq_consistent_hash_exchange"); none by default.
	Plugins []string
}

// TLSFiles are PEM files of a TLS listener.
type TLSFiles struct{ CA, Cert, Key []byte }

// DeadLetterConfirmTimeout is the dead_letter_worker_publisher_confirm_timeout
// of the suite's brokers: the private nodes started here, the shared 3.10
// broker and the 4.0 node (scripts/rabbitmq-dlx.sh, for make services,
// has the same value). RabbitMQ's default is 180 s.
const DeadLetterConfirmTimeout = 10 * time.Second

// StartPrivateRabbitMQ starts a RabbitMQ node of t's own on a free port
// (name, ports, data and config of its own; no plugins: not even
// rabbitmq_consistent_hash_exchange, which the shared brokers have) and stops it, with
// its files removed, when t ends. It runs from the installation under test
// (RabbitMQRoot: the 4.0 node's directory, or the machine's RabbitMQ) and
// needs root (on the machine, the node runs as the rabbitmq user).
func StartPrivateRabbitMQ(t testing.TB) *PrivateRabbitMQ {
	t.Helper()
	return StartPrivateRabbitMQWith(t, PrivateRabbitMQOptions{})
}

// StartPrivateRabbitMQWith is StartPrivateRabbitMQ with options.
func StartPrivateRabbitMQWith(t testing.TB, o PrivateRabbitMQOptions) *PrivateRabbitMQ {
	t.Helper()
	r, err := StartRabbitMQ(o)
	require.NoError(t, err)
	t.Cleanup(func() { _ = r.Close() })
	return r
}

// StartRabbitMQ is StartPrivateRabbitMQWith for a node shared by a
// package's tests (started once, closed in TestMain; each test in a vhost
// of its own, VHost): Close stops it and removes its files.
func StartRabbitMQ(o PrivateRabbitMQOptions) (*PrivateRabbitMQ, error) {
	port, err := pickPort()
	if err != nil {
		return nil, err
	}
	distPort, err := pickPort()
	if err != nil {
		return nil, err
	}
	// dir is where this process writes the node's files; nodeDir is the
	// same directory as the node sees it (inside RabbitMQRoot, if set).
	base := os.TempDir()
	if RabbitMQRoot != "" {
		base = filepath.Join(RabbitMQRoot, "tmp")
	}
	dir, err := os.MkdirTemp(base, "sluice-rabbitmq-")
	if err != nil {
		return nil, err
	}
	if err := ClaimDir(dir); err != nil {
		return nil, errors.Join(err, os.RemoveAll(dir))
	}
	r := &PrivateRabbitMQ{dir: dir}
	if err := r.start(o, port, distPort); err != nil {
		return nil, errors.Join(err, r.Close())
	}
	return r, nil
}

// start writes the node's files into r.dir, starts it and waits for it.
func (r *PrivateRabbitMQ) start(o PrivateRabbitMQOptions, port, distPort int) error {
	dir := r.dir
	nodeDir := "/" + strings.TrimPrefix(strings.TrimPrefix(dir, RabbitMQRoot), "/")
	name := Name("sluice") + "@localhost"
	conf := fmt.Sprintf("listeners.tcp.local = 127.0.0.1:%d\n", port)
	tlsPort := 0
	if o.TLS != nil {
		var err error
		if tlsPort, err = pickPort(); err != nil {
			return err
		}
		for file, pem := range map[string][]byte{"ca.pem": o.TLS.CA, "cert.pem": o.TLS.Cert, "key.pem": o.TLS.Key} {
			if err := os.WriteFile(filepath.Join(dir, file), pem, 0o600); err != nil {
				return err
			}
		}
		conf += fmt.Sprintf("listeners.ssl.local = 127.0.0.1:%d\nssl_options.cacertfile = %s\nssl_options.certfile = %s\nssl_options.keyfile = %s\nssl_options.verify = verify_none\nssl_options.fail_if_no_peer_cert = false\n",
			tlsPort, path.Join(nodeDir, "ca.pem"), path.Join(nodeDir, "cert.pem"), path.Join(nodeDir, "key.pem"))
	}
	enabled := o.Plugins
	mgmtPort := 0
	if o.Management {
		var err error
		if mgmtPort, err = pickPort(); err != nil {
			return err
		}
		enabled = append([]string{"rabbitmq_management"}, enabled...)
		// Statistics every second (5 s by default): tests wait less for them.
		conf += fmt.Sprintf("management.tcp.ip = 127.0.0.1\nmanagement.tcp.port = %d\ncollect_statistics_interval = 1000\n", mgmtPort)
	}
	conf += o.Config
	if err := os.WriteFile(filepath.Join(dir, "rabbitmq.conf"), []byte(conf), 0o644); err != nil {
		return err
	}
	// The suite's brokers resend a quorum queue's dead-lettered copy a
	// restarting broker refused after 10 s, not RabbitMQ's 180 s
	// (scripts/rabbitmq-dlx.sh says why; docs/retry-tiers.md).
	advanced := fmt.Sprintf("[{rabbit, [{dead_letter_worker_publisher_confirm_timeout, %d}]}].\n", DeadLetterConfirmTimeout.Milliseconds())
	if err := os.WriteFile(filepath.Join(dir, "advanced.config"), []byte(advanced), 0o644); err != nil {
		return err
	}
	plugins := "[" + strings.Join(enabled, ",") + "].\n"
	if err := os.WriteFile(filepath.Join(dir, "enabled_plugins"), []byte(plugins), 0o644); err != nil {
		return err
	}
	if RabbitMQRoot == "" {
		if err := exec.CommandContext(context.Background(), "chown", "-R", "rabbitmq:rabbitmq", dir).Run(); err != nil {
			return fmt.Errorf("the node runs as the rabbitmq user: chown: %w", err)
		}
	}
	r.URL, r.node = fmt.Sprintf("amqp://guest:guest@127.0.0.1:%d/", port), name
	if tlsPort != 0 {
		r.TLSURL = fmt.Sprintf("amqps://guest:guest@127.0.0.1:%d/", tlsPort)
	}
	if mgmtPort != 0 {
		r.ManagementURL = fmt.Sprintf("http://127.0.0.1:%d", mgmtPort)
	}
	launch := func() error {
		cmd := rabbitmqCommand(context.Background(), []string{
			"RABBITMQ_NODENAME=" + name, "RABBITMQ_NODE_PORT=" + strconv.Itoa(port), "RABBITMQ_DIST_PORT=" + strconv.Itoa(distPort),
			"RABBITMQ_CONFIG_FILE=" + path.Join(nodeDir, "rabbitmq.conf"), "RABBITMQ_ADVANCED_CONFIG_FILE=" + path.Join(nodeDir, "advanced.config"),
			"RABBITMQ_MNESIA_BASE=" + path.Join(nodeDir, "mnesia"),
			"RABBITMQ_LOG_BASE=" + path.Join(nodeDir, "log"), "RABBITMQ_ENABLED_PLUGINS_FILE=" + path.Join(nodeDir, "enabled_plugins"),
		}, "rabbitmq-server", "-detached")
		if out, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("starting a private RabbitMQ node: %w: %s", err, out)
		}
		return nil
	}
	if err := launch(); err != nil {
		return err
	}
	log := filepath.Join(dir, "log", name+".log")
	if err := awaitBoot(name, log, func() (string, error) {
		out, err := r.ctl(context.Background(), "await_startup", "--timeout", "60")
		return string(out), err
	}, launch, &r.Boot, startAppPause); err != nil {
		return err
	}
	return r.checkListeners(conf, log)
}

// checkListeners returns an error naming each listener of conf the booted
// node does not hold, with what its log says: RabbitMQ boots without a TLS
// listener whose port was taken (only a plain AMQP listener's stops it).
func (r *PrivateRabbitMQ) checkListeners(conf, log string) error {
	held, err := r.listening()
	if err != nil {
		return fmt.Errorf("private RabbitMQ node %s: its listeners: %w", r.node, err)
	}
	var missing []string
	for _, m := range confPort.FindAllStringSubmatch(conf, -1) {
		if !held[m[2]] {
			missing = append(missing, m[1]+" "+m[2])
		}
	}
	if len(missing) == 0 {
		return nil
	}
	// The node logs the listener it could not start a moment after it
	// reports booted (its logger writes the file on its own): wait for a
	// warning or error line, up to 10 s. Read at once, the log was empty of
	// them in a fresh-clone run at f17dc61, and the error said nothing of
	// eaddrinuse.
	var lines []string
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		if lines, _ = bootLines(log); len(lines) > 0 || time.Now().After(deadline) {
			break
		}
	}
	return fmt.Errorf("private RabbitMQ node %s booted without its listeners %s; the warning and error lines of its log:\n%s",
		r.node, strings.Join(missing, ", "), strings.Join(lines, "\n"))
}

// confPort finds the ports of rabbitmq.conf's listeners and the
// management plugin's.
var confPort = regexp.MustCompile(`(?m)^(listeners\.\w+\.\w+|management\.tcp\.port)\s*=\s*(?:\S*:)?(\d+)\s*(?:#.*)?$`)

// listening returns the TCP ports the node's VM listens on, read from
// /proc (its pid file, its sockets; a private node's start runs as root):
// no rabbitmqctl, an Erlang VM of its own that took 5-100 s under the
// suite's load (status, 107 s once).
func (r *PrivateRabbitMQ) listening() (map[string]bool, error) {
	b, err := os.ReadFile(filepath.Join(r.dir, "mnesia", r.node+".pid"))
	if err != nil {
		return nil, err
	}
	fdDir := "/proc/" + strings.TrimSpace(string(b)) + "/fd"
	fds, err := os.ReadDir(fdDir)
	if err != nil {
		return nil, err
	}
	sockets := map[string]bool{}
	for _, fd := range fds {
		if l, err := os.Readlink(filepath.Join(fdDir, fd.Name())); err == nil && strings.HasPrefix(l, "socket:[") {
			sockets[strings.TrimSuffix(strings.TrimPrefix(l, "socket:["), "]")] = true
		}
	}
	held := map[string]bool{}
	for _, table := range []string{"/proc/net/tcp", "/proc/net/tcp6"} {
		b, err := os.ReadFile(table)
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(b), "\n") {
			// sl local_address rem_address st ... inode: st 0A is LISTEN
			f := strings.Fields(line)
			if len(f) < 10 || f[3] != "0A" || !sockets[f[9]] {
				continue
			}
			if port, err := strconv.ParseUint(f[1][strings.LastIndex(f[1], ":")+1:], 16, 16); err == nil {
				held[strconv.FormatUint(port, 10)] = true
			}
		}
	}
	return held, nil
}

// privateBootTimeout bounds a private node's boot, its starts again
// included.
const privateBootTimeout = 3 * time.Minute

// awaitBoot waits until the node name serves (await: rabbitmqctl
// await_startup, which fails at once until the node has registered with
// epmd). A node whose VM exits while booting — its log (file) says BOOT
// FAILED — is reported at once with its log's warning and error lines,
// not after the wait; one that RabbitMQ 4.0 refused to boot with
// denyRace (StartApp has the race; a whole node's start runs the same
// check) is launched again once its VM is gone, at most startAppAttempts
// times in all, each refusal in b. The refused start's log is kept beside
// the log as .refused-N.
func awaitBoot(name, file string, await func() (string, error), launch func() error, b *Boot, pause time.Duration) error {
	deadline := time.Now().Add(privateBootTimeout)
	b.Attempts = 1
	for {
		out, err := await()
		if err == nil {
			return nil
		}
		lines, failed, race := bootFailure(file)
		gone := strings.Contains(out, "not running at all")
		switch {
		case failed && gone && race && b.Attempts < startAppAttempts:
			b.Refused = append(b.Refused, denyRace+" (the node's boot check raced Mnesia's table load)")
			if err := os.Rename(file, fmt.Sprintf("%s.refused-%d", file, b.Attempts)); err != nil {
				return fmt.Errorf("private RabbitMQ node %s refused to boot (%s) and its log could not be put aside: %w", name, denyRace, err)
			}
			time.Sleep(time.Duration(b.Attempts) * pause)
			b.Attempts++
			if err := launch(); err != nil {
				return err
			}
			continue
		case failed && gone:
			return fmt.Errorf("private RabbitMQ node %s exited while booting (start %d, %d refused before with %s); why, from its log:\n%s",
				name, b.Attempts, len(b.Refused), denyRace, strings.Join(lines, "\n"))
		case time.Now().After(deadline):
			lines, _ = bootLines(file)
			return fmt.Errorf("private RabbitMQ node %s did not start within %s (start %d, %d refused before with %s): %s\nthe warning and error lines of its log:\n%s",
				name, privateBootTimeout, b.Attempts, len(b.Refused), denyRace, cmp.Or(strings.TrimSpace(out), err.Error()), strings.Join(lines, "\n"))
		}
		time.Sleep(500 * time.Millisecond)
	}
}

// Close stops the node (if it was started) and removes its files.
func (r *PrivateRabbitMQ) Close() error {
	var err error
	if r.node != "" {
		if out, e := r.ctl(context.Background(), "stop"); e != nil {
			err = fmt.Errorf("stopping the private RabbitMQ node %s: %w: %s", r.node, e, out)
		}
	}
	return errors.Join(err, os.RemoveAll(r.dir))
}

// VHost creates a vhost of t's own on the node, through its management
// API (PrivateRabbitMQOptions.Management), with every permission for the
// guest account, and deletes it, with its queues, when t ends. The node it
// returns is r with URL and TLSURL in that vhost: tests that share a node
// each see only their own queues, fixed names included.
func (r *PrivateRabbitMQ) VHost(t testing.TB) *PrivateRabbitMQ {
	t.Helper()
	require.NotEmpty(t, r.ManagementURL, "VHost needs the management API (PrivateRabbitMQOptions.Management)")
	vhost := Name("vhost")
	r.manage(t, http.MethodPut, "/api/vhosts/"+vhost, "")
	t.Cleanup(func() { r.manage(t, http.MethodDelete, "/api/vhosts/"+vhost, "") })
	r.manage(t, http.MethodPut, "/api/permissions/"+vhost+"/guest", `{"configure":".*","write":".*","read":".*"}`)
	v := *r
	v.URL = r.URL + vhost
	if r.TLSURL != "" {
		v.TLSURL = r.TLSURL + vhost
	}
	return &v
}

// manage sends one request to the node's management API as guest, which
// must answer 2xx.
func (r *PrivateRabbitMQ) manage(t testing.TB, method, apiPath, body string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, method, r.ManagementURL+apiPath, strings.NewReader(body))
	require.NoError(t, err)
	req.SetBasicAuth("guest", "guest")
	req.Header.Set("Content-Type", "application/json")
	req.Close = true // no idle connection left to a node that outlives t
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err, "%s %s", method, apiPath)
	msg, _ := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	require.True(t, resp.StatusCode/100 == 2, "%s %s: %s %s", method, apiPath, resp.Status, msg)
}

// Ctl runs rabbitmqctl against the private node.
func (r *PrivateRabbitMQ) Ctl(t testing.TB, args ...string) {
	t.Helper()
	out, err := r.ctl(context.Background(), args...)
	require.NoError(t, err, "rabbitmqctl %v: %s", args, out)
}

// NodeCtl is Ctl for the private node (for RestartApp, StartApp, NodeLog).
func (r *PrivateRabbitMQ) NodeCtl() Ctl {
	return func(ctx context.Context, args ...string) (string, error) {
		out, err := r.ctl(ctx, args...)
		if err != nil {
			return string(out), fmt.Errorf("rabbitmqctl %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
		}
		return string(out), nil
	}
}

// StallQuorumLeader suspends (sys:suspend) the Ra server that leads the
// quorum queue on the node, in r.URL's vhost, until its mailbox holds n
// messages whose text contains call — "dequeue" for a basic.get,
// "query_stat" for a passive declare's count — or a minute passed: a leader
// too slow to answer within 250 ms, whose queue a passive declare then
// counts 0 (rabbit_quorum_queue:stat/2). The function it returns waits until
// the server runs again.
func (r *PrivateRabbitMQ) StallQuorumLeader(t testing.TB, queue, call string, n int) (resumed func()) {
	t.Helper()
	server := fmt.Sprintf(`{ok, Q} = rabbit_amqqueue:lookup(%s), {Name, _} = amqqueue:get_pid(Q), P = whereis(Name)`, r.queueName(queue))
	r.Ctl(t, "eval", server+fmt.Sprintf(`,
		ok = sys:suspend(P),
		Calls = fun() ->
			{messages, Ms} = erlang:process_info(P, messages),
			length([M || M <- Ms, string:find(lists:flatten(io_lib:format("~p", [M])), %q) =/= nomatch])
		end,
		spawn(fun() ->
			Wait = fun W(0) -> ok;
			           W(K) -> case Calls() >= %d of
			                       true -> ok;
			                       false -> timer:sleep(10), W(K - 1)
			                   end
			       end,
			Wait(6000),
			sys:resume(P)
		end),
		ok.`, call, n))
	return func() {
		t.Helper()
		require.Eventually(t, func() bool {
			out, err := r.ctl(context.Background(), "eval", server+`, {status, _, _, [_, S | _]} = sys:get_status(P, 5000), S.`)
			return err == nil && strings.TrimSpace(string(out)) == "running"
		}, 2*time.Minute, 100*time.Millisecond, "%s's Ra server runs again", queue)
	}
}

// CountZero makes the node count queue — a quorum queue in r.URL's vhost —
// 0 messages and 0 consumers, as RabbitMQ answers while the queue's leader
// does not answer within 250 ms (rabbit_quorum_queue:stat/2), for as long
// as the test runs or until the function it returns is called: a false 0
// that lasts while the queue serves basic.get, which no stalled leader
// gives. It loads, once per node, a rabbit_quorum_queue whose stat/2
// answers {ok, 0, 0} for the queues listed in a persistent term and
// otherwise calls the one the node shipped with.
func (r *PrivateRabbitMQ) CountZero(t testing.TB, queue string) (restore func()) {
	t.Helper()
	res := r.queueName(queue)
	r.Ctl(t, "eval", fmt.Sprintf(`global:trans({sluice_zero_stat, self()}, fun() ->
		M = rabbit_quorum_queue,
		case erlang:function_exported(M, sluice_zero_stat, 0) of
			true -> ok;
			false ->
				{ok, {_, [{abstract_code, {_, Fs}}]}} = beam_lib:chunks(code:which(M), [abstract_code]),
				Parse = fun(S) -> {ok, Ts, _} = erl_scan:string(S), {ok, F} = erl_parse:parse_form(Ts), F end,
				New = [Parse("stat(Q, T) -> case lists:member(amqqueue:get_name(Q), persistent_term:get(sluice_zero_stat, [])) of true -> {ok, 0, 0}; false -> sluice_orig_stat(Q, T) end."),
				       Parse("sluice_zero_stat() -> ok.")],
				Fs2 = lists:flatmap(fun({attribute, _, module, _} = A) -> [A, {attribute, 1, export, [{sluice_zero_stat, 0}]}];
				                       ({function, L, stat, 2, Cs}) -> [{function, L, sluice_orig_stat, 2, Cs}];
				                       ({eof, _} = E) -> New ++ [E];
				                       (F) -> [F]
				                    end, Fs),
				{ok, M, Bin} = compile:forms(Fs2, [binary, return_errors]),
				{module, M} = code:load_binary(M, code:which(M), Bin)
		end,
		persistent_term:put(sluice_zero_stat, [%s | persistent_term:get(sluice_zero_stat, [])])
	end).`, res))
	var once sync.Once
	restore = func() {
		once.Do(func() {
			t.Helper()
			r.Ctl(t, "eval", fmt.Sprintf(`global:trans({sluice_zero_stat, self()}, fun() ->
				persistent_term:put(sluice_zero_stat, persistent_term:get(sluice_zero_stat, []) -- [%s])
			end).`, res))
		})
	}
	t.Cleanup(restore)
	return restore
}

// queueName is the Erlang term that names queue in r.URL's vhost on the
// node, for rabbitmqctl eval.
func (r *PrivateRabbitMQ) queueName(queue string) string {
	vhost := "/"
	if u, err := amqp.ParseURI(r.URL); err == nil {
		vhost = u.Vhost
	}
	return fmt.Sprintf(`rabbit_misc:r(<<%q>>, queue, <<%q>>)`, vhost, queue)
}

func (r *PrivateRabbitMQ) ctl(ctx context.Context, args ...string) ([]byte, error) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	return rabbitmqCommand(ctx, nil, "rabbitmqctl", ctlArgs(r.node, args)...).CombinedOutput()
}

func freePort(t testing.TB) int {
	t.Helper()
	port, err := pickPort()
	require.NoError(t, err)
	return port
}

// Confirmed is a channel in confirm mode whose PublishWithContext returns
// once the broker confirmed the message (Confirm).
type Confirmed struct{ ch *amqp.Channel }

// Confirm puts ch in confirm mode: a test that publishes on it and then
// reads the queue on another channel (a dlq scan, the CLI, basic.get) finds
// the message there. A plain publish returns once written, and a read on
// another channel can overtake it on a loaded broker
// (dlq.TestReplayDryRunPlansEachMessageAndChangesNothing read 6 of 7).
func Confirm(t testing.TB, ch *amqp.Channel) Confirmed {
	t.Helper()
	require.NoError(t, ch.Confirm(false))
	return Confirmed{ch: ch}
}

// PublishWithContext publishes msg as amqp.Channel's does and waits, at
// most 2 minutes, for the broker's confirm; a nack is an error.
func (c Confirmed) PublishWithContext(ctx context.Context, exchange, key string, mandatory, immediate bool, msg amqp.Publishing) error {
	dc, err := c.ch.PublishWithDeferredConfirmWithContext(ctx, exchange, key, mandatory, immediate, msg)
	if err != nil {
		return err
	}
	return waitConfirm(ctx, dc, cmp.Or(key, exchange))
}

// PublishAll publishes msgs to queue through the default exchange, all in
// flight at once, and waits, at most 2 minutes each, for every confirm: a
// quorum queue confirming a thousand one at a time takes many seconds.
func (c Confirmed) PublishAll(ctx context.Context, queue string, msgs []amqp.Publishing) error {
	dcs := make([]*amqp.DeferredConfirmation, len(msgs))
	for i, m := range msgs {
		dc, err := c.ch.PublishWithDeferredConfirmWithContext(ctx, "", queue, false, false, m)
		if err != nil {
			return err
		}
		dcs[i] = dc
	}
	for _, dc := range dcs {
		if err := waitConfirm(ctx, dc, queue); err != nil {
			return err
		}
	}
	return nil
}

// waitConfirm waits, at most 2 minutes, for dc's confirm; a nack is an
// error.
func waitConfirm(ctx context.Context, dc *amqp.DeferredConfirmation, to string) error {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	ok, err := dc.WaitContext(ctx)
	if err != nil {
		return fmt.Errorf("waiting for the confirm of a publish to %q: %w", to, err)
	}
	if !ok {
		return fmt.Errorf("the broker nacked a publish to %q", to)
	}
	return nil
}
