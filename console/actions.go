package console

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/sluicemq/sluice"
	"github.com/sluicemq/sluice/dlq"
	"github.com/sluicemq/sluice/internal/diag"
	"github.com/sluicemq/sluice/internal/replayledger"
	"github.com/sluicemq/sluice/replay"
	"github.com/sluicemq/sluice/replay/ledger"
)

type previewData struct {
	Queue     Queue
	Consumers []string // the queues a replay may be redirected to
	Group     string
	Title     string // the group's class and reason's shape (groupTitle)
	Action    string
	Count     int
	Targets   map[string]int
	Refused   int // messages the replay to their own queue would refuse
	Sample    []string
	Sample50  int
	Defaults  map[string]string
	Error     string
}

func (c *Console) preview(w http.ResponseWriter, r *http.Request) {
	q, ok := c.poisonQueue(r.PathValue("queue"))
	action := r.PathValue("action")
	if !ok || !c.actions()[strings.ToUpper(action[:1])+action[1:]] {
		c.fail(w, r, http.StatusNotFound, errors.New("no such action here (read-only, or not configured)"))
		return
	}
	d, err := c.dryRun(r.Context(), q, r.PathValue("group"), action)
	if errors.Is(err, ErrQueueBusy) {
		c.fail(w, r, http.StatusServiceUnavailable, err)
		return
	}
	if err != nil {
		c.fail(w, r, http.StatusBadGateway, err)
		return
	}
	c.render(w, r, "preview", d)
}

// dryRun selects the group's messages and counts them by target, moving
// nothing: what a confirmation shows.
func (c *Console) dryRun(ctx context.Context, q Queue, group, action string) (previewData, error) {
	d := previewData{Queue: q, Group: group, Action: action, Targets: map[string]int{}, Consumers: c.consumerQueues(),
		Defaults: map[string]string{"canary": "1", "ramp": "5,20,100", "max_repoison": "10%", "wait": "30s"}}
	release, err := c.reading(ctx, q.Poison, c.cfg.CallTimeout)
	if err != nil {
		return d, err
	}
	defer release()
	conn, err := c.conn()
	if err != nil {
		return d, err
	}
	defer c.hangUp(conn)
	plan, pq := c.replayConfig(q, group, ""), dlq.Open(conn, q.Poison, dlq.Config{Signer: c.signer})
	d.Title = "group " + diag.Printable(group, textMax)
	titled := false
	n, err := pq.Each(ctx, dlq.Filter{Group: group}, 0, func(m *dlq.Message) error {
		if !titled {
			d.Title, titled = groupTitle(m), true
		}
		label, refused := targetLabel(pq, plan, m)
		if _, ok := d.Targets[label]; ok || len(d.Targets) < 20 {
			d.Targets[label]++
		}
		if refused {
			d.Refused++
		}
		if len(d.Sample) < 20 {
			d.Sample = append(d.Sample, cmp.Or(m.Identity().Name(), fmt.Sprintf("message at position %d", m.Position)))
		}
		return nil
	})
	d.Count = n
	return d, diag.RedactError(err)
}

func (c *Console) replay(w http.ResponseWriter, r *http.Request) {
	q, ok := c.poisonQueue(r.PathValue("queue"))
	if !ok || !c.actions()["Replay"] {
		c.fail(w, r, http.StatusNotFound, errors.New("replay is not offered here"))
		return
	}
	if r.PostFormValue("confirm") != "yes" {
		c.fail(w, r, http.StatusBadRequest, errors.New("confirm the replay: tick the box on the preview"))
		return
	}
	plan, err := loopForm(r)
	if err != nil {
		c.fail(w, r, http.StatusBadRequest, err)
		return
	}
	if plan.to = strings.TrimSpace(r.PostFormValue("to")); plan.to != "" && !slices.Contains(c.consumerQueues(), plan.to) {
		c.fail(w, r, http.StatusBadRequest, errors.New("replay to: not a consumer queue of this console (redirect only to a queue it shows)"))
		return
	}
	if c.unaudited(w, r) {
		return
	}
	group := r.PathValue("group")
	operator := c.cfg.Operator(r)
	ru := c.newRun("replay", replayledger.NewRun("run"), q.Poison, group, operator)
	c.wg.Add(1)
	go func() {
		defer c.wg.Done()
		c.runReplay(ru, q, group, operator, plan)
	}()
	http.Redirect(w, r, c.cfg.Prefix+"/runs/"+ru.ID, http.StatusSeeOther)
}

