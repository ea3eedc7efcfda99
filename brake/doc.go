// Package brake is the stage that stops consuming while a dependency is
// down, so an outage longer than the retry ladder does not spend every
// message's ladder and fill the poison queue.
//
// The stage weighs the outcomes of the last Window deliveries. When at least
// FailureRatio of them are Transient failures that Match accepts (by default
// every Transient failure; MatchUnreachable narrows it to "the database or
// service cannot be reached"), the brake engages:
//
//   - the failure that tripped it, and every counted failure after it, is
//     given back to its queue unprocessed (sluice.ErrHeld): no attempt and no
//     retry tier spent;
//   - a subscriber that can stop consuming (rabbitmq.Consumer, through
//     router.Add) cancels its consumers — the broker shows no consumer —
//     and the deliveries it still has in flight are nacked back;
//   - with a subscriber that cannot (the embedded default's, watermill-amqp's
//     subscriber), each delivery waits in the stage instead; those
//     subscribers hand a busy handler nothing new.
//
// After CoolDown the brake probes. With Config.Probe (db.PingContext, say)
// it first tests the dependency without touching a message, still engaged:
// a failed Probe starts another, doubled cool-down, and no delivery is
// taken, so an outage of any length spends no attempt and, on a quorum
// queue, no x-delivery-limit. Once Probe passes (at once without one) it
// lets one probe delivery through, and a subscriber that reads Probing
// (rabbitmq.Consumer) takes one delivery at a time meanwhile. Success
// releases it; a counted failure engages it again with the cool-down doubled
// (up to MaxCoolDown); any other outcome (a poison message, say) lets the
// next probe through. Poison, Invariant, Rejected and Exhausted failures
// never count. Close stops the cool-downs and probes (router.Add closes the
// brake with the handler's subscriber).
//
// Every change of state is logged once, counted (sluice.brake.transitions),
// recorded in the sluice.brake.state gauge (0 released, 1 engaged, 2 probing) and
// spanned. It sits inside the retry stage, so what it holds never reaches a
// tier:
//
//	ShutdownGrace → Trace → Replay → Order → Poison → Retry → Brake → Classify → Inbox → Recoverer → handler
package brake
