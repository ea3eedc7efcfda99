package middleware

// EventIDKey is the metadata key of a message's business event id — the id
// the producer gives the event, stable across redeliveries and republishing,
// unlike the broker's or Watermill's message id. On AMQP it becomes the
// header "sluice_event_id". The deduplication stage reads it by default and
// sets it from its key function when it is missing, so retry copies and
// poison diagnoses carry it.
const EventIDKey = "sluice_event_id"
