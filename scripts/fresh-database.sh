# Sourced by scripts/test-cluster.sh: a fresh database for one test run.
# fresh_database NAME EMBEDDED_PORT
#   Creates database NAME on ADMIN_DATABASE_URL (default: the machine's PostgreSQL);
#   when no PostgreSQL answers there, starts the embedded one from node_modules in
#   "$work/pg" on EMBEDDED_PORT first. Sets db_url, db_source and (when it started
#   one) embedded_pid, which the caller's cleanup stops.
fresh_database () {
  local name=$1 port=$2 rc admin
  if db_url=$(node scripts/test-postgres.mjs create "$name"); then
    db_source="the machine's PostgreSQL"
    return 0
  else
    rc=$?
  fi
  [ "$rc" = 3 ] || { echo "FAIL: could not create the test database" >&2; return 1; }
  echo "  no PostgreSQL answers; starting the embedded one from node_modules"
  node --import tsx scripts/test-postgres.mjs embedded "$work/pg" "$port" >"$work/pg.out" 2>"$work/pg.err" &
  embedded_pid=$!
  for _ in $(seq 1 120); do grep -q '^ready ' "$work/pg.out" && break; kill -0 "$embedded_pid" 2>/dev/null || break; sleep 0.5; done
  admin=$(sed -n 's/^ready //p' "$work/pg.out")
  [ -n "$admin" ] || { cat "$work/pg.err" >&2; echo "FAIL: embedded PostgreSQL did not start" >&2; return 1; }
  db_url=$(ADMIN_DATABASE_URL=$admin node scripts/test-postgres.mjs create "$name")
  db_source="embedded PostgreSQL"
}
