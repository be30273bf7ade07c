#!/bin/sh
# Writes the settings file docker compose reads (default .env) from .env.example, with a
# random password for each PostgreSQL role and a random API key, readable by its owner only (0600).
# Refuses to replace an existing file. Needs only a POSIX shell and /dev/urandom.
#   sh scripts/create-env.sh [FILE]
set -eu
target=${1:-}
case "$target" in '') ;; /*) ;; *) target="$PWD/$target" ;; esac
cd "$(dirname "$0")/.."
target=${target:-$PWD/.env}
if [ -e "$target" ]; then
  echo "create-env: $target exists; not replacing it (delete it first to start over)" >&2
  exit 1
fi
random_hex () { od -An -N"$1" -tx1 /dev/urandom | tr -d ' \n'; }
password=$(random_hex 24)
service_password=$(random_hex 24)
key=$(random_hex 32)
umask 077
# Written under a temporary name first, so a failure never leaves a half-filled file.
sed -e "s/^POSTGRES_PASSWORD=.*/POSTGRES_PASSWORD=$password/" \
  -e "s/^PETSTORE_DB_PASSWORD=.*/PETSTORE_DB_PASSWORD=$service_password/" \
  -e "s/^API_KEYS=.*/API_KEYS=$key/" .env.example > "$target.tmp.$$"
grep -q "^POSTGRES_PASSWORD=$password\$" "$target.tmp.$$" \
  && grep -q "^PETSTORE_DB_PASSWORD=$service_password\$" "$target.tmp.$$" \
  && grep -q "^API_KEYS=$key\$" "$target.tmp.$$" || {
  rm -f "$target.tmp.$$"
  echo "create-env: .env.example has no POSTGRES_PASSWORD=, PETSTORE_DB_PASSWORD= or API_KEYS= line" >&2
  exit 1
}
mv "$target.tmp.$$" "$target"
echo "create-env: wrote $target (mode 600) with random POSTGRES_PASSWORD, PETSTORE_DB_PASSWORD and API_KEYS;" \
  "the key: grep ^API_KEYS= $target"
