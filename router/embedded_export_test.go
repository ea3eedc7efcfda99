package router

// EmbeddedSubscriptions returns how many subscriptions of e have not closed
// their channel yet: zero means nothing more can be handed to a handler.
func EmbeddedSubscriptions(e *Embedded) int { return e.PubSub.subscriptions() }
