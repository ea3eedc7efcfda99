// Package inherit fills a stage's sluice.Env from the one router.Stages or
// service.Config gives: the stage's own fields win, field by field.
package inherit

import (
	"github.com/sluicemq/sluice"
	"github.com/sluicemq/sluice/internal/envsigner"
)

// Env returns own with each zero field taken from parent. A Signer holding
// a nil pointer (no key, envsigner.Of) counts as zero.
func Env(own, parent sluice.Env) sluice.Env {
	if own.Logger == nil {
		own.Logger = parent.Logger
	}
	if own.MeterProvider == nil {
		own.MeterProvider = parent.MeterProvider
	}
	if own.TracerProvider == nil {
		own.TracerProvider = parent.TracerProvider
	}
	if own.Clock == nil {
		own.Clock = parent.Clock
	}
	if own.Classifier == nil {
		own.Classifier = parent.Classifier
	}
	if _, keyed := envsigner.Of(own.Signer); !keyed {
		own.Signer = parent.Signer
	}
	if own.PublishTimeout == 0 {
		own.PublishTimeout = parent.PublishTimeout
	}
	if own.PublishBackoff == 0 {
		own.PublishBackoff = parent.PublishBackoff
	}
	if own.StoreTimeout == 0 {
		own.StoreTimeout = parent.StoreTimeout
	}
	return own
}

// Field names field of a stage's Env in an error message, saying where it
// may have come from: the stage's own Env or the one router.Stages and
// service.Config give every stage.
func Field(field string) string {
	return "Env." + field + " (the stage's own or router.Stages' and service.Config's shared Env)"
}
