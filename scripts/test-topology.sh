#!/usr/bin/env bash
# npm run test:topology
# Real database topologies under load (test/topology/): backends terminated, a synchronous
# standby promoted in both orders. Each test creates its own PostgreSQL clusters with Debian's
# pg_createcluster and removes them; the machine's own clusters (5432) are never touched.
# Needs root; installs Debian's PostgreSQL packages when they are missing.
#
# Environment (optional):
#   TOPOLOGY_PORTS=6400-6449   ports for clusters, proxies and instances (default: free ports below the ephemeral range)
#   TOPOLOGY_LOAD_MS=15000     how long backends are terminated under load
#   TOPOLOGY_SERVICE_DIR=DIR   run another checkout's build (to watch the tests fail on old code)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
started=$(date +%s)

if [ "$(id -u)" != 0 ]; then
  echo "test:topology: must run as root (it creates PostgreSQL clusters with pg_createcluster)" >&2
  exit 1
fi
if ! command -v pg_createcluster >/dev/null || ! ls /usr/lib/postgresql/*/bin/postgres >/dev/null 2>&1; then
  echo "== installing Debian's PostgreSQL packages"
  apt-get update -qq >/dev/null
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql-common >/dev/null
  # The tests make their own clusters: do not let the package create and start one on 5432.
  sed -i 's/^#\?\s*create_main_cluster.*/create_main_cluster = false/' /etc/postgresql-common/createcluster.conf
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >/dev/null
fi
echo "== PostgreSQL $(ls /usr/lib/postgresql | sort -n | tail -1) from Debian's packages"

# scripts/run-tests.ts builds the checkout once for the instances (and starts a PostgreSQL the tests do not use).
rc=0
node --import tsx scripts/run-tests.ts --disable-coverage --jobs=1 --timeout=900 test/topology/*.test.ts || rc=$?
echo "== test:topology took $(( $(date +%s) - started ))s in all (exit $rc)"
exit "$rc"
