#!/usr/bin/env bash
# Builds a PostgreSQL image from Debian's packages, for machines that cannot pull
# images from a registry. The result behaves like the official image as far as the
# tests and testcontainers' postgres module care: POSTGRES_USER, POSTGRES_PASSWORD
# and POSTGRES_DB are honoured, port 5432, and `postgres -c name=value ...` as the
# command. It is cached: nothing is built when the image already exists.
#
# Usage: build.sh [IMAGE]   (default: certworker-postgres:15)
#
# The Debian mirror is read from this machine's apt sources at build time, so no
# mirror host is written into the repository.
set -euo pipefail

image=${1:-certworker-postgres:15}
# Raised whenever the image's build changes, so that a machine holding an older build
# makes it again rather than testing against what it no longer is.
revision=2
if [ "$(docker image inspect -f '{{index .Config.Labels "org.certworker.pgimage"}}' "$image" 2>/dev/null || true)" = "$revision" ]; then
  echo "image $image already present"
  exit 0
fi

mirror=${DEBIAN_MIRROR:-}
if [ -z "$mirror" ]; then
  # deb822 sources (bookworm's default), then the one-line format.
  mirror=$(grep -hs '^URIs:' /etc/apt/sources.list.d/*.sources | awk '{print $2}' | grep -v security | head -n1 || true)
fi
if [ -z "$mirror" ]; then
  mirror=$(grep -hs '^deb ' /etc/apt/sources.list /etc/apt/sources.list.d/*.list | awk '{print $2}' | grep -v security | head -n1 || true)
fi
if [ -z "$mirror" ]; then
  echo "no Debian mirror found in /etc/apt sources; set DEBIAN_MIRROR" >&2
  exit 1
fi
# A fresh machine has Go and Docker, not debootstrap: install it where we may (root,
# with apt), otherwise say the one command that does.
if ! command -v debootstrap >/dev/null; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    echo "debootstrap is not installed; installing it with apt-get"
    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap; } >/dev/null || {
      echo "could not install debootstrap; run: apt-get install -y debootstrap" >&2
      exit 1
    }
  elif command -v apt-get >/dev/null; then
    echo "debootstrap is not installed; run: sudo apt-get install -y debootstrap" >&2
    exit 1
  else
    echo "debootstrap is not installed; install it with your package manager, or set CERTWORKER_PG_IMAGE to a PostgreSQL image you have" >&2
    exit 1
  fi
fi

root=$(mktemp -d)
trap 'rm -rf "$root"' EXIT

debootstrap --variant=minbase --include=postgresql-15,locales-all bookworm "$root" "$mirror" >"$root.log" 2>&1 || {
  tail -n 30 "$root.log" >&2
  exit 1
}
rm -f "$root.log"

# Debian's package creates a cluster under /etc/postgresql; the entrypoint makes its
# own data directory instead, as the official image does.
rm -rf "$root/var/lib/postgresql/15/main" "$root/etc/postgresql/15/main"
rm -rf "$root/var/cache/apt/archives/"*.deb "$root/var/lib/apt/lists/"*

cat >"$root/usr/local/bin/docker-entrypoint.sh" <<'ENTRY'
#!/bin/bash
set -euo pipefail
bin=/usr/lib/postgresql/15/bin
export PGDATA=${PGDATA:-/var/lib/postgresql/data}
user=${POSTGRES_USER:-postgres}
db=${POSTGRES_DB:-$user}

# The official image's command is `postgres [-c name=value ...]`.
if [ "${1:-}" = postgres ]; then shift; fi

mkdir -p "$PGDATA" /var/run/postgresql
chown -R postgres:postgres "$PGDATA" /var/run/postgresql
chmod 700 "$PGDATA"

if [ ! -s "$PGDATA/PG_VERSION" ]; then
  pwfile=$(mktemp)
  printf '%s\n' "${POSTGRES_PASSWORD:-postgres}" >"$pwfile"
  chown postgres "$pwfile"
  runuser -u postgres -- "$bin/initdb" -D "$PGDATA" -U "$user" --pwfile="$pwfile" \
    --auth-local=trust --auth-host=scram-sha-256 -E UTF8 --locale=C.UTF-8 >/dev/null
  rm -f "$pwfile"
  echo "host all all all scram-sha-256" >>"$PGDATA/pg_hba.conf"
  echo "host replication all all scram-sha-256" >>"$PGDATA/pg_hba.conf"
  echo "listen_addresses = '*'" >>"$PGDATA/postgresql.conf"
  if [ "$db" != postgres ]; then
    runuser -u postgres -- "$bin/postgres" --single -D "$PGDATA" postgres <<<"CREATE DATABASE \"$db\" OWNER \"$user\";" >/dev/null
  fi
fi

exec runuser -u postgres -- "$bin/postgres" -D "$PGDATA" "$@"
ENTRY
chmod 755 "$root/usr/local/bin/docker-entrypoint.sh"

# The data directory is a volume, as in the official image: in the container's own
# layer every write would go through the storage driver (fuse-overlayfs on some
# engines), which on a 2-core VM doubled a one-row UPDATE's round trip (218 us against
# 104 us on tmpfs and 135 us on a volume, fsync off) and added 0.2 ms to a commit
# after an idle spell. Docker removes the anonymous volume with the container when
# asked to (testcontainers' Terminate does; `docker rm -v`).
tar -C "$root" -c . | docker import \
  --change 'ENTRYPOINT ["/usr/local/bin/docker-entrypoint.sh"]' \
  --change 'CMD ["postgres"]' \
  --change 'EXPOSE 5432' \
  --change 'VOLUME /var/lib/postgresql/data' \
  --change "LABEL org.certworker.pgimage=$revision" \
  --change 'ENV PATH=/usr/lib/postgresql/15/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
  - "$image" >/dev/null
echo "built $image"
