// Package store is the audit service's append-only, hash-chained log of admin events
// and tool-call attempts, kept in one bbolt file.
//
// It exists so that any change to stored history is detectable: each record's body
// carries its seq and the previous record's hash, and the stored hash is
// SHA-256(previous hash || body), chained from a fixed Genesis. Verify recomputes the
// chain over the raw bytes and names the first record that does not hold. The indexes
// are outside the chain, so Verify also proves they hold exactly the entries the
// records require (a keyed sum per index, see indexChecker): a deleted index entry
// would otherwise hide a record from filtered reads.
//
// Writes go through one writer goroutine that group-commits: every Append waiting when
// a commit starts joins one bbolt transaction and one fsync, and each caller is answered
// only after its transaction is durable. Appends are idempotent by record ID, which is
// what lets every producer's spool resend after an outage or a lost acknowledgement
// without ever storing an event twice.
//
// Indexes, and why these: by_id is needed for idempotency; it stays cheap to write
// because audit.NewID puts the minting time first, so new IDs land at the end of the
// index (any other ID format is accepted, and costs a random page per record). by_run
// (run id) and by_tenant serve the two questions operators ask most ("what did this run
// call", "what happened in this tenant") and turn them from a scan of the whole log into a
// range read. by_tenant_run serves a run of one tenant: run ids are unique within a
// tenant only, so a tenant-bound reader's run filter through by_run would examine other
// tenants' runs of the same id. by_call and by_tenant_call serve the third ("what happened
// to call X", the id a caller or an agent was given) the same way: a tool-call record is
// indexed under its call_id and, when set and different, its approval.dispatched_call_id
// (the retry handed the call's approved outcome), the two ids the call filter matches. A
// filter with a call reads them even when it names a run as well: a call's records are a
// handful, a run's are every call it made. Keys are length-prefixed names followed by the
// seq, so a run's or tenant's entries land at the end of its range and cost little to
// write; call ids are random (the pool's, an LLM provider's), so by_call's and
// by_tenant_call's keys are led by the epoch of the record's seq (4,096 records): a commit's
// entries land in the newest epoch's few pages instead of at random pages of an index as large
// as the log, and a call is read as one range per epoch (figures in docs/benchmarks.md). Server, tool, outcome, kind and time are not indexed:
// they are tested per record, first as a byte search for the encoded field in the body
// and then on the decoded record, and every List call examines at most ScanBudget
// records, returning a short page with a next token when the budget runs out. Time in
// particular is the producer's clock, which is not monotonic in seq (a spool can deliver
// an hour-old record after an outage), so a seq range cannot stand in for a time range.
// Results are always in seq order.
//
// Watchers read from the file, not from a buffer the writer fills: the writer only
// wakes them after each commit, so a slow watcher falls behind without slowing appends
// or losing records, and holds at most one chunk in memory.
package store
