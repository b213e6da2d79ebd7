#!/usr/bin/env bash
# `make run`, its isolation image: packs the demo MCP server BINARY into a FROM-scratch image
# with the checkout's bin/ringfence (CHECKOUT: default, the one this script is in; or the one in
# DEMO_BIN, the directory the demo runs its binaries from) and prints the
# reference to pin (sha256:<image id>). The image is tagged ringfence-demo:<checkout id> and
# labeled org.ringfence.checkout=<checkout id> (scripts/checkout-id.sh): two checkouts on one
# engine never take each other's tag, so neither's image is left untagged (dangling) for a
# `docker image prune` to remove under its running demo, `docker images` shows whose each is,
# and each checkout's `make clean` removes its own.
set -euo pipefail
here="$(dirname "$0")"
if [ $# -lt 1 ] || [ $# -gt 2 ]; then
	echo "usage: $0 BINARY [CHECKOUT]" >&2
	exit 2
fi
binary="$1"
dir="${2:-$here/..}"
id=$("$here/checkout-id.sh" "$dir")
"${DEMO_BIN:-$dir/bin}/ringfence" image build --binary "$binary" --name "ringfence-demo:$id" \
	--label "org.ringfence.checkout=$id" -o json |
	sed -nE 's/.*"image": *"([^"]+)".*/\1/p'
