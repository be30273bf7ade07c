#!/usr/bin/env bash
# npm run test:redis
# The rate limits against a real Redis (test/redis/): several instances of the app sharing one
# redis-server, Redis stopped, hung and restarted, a wrong password. Each test file starts its own
# redis-server on a free loopback port (never the machine's 6379); this installs Debian's
# redis-server package first when it is missing. Not part of `npm test`, which must pass on a
# machine with only Node.js. The same test database as `npm test`: one server for the run (scripts/run-tests.ts).
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v redis-server >/dev/null; then
  echo "installing redis-server from Debian's packages"
  apt-get update -qq >/dev/null
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server >/dev/null
fi
redis-server --version
# Files named on the command line run even though package.json's tap "exclude" keeps them out of `npm test`;
# coverage is judged on the whole suite there, not on this subset.
exec node --import tsx scripts/run-tests.ts --disable-coverage test/redis/*.test.ts
