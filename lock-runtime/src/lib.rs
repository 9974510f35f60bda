//! Distributed locks on Redis behind one attribute.
//!
//! ```no_run
//! use lock_runtime::{distributed_lock, LockConfig, LockError};
//!
//! #[derive(Debug, thiserror::Error)]
//! enum WalletError {
//!     #[error(transparent)]
//!     Lock(#[from] LockError),
//!     #[error("insufficient funds")]
//!     Insufficient,
//! }
//!
//! #[distributed_lock(key = "wallet:<user_id>", ttl = "10s", wait = "5s")]
//! async fn withdraw(user_id: u64, amount: u64) -> Result<u64, WalletError> {
//!     // Only one caller per user id runs this, across every process that shares the Redis.
//!     # let balance = 100;
//!     if amount > balance { return Err(WalletError::Insufficient); }
//!     Ok(balance - amount)
//! }
//!
//! #[tokio::main]
//! async fn main() -> Result<(), WalletError> {
//!     lock_runtime::init(LockConfig::single("redis://127.0.0.1:6379/"))?;  // once, at startup
//!     let left = withdraw(42, 30).await?;
//!     println!("{left} left");
//!     Ok(())
//! }
//! ```
//!
//! Around the body the attribute renders the key, acquires the lock (waiting up to `wait`), renews
//! it while the body runs, and releases it when the body returns, panics or is cancelled. When the
//! lock cannot be had, the body does not run and the function returns the error instead.
//!
//! # What to add to `Cargo.toml`
//!
//! ```toml
//! [dependencies]
//! lock-runtime = "0.1"
//! # The example's async `main` (`#[tokio::main]`); the locks work from any runtime, or none.
//! tokio = { version = "1.47", features = ["macros", "rt-multi-thread"] }
//! # The example's error type.
//! thiserror = "2"
//! ```
//!
//! - Your own redis-rs client or connections ([`LockConfig::from_client`],
//!   [`LockConfig::redlock_from_clients`], [`fence`]): name them through `lock_runtime::redis`
//!   (`lock_runtime::redis::Client`), the redis-rs this crate is built with and re-exports, or
//!   pin a `redis` dependency of your own to the same major version, 1.x. Another major
//!   version's types are not these.
//! - Cargo features of this crate: `tls` (`rediss://`, etcd `https://`), `etcd` (an etcd v3
//!   cluster; building it needs `protoc`), `metrics`, `tonic` and `axum` (the conversions in
//!   [Your error type](#your-error-type)), `testing` (in `[dev-dependencies]`, see
//!   [Testing your code](#testing-your-code)).
//!
//! # The attribute
//!
//! `#[distributed_lock(key = "...", ttl = "...", wait = "...", max_hold = "...", min_hold = "...",
//! reentrant = BOOL, fencing = BOOL, fair = BOOL, shared = BOOL, permits = N, guard = NAME,
//! map_err = path, crate = "path")]`, or `keys = ["...", "..."]` in place of `key`.
//!
//! | argument | required | meaning | default |
//! |---|---|---|---|
//! | `key` | one of `key`/`keys` | the lock's name: a template, see below | |
//! | `keys` | one of `key`/`keys` | several templates, one lock over all of them: see [Several keys](#several-keys) | |
//! | `ttl` | no | time to live, e.g. `"500ms"`, `"10s"`, `"1m 30s"` (10ms to 365 days); renewed while the body runs, so it bounds how long a *crashed* holder blocks others, not how long the body may take | [`LockConfig::default_ttl`] (30s) |
//! | `wait` | no | how long to wait while someone else holds it; `"0s"` = one attempt | [`LockConfig::default_wait`] (0) |
//! | `max_hold` | no | the longest the lock may be held; past it renewal stops, an async body is cancelled, a sync body's success is replaced, and the call returns [`LockError::MaxHoldExceeded`] | [`LockConfig::max_hold`] (none) |
//! | `min_hold` | no | the least time the lock is kept after its grant, even when the body returns earlier: see [Min hold](#min-hold); at most `max_hold` (both given: a compile error) and 365 days, exclusive locks only | none |
//! | `reentrant` | no | whether a call made inside a locked body of the same task (async) or thread (sync) on keys it already holds joins that hold: see [Reentrancy](#reentrancy) | `true` |
//! | `fencing` | no | whether the lock carries a fencing token ([`LockGuard::fencing_token`], read through `guard`; [`Lock::fencing`]), a number that grows with every grant of the key, for a resource that checks it ([`fence`]); on Redis it costs the grant a counter, so it is off unless asked for; etcd and in memory carry one whatever this says | [`LockConfig::fencing`] (off) |
//! | `fair` | no | waiters are granted the lock in arrival order, handed over on the server ([`Lock::fair`]); one key; on Redlock the order is the gate node's line | `false` |
//! | `shared` | no | a read lock: many shared holders, or one exclusive holder of the key; a waiting writer keeps new readers out ([`Lock::shared`]); one key | `false` |
//! | `permits` | no | a semaphore: up to N holders ([`Lock::permits`]); every caller of the key must give the same N; one key; not on Redlock (unsafe over independent majorities) | none |
//! | `guard` | no | binds `NAME: &LockGuard` inside the body (fencing token, [`LockGuard::is_lost`], [`LockGuard::lost`]) | |
//! | `map_err` | no | a `fn(LockError) -> E` that makes the function's error type `E` of a lock failure, for an `E` without `From<LockError>` (a foreign type): see [Your error type](#your-error-type) | `From<LockError>` |
//! | `crate` | no | path of this crate when it is re-exported, e.g. `crate = "my_lib::locks"` | `::lock_runtime` |
//!
//! Durations are checked at compile time: a `ttl` outside 10ms..=365 days is a compile error, by
//! the same rule ([`lock_rules`](https://docs.rs/lock-rules)) the runtime applies to
//! [`Lock::ttl`] and [`LockConfig::default_ttl`]. There is no infinite ttl: every lock expires if
//! its holder dies. `Lock::wait(Duration::MAX)` waits as long as it takes.
//!
//! ## Key templates
//!
//! - `<name>`: a parameter, rendered with `Display`: `key = "wallet:<user_id>"`.
//! - `<name.field.sub>`: a field path: `key = "order:<order.id>"`.
//! - `<self.field>`: a field of the receiver, in methods: `key = "shard:<self.shard_id>"`.
//! - Everything else is literal, including braces, so `key = "{tenant}:<id>"` keeps the Redis
//!   Cluster hash tag `{tenant}`. Write `<<` and `>>` for a literal `<` and `>`.
//! - Placeholders read parameters and their fields; they do not call methods.
//! - `<name>` may also be a name bound inside a parameter's pattern, so extractor parameters work
//!   as written: `Path((user, amount))` binds `user` and `amount`, `Query(Page { number, .. })`
//!   binds `number`, `Point { x, y: why }` binds `x` and `why`; what `..` or `_` leaves out is not
//!   bound, so it is not a name. Field paths work on them too:
//!
//! ```no_run
//! # use lock_runtime::{distributed_lock, LockError};
//! # pub struct State<T>(pub T);
//! # pub struct Path<T>(pub T);
//! # pub struct App { tenant: String, balance: i64 }
//! #[distributed_lock(key = "{<app.tenant>}:wallet:<user>", wait = "5s")]
//! async fn withdraw(
//!     State(app): State<App>,
//!     Path((user, amount)): Path<(u64, i64)>,
//! ) -> Result<i64, LockError> {
//!     // `app`, `user` and `amount` are the body's, as without the attribute
//!     Ok(app.balance - amount)
//! }
//! ```
//!
//! Parts are rendered from borrows before the body runs: arguments are neither moved nor cloned.
//! An unknown name, `<>`, an unterminated `<`, or `<self..>` outside a method is a compile error
//! naming the placeholder and listing the parameters and the names their patterns bind.
//!
//! ## Sync and async functions
//!
//! Both work, as free functions, inherent or trait-impl methods (`&self`, `&mut self`, `self`),
//! with generics, `where` clauses, `impl Trait` arguments, and native `async fn` in traits. The
//! body stays in your function, so `return` and `?` mean what they did. An async function's future
//! is `Send` when its body's is. A sync function blocks its thread while it waits for the lock, and
//! may be called from async code (it blocks that thread, never panics).
//!
//! ## Your error type
//!
//! The return type must be `Result<T, E>` (through an alias too: `std::io::Result<T>`,
//! `anyhow::Result<T>`), and a lock failure becomes an `E` one of four ways:
//! - `E: From<LockError>` (see [`FromLockError`]): your own error with a `#[from] LockError`
//!   variant;
//! - `map_err = path`: a `fn(LockError) -> E`, for an `E` you cannot give `From<LockError>` (a
//!   framework's or another crate's type: the orphan rule); a function of the wrong type is one
//!   compile error, at the argument;
//! - the conversions provided: `std::io::Error` (see its `From<LockError>`: the kind says what
//!   happened, the `LockError` is the inner error), `anyhow::Error`,
//!   `Box<dyn std::error::Error + Send + Sync>`, with feature `tonic` `tonic::Status` (`Contended`
//!   and `Lost`: `ABORTED`, `Unavailable`: `UNAVAILABLE`, `MaxHoldExceeded`:
//!   `DEADLINE_EXCEEDED`, the rest `INTERNAL`), and with feature `axum` [`LockError`] is an axum
//!   response (`Contended` and `Lost` 409, `Unavailable` 503, `MaxHoldExceeded` 504, the rest 500,
//!   the message as the body), so a handler returns `Result<T, LockError>`;
//! - [`LockError`] itself.
//!
//! An `E` with neither `From<LockError>` nor `map_err` is one compile error that names both.
//!
//! ```
//! use lock_runtime::{distributed_lock, LockError};
//!
//! /// A foreign error type: no `From<LockError>` can be written for it here.
//! # #[derive(Debug)] pub struct Status(String);
//! fn to_status(err: LockError) -> Status {
//!     Status(err.to_string())
//! }
//!
//! #[distributed_lock(key = "job:<id>", map_err = to_status)]
//! async fn job(id: u64) -> Result<(), Status> {
//!     Ok(())
//! }
//! ```
//!
//! ## Several keys
//!
//! ```no_run
//! # use lock_runtime::{distributed_lock, LockError};
//! #[distributed_lock(keys = ["wallet:<from>", "wallet:<to>"], wait = "5s")]
//! async fn transfer(from: u64, to: u64, amount: u64) -> Result<(), LockError> {
//!     // both wallets are ours here
//!     Ok(())
//! }
//! ```
//!
//! One lock over all the keys, taken all or nothing. The keys are rendered, sorted and
//! deduplicated, so `transfer(a, b)` and `transfer(b, a)` take them in the same order and never
//! deadlock, and `transfer(a, a)` locks one key. On one Redis node (and on each node of Redlock)
//! every key is taken, renewed and released by one script call, atomically; `wait` bounds the
//! whole acquisition, and a waiter wakes on the release of any of the keys. The lock is lost when
//! any key is lost (`Lost { key }` names it). Each key has its own fencing token
//! ([`LockGuard::fencing_token_of`]). Programmatically: [`Lock::many`].
//!
//! ## Reentrancy
//!
//! A locked function that calls another locked function on the same key (or on a subset of its
//! keys) from the same task (async) or thread (sync) joins the outer lock: no round trip, no
//! waiting, and the lock is released when the outermost call ends; a loss reaches every level.
//! Spawned tasks and other threads are never taken for the holder: they wait like anyone else.
//! A nested call on more keys than the outer lock holds is a [`LockError::Config`] error
//! (taking the rest would not be atomic: lock them all in the outer call). With
//! `reentrant = false` a nested call is an ordinary caller: it waits for the outer call, which
//! cannot end meanwhile, so it returns `Contended` when its `wait` runs out.
//!
//! ## Max hold
//!
//! Renewal keeps a lock alive for as long as the body runs, so a body that hangs would hold it
//! forever. `max_hold = "2m"` (or [`LockConfig::max_hold`] for every lock) caps that: past it
//! renewal stops, an async body is cancelled at its next `.await` and the lock released at once,
//! a sync body runs to its end (the lock then expires within one TTL if it never ends), and the
//! call returns [`LockError::MaxHoldExceeded`].
//!
//! ## Min hold
//!
//! A scheduled job that runs on several instances should run once per tick, even when it
//! finishes in 200 ms on one instance and another instance's timer fires 300 ms later.
//! `min_hold = "30s"` ([`Lock::min_hold`]; ShedLock's `lockAtLeastFor`) keeps the lock until
//! 30 s after its grant: a body that returns earlier (or a guard released or dropped earlier)
//! does not delete the keys but leaves them to expire then (Redis: compare the token and
//! `PEXPIRE` to the time left; Redlock: on every node, settled by a quorum as a release is; etcd:
//! the keys move to a new lease of the time left, rounded up to whole seconds, so they may live
//! up to a second longer). The call is not blocked: it returns as soon as that request is
//! answered, and nothing is renewed after it. A `min_hold` longer than the `ttl` extends the keys
//! at release. Meanwhile other callers get `Contended`, or wait until the keys expire (the
//! release wakes no waiter: their pause is capped by the key's time to live). Let go after
//! `min_hold` passed, the keys are deleted as usual.
//!
//! ```no_run
//! use lock_runtime::{distributed_lock, LockError};
//!
//! // Every instance fires at 02:00; the first one runs the report, the others are `Contended`.
//! #[distributed_lock(key = "report:<day>", min_hold = "5m", max_hold = "1h")]
//! async fn nightly_report(day: &str) -> Result<(), LockError> {
//!     # let _ = day;
//!     Ok(())
//! }
//! ```
//!
//! A lock that was lost stays [`LockError::Lost`]; [`shutdown`] leaves locks let go before their
//! `min_hold` alone (they end by themselves), and a lock still held at shutdown, though its holder
//! sees it lost, is left for the rest of its `min_hold`. `min_hold` applies to exclusive locks
//! (one key or several); with `fair`, `shared` or `permits`, or longer than `max_hold`, it is a
//! compile error in the attribute and a [`LockError::Config`] error naming `min_hold` in the
//! builder (or against [`LockConfig::max_hold`]). Zero asks for nothing.
//!
//! # Leader election
//!
//! Of all the campaigners on one name, in every process that shares the backend, one leads at a
//! time: [`Election::campaign`] waits until elected (cancellable), and the [`Leadership`] it
//! returns has an epoch that grows with every leader, knows when it is lost, and is given up
//! with [`Leadership::resign`] (or by dropping it). [`Election::leader`] says who leads now and
//! [`Election::observe`] each change. An election named `name` is the lock `name` (exclusive,
//! not reentrant, renewed while held, always fenced: the epoch is its fencing token), so
//! [`inspect`]`(name)` and `lockctl inspect name` show it, and a crashed leader is replaced
//! within its ttl.
//!
//! ```
//! # #[tokio::main]
//! # async fn main() -> Result<(), lock_runtime::LockError> {
//! use lock_runtime::{LockClient, LockConfig};
//!
//! let client = LockClient::new(LockConfig::in_memory())?;
//! let first = client.election("scheduler").campaign().await?; // free: elected at once
//! let epoch = first.epoch();
//! // A rival waits for as long as the first leads; it is elected when the first resigns.
//! let rival = client.election("scheduler");
//! let (next, resigned) = tokio::join!(rival.campaign(), first.resign());
//! resigned?;
//! let next = next?;
//! assert!(next.epoch() > epoch);
//! next.resign().await?;
//! # Ok(())
//! # }
//! ```
//!
//! # Errors
//!
//! | error | when | the body |
//! |---|---|---|
//! | [`LockError::Contended`] `{ key, waited }` | someone else holds the lock and `wait` ran out | did not run |
//! | [`LockError::Unavailable`] `{ key, causes }` | Redis unreachable, timed out, refused the credentials or a permission, or stayed busy (`LOADING`, `BUSY`, ...) for the whole `wait`; something other than Redis at the address (`Protocol`, at once); in Redlock mode, too many nodes failed for a quorum | did not run |
//! | [`LockError::Lost`] `{ key }` | the lock was lost while the body ran (renewal refused, key deleted or taken over, renewal not confirmed before the lock's validity ran out, or [`shutdown`] released it) | async: stopped at its next `.await`; sync: ran to the end; a success is replaced by `Lost`, the body's own error is kept |
//! | [`LockError::MaxHoldExceeded`] `{ key, max_hold }` | the body ran past `max_hold` | async: stopped at its next `.await`; sync: ran to the end; a success is replaced, the body's own error is kept |
//! | [`LockError::NotInitialized`] | [`init`] was not called | did not run |
//! | [`LockError::AlreadyInitialized`] | [`init`] was called again after a successful call (the first configuration stays) | |
//! | [`LockError::Runtime`] `{ reason }` | [`shutdown`] was called: every lock call made after it, and an acquisition still waiting when it came; also the library's runtime could not be started, or the runtime given to [`LockConfig::runtime`] shut down before answering | did not run |
//! | [`LockError::Config`] `{ field, reason }` | an invalid value (from [`init`], or a per-call `ttl`; `min_hold` longer than `max_hold` or on a non-exclusive lock), or a nested call on more keys than its enclosing lock holds (`field: "keys"`) | did not run |
//!
//! Infrastructure failures are never reported as contention: `Contended` means Redis answered
//! that someone else holds the lock. Each [`NodeFailure`] in `causes` names the node and a
//! [`FailureKind`] (`Timeout`, `Refused`, `Io`, `Auth`, `Permission`, `Busy`, `Response`,
//! `Protocol`, `Replication`; `Injected` with the feature `testing`). `Timeout`, `Refused`, `Io`,
//! `Busy`, `Replication` and `Injected` are retried within `wait` (a reply whose outcome is
//! unknown is retried with the same token, which the server recognises); the others answer at
//! once. `Protocol` is an address where something other than Redis answers: its cause reads
//! `127.0.0.1:8080: protocol error: not a Redis server (or a TLS port spoken to in plain text)`.
//!
//! # Testing your code
//!
//! With the cargo feature `testing` (in `[dev-dependencies]`: `lock-runtime = { version = "0.1",
//! features = ["testing"] }`; the example below also uses `tokio`, as above),
//! `lock_runtime::testing::Faults` injects faults into the in-memory backend, so tests take the
//! paths a real fault takes, without a server:
//! `faults.unavailable(pattern)` is an outage of the keys a glob (`*`, `?`) matches (their
//! acquires answer [`LockError::Unavailable`], a held lock is lost when its validity runs out),
//! until `faults.available(pattern)` or `faults.clear()`; `faults.lose(key)` takes the key from
//! its holders now (their `lost()` resolves before it returns, an async body is cancelled, the
//! call answers [`LockError::Lost`]). The attribute, [`Lock`], guards and elections behave
//! exactly as on a real fault. See the `testing` module.
//!
//! ```
//! # #[cfg(feature = "testing")]
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), lock_runtime::LockError> {
//! use lock_runtime::testing::Faults;
//! use lock_runtime::{LockClient, LockConfig, LockError};
//!
//! let faults = Faults::new();
//! let locks = LockClient::new(LockConfig::in_memory().faults(faults.clone()))?;
//! let guard = locks.lock("wallet:42").acquire().await?;
//! faults.lose("wallet:42");
//! guard.lost().await; // at once
//! assert!(matches!(guard.release().await, Err(LockError::Lost { .. })));
//! # Ok(())
//! # }
//! # #[cfg(not(feature = "testing"))]
//! # fn main() {}
//! ```
//!
//! # Renewal and loss
//!
//! While the body runs, the lock is extended every third of its TTL (see
//! [`LockConfig::renew_interval`]), and always early enough for the renewal to be confirmed before
//! the lock's validity runs out (one `response_timeout`, at most half the TTL, before it), by one
//! background driver per client, which batches all due locks into one pipeline per node: holding
//! 10,000 locks costs a few round trips per tick, not 10,000 tasks. A lock is declared lost when
//! Redis says it is no longer ours, or when its validity deadline (`ttl - elapsed - drift`,
//! measured on a monotonic clock from the sending of the last confirmed renewal) passes without a
//! confirmed renewal. One failed request is retried, not a loss; one bad lock in a batch does not
//! affect the others.
//!
//! On loss an async body is cancelled at its next `.await` and the call returns `Err(Lost)`; a
//! sync body cannot be interrupted, so it runs to the end and the call returns `Err(Lost)` in place
//! of its success (its own error is kept); it can check `guard.is_lost()` itself between steps.
//! Loss is decided before the release is sent, on the monotonic clock: a lock whose validity ran
//! out is `Lost` whatever the release then says, even when the release cannot reach Redis (a
//! partition). If the body had already finished, a release that finds the lock gone also returns
//! `Err(Lost)`: the body may not have been alone.
//!
//! Releasing happens when the body returns, when it panics (the panic continues), and when an
//! async call's future is dropped: promptly, not after the TTL. Releases started by a drop or a
//! cancellation run in the background: call [`shutdown`] before the process exits so they reach
//! Redis (otherwise the lock stays taken until its TTL runs out).
//!
//! # Configuration
//!
//! Call [`init`] once at startup with one of:
//!
//! - [`LockConfig::single`]`("redis://[user:pass@]host:port/db")`: one Redis master
//!   (`rediss://` with the `tls` feature).
//! - [`LockConfig::redlock`]`([url, url, url])`: the Redlock algorithm over independent masters.
//! - [`LockConfig::cluster`]`([seed, seed])`: Redis Cluster (follows resharding and failover).
//! - [`LockConfig::sentinel`]`("master-name", [sentinel, sentinel, sentinel])`: a master with
//!   replicas behind Redis Sentinel (follows failover).
//! - [`LockConfig::etcd`]`(["http://host:2379", ..])`: an etcd v3 cluster (cargo feature `etcd`);
//!   see "etcd" below.
//! - [`LockConfig::in_memory`]`()`: one process only; tests, demos, single-instance deployments.
//! - [`LockConfig::from_env`]`()`: `LOCK_REDIS_URL`, one URL for single, a comma-separated list for
//!   Redlock, or seeds / sentinels with `LOCK_REDIS_MODE=cluster|sentinel` (and
//!   `LOCK_REDIS_SENTINEL_MASTER`); or `LOCK_ETCD_ENDPOINTS`, a comma-separated list of etcd
//!   endpoints; [`LockConfig::from_env_or`] picks a fallback when neither is set.
//!
//! With Cluster and Sentinel, [`LockConfig::min_replicas`]`(n)` makes a grant (and each renewal)
//! count only once `n` replicas acknowledged it (`WAIT`).
//!
//! With the `tls` feature, [`LockConfig::tls_root_ca`]`(pem)` trusts a private CA instead of the
//! public roots, and [`LockConfig::tls_client_cert`]`(cert, key)` presents a client
//! certificate, on every `rediss://` and etcd `https://` connection. Sentinels that require a
//! password take it in their URLs; [`LockConfig::master_auth`] gives the master's when it
//! differs.
//!
//! Builder methods set the key prefix (default `"lock:"`), default TTL and wait, retry delay and
//! jitter, renew interval, drift factor, connect and response timeouts, fencing, and the runtime
//! that hosts connections ([`LockConfig::runtime`]: by default the library's own, so locks work
//! from any runtime or none, with calls on a single node or Redlock's nodes from a multi-thread
//! runtime going over connections of that runtime; a long-lived application runtime can host
//! everything). `init` validates everything (a bad value is `LockError::Config` naming the field) but does not
//! connect: connections are made on first use. At the end of `main`, [`shutdown`] releases what is
//! still held and waits (at most one request timeout) for releases still in flight. Passwords never appear in `Debug` or errors, and
//! lock tokens are never logged.
//!
//! # Observability
//!
//! - Each acquisition runs in one `distributed_lock` [tracing](https://docs.rs/tracing) span,
//!   with the fields `lock` (the key template, or [`Lock::name`]), `key` and `backend`; it covers
//!   the wait, the body and the release. Inside it: `debug` events for acquired, contended,
//!   unavailable and released; `warn` for lost, `max_hold` passed, forced and failed releases.
//!   Tokens and passwords never appear.
//! - With the `metrics` feature, through the [metrics](https://docs.rs/metrics) facade:
//!   `lock_acquire_total{lock, backend, outcome}`, the histograms `lock_wait_seconds`,
//!   `lock_hold_seconds` and `lock_renewal_lag_seconds`, `lock_lost_total`, and the gauge
//!   `locks_held`, all labelled `lock` (the template, never the rendered key) and `backend`.
//! - [`inspect`] shows a lock: `Ok(None)` when nobody holds it, else [`LockInfo`] (time to
//!   live, fencing token, who holds it as [`Owner`]s (named by [`LockConfig::owner`], or
//!   `host:pid`), each node's view); [`force_release`] frees one whose holder is gone. The `lockctl` command line tool (crate
//!   `lock-cli`) lists, inspects, force-releases and watches locks.
//! - [`layout`] tells how locks lie on the servers, for tools that read them directly (as
//!   `lockctl` does): each lock's Redis keys and etcd key and the way back to its name, the call
//!   that reads what a Redis node holds of a lock and its typed reply, and the quorum arithmetic
//!   of Redlock and `inspect`.
//! - The `observed` example (`cargo run -p lock-examples --bin observed`) runs a workload with a
//!   tracing subscriber and a Prometheus endpoint; DEPLOYING.md's "Operating it" shows its output.
//!
//! # The same code without the macro
//!
//! [`Lock::run`] does what the attribute does (acquire, run the body in the reentrancy scope,
//! cancel it on loss or `max_hold`, release, decide the result):
//!
//! ```no_run
//! use std::time::Duration;
//! use lock_runtime::{Lock, LockError};
//!
//! async fn withdraw(user_id: u64, amount: u64) -> Result<u64, LockError> {
//!     Lock::new(format!("wallet:{user_id}"))
//!         .ttl(Duration::from_secs(10))
//!         .wait(Duration::from_secs(5))
//!         .run(async move { Ok(100 - amount) })
//!         .await
//! }
//! ```
//!
//! By hand, with a [`LockGuard`]:
//!
//! ```no_run
//! use std::time::Duration;
//! use lock_runtime::{Lock, LockError};
//!
//! async fn withdraw(user_id: u64, amount: u64) -> Result<u64, LockError> {
//!     let guard = Lock::new(format!("wallet:{user_id}"))
//!         .ttl(Duration::from_secs(10))
//!         .wait(Duration::from_secs(5))
//!         .acquire()
//!         .await?; // Contended / Unavailable: the body does not run
//!     let body = async move {
//!         // critical section
//!         Ok::<u64, LockError>(100 - amount)
//!     };
//!     let out = tokio::select! {
//!         out = body => Some(out),
//!         () = guard.lost() => None, // cancelled on loss
//!     };
//!     let released = guard.release().await; // Err(Lost) if it was no longer ours
//!     match (out, released) {
//!         // Lost while the body ran: its success does not count (its own error may stay).
//!         (Some(Ok(_)), Err(lost @ LockError::Lost { .. })) => Err(lost),
//!         (None, _) => Err(LockError::Lost { key: format!("wallet:{user_id}") }),
//!         // A release that cannot reach Redis does not undo a body that finished while the
//!         // lock was valid: the TTL frees the lock.
//!         (Some(out), _) => out,
//!     }
//! }
//! ```
//!
//! Sync code uses [`Lock::acquire_blocking`] and [`LockGuard::release_blocking`]. A
//! [`LockClient`] does the same against an explicit backend instead of the global one.
//!
//! # Guarantees and limits
//!
//! Topologies, and what each promises:
//!
//! - Single node: mutual exclusion while the node keeps the key and the holder finishes within the
//!   validity; the fencing token (asked for with `fencing = true`; counted by one counter per
//!   server, strictly increasing per key) lets a resource reject a holder that has been
//!   superseded. A failover to a replica that missed the write can grant the
//!   lock twice: the second grant's token is still larger (see [`LockGuard::fencing_token`]), so
//!   use fencing, `min_replicas`, or Redlock.
//! - Redis Cluster: the single-node promise, per master (all keys of a lock live in one slot;
//!   `MOVED`/`ASK` during resharding are followed, and a lock held while its slot moves stays
//!   held). Replication is asynchronous, so a master that dies before its replica received a
//!   grant opens a double-grant window after the failover (the first holder is told `Lost` at its
//!   next renewal). [`LockConfig::min_replicas`]`(1)` closes the common case: a grant no replica
//!   acknowledged is withdrawn and reported `Unavailable`.
//! - Sentinel: the same as Cluster for one master; the client follows a failover within the
//!   sentinels' failover time + 1 s + one lookup and one request (see [`LockConfig::sentinel`]).
//! - Redlock: mutual exclusion under Redlock's assumptions (independent nodes, bounded clock rate
//!   error, restarts delayed by a TTL or `appendfsync always`); survives the loss of a minority of
//!   nodes. Fencing is opt-in here ([`LockConfig::fencing`]): the token is the largest counter of
//!   the granting majority, written back to a majority of the nodes that granted it before the
//!   guard is returned, so every later majority hands out a larger one (as long as no node loses its counters). Every node
//!   announces a release; a waiter listens at one, the gate of its lock (chosen by the lock's
//!   first key: the node its attempts ask first), and at the others when that one does not
//!   confirm its subscription. A release's part on a node that may have run unseen (no answer,
//!   a reset connection) is sent again until the node answers, so a copy it left there goes,
//!   with the release announced, once the releaser reaches the node again. A waiter whose pause
//!   ran out with the same copy on the gate asks every node: a copy the releaser cannot reach
//!   holds it up for one pause (at most `8 x retry_delay x (1 + retry_jitter)`, 1.2 s by
//!   default), not for that copy's ttl (DEPLOYING.md, "The gate").
//! - Always: a crashed holder's lock frees itself within its TTL; only the owner (by a random
//!   UUID token) extends or releases; loss is signalled; no orphan locks after cancellation, panic
//!   or [`shutdown`]; contention and failure are distinct errors; every acquire answers within its
//!   `wait` plus one request timeout, whatever the servers do. The [`fault_table`] lists each
//!   fault, the promise that holds under it, and the test that proves it.
//! - Other libraries on the same key: an exclusive lock's key (fenced or not, on Redis) is a plain
//!   string holding the holder's token, taken with `SET NX PX` and released by compare-and-delete,
//!   so redis-py's `Lock` and node-redlock on the key [`layout::redis_key`] names exclude it and
//!   are excluded by it, and cannot release it. Their releases announce nothing: a waiter, which
//!   tells their holder from ours by the key's value, notices one at its next attempt, at most
//!   `2 x retry_delay x (1 + retry_jitter)` (300 ms by default, see
//!   [`LockConfig::retry_delay`]) and one request later.
//! - etcd: linearizable. Grants, renewals and releases are committed by a majority of members
//!   (raft), so no failover, restart or partition of a minority, the leader included, can hand a
//!   held lock to a second client; the fencing token is the key's create revision, strictly
//!   increasing across the whole cluster and across leader changes. A crashed holder's lock frees
//!   when its lease expires: its `ttl` rounded up to whole seconds (etcd raises it to its minimum
//!   lease, 1.5 x the election timeout, 2s with default member settings).
//! - In memory: the same semantics inside one process, nothing across processes.
//!
//! # etcd
//!
//! The standard advice for locks that must be correct (money, say) is a consensus system rather
//! than Redis, whose replication is asynchronous and whose Redlock depends on timing assumptions.
//! With the `etcd` feature, the same attribute and API run on etcd v3:
//!
//! ```no_run
//! # #[cfg(feature = "etcd")]
//! # fn main() -> Result<(), lock_runtime::LockError> {
//! lock_runtime::init(lock_runtime::LockConfig::etcd([
//!     "http://10.0.0.1:2379",
//!     "http://10.0.0.2:2379",
//!     "http://10.0.0.3:2379",
//! ]))?;
//! # Ok(())
//! # }
//! # #[cfg(not(feature = "etcd"))]
//! # fn main() {}
//! ```
//!
//! or `LOCK_ETCD_ENDPOINTS=http://10.0.0.1:2379,...` with [`LockConfig::from_env`].
//!
//! - A lock is a key (`key_prefix` + name) bound to a lease, created in one transaction that
//!   succeeds only if every key of the lock is absent (several `keys`: all or nothing). Renewal is
//!   a lease keepalive followed by a read of the keys; the lock is lost when the lease expired,
//!   a key is gone, or the validity deadline (`ttl` after the last confirmed keepalive, on this
//!   process's monotonic clock, never the longer rounded-up lease) passes. Waiting is a watch on
//!   the key's deletion, bounded by `wait`. Release deletes the keys only if they still hold this
//!   acquisition's token and create revision, then revokes the lease.
//! - Fair, shared and permit locks: each caller has an entry under the lock key, bound to its
//!   lease. A fair lock's line and a semaphore's line are ordered by create revision (the first,
//!   or the first N, hold it; so a semaphore's waiters are served in arrival order too), readers
//!   have one entry each, and a writer waiting for readers leaves a mark that keeps new readers
//!   out. The fencing token of each grant is its entry's create revision.
//! - `Contended` means a linearizable read saw another holder. No quorum, unreachable members or
//!   a member without a leader are `Unavailable`, with every endpoint's cause: the client tries
//!   the members in turn, within one connect plus one response timeout.
//! - `http://user:password@host:2379` authenticates as an etcd user (the password never shows in
//!   `Debug` or errors); `https://` needs the `tls` feature as well (webpki roots, or
//!   [`LockConfig::tls_root_ca`]).
//! - The cost: each grant is two raft writes (lease grant, transaction) and each release two more
//!   (delete, revoke), each fsynced by a majority; see BENCHMARKS.md for figures next to
//!   Redis. Building needs `protoc` (Debian: `protobuf-compiler`).

mod acquire;
mod atomic_instant;
mod backend;
mod bridge;
mod callers;
mod client;
mod config;
mod convert;
mod election;
mod engine;
mod error;
mod events;
mod global;
mod guard;
mod hold;
mod info;
mod lock;
mod owner;
mod renew;
mod scope;
mod signal;
mod wait;

#[doc(hidden)]
pub mod __private;
pub mod fence;
pub mod layout;
#[cfg(feature = "testing")]
pub mod testing;

/// What the library promises under each fault, and the test that proves it.
#[doc = include_str!("../FAULTS.md")]
pub mod fault_table {}

// The README's Rust code blocks, compiled (and those not marked `no_run` run) as doctests, so
// that each compiles as written. They use the `axum` and `tonic` conversions: `cargo test
// --workspace` turns both on (through lock-tests), as does `cargo test -p lock-runtime --doc
// --features axum,tonic`.
#[cfg(all(doctest, feature = "axum", feature = "tonic"))]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;

pub use client::LockClient;
pub use config::{ENV_ETCD_ENDPOINTS, ENV_MODE, ENV_SENTINEL_MASTER, ENV_URL, LockConfig};
pub use election::{Election, Leadership};
pub use error::{FailureKind, FromLockError, LockError, NodeFailure};
pub use fence::FenceError;
pub use global::{force_release, init, inspect, shutdown};
pub use guard::LockGuard;
pub use info::{LockInfo, NodeLockState};
pub use lock::Lock;
/// Runs a function body while holding a distributed lock. See the [crate documentation](crate).
pub use lock_macros::distributed_lock;
pub use owner::Owner;
/// The redis-rs this crate is built with (1.x), for the types you name: the `Client` that
/// [`LockConfig::from_client`] and [`LockConfig::redlock_from_clients`] take, the connections
/// that [`fence::set`] and [`fence::get`] write and read through.
///
/// Use `lock_runtime::redis` rather than a `redis` dependency of your own, or pin the same major
/// version: 1.x (`redis = "1"`; cargo then builds one redis-rs for both, and the features you
/// enable on yours, `tls-rustls` say, apply to it). Another major version is another crate
/// whose types are not these: `fence::set` over a redis 0.32 connection fails to compile with
/// "the trait bound `MultiplexedConnection: redis::aio::ConnectionLike` is not satisfied", and
/// only a note that the build has "multiple different versions of crate `redis`".
///
/// It has the features this crate needs: `tokio-comp`, `connection-manager`, `script`, `acl`
/// and `cluster-async`; with this crate's `tls` feature also `tokio-rustls-comp` and
/// `tls-rustls-webpki-roots`.
///
/// ```no_run
/// use lock_runtime::{LockConfig, redis};
///
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let client = redis::Client::open("redis://locker:secret@10.0.0.5:6379/2")?;
/// lock_runtime::init(LockConfig::from_client(client))?;
/// # Ok(())
/// # }
/// ```
pub use redis;