// replayConfig is a replay of group from q's poison queue to to ("": each
// message's own queue): its targets only the console's consumer queues,
// whatever a message names — the dry run and the replay choose them alike
// (dlq.Queue.Target).
func (c *Console) replayConfig(q Queue, group, to string) dlq.ReplayConfig {
	return dlq.ReplayConfig{Filter: dlq.Filter{Group: group}, To: to, Targets: c.consumerQueues()}
}

// targetLabel is where a replay to each message's own queue sends m, as the
// dry run shows it: the queue, or why there is none (refused: the replay
// would stop on m). It asks pq.Target once a message: with a Signer, that
// verifies the message's signature.
func targetLabel(pq *dlq.Queue, cfg dlq.ReplayConfig, m *dlq.Message) (label string, refused bool) {
	t, err := pq.Target(cfg, m)
	named := diag.Printable(m.Queue, 255)
	switch {
	case err == nil:
		return diag.Printable(t, 255), false
	case errors.Is(err, dlq.ErrUnreadable):
		return "(none: its headers could not be read)", true
	case errors.Is(err, dlq.ErrTargetRefused):
		return named + " (refused: not a consumer queue of this console)", true
	case m.Queue != "":
		return named + " (refused: its diagnosis is not signed with the console's key)", true
	}
	return "(none: not replayable)", true
}

func loopForm(r *http.Request) (loopPlan, error) {
	var sizes []int
	canary, err := strconv.Atoi(cmp.Or(strings.TrimSpace(r.PostFormValue("canary")), "0"))
	if err != nil || canary < 0 {
		return loopPlan{}, errors.New("canary: want a number of messages, 0 for none")
	}
	if canary > 0 {
		sizes = append(sizes, canary)
	}
	if ramp := strings.TrimSpace(r.PostFormValue("ramp")); ramp != "" {
		for _, p := range strings.Split(ramp, ",") {
			n, err := strconv.Atoi(strings.TrimSpace(p))
			if err != nil || n < 1 {
				return loopPlan{}, errors.New("ramp: want batch sizes such as 5,20,100")
			}
			sizes = append(sizes, n)
		}
	}
	if len(sizes) == 0 {
		return loopPlan{}, errors.New("give a canary, a ramp, or both")
	}
	mr, err := strconv.ParseFloat(strings.TrimSuffix(cmp.Or(strings.TrimSpace(r.PostFormValue("max_repoison")), "10%"), "%"), 64)
	if err != nil || mr < 0 || mr > 100 {
		return loopPlan{}, errors.New("max re-poison: want a percentage such as 10%")
	}
	wait, err := time.ParseDuration(cmp.Or(strings.TrimSpace(r.PostFormValue("wait")), "30s"))
	if err != nil || wait <= 0 || wait > time.Hour {
		return loopPlan{}, errors.New("wait: want a duration such as 30s, at most 1h")
	}
	limit, err := strconv.Atoi(cmp.Or(strings.TrimSpace(r.PostFormValue("limit")), "0"))
	if err != nil || limit < 0 {
		return loopPlan{}, errors.New("limit: want a number of messages, 0 for all")
	}
	return loopPlan{sizes: sizes, canary: canary > 0, maxRepoison: mr / 100, wait: wait, limit: limit}, nil
}

// loopPlan is a replay form's closed loop.
type loopPlan struct {
	to          string // a consumer queue every message goes to instead of its own; "": its own
	sizes       []int
	canary      bool
	maxRepoison float64
	wait        time.Duration
	limit       int
}

func (c *Console) runReplay(ru *run, q Queue, group, operator string, p loopPlan) {
	cfg := c.replayConfig(q, group, p.to)
	cfg.Limit, cfg.Batch, cfg.Run = p.limit, 10, ru.ID
	res, err := c.closedLoop(ru, q, operator, cfg, p)
	c.end(ru, operator, map[string]string{"sizes": fmt.Sprint(p.sizes), "canary": strconv.FormatBool(p.canary),
		"max_repoison": strconv.FormatFloat(100*p.maxRepoison, 'f', -1, 64) + "%", "wait": p.wait.String(), "limit": strconv.Itoa(p.limit),
		"to": p.to}, res, err, "", nil)
}

