#!/usr/bin/env bash
# Make sure a Docker engine answers: install Debian's docker.io when dockerd is missing, start
# dockerd in the background when no engine answers, and wait for it. With --registry, also
# install Debian's docker-registry, which the tests of digest-pinned image references run on
# loopback (never as a service). Idempotent: what is there and running is left alone. Used by
# `make test` (with --registry), `make run`, `make bench` and .ci/run.
set -euo pipefail

log() { printf 'ensure-docker: %s\n' "$*" >&2; }

sudo=""
if [ "$(id -u)" -ne 0 ] && command -v sudo >/dev/null 2>&1; then
	sudo="sudo"
fi

# apt_install PACKAGE: install one Debian package, refreshing the index once if needed.
apt_install() {
	export DEBIAN_FRONTEND=noninteractive
	if ! $sudo apt-get install -y --no-install-recommends "$1" >>/tmp/ensure-docker-apt.log 2>&1; then
		$sudo apt-get update >>/tmp/ensure-docker-apt.log 2>&1
		$sudo apt-get install -y --no-install-recommends "$1" >>/tmp/ensure-docker-apt.log 2>&1 || {
			log "apt-get install $1 failed; see /tmp/ensure-docker-apt.log"
			exit 1
		}
	fi
}

if [ "${1:-}" = "--registry" ] && ! command -v docker-registry >/dev/null 2>&1; then
	if [ "$(id -u)" -ne 0 ] && [ -z "$sudo" ]; then
		log "docker-registry is missing and this user cannot install it; install Debian's docker-registry, or run as root"
		exit 1
	fi
	log "installing Debian's docker-registry (the tests of digest-pinned images run one on loopback)"
	apt_install docker-registry
	# The package enables a registry service on :5000 where systemd runs; the tests start their
	# own on loopback, so do not leave one listening.
	if command -v systemctl >/dev/null 2>&1 && [ -d /run/systemd/system ]; then
		$sudo systemctl disable --now docker-registry >/dev/null 2>&1 || true
		log "disabled the docker-registry service the package enabled"
	fi
fi

if docker info >/dev/null 2>&1; then
	exit 0
fi

if [ "$(id -u)" -ne 0 ] && [ -z "$sudo" ]; then
	log "no engine answers and this user cannot install or start one; start Docker, or run as root"
	exit 1
fi

if ! command -v dockerd >/dev/null 2>&1; then
	log "installing Debian's docker.io (dockerd is missing; a minute or two)"
	apt_install docker.io
fi
if ! command -v docker >/dev/null 2>&1; then
	log "the docker client is missing after installing docker.io"
	exit 1
fi

if ! pgrep -x dockerd >/dev/null 2>&1; then
	log "starting dockerd in the background (a few seconds; log: /tmp/dockerd.log)"
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
