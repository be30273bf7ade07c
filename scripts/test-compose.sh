#!/usr/bin/env bash
# npm run test:compose
# Brings the project's own docker-compose.yml up under a throwaway project name, on free
# loopback ports, with a .env written by scripts/create-env.sh, and checks what a developer
# relies on: compose refuses an unfilled .env.example; one image build; db healthy; the
# migration job exits 0; the API ready; each service gets only its own variables; create and
# list with the key from .env; the data kept across down/up; `stop` exits 0 within the grace
# period; `down -v` leaves nothing. Tears everything down (image included) even on failure.
#
# Works with `docker compose` (v2) and `docker-compose` (1.29). Environment (optional):
#   COMPOSE="docker-compose"   the compose command (default: docker compose, else docker-compose)
#   READY_SECONDS=180          how long `up` may take to answer ready
#   GRACE_SECONDS=30           the api's stop_grace_period in docker-compose.yml
#   KEEP_LOGS=1                print every service's log at the end
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
# shellcheck source=scripts/container-test-lib.sh
. scripts/container-test-lib.sh
t_start=$(date +%s%N)
ready_seconds=${READY_SECONDS:-180}
grace=${GRACE_SECONDS:-30}

if [ -n "${COMPOSE:-}" ]; then read -r -a compose <<<"$COMPOSE"
elif docker compose version >/dev/null 2>&1; then compose=(docker compose)
elif command -v docker-compose >/dev/null; then compose=(docker-compose)
else die "neither docker compose (v2) nor docker-compose answers"; fi
engine=docker
docker info >/dev/null 2>&1 || die "the Docker engine does not answer (docker info)"
need_curl

project="petstore-composetest-$$-$RANDOM"
image="petstore-composetest:$$-$RANDOM"
work=$(mktemp -d)
read -r api_port metrics_port <<<"$(free_ports 2)"
label="label=com.docker.compose.project=$project"
c() { "${compose[@]}" --env-file "$work/.env" -p "$project" -f docker-compose.yml "$@"; }
service_container() { docker ps -aq --filter "$label" --filter "label=com.docker.compose.service=$1" | head -1; }
volumes_before=$(docker volume ls -q | sort)

