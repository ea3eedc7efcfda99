// Package service is the short path: one production service on a Watermill
// router, a database and any number of brokers, with every stage in its one
// order and production defaults, and what a service must otherwise remember
// owned for it.
//
//	svc, err := service.New(service.Config{DB: db, Schema: "inventory", Router: r, Publisher: q.Publisher(), Env: sluice.Env{MeterProvider: metrics}})
//	err = svc.Stores().Migrate(ctx)             // the inbox, the outbox, the replay outcomes
//	err = svc.Add(service.Handler{Broker: q, Name: "inventory", Key: sluice.KeyFromJSON("eventId"), PublishingHandler: reserve, PublishTopic: "inventory.reserved"})
//	mux.Handle("/livez", svc.Health())          // liveness and readiness, as Kubernetes probes expect
//	mux.Handle("/readyz", svc.Health())
//	go r.Run(ctx)                               // the handlers, the outbox relay and the pruners
//	...
//	svc.Close()                                 // the router closed, the outbox drained, the relay and pruners stopped
//	q.Close()
//
// Each handler gets (Defaults): shutdown grace → trace → replay (outcomes
// recorded in the inbox's transaction) → poison → retry tiers → brake
// (unreachable dependencies; its probe the database's ping) → classify →
// inbox (the service's table; group commit with Handler.GroupCommit) →
// recoverer → the handler; what a PublishingHandler returns goes through
// the outbox. Handler.Stages replaces any stage's configuration and
// Handler.Without leaves stages out; router.Add's refusals hold
// (router.ErrUnsafeStages).
//
// The service owns: the outbox relay (started when the router runs, drained
// when it closes — after its handlers stopped, at most Config.DrainTimeout —
// then stopped); the pruners of the inbox (retention checked against each
// handler's retry ladder plus the replay window) and of the replay outcomes,
// in bounded batches; its stores, whose one Migrate creates every table;
// the health reports (Live, Ready, served by Health). Metrics go to
// Config.Env.MeterProvider: package promexport serves them to Prometheus in
// one option. Everything it starts stops when the router closes; Close
// waits for it.
//
// router.Add and router.Stages stay for those who wire the stages by hand.
package service
