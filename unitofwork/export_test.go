package unitofwork

// ErrHandlerReentered is the error Reentry returns for a second run, for
// the package's tests: a composition bug the error names, not a condition a
// program branches on.
var ErrHandlerReentered = errHandlerReentered
