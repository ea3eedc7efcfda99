// Package keysource lets the inbox stage (package deduplication) ask, on its
// error path, which of the root's key functions (sluice.KeyFromMetadata,
// KeyFromJSON, ...) ran on a message, and where each looked for the key
// (`JSON field "eventId"`): the key functions note it in the message's
// context, which the stage gives them with Collect. It imports nothing of
// the module, so the root may import it.
package keysource

import "context"

type key struct{}

// Collect returns ctx with a list that Note appends to, and the list.
func Collect(ctx context.Context) (context.Context, *[]string) {
	var sources []string
	return context.WithValue(ctx, key{}, &sources), &sources
}

// Note appends source to the list of the Collect ctx descends from, if any.
func Note(ctx context.Context, source string) {
	if s, ok := ctx.Value(key{}).(*[]string); ok {
		*s = append(*s, source)
	}
}
