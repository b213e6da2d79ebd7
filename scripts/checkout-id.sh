#!/usr/bin/env bash
# Prints the id of a source checkout (default: the one this script is in): the first 16 hex
# digits of the SHA-256 of its physical path. Images the checkout builds carry it as the label
# org.ringfence.checkout (the demo's isolation image, the tests' fixture images), so that its
# `make clean` removes them and leaves another checkout's alone. Go computes the same
# (dockertest.CheckoutID).
set -euo pipefail
dir="${1:-$(dirname "$0")/..}"
printf %s "$(cd "$dir" && pwd -P)" | sha256sum | cut -c1-16
