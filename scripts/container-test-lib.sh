# Sourced by scripts/test-container.sh and scripts/test-compose.sh: the container engine,
# free ports, HTTP checks and the pass/fail tally. Needs bash, node and curl.

# The Dockerfile's cache mounts need BuildKit: Docker 20.10 and docker-compose 1.29 use it only when asked.
export DOCKER_BUILDKIT=1 COMPOSE_DOCKER_CLI_BUILD=1
failures=0
pass() { echo "  ok   $*"; }
fail() { echo "  FAIL $*"; failures=$((failures + 1)); }
step() { echo "== $*"; }
die() { echo "FAIL: $*" >&2; exit 1; }
# Seconds since $1 (a `date +%s%N` value), one decimal.
since() { awk -v a="$1" -v b="$(date +%s%N)" 'BEGIN { printf "%.1f", (b - a) / 1e9 }'; }

# The engine's CLI: CONTAINER_ENGINE if set (docker, podman, or a wrapper with docker's
# arguments), else docker when its engine answers, else podman when it answers.
pick_engine() {
  if [ -n "${CONTAINER_ENGINE:-}" ]; then
    engine=$CONTAINER_ENGINE
  elif command -v docker >/dev/null && docker info >/dev/null 2>&1; then
    engine=docker
  elif command -v podman >/dev/null && podman info >/dev/null 2>&1; then
    engine=podman
  else
    die "no container engine answers (tried docker, podman); start one or set CONTAINER_ENGINE"
  fi
  "$engine" info >/dev/null 2>&1 || die "$engine does not answer ($engine info failed)"
  engine_version=$("$engine" version --format '{{.Server.Version}}' 2>/dev/null || "$engine" --version)
  is_podman=no; grep -qi podman <("$engine" --version 2>/dev/null) && is_podman=yes
  return 0
}

need_curl() {
  command -v curl >/dev/null && return 0
  # CI machines start bare; elsewhere, say what is missing.
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq curl >/dev/null
  else
    die "curl is needed"
  fi
}

# Prints N free TCP ports on 127.0.0.1, space-separated.
free_ports() {
  node -e '
    const net = require("node:net")
    const servers = Array.from({ length: Number(process.argv[1]) }, () => net.createServer())
    Promise.all(servers.map(s => new Promise(r => s.listen(0, "127.0.0.1", () => r(s.address().port)))))
      .then(ports => { console.log(ports.join(" ")); servers.forEach(s => s.close()) })' "$1"
}

# wait_ready URL SECONDS: polls until URL answers 200; returns 1 on timeout.
wait_ready() {
  local deadline=$(( $(date +%s) + $2 ))
  while [ "$(date +%s)" -lt "$deadline" ]; do
    [ "$(curl -s -o /dev/null -m 2 -w '%{http_code}' "$1" || true)" = 200 ] && return 0
    sleep 0.5
  done
  return 1
}

# create_and_list BASE KEY NAME: POSTs a category, checks 201 + Location and that the list
# has it; sets created_id.
create_and_list() {
  local base=$1 key=$2 name=$3 code body headers
  body=$(mktemp); headers=$(mktemp)
  code=$(curl -s -D "$headers" -o "$body" -w '%{http_code}' -X POST "$base/v1/categories" \
    -H "authorization: Bearer $key" -H 'content-type: application/json' --data "{\"name\":\"$name\"}")
  created_id=$(node -e 'try{process.stdout.write(String(JSON.parse(require("fs").readFileSync(process.argv[1],"utf8")).id??""))}catch{}' "$body")
  if [ "$code" = 201 ] && [ -n "$created_id" ] && grep -qi "^location: /v1/categories/$created_id" "$headers"; then
    pass "POST /v1/categories 201 id=$created_id with Location"
  else
    fail "POST /v1/categories: $code $(head -c 300 "$body")"
  fi
  grep -qi '^x-request-id:' "$headers" && pass "X-Request-Id on the response" || fail "no X-Request-Id"
  lists_category "$base" "$key" "$created_id" "$name" "GET /v1/categories 200 lists it"
  rm -f "$body" "$headers"
}

# lists_category BASE KEY ID NAME LABEL
lists_category() {
  local body code
  body=$(mktemp)
  code=$(curl -s -o "$body" -w '%{http_code}' "$1/v1/categories" -H "authorization: Bearer $2")
  if [ "$code" = 200 ] && grep -q "\"id\":$3,\"name\":\"$4\"" "$body"; then pass "$5"
  else fail "$5: $code $(head -c 300 "$body")"; fi
  rm -f "$body"
}

# The classic builder leaves each earlier stage of a multi-stage build as an untagged image.
# note_dangling before building; remove_new_dangling at the end removes only the untagged
# images that appeared since (an image still in use is kept).
note_dangling() { dangling_before=$("$engine" images -q --filter dangling=true | sort); }
remove_new_dangling() {
  [ -n "${dangling_before+set}" ] || return 0
  comm -13 <(echo "$dangling_before") <("$engine" images -q --filter dangling=true | sort) | xargs -r "$engine" rmi >/dev/null 2>&1 || true
}