cleanup() {
  local rc=$?
  set +e
  if [ "$rc" != 0 ] || [ "$failures" != 0 ] || [ -n "${KEEP_LOGS:-}" ]; then
    echo "== logs (last lines of each service)"
    c logs --no-color --tail 30 2>&1 | cut -c1-400
  fi
  c down -v --remove-orphans -t 5 >/dev/null 2>&1
  docker rmi -f "$image" >/dev/null 2>&1
  remove_new_dangling
  rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

echo "test:compose with ${compose[*]} ($("${compose[@]}" version --short 2>/dev/null || "${compose[@]}" version | head -1)), engine $(docker version --format '{{.Server.Version}}'), project $project"

step "an unfilled .env.example is refused"
out=$("${compose[@]}" --env-file .env.example -p "$project" -f docker-compose.yml config 2>&1) && rc=0 || rc=$?
if [ "$rc" != 0 ] && grep -q 'create-env.sh' <<<"$out"; then pass "compose refuses (exit $rc), naming the fix (sh scripts/create-env.sh)"
else fail "compose accepted .env.example unchanged (exit $rc): $(tail -2 <<<"$out")"; fi

step ".env from scripts/create-env.sh"
sh scripts/create-env.sh "$work/.env" >/dev/null
mode=$(stat -c %a "$work/.env")
[ "$mode" = 600 ] && pass ".env mode $mode" || fail ".env mode $mode, expected 600"
key=$(sed -n 's/^API_KEYS=//p' "$work/.env" | cut -d, -f1)
[ ${#key} -ge 32 ] && pass "a random API key (${#key} characters)" || fail "API key '${key}' is too short"
# The throwaway image and ports; LOG_LEVEL checks that a setting in .env reaches the API.
printf 'PETSTORE_IMAGE=%s\nHOST_API_PORT=%s\nHOST_METRICS_PORT=%s\nLOG_LEVEL=info\n' "$image" "$api_port" "$metrics_port" >>"$work/.env"
base="http://127.0.0.1:$api_port"

step "build (one image for migrate and api)"
note_dangling
t0=$(date +%s%N)
c build >"$work/build.log" 2>&1 || { tail -30 "$work/build.log"; die "compose build"; }
build_s=$(since "$t0")
built=$(docker images -q "$image" | wc -l)
[ "$built" = 1 ] && pass "built $image in ${build_s} s" || fail "image $image not built"
services_built=$(c config 2>/dev/null | grep -c '^ *build:' || true)
[ "$services_built" = 1 ] && pass "one service has build: (the other runs the same image)" || fail "$services_built services have build:"

step "up"
t0=$(date +%s%N)
c up -d >"$work/up.log" 2>&1 || { tail -30 "$work/up.log"; die "compose up"; }
if wait_ready "$base/health/ready" "$ready_seconds"; then up_s=$(since "$t0"); pass "API ready on $base after ${up_s} s"
else die "API not ready within ${ready_seconds} s"; fi
db=$(service_container db); migrate=$(service_container migrate); api=$(service_container api)
health=$(docker inspect -f '{{.State.Health.Status}}' "$db")
[ "$health" = healthy ] && pass "db healthy" || fail "db health: $health"
state=$(docker inspect -f '{{.State.Status}} {{.State.ExitCode}}' "$migrate")
[ "$state" = "exited 0" ] && pass "migrate job: exited 0" || fail "migrate job: $state"
grep -qi 'migrat' <(docker logs "$migrate" 2>&1) && pass "migrate job: $(docker logs "$migrate" 2>&1 | grep -i migrat | head -1)" || fail "migrate job logged nothing about migrations"

step "each service gets only its own variables"
env_of() { docker inspect -f '{{range .Config.Env}}{{println .}}{{end}}' "$1"; }
api_env=$(env_of "$api"); migrate_env=$(env_of "$migrate")
grep -q '^POSTGRES_' <<<"$api_env" && fail "the API gets POSTGRES_* ($(grep -o '^POSTGRES_[A-Z]*' <<<"$api_env" | tr '\n' ' '))" || pass "no POSTGRES_* in the API"
grep -q '^POSTGRES_' <<<"$migrate_env" && fail "the migration job gets POSTGRES_*" || pass "no POSTGRES_* in the migration job"
grep -q '^DATABASE_URL=postgres://petstore:.*@db:5432/petstore$' <<<"$api_env" && pass "API has DATABASE_URL (db:5432)" || fail "API lacks DATABASE_URL"
grep -qx "API_KEYS=$key" <<<"$api_env" && pass "API has the API_KEYS of .env" || fail "API lacks the API_KEYS of .env"
grep -qx 'LOG_LEVEL=info' <<<"$api_env" && pass "API has LOG_LEVEL from .env (a setting without a value in compose)" || fail "LOG_LEVEL of .env did not reach the API"
# Compose 1.x lists an unset one as a bare name, which the process does not see.
grep -q '^REDIS_URL=' <<<"$api_env" && fail "REDIS_URL is passed although unset" || pass "REDIS_URL absent when unset"

step "the API container"
[ "$(docker inspect -f '{{.HostConfig.ReadonlyRootfs}}' "$api")" = true ] && pass "read-only root filesystem" || fail "root filesystem is writable"
uid=$(docker exec "$api" id -u)
[ "$uid" != 0 ] && pass "runs as uid $uid" || fail "runs as root"
create_and_list "$base" "$key" "compose-test"
id=$created_id
code=$(curl -s -o /dev/null -w '%{http_code}' "$base/v1/categories")
[ "$code" = 401 ] && pass "no key: 401" || fail "no key: $code"
grep -q '^# TYPE' <<<"$(curl -sf "http://127.0.0.1:$metrics_port/metrics")" && pass "metrics on 127.0.0.1:$metrics_port" || fail "no metrics on :$metrics_port"
grep -qF "$key" <(docker logs "$api" 2>&1) && fail "the API key appears in the API's log" || pass "key not in the log"

step "the service's own role: the API is no superuser, an operator's session has no statement timeout"
psql_as() { docker exec -e PGPASSWORD="$2" "$db" psql -h 127.0.0.1 -U "$1" -d petstore -tAc "$3" 2>&1; }
superuser_password=$(sed -n 's/^POSTGRES_PASSWORD=//p' "$work/.env")
service_password=$(sed -n 's/^PETSTORE_DB_PASSWORD=//p' "$work/.env")
roles=$(psql_as postgres "$superuser_password" "SELECT DISTINCT a.usename || ' superuser=' || r.rolsuper FROM pg_stat_activity a
  JOIN pg_roles r ON r.rolname = a.usename WHERE a.application_name LIKE 'petstore%'")
[ "$roles" = "petstore superuser=false" ] && pass "the API's sessions run as petstore, no superuser" || fail "the API's sessions run as: $roles"
owner=$(psql_as postgres "$superuser_password" "SELECT tableowner FROM pg_tables WHERE tablename = 'categories'")
[ "$owner" = petstore ] && pass "petstore owns its tables" || fail "categories is owned by $owner"
[ "$(psql_as petstore "$service_password" 'SHOW statement_timeout')" = 5s ] && pass "petstore's sessions: statement_timeout 5s" \
  || fail "petstore's statement_timeout: $(psql_as petstore "$service_password" 'SHOW statement_timeout')"
out=$(psql_as postgres "$superuser_password" 'SELECT pg_sleep(5.5)') && pass "an operator's 5.5 s statement as postgres completes" \
  || fail "the operator's statement failed: $out"
grep -q 'canceling statement due to statement timeout' <<<"$(psql_as petstore "$service_password" 'SELECT pg_sleep(5.5)')" \
  && pass "the same statement as petstore is cancelled at 5 s" || fail "petstore's 5.5 s statement was not cancelled"

step "managed keys: issued and revoked with docker compose run while the API runs"
keys() { c run --rm -T migrate node dist/keys/command.js "$@" 2>>"$work/keys.err"; }
created=$(keys create --name compose-reader --scope read) || { cat "$work/keys.err"; fail "keys create"; }
managed=$(tail -n1 <<<"$created")
[[ "$managed" =~ ^petstore_[0-9A-Za-z]{36}$ ]] && pass "keys create: the key alone on its last line" || fail "keys create printed: $created"
status() { curl -s -o /dev/null -w '%{http_code}' -H "Authorization: Bearer $managed" "$@"; }
code=$(status "$base/v1/categories"); [ "$code" = 200 ] && pass "the new read key lists: 200" || fail "the new key: $code"
code=$(status -H 'content-type: application/json' -d '{"name":"by a reader"}' "$base/v1/categories")
[ "$code" = 403 ] && pass "and may not create: 403" || fail "the read key's create: $code"
listed=$(keys list --json) || fail "keys list --json"
grep -qF "$managed" <<<"$listed" && fail "keys list shows the key" || pass "keys list never shows the key"
managed_id=$(node -e 'const k = JSON.parse(process.argv[1]).find(k => k.name === "compose-reader"); console.log(k ? k.id : "")' "$listed")
[ -n "$managed_id" ] && pass "keys list --json names it (id $managed_id)" || fail "keys list --json: $listed"
keys revoke "$managed_id" >/dev/null || fail "keys revoke"
revoked=$(date +%s%N); code=$(status "$base/v1/categories")
while [ "$code" != 401 ] && [ $(( ($(date +%s%N) - revoked) / 1000000 )) -lt 1000 ]; do sleep 0.05; code=$(status "$base/v1/categories"); done
[ "$code" = 401 ] && pass "revoked: 401 within $(( ($(date +%s%N) - revoked) / 1000000 )) ms" || fail "1 s after the revocation: $code"
grep -qF "$managed" <(docker logs "$api" 2>&1) && fail "the managed key appears in the API's log" || pass "managed key not in the log"
grep -q "\"apiKeyId\":\"$managed_id\"" <(docker logs "$api" 2>&1) && pass "the API's log names key $managed_id" \
  || fail "no log line names key $managed_id"

step "down, up: the data is kept"
t0=$(date +%s%N)
c down >"$work/down.log" 2>&1 || { cat "$work/down.log"; fail "compose down"; }
left=$(docker ps -aq --filter "$label" | wc -l)
[ "$left" = 0 ] && pass "down: no container left (${left}) after $(since "$t0") s" || fail "down left $left containers"
t0=$(date +%s%N)
c up -d >"$work/up2.log" 2>&1 || { tail -30 "$work/up2.log"; die "second compose up"; }
if wait_ready "$base/health/ready" "$ready_seconds"; then up2_s=$(since "$t0"); pass "ready again after ${up2_s} s"
else die "API not ready after the second up"; fi
lists_category "$base" "$key" "$id" compose-test "category $id still listed after down/up"

step "stop (grace ${grace} s)"
api=$(service_container api)
t0=$(date +%s%N)
c stop >"$work/stop.log" 2>&1 || { cat "$work/stop.log"; fail "compose stop"; }
stop_s=$(since "$t0")
for svc in api db; do
  state=$(docker inspect -f '{{.State.Status}} {{.State.ExitCode}}' "$(service_container "$svc")")
  [ "$state" = "exited 0" ] && pass "$svc: exited 0" || fail "$svc after stop: $state"
done
api_stop_s=$(docker inspect -f '{{.State.FinishedAt}}' "$api" | xargs -I{} date -d {} +%s%N | awk -v a="$t0" '{ printf "%.1f", ($1 - a) / 1e9 }')
awk -v s="$stop_s" -v g="$grace" 'BEGIN { exit !(s < g) }' && pass "stop took ${stop_s} s (API exited after ${api_stop_s} s), inside the ${grace} s grace period" || fail "stop took ${stop_s} s"
grep -q 'shutdown complete' <(docker logs "$api" 2>&1) && pass "API logged 'shutdown complete'" || fail "no 'shutdown complete' in the API's log"

step "down -v leaves nothing"
c down -v >"$work/down.log" 2>&1 || { cat "$work/down.log"; fail "compose down -v"; }
for kind in container network volume; do
  n=$(case $kind in container) docker ps -aq --filter "$label" ;; *) docker "$kind" ls -q --filter "$label" ;; esac | wc -l)
  [ "$n" = 0 ] && pass "no $kind of the project left" || fail "$n ${kind}s of the project left"
done
new_volumes=$(comm -13 <(echo "$volumes_before") <(docker volume ls -q | sort) | wc -l)
[ "$new_volumes" = 0 ] && pass "no anonymous volume left" || fail "$new_volumes new volumes left"
docker rmi "$image" >/dev/null && pass "image $image removed" || fail "image $image not removed"

echo "== test:compose finished in $(since "$t_start") s (build ${build_s} s, up to ready ${up_s} s, again after down ${up2_s} s, stop ${stop_s} s): $failures failure(s)"
[ "$failures" = 0 ]
