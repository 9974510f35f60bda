#!/usr/bin/env bash
# How much machine code each `#[distributed_lock]` fn adds, as a new user would measure it: a
# binary crate with N annotated async fns (each with its own key template and body) that calls
# them all, built in release mode with N=1 and N=200; the growth of the `.text` section divided by
# 199 is the cost of one annotated fn. Also with `#[tracing::instrument]` in place of the
# attribute, as a yardstick. Prints one line per variant; the figures go to BENCHMARKS.md.
#
# Usage: scripts/expansion-size.sh [N]   (default 200). Builds under target/expansion-size/.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
n=${1:-200}
work=$root/target/expansion-size
mkdir -p "$work"

# $1: variant (lock | instrument), $2: how many fns
make_crate() {
  local variant=$1 count=$2 dir=$work/$1-$2
  mkdir -p "$dir/src"
  local deps
  if [ "$variant" = lock ]; then
    deps="lock-runtime = { path = \"$root/lock-runtime\" }"
  else
    deps='tracing = { version = "0.1", default-features = false, features = ["std", "attributes"] }'
  fi
  cat >"$dir/Cargo.toml" <<TOML
[package]
name = "size-$variant-$count"
version = "0.0.0"
edition = "2024"
publish = false

[workspace]

[dependencies]
$deps
tokio = { version = "1", features = ["rt", "macros"] }

[profile.release]
debug = false
TOML
  {
    echo "#![allow(dead_code)]"
    if [ "$variant" = lock ]; then
      echo "use lock_runtime::{distributed_lock, LockConfig, LockError};"
      echo "type E = LockError;"
    else
      echo "#[derive(Debug)] pub struct E;"
    fi
    for i in $(seq 1 "$count"); do
      if [ "$variant" = lock ]; then
        echo "#[distributed_lock(key = \"job$i:<id>\", ttl = \"10s\")]"
      else
        echo "#[tracing::instrument]"
      fi
      echo "pub async fn job$i(id: u64) -> Result<u64, E> { tokio::task::yield_now().await; Ok(id + $i) }"
    done
    echo "#[tokio::main(flavor = \"current_thread\")]"
    echo "async fn main() {"
    if [ "$variant" = lock ]; then
      echo "    lock_runtime::init(LockConfig::in_memory()).unwrap();"
    fi
    echo "    let mut sum = 0u64;"
    for i in $(seq 1 "$count"); do
      echo "    sum += job$i(std::hint::black_box($i)).await.unwrap_or(0);"
    done
    echo "    println!(\"{sum}\");"
    echo "}"
  } >"$dir/src/main.rs"
  (cd "$dir" && CARGO_TARGET_DIR=$work/target cargo build --release -q)
  size -A "$work/target/release/size-$variant-$count" | awk '$1 == ".text" { print $2 }'
}

for variant in lock instrument; do
  one=$(make_crate "$variant" 1)
  many=$(make_crate "$variant" "$n")
  per=$(( (many - one) / (n - 1) ))
  echo "$variant: .text $one bytes with 1 fn, $many with $n: $per bytes per fn"
done
