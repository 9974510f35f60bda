#!/usr/bin/env bash
# The test command: installs redis-server if it is missing (the tests start their own servers on
# 127.0.0.1), then runs every test of the workspace. Arguments go to `cargo test`.
set -euo pipefail
cd "$(dirname "$0")/.."

# redis-cli (Debian: redis-tools, which redis-server depends on) joins the test Redis Cluster.
if ! command -v "${LOCK_TESTS_REDIS_SERVER:-redis-server}" >/dev/null 2>&1 \
  || ! command -v redis-cli >/dev/null 2>&1; then
  if ! command -v apt-get >/dev/null 2>&1; then
    echo "scripts/test.sh: redis-server or redis-cli is not installed and there is no apt-get here;" >&2
    echo "install redis-server and redis-cli with your package manager, or set" >&2
    echo "LOCK_TESTS_REDIS_SERVER to its path, then run this again." >&2
    exit 1
  fi
  if [ "$(id -u)" -eq 0 ]; then
    sudo=()
  elif command -v sudo >/dev/null 2>&1; then
    sudo=(sudo)
  else
    echo "scripts/test.sh: redis-server is not installed, and installing it needs root:" >&2
    echo "run 'apt-get update && apt-get install -y redis-server' as root, then run this again." >&2
    exit 1
  fi
  echo "scripts/test.sh: installing redis-server" >&2
  export DEBIAN_FRONTEND=noninteractive
  "${sudo[@]}" apt-get update -qq
  "${sudo[@]}" apt-get install -y -qq redis-server redis-tools >/dev/null
fi

cargo test --workspace "$@"
