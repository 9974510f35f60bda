#!/usr/bin/env bash
# The test command: installs what the tests run against when it is missing (redis-server; etcd and,
# to build the etcd client, protoc; libfaketime; openssl), then runs every test of the workspace,
# the etcd backend's included. The tests start their own servers on 127.0.0.1. Arguments go to
# `cargo test`.
set -euo pipefail
cd "$(dirname "$0")/.."

# command -> Debian package that provides it
missing=()
command -v "${LOCK_TESTS_REDIS_SERVER:-redis-server}" >/dev/null 2>&1 || missing+=(redis-server)
# redis-cli (Debian: redis-tools, which redis-server depends on) joins the test Redis Cluster.
command -v redis-cli >/dev/null 2>&1 || missing+=(redis-tools)
command -v "${LOCK_TESTS_ETCD:-etcd}" >/dev/null 2>&1 || missing+=(etcd-server)
command -v "${PROTOC:-protoc}" >/dev/null 2>&1 || missing+=(protobuf-compiler)
# libfaketime runs redis-server with a stepped clock in the clock-fault tests.
command -v faketime >/dev/null 2>&1 || missing+=(faketime)
# openssl makes the TLS tests' throw-away CA and certificates.
command -v openssl >/dev/null 2>&1 || missing+=(openssl)

if [ "${#missing[@]}" -gt 0 ]; then
  if ! command -v apt-get >/dev/null 2>&1; then
    echo "scripts/test.sh: ${missing[*]} not installed and there is no apt-get here;" >&2
    echo "install them with your package manager (or set LOCK_TESTS_REDIS_SERVER," >&2
    echo "LOCK_TESTS_ETCD, PROTOC to their paths), then run this again." >&2
    exit 1
  fi
  if [ "$(id -u)" -eq 0 ]; then
    sudo=()
  elif command -v sudo >/dev/null 2>&1; then
    sudo=(sudo)
  else
    echo "scripts/test.sh: ${missing[*]} not installed, and installing needs root:" >&2
    echo "run 'apt-get update && apt-get install -y ${missing[*]}' as root, then run this again." >&2
    exit 1
  fi
  echo "scripts/test.sh: installing ${missing[*]}" >&2
  export DEBIAN_FRONTEND=noninteractive
  "${sudo[@]}" apt-get update -qq
  "${sudo[@]}" apt-get install -y -qq "${missing[@]}" >/dev/null
fi

cargo test --workspace --features lock-tests/etcd,lock-cli/etcd "$@"
