package router

// The assembly errors Add's refusals wrap, for the package's tests: a
// program does not branch on them (each names its cause), so they are not
// exported.
var (
	ErrUnsupported      = errUnsupported
	ErrDuplicateHandler = errDuplicateHandler
)
