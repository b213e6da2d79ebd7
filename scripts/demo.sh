#!/usr/bin/env bash
# `make run`: start ringfenced (every service in one process) on 127.0.0.1 with a demo admin
# key and a data directory under .tmp/, printing the commands to try against it.
set -euo pipefail
cd "$(dirname "$0")/.."

export RINGFENCE_DATA_DIR="${RINGFENCE_DATA_DIR:-$PWD/.tmp/demo-data}"
export RINGFENCE_BOOTSTRAP_ADMIN_KEY="${RINGFENCE_BOOTSTRAP_ADMIN_KEY:-ringfence-demo-admin-key}"
export RINGFENCE_SANDBOX__MCP_ISOLATION_ALLOWED_ENVIRONMENT_KEYS="${RINGFENCE_SANDBOX__MCP_ISOLATION_ALLOWED_ENVIRONMENT_KEYS:-[\"APP_TOKEN\"]}"
grpc="${RINGFENCE_GRPC_ADDR:-127.0.0.1:50051}"
http="${RINGFENCE_HTTP_ADDR:-127.0.0.1:8000}"

cat <<EOT
ringfenced: data in $RINGFENCE_DATA_DIR, gRPC on $grpc, REST on http://$http
Admin key (RINGFENCE_BOOTSTRAP_ADMIN_KEY): $RINGFENCE_BOOTSTRAP_ADMIN_KEY

In another shell:
  export MCP_ADMIN_KEY=$RINGFENCE_BOOTSTRAP_ADMIN_KEY
  curl -s -X POST http://$http/v1/mcp/servers -H "X-API-Key: \$MCP_ADMIN_KEY" \\
    -d '{"ref":"docs-search","command":"npx","args":["-y","@modelcontextprotocol/server-filesystem","/srv/docs"],"env":{},"grants":["process_spawn","external_api_call"]}'
  curl -s http://$http/v1/mcp/servers -H "X-API-Key: \$MCP_ADMIN_KEY"
  .tmp/bin/grpcurl -plaintext -H "x-api-key: \$MCP_ADMIN_KEY" $grpc ringfence.registry.v1.RegistryService/ListServers
  RINGFENCE_API_KEY=\$MCP_ADMIN_KEY ./bin/ringfence servers list

Ctrl-C stops the server.
EOT
exec ./bin/ringfenced
