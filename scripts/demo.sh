#!/usr/bin/env bash
# `make run`: the whole product on one machine. It builds a FROM-scratch isolation image from
# the demo MCP server in examples/docs-mcp, starts ringfenced (every service in one process)
# with that image pinned, registers the server, imports its tools into a graph, publishes it,
# runs three calls (one succeeds, one is refused by a gate, one reads a document the user
# uploaded), prints the audit trail, and leaves the server running for the curl, grpcurl and
# CLI examples it prints. Ctrl-C stops it. DEMO_BIN names the directory of the
# ringfence and ringfenced binaries to run (default: ./bin, which make run builds).
set -euo pipefail
cd "$(dirname "$0")/.."
# Not RINGFENCE_*: ringfenced refuses an environment variable of its prefix it does not know.
DEMO_BIN="${DEMO_BIN:-$PWD/bin}"

export RINGFENCE_GRPC_ADDR="${RINGFENCE_GRPC_ADDR:-127.0.0.1:50051}"
export RINGFENCE_HTTP_ADDR="${RINGFENCE_HTTP_ADDR:-127.0.0.1:8000}"
# One data directory per gRPC port, so two demos on different ports never share (or wipe)
# each other's data.
data_dir_given="${RINGFENCE_DATA_DIR:-}"
export RINGFENCE_DATA_DIR="${RINGFENCE_DATA_DIR:-$PWD/.tmp/demo-data-${RINGFENCE_GRPC_ADDR##*:}}"
export RINGFENCE_BOOTSTRAP_ADMIN_KEY="${RINGFENCE_BOOTSTRAP_ADMIN_KEY:-ringfence-demo-admin-key}"
export RINGFENCE_SANDBOX__MCP_ISOLATION_ALLOWED_ENVIRONMENT_KEYS="${RINGFENCE_SANDBOX__MCP_ISOLATION_ALLOWED_ENVIRONMENT_KEYS:-[\"APP_TOKEN\"]}"
export RINGFENCE_LOG_LEVEL="${RINGFENCE_LOG_LEVEL:-warn}"
grpc="$RINGFENCE_GRPC_ADDR"
http="$RINGFENCE_HTTP_ADDR"
rf() { RINGFENCE_ADDR="$grpc" RINGFENCE_API_KEY="$RINGFENCE_BOOTSTRAP_ADMIN_KEY" "$DEMO_BIN/ringfence" "$@"; }
step() { printf '\n\033[1m== %s\033[0m\n' "$*"; }

# Another server on the demo's ports (a demo still running, or anything else) would answer in
# its place: stop here, before wiping its data or registering into it.
for addr in "$grpc" "$http"; do
	if (exec 3<>"/dev/tcp/${addr%:*}/${addr##*:}") 2>/dev/null; then
		echo "demo: something already listens on $addr (a demo still running?): stop it, or pick other ports with RINGFENCE_GRPC_ADDR and RINGFENCE_HTTP_ADDR" >&2
		exit 1
	fi
done

# A second demo on the same data directory would wipe the first one's data under it. The lock
# is held on fd 9, which ringfenced inherits: it lasts as long as the server, even if this
# script is killed. The ports are checked first: a demo still running on them holds the lock
# too, and other ports, not another directory, are what a second demo needs. One that holds the
# lock and listens on neither is still starting, or was given this directory by
# RINGFENCE_DATA_DIR.
mkdir -p "$(dirname "$RINGFENCE_DATA_DIR")"
lock="$RINGFENCE_DATA_DIR.lock"
exec 9>>"$lock"
if ! flock -n 9; then
	if [ -n "$data_dir_given" ]; then
		fix="or give this one a RINGFENCE_DATA_DIR of its own"
	else
		fix="or run this one on other ports (RINGFENCE_GRPC_ADDR, RINGFENCE_HTTP_ADDR), which gives it a data directory of its own"
	fi
	echo "demo: another demo is using $RINGFENCE_DATA_DIR (it holds $lock): stop it (Ctrl-C in its shell), $fix" >&2
	exit 1
fi

step "building the demo MCP server (static) and its isolation image (seconds; up to a minute on a cold machine)"
mkdir -p .tmp/demo
CGO_ENABLED=0 go build -trimpath -ldflags="-s -w" -o .tmp/demo/docs-mcp ./examples/docs-mcp
# Tagged ringfence-demo:<this checkout's id> and labeled with it: another checkout's demo never
# takes this one's tag, and make clean removes this checkout's image (and no other's).
image=$(DEMO_BIN="$DEMO_BIN" ./scripts/demo-image.sh .tmp/demo/docs-mcp)
[ -n "$image" ] || { echo "demo: building the isolation image failed; see the messages above" >&2; exit 1; }
echo "pinned isolation image: $image"
export RINGFENCE_SANDBOX__MCP_ISOLATION_IMAGE="$image"

