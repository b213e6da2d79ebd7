#!/usr/bin/env bash
# Make sure a Docker engine answers: install Debian's docker.io when dockerd is missing, start
# dockerd in the background when no engine answers, and wait for it. Idempotent: a running
# engine is left alone. Used by `make test`, `make run` and .ci/run.
set -euo pipefail

log() { printf 'ensure-docker: %s\n' "$*" >&2; }

if docker info >/dev/null 2>&1; then
	exit 0
fi

sudo=""
if [ "$(id -u)" -ne 0 ]; then
	if command -v sudo >/dev/null 2>&1; then sudo="sudo"; else
		log "no engine answers and this user cannot install or start one; start Docker, or run as root"
		exit 1
	fi
fi

if ! command -v dockerd >/dev/null 2>&1; then
	log "installing Debian's docker.io (dockerd is missing)"
	export DEBIAN_FRONTEND=noninteractive
	if ! $sudo apt-get install -y --no-install-recommends docker.io >/tmp/ensure-docker-apt.log 2>&1; then
		$sudo apt-get update >>/tmp/ensure-docker-apt.log 2>&1
		$sudo apt-get install -y --no-install-recommends docker.io >>/tmp/ensure-docker-apt.log 2>&1 || {
			log "apt-get install docker.io failed; see /tmp/ensure-docker-apt.log"
			exit 1
		}
	fi
fi
if ! command -v docker >/dev/null 2>&1; then
	log "the docker client is missing after installing docker.io"
	exit 1
fi

if ! pgrep -x dockerd >/dev/null 2>&1; then
	log "starting dockerd in the background (log: /tmp/dockerd.log)"
	$sudo sh -c 'nohup dockerd >/tmp/dockerd.log 2>&1 &'
fi

for _ in $(seq 1 60); do
	if docker info >/dev/null 2>&1; then
		log "engine ready: $(docker version --format '{{.Server.Version}} (API {{.Server.APIVersion}})' 2>/dev/null)"
		exit 0
	fi
	sleep 1
done
log "dockerd did not answer within 60s; see /tmp/dockerd.log"
tail -n 20 /tmp/dockerd.log >&2 || true
exit 1
