// Package chunks splits a list into bounded slices, for queries that name
// their items (an IN list, HMGET) and must stay within a bound.
package chunks

// Each calls fn with items in slices of at most n (n < 1: one slice),
// stopping at fn's first error.
func Each[T any](items []T, n int, fn func([]T) error) error {
	if n < 1 {
		n = max(1, len(items))
	}
	for len(items) > 0 {
		k := min(len(items), n)
		if err := fn(items[:k]); err != nil {
			return err
		}
		items = items[k:]
	}
	return nil
}
