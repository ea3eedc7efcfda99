package embedded

// Subscriptions returns how many subscriptions of e have not closed
// their channel yet: zero means nothing more can be handed to a handler.
func Subscriptions(e *Broker) int { return e.pubsub.subscriptions() }
