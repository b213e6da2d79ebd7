#!/usr/bin/env bash
# `make clean`, images: removes the Docker images a checkout (default: this one) built, and
# only those, and first refuses while a demo of that checkout runs. They carry the label
# org.ringfence.checkout=<its id> (scripts/checkout-id.sh): the demo's isolation image
# (ringfence-demo:<id>) and the tests' fixture images. An image of another checkout on the same
# engine has another id, and stays. Without a Docker engine there is nothing to remove.
set -euo pipefail
here="$(dirname "$0")"
dir="$(cd "${1:-$here/..}" && pwd)"
id=$("$here/checkout-id.sh" "$dir")
# make clean removes .tmp, where a running demo of this checkout keeps its data and its lock:
# refuse while one runs (it holds its lock as long as its ringfenced lives), before anything is
# removed, rather than delete its data under it.
for lock in "$dir"/.tmp/demo-data-*.lock; do
	[ -e "$lock" ] || continue
	if ! flock -n "$lock" true; then
		echo "clean: a demo of this checkout still runs (it holds $lock): stop it (Ctrl-C in its shell), then make clean again" >&2
		exit 1
	fi
done
if ! command -v docker >/dev/null 2>&1 || ! docker info >/dev/null 2>&1; then
	echo "clean: no Docker engine answers: no images removed"
	exit 0
fi
mapfile -t images < <(docker images --quiet --no-trunc --filter "label=org.ringfence.checkout=$id" | sort -u)
if [ ${#images[@]} -eq 0 ]; then
	echo "clean: no images of this checkout ($id) in the engine"
	exit 0
fi
echo "clean: removing the ${#images[@]} image(s) this checkout ($id) built"
# -f: an image may carry several tags (the fixture image's, a registry test's digest). A
# container still running from one (a server of this checkout not stopped yet, or stopping:
# its containers go within seconds) keeps it; say so rather than leave the engine's words alone.
if ! out=$(docker rmi -f "${images[@]}" 2>&1 >/dev/null); then
	echo "$out" >&2
	echo "clean: an image of this checkout is still used by a running container: stop the ringfenced (or tests) of this checkout, wait a few seconds, then make clean again" >&2
	exit 1
fi
