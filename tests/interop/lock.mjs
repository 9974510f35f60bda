// node-redlock (the `redlock` package, over `ioredis` clients) on one key over one or more Redis
// nodes, driven line by line by tests/tests/interop.rs.
//
// Usage: node lock.mjs --node-modules DIR --port PORT [--port PORT ...] --key KEY --ttl-ms TTL.
// DIR is where `npm ci` installed this folder's package-lock.json. Prints "ready" once every node
// answered, then one line per command read on stdin:
//
//   try                  one Redlock attempt over all the nodes: "held" or "refused"
//   wait MS              attempts every 10 ms for up to MS: "held" or "refused"
//   release              Redlock's compare-and-delete on every node: "released", or "not-owned"
//                        when a majority no longer holds this lock's value
//   count COUNTER N      N times: take the lock (waiting), GET COUNTER (on the first node), +1,
//                        SET COUNTER, release; then "counted"
//
// Lock values are never printed.

import { createRequire } from "node:module";
import { join } from "node:path";
import { createInterface } from "node:readline";
import { parseArgs } from "node:util";

const { values } = parseArgs({
  options: {
    "node-modules": { type: "string" },
    port: { type: "string", multiple: true },
    key: { type: "string" },
    "ttl-ms": { type: "string" },
  },
});
const require = createRequire(join(values["node-modules"], "package.json"));
const Redis = require("ioredis");
const Redlock = require("redlock");

const key = values.key;
const ttl = Number(values["ttl-ms"]);
const clients = values.port.map(
  (port) => new Redis({ host: "127.0.0.1", port: Number(port), maxRetriesPerRequest: 1 }),
);
// One attempt per call: the waiting below is this script's, with its own bound.
const redlock = new Redlock(clients, { retryCount: 0 });
redlock.on("clientError", (err) => console.error(`lock.mjs: ${err.message}`));

const say = (line) => process.stdout.write(`${line}\n`);
const pause = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

let lock = null;

async function attempt() {
  try {
    lock = await redlock.lock(key, ttl);
    return true;
  } catch (err) {
    if (err instanceof Redlock.LockError) return false;
    throw err;
  }
}

async function waitFor(ms) {
  const until = Date.now() + ms;
  for (;;) {
    if (await attempt()) return true;
    if (Date.now() >= until) return false;
    await pause(10);
  }
}

async function release() {
  try {
    await lock.unlock();
    return true;
  } catch (err) {
    if (err instanceof Redlock.LockError) return false;
    throw err;
  } finally {
    lock = null;
  }
}

async function run(command, rest) {
  switch (command) {
    case "try":
      return (await attempt()) ? "held" : "refused";
    case "wait":
      return (await waitFor(Number(rest[0]))) ? "held" : "refused";
    case "release":
      return (await release()) ? "released" : "not-owned";
    case "count": {
      const [counter, times] = [rest[0], Number(rest[1])];
      for (let i = 0; i < times; i++) {
        // No bound: the test bounds the whole run.
        await waitFor(Infinity);
        const value = Number((await clients[0].get(counter)) ?? 0);
        await clients[0].set(counter, value + 1);
        await release();
      }
      return "counted";
    }
    default:
      throw new Error(`unknown command ${command}`);
  }
}

await Promise.all(clients.map((c) => c.ping()));
say("ready");
for await (const line of createInterface({ input: process.stdin })) {
  const [command, ...rest] = line.trim().split(/\s+/);
  say(await run(command, rest));
}
await Promise.all(clients.map((c) => c.quit()));
