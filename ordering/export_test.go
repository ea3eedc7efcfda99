package ordering

import "github.com/ThreeDotsLabs/watermill/message"

// OnStopped sets the function Serialize's view sub calls once a
// subscription's loop has begun stopping (Close, its context, its
// subscriber's channel closing). Set it before that.
func OnStopped(sub message.Subscriber, f func()) { sub.(*serial).stopped = f }

// OnReporting sets the function Serialize's view sub calls from the
// goroutine that watches a delivery handed out, once the delivery is
// settled and before the view's loop hears of it. Set it before Subscribe.
func OnReporting(sub message.Subscriber, f func()) { sub.(*serial).reporting = f }
