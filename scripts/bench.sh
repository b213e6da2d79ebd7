#!/usr/bin/env bash
# `make bench`: every benchmark that backs a figure in docs/benchmarks.md, each with the
# iteration count its measurement needs (a cold container start is not a microsecond hash),
# repeated COUNT times (default 6) and summarized by benchstat. Raw output: .tmp/bench.txt.
set -euo pipefail
cd "$(dirname "$0")/.."
count="${COUNT:-6}"
out=.tmp/bench.txt
mkdir -p .tmp
: >"$out"

run() { # package, pattern, benchtime[, count]
	echo "== $1 $2 ($3)" >&2
	go test -run '^$' -bench "$2" -benchtime "$3" -count "${4:-$count}" -benchmem -timeout 60m "$1" | tee -a "$out" | grep -E '^Benchmark' >&2 || true
}

# Registry: authenticated gRPC on loopback, on bbolt and on an embedded three-member etcd cluster.
run ./services/registry/ 'RegistryGet$' 20000x
run ./services/registry/ 'RegistryCreate$' 5000x
# Declarations: pin (hash of the canonical JSON), screen, sanitize.
run ./mcpgate/mcpdecl/ 'Hash$' 1s
run ./mcpgate/mcpdecl/jcs/ 'Canonicalize$' 1s
run ./mcpgate/sanitize/ '.' 1s
run ./mcpgate/screen/ '.' 1s
# mcpgate: the whole gated path of one call on an in-memory session.
run ./mcpgate/ 'CallTool$' 2s
# Gate 5: counting a value's validation work beside the validation it guards.
run ./mcpgate/schemas/ 'Validate$' 1s
# The pool's pure gate pipeline before any server, with and without the agent surface's gates.
run ./services/pool/ 'Decide$' 1s
# Discovery: cold spawn → handshake → full list → stop, beside docker run -i of the same image.
run ./services/pool/spawner/ 'ColdDiscoveryVsDockerRun$' 20x 3
# Publisher: validate a 10,000-node draft; import 200 tools (time beyond the spawn reported).
run ./internal/graph/ 'Validate10kNodes$' 20x
run ./internal/graph/ 'Validate10kNodesFirstScreen$' 3x 3
run ./internal/graph/ 'ValidatePathological' 20x
run ./mcpgate/capability/ 'RevokedByPathological' 1s
run ./services/publisher/ 'ValidateDraft10kNodes' 20x
run ./services/publisher/ 'Import200Tools' 10x 3
# Publish of a 1,000-node draft, on bbolt and on etcd.
run ./services/publisher/ 'Publish$' 20x 3
# Audit: durable batched appends, the spool, Verify over 1,000,000 records (one pass each).
run ./services/audit/internal/store/ 'AppendDurable' 100000x
# The audit log shared through etcd beside bbolt alone, in one run.
run ./services/audit/ 'AppendBackends' 20000x 3
run ./services/audit/internal/store/ 'SpoolToStore' 50000x
run ./internal/audit/ 'SpoolEnqueue$' 50000x
run ./internal/audit/ 'SpoolEnqueueSerial$' 2000x
run ./services/audit/internal/store/ 'Verify1M' 1x 3
# The floor a gRPC hop puts under every call: this server beside bare grpc-go, hot and after idle.
run ./internal/grpcserver/ 'UnaryHop' 2000x 3
# Pool: (a) warm call, (b) first call of a run, (c) 16 concurrent runs, (d) memory per session.
run ./services/pool/ 'PoolWarmCall$' 300x 3
run ./services/pool/ 'PoolFirstCall$' 20x 3
# (e) issue 23: a run's first call taking a warm container, beside a cold first call and a warm call.
run ./services/pool/ 'PoolFirstCallWarm$' 20x 3
# (f) issue 22: a warm tools/call through the MCP front door, stateful and stateless, beside
# gRPC CallTool and the raw attach path.
run ./services/pool/ 'FrontDoorWarmCall$' 300x 3
run ./services/pool/ 'PoolThroughput$' 5000x 3
run ./services/pool/ 'RawAttachThroughput$' 5000x 3
run ./services/pool/ 'PoolIdleSessionMemory$' 1x 3
# (e) heap and RSS of 1, 4 and 12 tool results of 16 MB in flight: one process each, so that
# the peak RSS of one is not an earlier one's.
for gc in 400 25; do for n in 1 4 12; do
	run ./services/pool/ "PoolResultMemory/gc=$gc/results=$n\$" 3x 1
done; done
# Pool, issue 23: ringfenced as a process of its own: its CPU time per warm call beside the raw
# ceiling in the same run; and the soak, 100,000 calls in rounds of 16 runs (RSS per round in
# .tmp/bench.txt, live heap after the first round and at the end).
run ./tests/ 'PoolProcessCPU$' 12000x 3
run ./tests/ 'PoolSoak$' 100000x 1
# Issue 26: calls/s across two pool hosts on etcd (each call to its owner, and to either host,
# half of them forwarded) beside one pool on bbolt, in one deployment.
run ./tests/ 'PoolHosts$' 3000x 3
# Issue 25 on 26: a call to a server that signs each user in, the pool on bbolt and on etcd.
run ./services/pool/ 'SignInCall$' 2000x 3

echo >&2
.tmp/bin/benchstat "$out"