step "starting ringfenced (about a second; data in $RINGFENCE_DATA_DIR)"
# The demo starts from nothing each time, but only ever wipes a directory of its own.
case "$RINGFENCE_DATA_DIR" in "$PWD"/.tmp/demo-data-*) rm -rf "$RINGFENCE_DATA_DIR" ;; esac
"$DEMO_BIN/ringfenced" &
server=$!
# `|| true`: under set -e a failing kill (the server already gone) would turn any exit into 1.
trap 'kill $server 2>/dev/null || true; wait $server 2>/dev/null || true' EXIT
# Ctrl-C is how the demo ends: stop the server and exit 0, not with the interrupted wait's 130.
stopped() {
	trap - INT TERM EXIT
	kill $server 2>/dev/null || true
	wait $server 2>/dev/null || true
	printf '\ndemo: ringfenced stopped; its data stays in %s until the next demo on this port\n' "$RINGFENCE_DATA_DIR"
	exit 0
}
trap stopped INT TERM
for _ in $(seq 1 100); do
	curl -fsS "http://$http/healthz" >/dev/null 2>&1 && break
	kill -0 $server 2>/dev/null || { echo "ringfenced exited; see the messages above" >&2; exit 1; }
	sleep 0.1
done

step "an operator registers the server: grants cover the floor; read_doc is scoped by its path argument"
rf servers add docs --command docs-mcp --description "Company handbook" \
	--grant process_spawn --grant external_api_call --tool-permission 'read_doc=docs.read:{path}'
rf servers tools docs

step "an author imports its tools into a draft graph, lets the agent read the handbook, and publishes"
rf graphs create --graph support --agent researcher >/dev/null
rf mcp-import --server docs --graph support --agent researcher
rf graphs bind --graph support --agent researcher --capability 'docs.read:/handbook/**' >/dev/null
# Documents the user uploads reach the docs server only: calls to it name them as
# my-documents://<id>, and Ringfence puts their content there.
rf graphs settings --graph support --agent researcher --document-resolver --document-servers docs >/dev/null
rf graphs publish --graph support

step "a run: the researcher reads a handbook page (allowed)"
run=$(rf runs start --graph support)
rf runs call --run "$run" --agent researcher --tool docs__read_doc --args '{"path":"/handbook/leave.md"}'

step "the same agent asks for a restricted page (refused by the argument-scope gate before anything reaches the server)"
rf runs call --run "$run" --agent researcher --tool docs__read_doc --args '{"path":"/restricted/payroll.md"}' || true

step "the user uploads a receipt; the researcher's call names it as my-documents://<id>, and the docs server gets its content (the audit trail never holds it)"
printf 'Taxi to the airport: 42.50 EUR, 3 March.\n' > .tmp/demo/receipt.txt
doc=$(rf documents put .tmp/demo/receipt.txt)
echo "stored .tmp/demo/receipt.txt as document $doc"
rf runs call --run "$run" --agent researcher --tool docs__read_upload --args '{"content":"my-documents://'"$doc"'"}'
rf runs end --run "$run" >/dev/null

step "the audit trail (tamper-evident; every attempt, refused or dispatched)"
sleep 0.5
rf audit list
rf audit verify

cat <<EOT

ringfenced keeps running: gRPC on $grpc, REST on http://$http, admin key $RINGFENCE_BOOTSTRAP_ADMIN_KEY,
data in $RINGFENCE_DATA_DIR
Try, in another shell:
  export MCP_ADMIN_KEY=$RINGFENCE_BOOTSTRAP_ADMIN_KEY
  curl -s http://$http/v1/mcp/servers -H "X-API-Key: \$MCP_ADMIN_KEY"
  curl -s http://$http/v1/mcp/servers/docs/tools -H "X-API-Key: \$MCP_ADMIN_KEY"
  curl -s -X POST http://$http/v1/runs -H "X-API-Key: \$MCP_ADMIN_KEY" -d '{"graph_id":"support","run_id":"r1"}'
  curl -s -X POST http://$http/v1/runs/r1:call -H "X-API-Key: \$MCP_ADMIN_KEY" \\
    -d '{"agent":"researcher","tool":"docs__search_docs","arguments":{"query":"leave"}}'
  .tmp/bin/grpcurl -plaintext -H "x-api-key: \$MCP_ADMIN_KEY" $grpc list     # make grpcurl installs it (~1 min cold)
  export RINGFENCE_ADDR=$grpc RINGFENCE_API_KEY=\$MCP_ADMIN_KEY
  ./bin/ringfence audit tail
Ctrl-C stops the server.
EOT
wait $server
