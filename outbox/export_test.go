package outbox

// Closing is closed once r's Close has been called.
func Closing(r *Relay) <-chan struct{} { return r.closing }
