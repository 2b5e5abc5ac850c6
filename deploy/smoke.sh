#!/usr/bin/env bash
# Runs certworker's image against a throwaway PostgreSQL container: `migrate`, then
# `run`, then checks that /readyz answers 200 (from the host, and with the image's own
# `certworker healthcheck`). `run` seals with a key file made by the compose
# quickstart's own lines, as docs/running.md writes them, mounted as compose mounts
# its secret. Removes what it started, whatever happens.
#
# Usage: smoke.sh [IMAGE]   (default certworker:latest)
# CERTWORKER_PG_IMAGE picks PostgreSQL's image (default postgres:17-alpine; the
# Makefile's image-test sets certworker-postgres:15 where no registry can serve it).
set -euo pipefail

image=${1:-certworker:latest}
pg_image=${CERTWORKER_PG_IMAGE:-postgres:17-alpine}
name=certworker-smoke-$$
url="postgres://postgres:smoke@$name-pg:5432/certworker?sslmode=disable"
repo=$(cd "$(dirname "$0")/.." && pwd)
work=$(mktemp -d)

cleanup() {
  docker rm -f -v "$name-run" "$name-pg" >/dev/null 2>&1 || true
  docker network rm "$name" >/dev/null 2>&1 || true
  rm -rf "$work"
}
trap cleanup EXIT

# fail prints the worker's log, when there is one, and stops.
fail() {
  echo "smoke: $*" >&2
  docker logs "$name-run" 2>&1 | tail -n 40 >&2 || true
  exit 1
}

# within SECONDS CMD...: runs CMD every half second until it succeeds.
within() {
  local deadline=$((SECONDS + $1))
  shift
  until "$@" >/dev/null 2>&1; do
    [ "$SECONDS" -lt "$deadline" ] || return 1
    sleep 0.5
  done
}

# The key file, by the quickstart's lines in docs/running.md (those naming
# deploy/secrets/key-encryption-key), run as written in a scratch directory: umask
# 077, then chown to the workers' uid. `sudo` stands for itself where it is not
# installed (CI runs as root).
keylines=$(sed -n '/^```sh$/,/^```$/p' "$repo/docs/running.md" | grep 'deploy/secrets/key-encryption-key' || true)
[ "$(printf '%s\n' "$keylines" | grep -c .)" = 2 ] ||
  fail "docs/running.md's quickstart does not make the key file in two lines: $keylines"
(
  cd "$work"
  command -v sudo >/dev/null || sudo() { "$@"; }
  eval "$keylines"
) || fail "the quickstart's key-file lines failed: $keylines"
keyfile=$work/deploy/secrets/key-encryption-key
echo "smoke: key file made as docs/running.md says ($(stat -c '%a %u' "$keyfile"))"

docker network create "$name" >/dev/null
docker run -d --name "$name-pg" --network "$name" \
  -e POSTGRES_PASSWORD=smoke -e POSTGRES_DB=certworker "$pg_image" >/dev/null
within 60 docker exec "$name-pg" pg_isready -h 127.0.0.1 -U postgres -d certworker ||
  fail "PostgreSQL ($pg_image) did not start"

# The one-shot migrate, as compose and the Kubernetes Job run it.
docker run --rm --network "$name" "$image" migrate --database-url "$url" ||
  fail "migrate failed"
echo "smoke: migrate done"

# The worker. Its ACME directory is a loopback address of its own container where
# nothing listens: with no domain queued it never asks, and if it did, nothing would
# leave the container. The image keeps the admin endpoints on loopback; a deployment
# that probes them from outside the container sets the address, as this does. The
# key file is mounted as compose mounts its secret (a read-only bind mount keeping
# the host file's owner and mode).
docker run -d --name "$name-run" --network "$name" -p 127.0.0.1::9090 \
  -v "$keyfile:/run/secrets/key-encryption-key:ro" \
  -e CERTWORKER_KEY_ENCRYPTION_KEY_FILE=/run/secrets/key-encryption-key \
  -e CERTWORKER_DATABASE_URL="$url" \
  -e CERTWORKER_ADMIN_LISTEN=:9090 \
  -e CERTWORKER_ACME_DIRECTORY=https://127.0.0.1:9/directory \
  "$image" run >/dev/null
# The whole answer, then its first line in bash: under pipefail, `| head -n1` fails
# the script when head exits before docker port has written its last line.
port=$(docker port "$name-run" 9090/tcp)
port=${port%%$'\n'*}
port=${port##*:}

# readyz GETs /readyz on the published admin port, with bash alone (no curl on every
# machine), and succeeds on a 200. A subshell, because a failed exec redirection ends
# a non-interactive shell.
readyz() (
  exec 3<>"/dev/tcp/127.0.0.1/$port"
  printf 'GET /readyz HTTP/1.0\r\nHost: localhost\r\n\r\n' >&3
  read -r status <&3
  [[ $status == "HTTP/1.0 200"* ]]
)
within 60 readyz || fail "/readyz did not answer 200 on 127.0.0.1:$port"
echo "smoke: /readyz answered 200"
# The log is read whole before it is searched: under pipefail, `docker logs | grep -q`
# fails when grep exits at its match while docker logs is still writing (SIGPIPE).
log=$(docker logs "$name-run" 2>&1)
[[ $log == *'"sealed":true'* ]] ||
  fail "run did not say it seals new private keys with the quickstart's key file"
echo "smoke: run seals with the quickstart's key file"
docker exec "$name-run" /usr/local/bin/certworker healthcheck >/dev/null ||
  fail "certworker healthcheck failed inside the container"
echo "smoke: certworker healthcheck passed"

# SIGTERM: a clean stop, exit status 0.
docker stop -t 60 "$name-run" >/dev/null
code=$(docker inspect -f '{{.State.ExitCode}}' "$name-run")
[ "$code" = 0 ] || fail "run exited $code on SIGTERM"
echo "smoke: run stopped cleanly; image $image works"
