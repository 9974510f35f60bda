//! Test helper for `tests/election.rs`: one campaigner of an election.
//!
//! Usage: `election_worker <redis-url[,url...]> <election> <data-prefix> <ttl-ms> <lead-ms>`
//! (several URLs: Redlock over them, with the config's default fencing, off: the election
//! fences anyway; the data lives on the first).
//!
//! It campaigns once. Elected, it appends `<pid> <epoch> <elected-ns>` to the list
//! `<data-prefix>:leaders` and leads for `<lead-ms>`. Every 20 ms it reads the clock
//! ([`now_ns`]), checks that it still leads, prints a `lock_tests::history::Grant` line from
//! its election to that reading (the last one printed before a SIGKILL lies inside what it
//! held), and writes its epoch to the resource `<data-prefix>:epoch`, which refuses an epoch
//! below the one it has (a deposed leader that still writes): a refusal is printed as
//! `refused epoch=<e> resource=<r>`. Then it resigns. Exits with 0 after the resignation, 1 when
//! the leadership was lost, 2 on bad arguments, 3 on a config, lock or Redis error (on stderr).

use std::process::ExitCode;
use std::time::{Duration, Instant};

use lock_runtime::{LockClient, LockConfig, LockError};
use lock_tests::history::Grant;

/// How often the leader reports and writes.
const BEAT: Duration = Duration::from_millis(20);

/// KEYS: the resource. ARGV: the writer's epoch. Stores it unless the resource has a larger
/// one; returns 0 when stored, else the resource's epoch. (Epochs stay below 2^53: exact in Lua.)
static FENCED_WRITE: &str = r"
local held = tonumber(redis.call('GET', KEYS[1]) or '0')
if tonumber(ARGV[1]) < held then
    return held
end
redis.call('SET', KEYS[1], ARGV[1])
return 0
";

struct Args {
    urls: String,
    election: String,
    data: String,
    ttl: Duration,
    lead: Duration,
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    let Some(args) = parse_args() else {
        eprintln!(
            "usage: election_worker <redis-url[,url...]> <election> <data-prefix> <ttl-ms> <lead-ms>"
        );
        return ExitCode::from(2);
    };
    lead(&args).await.unwrap_or_else(|err| {
        eprintln!("election_worker ({}): {err}", std::process::id());
        ExitCode::from(3)
    })
}

fn parse_args() -> Option<Args> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [urls, election, data, ttl_ms, lead_ms] = args.as_slice() else {
        return None;
    };
    Some(Args {
        urls: urls.clone(),
        election: election.clone(),
        data: data.clone(),
        ttl: Duration::from_millis(ttl_ms.parse().ok()?),
        lead: Duration::from_millis(lead_ms.parse().ok()?),
    })
}

async fn lead(args: &Args) -> Result<ExitCode, String> {
    let urls: Vec<&str> = args.urls.split(',').collect();
    let config = match urls.as_slice() {
        [one] => LockConfig::single(*one),
        many => LockConfig::redlock(many.iter().copied()),
    };
    let client = LockClient::new(config).map_err(|e| e.to_string())?;
    let data_url = urls[0];
    let redis = redis::Client::open(data_url).map_err(|e| e.to_string())?;
    let mut con = redis
        .get_multiplexed_async_connection()
        .await
        .map_err(|e| e.to_string())?;
    let leadership = client
        .election(args.election.as_str())
        .ttl(args.ttl)
        .campaign()
        .await
        .map_err(|e| format!("campaign: {e}"))?;
    let elected_ns = lock_tests::history::now_ns();
    let epoch = leadership.epoch();
    let _: i64 = redis::cmd("RPUSH")
        .arg(format!("{}:leaders", args.data))
        .arg(format!("{} {epoch} {elected_ns}", std::process::id()))
        .query_async(&mut con)
        .await
        .map_err(|e| format!("record the election: {e}"))?;
    let fenced_write = redis::Script::new(FENCED_WRITE);
    let resource = format!("{}:epoch", args.data);
    let until = Instant::now() + args.lead;
    while Instant::now() < until {
        // The clock first: not lost after it was read, the lock was ours when it was read.
        let beat = Grant::ending_now(&args.election, Some(epoch), elected_ns);
        if leadership.is_lost() {
            eprintln!("election_worker ({}): lost", std::process::id());
            return Ok(ExitCode::from(1));
        }
        println!("{beat}");
        let refused_by: u64 = fenced_write
            .key(&resource)
            .arg(epoch)
            .invoke_async(&mut con)
            .await
            .map_err(|e| format!("write the resource: {e}"))?;
        if refused_by != 0 {
            println!("refused epoch={epoch} resource={refused_by}");
        }
        tokio::time::sleep(BEAT).await;
    }
    match leadership.resign().await {
        Ok(()) => Ok(ExitCode::SUCCESS),
        Err(LockError::Lost { .. }) => Ok(ExitCode::from(1)),
        Err(err) => Err(format!("resign: {err}")),
    }
}
