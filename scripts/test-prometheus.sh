#!/usr/bin/env bash
# npm run test:prometheus
# The alert rules (deploy/prometheus) and the dashboard (deploy/grafana) against Debian's Prometheus 2.42
# (test/prometheus/): promtool check rules and promtool test rules, then a Prometheus scraping the built
# service under a short load and a database outage (every rule and panel returns series, the database alert
# fires and resolves, promtool check metrics on a real scrape). Installs Debian's prometheus package first
# when it is missing (the tests start their own Prometheus on a free loopback port). Not part of `npm test`,
# which must pass on a machine with only Node.js. The same test database as `npm test` (scripts/run-tests.ts).
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v promtool >/dev/null || ! command -v prometheus >/dev/null; then
  echo "installing prometheus from Debian's packages"
  apt-get update -qq >/dev/null
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus >/dev/null
fi
prometheus --version 2>&1 | head -1
exec node --import tsx scripts/run-tests.ts --disable-coverage test/prometheus/*.test.ts
