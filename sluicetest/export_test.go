package sluicetest

// Epoch is where a Harness's virtual clock starts.
var Epoch = epoch