// end audits what ru did, then ends ru: a run that says it ended —
// a start that failed included — has its line in the audit log, or says
// why it has none (the log could not be written: a full disk, a file
// rotated away since the action checked it). The line names the run, its
// queue and its group.
func (c *Console) end(ru *run, operator string, opts map[string]string, res dlq.Result, err error, reason string, items []string) {
	if opts == nil {
		opts = map[string]string{}
	}
	opts["run"] = ru.ID
	auditErr := c.audit(operator, "console "+ru.Kind, ru.Queue, dlq.Filter{Group: ru.Group}, opts, res, err, reason, items)
	ru.finish(res, errors.Join(err, auditErr))
}

// closedLoop runs a replay form's closed loop on q's poison queue, its
// copies and outcomes in ru.
func (c *Console) closedLoop(ru *run, q Queue, operator string, cfg dlq.ReplayConfig, p loopPlan) (dlq.Result, error) {
	release, err := c.reading(c.ctx, q.Poison, runReadWait)
	if err != nil {
		return dlq.Result{}, err
	}
	defer release()
	defer c.forget(q.Poison)
	conn, err := c.conn()
	if err != nil {
		return dlq.Result{}, err
	}
	defer c.hangUp(conn)
	cfg.Published = func(_ context.Context, ms []*dlq.Message) error {
		for _, m := range ms {
			ru.add(m.Item(), m.EventID, string(ledger.OutcomeReplayed), "", "")
		}
		return nil
	}
	l := dlq.Loop{Sizes: p.sizes, Canary: p.canary, MaxRepoison: p.maxRepoison, Store: c.cfg.Outcomes, Wait: p.wait, Where: c.cfg.OutcomesWhere,
		Batch: ru.batch, Source: "console"} // the loop keeps the run beside its outcomes
	return dlq.Open(conn, q.Poison, dlq.Config{Operator: operator, Publisher: c.cfg.Publisher, Signer: c.signer}).ClosedLoop(c.ctx, cfg, l)
}

func (c *Console) discard(w http.ResponseWriter, r *http.Request) {
	q, ok := c.poisonQueue(r.PathValue("queue"))
	if !ok {
		c.fail(w, r, http.StatusNotFound, errors.New("no such poison queue in the console's configuration"))
		return
	}
	reason := strings.TrimSpace(r.PostFormValue("reason"))
	if reason == "" || r.PostFormValue("confirm") != "yes" {
		c.fail(w, r, http.StatusBadRequest, errors.New("a discard needs a reason and the confirmation box ticked"))
		return
	}
	a, ok := c.startAction(w, r, "discard", q.Poison, reason)
	if !ok {
		return
	}
	defer a.done()
	f := dlq.Filter{Group: a.group}
	res, items, err := dlq.Open(a.conn, q.Poison, dlq.Config{}).Discard(r.Context(), f, max(a.limit, 0), false)
	err = errors.Join(err, c.record(r.Context(), a.run, items, ledger.OutcomeDiscarded, reason, a.operator))
	c.endAction(a, nil, res, err, items)
	c.keep(r.Context(), a.run)
	http.Redirect(w, r, c.cfg.Prefix+"/runs/"+a.run.ID, http.StatusSeeOther)
}

// action is a discard's or an archive's run, begun: its group, limit and
// operator from the request, the operator's reason, and a connection to
// the broker.
type action struct {
	run      *run
	group    string
	limit    int
	operator string
	reason   string
	conn     *amqp.Connection
	done     func() // closes conn and gives the queue back
}

// startAction begins the run of verb on poison, holding the queue for it
// (reading; a.done gives it back); false when another reader holds it past
// Config.CallTimeout or the broker cannot be reached (the run is then
// ended with the error, audited, and the answer written).
func (c *Console) startAction(w http.ResponseWriter, r *http.Request, verb, poison, reason string) (action, bool) {
	if c.unaudited(w, r) {
		return action{}, false
	}
	a := action{group: r.PathValue("group"), operator: c.cfg.Operator(r), reason: reason}
	a.limit, _ = strconv.Atoi(r.PostFormValue("limit"))
	a.run = c.newRun(verb, replayledger.NewRun(verb), poison, a.group, a.operator)
	release, err := c.reading(r.Context(), poison, c.cfg.CallTimeout)
	if err != nil {
		c.endAction(a, nil, dlq.Result{}, err, nil)
		c.fail(w, r, http.StatusServiceUnavailable, err)
		return a, false
	}
	conn, err := c.conn()
	if err != nil {
		release()
		c.endAction(a, nil, dlq.Result{}, err, nil)
		c.fail(w, r, http.StatusBadGateway, err)
		return a, false
	}
	a.conn = conn
	a.done = func() {
		c.hangUp(conn)
		c.forget(poison)
		release()
	}
	return a, true
}

