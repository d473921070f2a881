#!/usr/bin/env bash
# Runs the MCP project's official conformance suite
# (@modelcontextprotocol/conformance, server mode: its default "active" suite)
# against `gdn mcp serve --http` on a bundle (default: tests/fixtures/base-tools).
#
#   scripts/mcp-conformance.sh [conformance options, e.g. --scenario tools-list --verbose]
#
# The suite and a Node >= 22 (it needs one) are installed from the npm registry
# into cache folders of the checkout when absent. Scenarios this server is
# known to fail (it offers tools only; see docs/MCP_CONFORMANCE.md) are listed
# in scripts/mcp-conformance-baseline.yml: the script exits 0 when exactly those
# fail, 1 on any other failure or when a listed scenario starts to pass.
# Environment: GDN (a built gdn binary; default: cargo build -p gdn),
# BUNDLE (the bundle to serve).
set -euo pipefail
cd "$(dirname "$0")/.."

CONFORMANCE_VERSION=0.1.16
CONFORMANCE=.cache/mcp-conformance/node_modules/@modelcontextprotocol/conformance/dist/index.js
if [ ! -f "$CONFORMANCE" ]; then
  npm install --prefix .cache/mcp-conformance --no-audit --no-fund --loglevel=error \
    "@modelcontextprotocol/conformance@$CONFORMANCE_VERSION" >/dev/null
fi

NODE=node
if ! command -v node >/dev/null 2>&1 || [ "$(node -p 'process.versions.node.split(".")[0]')" -lt 22 ]; then
  if [ ! -x .cache/node22/node_modules/.bin/node ]; then
    npm install --prefix .cache/node22 --no-audit --no-fund --loglevel=error node@22 >/dev/null
  fi
  NODE="$PWD/.cache/node22/node_modules/.bin/node"
fi

if [ -z "${GDN:-}" ]; then
  cargo build -p gdn --locked --quiet
  GDN="${CARGO_TARGET_DIR:-$PWD/target}/debug/gdn"
fi
BUNDLE="${BUNDLE:-tests/fixtures/base-tools}"

work="$(mktemp -d)"
server=""
cleanup() {
  if [ -n "$server" ]; then kill "$server" 2>/dev/null || true; wait "$server" 2>/dev/null || true; fi
  rm -rf "$work"
}
trap cleanup EXIT

# Port 0: the server picks a free port and prints its URL on standard output.
"$GDN" --state-root "$work/state" -c "$BUNDLE" mcp serve --http 127.0.0.1:0 >"$work/url" 2>"$work/server.log" &
server=$!
url=""
for _ in $(seq 1 300); do
  url="$(grep -o 'http://[^ ]*' "$work/url" || true)"
  [ -n "$url" ] && break
  if ! kill -0 "$server" 2>/dev/null; then
    cat "$work/server.log" >&2
    echo "gdn mcp serve exited before it listened" >&2
    exit 1
  fi
  sleep 0.1
done
[ -n "$url" ] || { echo "gdn mcp serve did not print its URL" >&2; exit 1; }
echo "gdn mcp serve (bundle $BUNDLE) at $url"

# Results go to a results/ folder of the working directory: keep them in the cache.
mkdir -p .cache/mcp-conformance/run
baseline="$PWD/scripts/mcp-conformance-baseline.yml"
cd .cache/mcp-conformance/run
"$NODE" "../../../$CONFORMANCE" server --url "$url" --expected-failures "$baseline" "$@"
