// Package envsigner turns sluice.Env's Signer into the one a stage calls.
package envsigner

import (
	"reflect"

	"github.com/sluicemq/sluice"
	"github.com/sluicemq/sluice/signing"
)

// Of returns s as a stage calls it and whether it holds a key: a nil s, or
// one holding a nil pointer, is the nil *signing.Signer — Sign removes a
// stale signature, Believe trusts only copies back from the consumer's own
// tiers.
func Of(s sluice.Signer) (sluice.Signer, bool) {
	if s == nil {
		return (*signing.Signer)(nil), false
	}
	if v := reflect.ValueOf(s); v.Kind() == reflect.Pointer && v.IsNil() {
		return (*signing.Signer)(nil), false
	}
	return s, true
}
