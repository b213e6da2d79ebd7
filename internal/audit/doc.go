// Package audit holds what every Ringfence producer and the audit service share about
// the audit trail: the record types, the rules a record must satisfy before anyone
// stores it, the secret mask, and the durable spool that carries records from a
// producer to the audit log.
//
// The types live here rather than in the audit service so that a producer (registry,
// publisher, pool) can build, validate and spool records without depending on the
// service's storage, and so that the honest statement of what an mcp_tool call does not
// guarantee (operation_support: at_least_once, operation_residual_duplicate_risk: true)
// is set in exactly one place and cannot be forgotten by a caller.
//
// The spool exists because an audit outage must never lose an event and must never let
// a change happen without its event: the record is written into the producer's own
// bbolt file in the same transaction as the change it describes, and forwarded later,
// in order, until the audit log acknowledges it. Exactly-once delivery end to end rests
// on the log's idempotency by record ID: the spool may resend, the log never duplicates.
package audit
