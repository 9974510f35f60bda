"""A redis-py `Lock` on one key, driven line by line by tests/tests/interop.rs.

Usage: lock.py --port PORT --key KEY --ttl-ms TTL. Prints "ready" once connected, then answers one
line per command read on stdin:

  try                  one attempt (SET NX PX): "held" or "refused"
  wait MS              attempts every 10 ms for up to MS: "held" or "refused"
  release              redis-py's compare-and-delete: "released", or "not-owned" when the key no
                       longer holds this lock's token (LockNotOwnedError)
  count COUNTER N      N times: take the lock (waiting), GET COUNTER, +1, SET COUNTER, release;
                       then "counted"

Tokens are never printed.
"""

import argparse
import sys

import redis
from redis.exceptions import LockNotOwnedError


def say(line):
    print(line, flush=True)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--key", required=True)
    parser.add_argument("--ttl-ms", type=int, required=True)
    args = parser.parse_args()
    client = redis.Redis(host="127.0.0.1", port=args.port, socket_timeout=5)
    client.ping()
    lock = client.lock(args.key, timeout=args.ttl_ms / 1000, sleep=0.01, thread_local=False)
    say("ready")
    for line in sys.stdin:
        command, *rest = line.split()
        if command == "try":
            say("held" if lock.acquire(blocking=False) else "refused")
        elif command == "wait":
            taken = lock.acquire(blocking=True, blocking_timeout=int(rest[0]) / 1000)
            say("held" if taken else "refused")
        elif command == "release":
            try:
                lock.release()
                say("released")
            except LockNotOwnedError:
                say("not-owned")
        elif command == "count":
            counter, times = rest[0], int(rest[1])
            for _ in range(times):
                # No bound: the test bounds the whole run.
                lock.acquire(blocking=True)
                value = int(client.get(counter) or 0)
                client.set(counter, value + 1)
                lock.release()
            say("counted")
        else:
            sys.exit(f"lock.py: unknown command {command!r}")


if __name__ == "__main__":
    main()
