//go:build race

package sluice_test

// raceEnabled: the test binary is built with -race; exportData asks go list
// for the same build, so that its export data come from the build cache
// `go test -race` filled, not from a second build of every package.
const raceEnabled = true
