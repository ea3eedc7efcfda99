package service

// StallRisk is stallRisk, for the tests of the warning New logs.
var StallRisk = stallRisk

// ErrClosed is errClosed: Add's error after Close.
var ErrClosed = errClosed
