#!/usr/bin/env bash
# npm run test:cluster
# Three instances of the built service on loopback behind HAProxy, over one fresh PostgreSQL
# database, while clients create and list categories and every instance is restarted in turn
# (a rolling deploy). Passes only if no client saw a failed request, every id answered 201 is
# in the final list, no row exists that no client sent, and all ids are unique.
# The instances share a redis-server (REDIS_URL): a burst of failed authentications spread over
# them must hit one limit, and Redis is stopped and started again under the same load.
# The load, the restarts and Redis are driven by scripts/cluster-load.mjs.
#
# Environment (all optional):
#   DATABASE_URL      server to create the test database on (default: the machine's
#                     postgres://postgres@127.0.0.1:5432/postgres; when nothing answers there,
#                     the embedded PostgreSQL from node_modules is started)
#   SKIP_BUILD=1      use the existing dist/ instead of running `npm run build`
#   LB_PORT=3100      HAProxy frontend; instances use LB_PORT+1..3, stats LB_PORT+99,
#                     metrics listeners LB_PORT+6401..6403
#   REDIS_PORT        the test's own redis-server (default: a free port picked at run time)
#   REDIS_OUTAGE_MS=3000  how long Redis stays stopped under load
#   WRITERS=20 READERS=4 MIN_CREATES=2000 CREATE_RATE=300 SHUTDOWN_DRAIN_MS=2000
#   KEEP_LOGS=1       keep the work directory (instance and HAProxy logs) after the run
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
started=$(date +%s)
lb_port=${LB_PORT:-3100}
stats_port=$((lb_port + 99))
ports="$((lb_port + 1)),$((lb_port + 2)),$((lb_port + 3))"
metrics_ports="$((lb_port + 6401)),$((lb_port + 6402)),$((lb_port + 6403))"
api_key="cluster-$(date +%s)-$RANDOM$RANDOM"
work=$(mktemp -d)
# shellcheck source=scripts/fresh-database.sh
. scripts/fresh-database.sh
haproxy_pid=''
driver_pid=''
embedded_pid=''
db_url=''

cleanup() {
  set +e
  [ -n "$driver_pid" ] && kill "$driver_pid" 2>/dev/null && wait "$driver_pid" 2>/dev/null
  # Instances the driver started, should it have died without stopping them.
  if [ -f "$work/instance.pids" ]; then
    while read -r pid; do [ -n "$pid" ] && kill -TERM "$pid" 2>/dev/null; done <"$work/instance.pids"
    sleep 3
    while read -r pid; do [ -n "$pid" ] && kill -KILL "$pid" 2>/dev/null; done <"$work/instance.pids"
  fi
  [ -n "$haproxy_pid" ] && kill "$haproxy_pid" 2>/dev/null && wait "$haproxy_pid" 2>/dev/null
  [ -n "$db_url" ] && node scripts/test-postgres.mjs drop "$db_url" 2>/dev/null
  if [ -n "$embedded_pid" ]; then kill "$embedded_pid" 2>/dev/null; wait "$embedded_pid" 2>/dev/null; fi
  if [ "${KEEP_LOGS:-0}" = 1 ]; then echo "logs kept in $work"; else rm -rf "$work"; fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

echo "== HAProxy"
if ! command -v haproxy >/dev/null; then
  echo "installing haproxy from Debian's packages"
  apt-get update -qq >/dev/null
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq haproxy >/dev/null
fi
haproxy -v | sed -n 1p

echo "== Redis"
if ! command -v redis-server >/dev/null; then
  echo "installing redis-server from Debian's packages"
  apt-get update -qq >/dev/null
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server >/dev/null
fi
redis-server --version
redis_port=${REDIS_PORT:-$(node -e "const s=require('net').createServer().listen(0,'127.0.0.1',()=>{console.log(s.address().port);s.close()})")}

echo "== database"
ADMIN_DATABASE_URL=${DATABASE_URL:-} fresh_database "petstore_cluster_$$" "${EMBEDDED_PG_PORT:-55432}" || exit 1
echo "fresh database petstore_cluster_$$ on $db_source"

echo "== build"
if [ "${SKIP_BUILD:-0}" != 1 ]; then npm run build --silent; fi
[ -f dist/server.js ] || { echo "FAIL: dist/server.js missing after the build" >&2; exit 1; }

echo "== HAProxy on 127.0.0.1:$lb_port (stats on :$stats_port)"
IFS=, read -r p1 p2 p3 <<<"$ports"
cat >"$work/haproxy.cfg" <<EOF
global
  maxconn 4096

defaults
  mode http
  timeout connect 2s
  timeout client 30s
  timeout server 30s
  timeout http-keep-alive 30s
  timeout check 1s
  option http-keep-alive
  # A request is retried only when it cannot have reached an instance (conn-failure), or,
  # for methods other than POST, when the instance closed without answering.
  retries 3
  retry-on conn-failure empty-response
  option redispatch 1

frontend stats
  bind 127.0.0.1:$stats_port
  stats enable
  stats uri /stats

frontend public
  bind 127.0.0.1:$lb_port
  http-request set-header X-Request-Id %[uuid()] unless { req.hdr(x-request-id) -m found }
  option forwardfor
  default_backend api

backend api
  balance roundrobin
  http-request disable-l7-retry if METH_POST
  option httpchk GET /health/ready
  http-check expect status 200
  default-server check inter 500ms fall 1 rise 2
  server s1 127.0.0.1:$p1
  server s2 127.0.0.1:$p2
  server s3 127.0.0.1:$p3
EOF
haproxy -c -q -f "$work/haproxy.cfg"
haproxy -db -f "$work/haproxy.cfg" >"$work/haproxy.log" 2>&1 &
haproxy_pid=$!

echo "== rolling restart under load"
LB_URL="http://127.0.0.1:$lb_port" STATS_URL="http://127.0.0.1:$stats_port/stats;csv" \
DATABASE_URL="$db_url" API_KEY="$api_key" INSTANCE_PORTS="$ports" METRICS_PORTS="$metrics_ports" \
WORK_DIR="$work" SHUTDOWN_DRAIN_MS="${SHUTDOWN_DRAIN_MS:-2000}" REDIS_PORT="$redis_port" \
  node scripts/cluster-load.mjs &
driver_pid=$!
rc=0
wait "$driver_pid" || rc=$?
driver_pid=''
if [ "$rc" != 0 ]; then
  for f in "$work"/instance-*.log "$work/haproxy.log" "$work/redis.log"; do
    [ -s "$f" ] && { echo "--- $(basename "$f") (last lines)"; tail -15 "$f"; }
  done
fi
echo "== test:cluster took $(( $(date +%s) - started ))s in all (exit $rc)"
exit "$rc"