// endAction ends a's run as end does; its audit line names what the
// operator asked — the limit, the reason — however the run ended, a start
// that failed included, with opts beside them.
func (c *Console) endAction(a action, opts map[string]string, res dlq.Result, err error, items []string) {
	if opts == nil {
		opts = map[string]string{}
	}
	opts["limit"] = strconv.Itoa(a.limit)
	c.end(a.run, a.operator, opts, res, err, a.reason, items)
}

func (c *Console) archive(w http.ResponseWriter, r *http.Request) {
	q, ok := c.poisonQueue(r.PathValue("queue"))
	if !ok || c.cfg.Archive == nil {
		c.fail(w, r, http.StatusNotFound, errors.New("archive is not offered here"))
		return
	}
	if r.PostFormValue("confirm") != "yes" {
		c.fail(w, r, http.StatusBadRequest, errors.New("confirm the archive: tick the box on the preview"))
		return
	}
	a, ok := c.startAction(w, r, "archive", q.Poison, "")
	if !ok {
		return
	}
	defer a.done()
	sink, err := c.cfg.Archive()
	if err != nil {
		c.endAction(a, nil, dlq.Result{}, err, nil)
		c.fail(w, r, http.StatusBadGateway, diag.RedactError(err))
		return
	}
	f := dlq.Filter{Group: a.group}
	var items []string
	res, err := dlq.Open(a.conn, q.Poison, dlq.Config{Operator: a.operator, Signer: c.signer}).Archive(r.Context(), dlq.ArchiveConfig{Filter: f, Limit: max(a.limit, 0), Sink: sink,
		Archived: func(m *dlq.Message) { items = append(items, m.Item()) }})
	err = errors.Join(err, sink.Close(), c.record(r.Context(), a.run, items, ledger.OutcomeArchived, "archived to "+sink.Name(), a.operator))
	c.endAction(a, map[string]string{"sink": sink.Name()}, res, err, nil)
	c.keep(r.Context(), a.run)
	http.Redirect(w, r, c.cfg.Prefix+"/runs/"+a.run.ID, http.StatusSeeOther)
}

// record writes what an operator did to each item into the outcome
// records (when configured) under the run, and into the run's rows.
func (c *Console) record(ctx context.Context, ru *run, items []string, outcome sluice.Outcome, reason, operator string) error {
	rs := make([]replay.Record, 0, len(items))
	for _, it := range items {
		ru.add(it, it, string(outcome), "", reason)
		rs = append(rs, replay.Record{Run: ru.ID, Item: it, EventID: it, Outcome: outcome,
			Reason: diag.Bound(reason, replayledger.ReasonMaxLength), Handler: "operator " + operator, At: time.Now().UTC()})
	}
	if c.cfg.Outcomes == nil || len(rs) == 0 {
		return nil
	}
	if err := c.storeCall(ctx, "writing the outcome records", func(ctx context.Context) error { return c.cfg.Outcomes.Records(ctx, rs) }); err != nil {
		return fmt.Errorf("recording the outcomes (the audit log has them): %w", diag.RedactError(err))
	}
	return nil
}

// unaudited answers an action whose audit log cannot be written, before
// it moves anything: true when it did (the action is not begun). New
// requires the log of a console that acts.
func (c *Console) unaudited(w http.ResponseWriter, r *http.Request) bool {
	if err := dlq.CheckAudit(c.cfg.AuditFile); err != nil {
		c.fail(w, r, http.StatusInternalServerError, err)
		return true
	}
	return false
}

// audit appends what an operator did to the audit log; an error when the
// line could not be written, which the caller shows and logs.
func (c *Console) audit(operator, command, queue string, f dlq.Filter, opts map[string]string, res dlq.Result, runErr error, reason string, items []string) error {
	rec := dlq.AuditRecord{Time: time.Now().UTC(), Operator: operator, Command: command, Queue: queue, Filters: f.Describe(),
		Options: opts, Result: res, Outcome: "ok", Reason: reason, Items: items}
	if runErr != nil {
		rec.Outcome, rec.Error = "error", diag.Redact(runErr.Error())
	}
	if c.cfg.AuditFile == "" {
		return nil
	}
	if err := dlq.AppendAudit(c.cfg.AuditFile, rec); err != nil {
		err = fmt.Errorf("console: what was done is not in the audit log: %w", err)
		c.cfg.Logger.Error("Console action not audited", err, watermill.LogFields{"command": command, "queue": diag.Printable(queue, 255), "operator": diag.Printable(operator, 255)})
		return err
	}
	return nil
}
