//! `lockctl release KEY --force`: the library's `force_release`, behind `--force` and a
//! confirmation.

use std::io::{BufRead as _, IsTerminal as _, Write as _};

use crate::error::{CliError, Exit};
use crate::inspect::describe;
use crate::target::Target;

pub(crate) async fn run(
    target: &Target,
    key: &str,
    force: bool,
    yes: bool,
    json: bool,
) -> Result<Exit, CliError> {
    if !force {
        return Err(CliError::new(format!(
            "refusing to release `{key}` without --force: it takes the lock away from its holder"
        )));
    }
    let client = target.client()?;
    if !yes {
        if !std::io::stdin().is_terminal() {
            return Err(CliError::new(format!(
                "refusing to release `{key}` without confirmation: stdin is not a terminal (pass --yes)"
            )));
        }
        match client.inspect(key).await.map_err(|e| target.error(e))? {
            Some(info) => eprint!("{}", describe(&info, target.redlock().is_some())),
            None if target.redlock().is_some() => {
                eprintln!("lock `{key}` is not held by a majority of the nodes");
            }
            None => eprintln!("lock `{key}` is not held"),
        }
        if !confirm(key)? {
            return Err(CliError::new(format!("release of `{key}` cancelled")));
        }
    }
    let released = client
        .force_release(key)
        .await
        .map_err(|e| target.error(e))?;
    if json {
        println!(
            "{}",
            serde_json::json!({ "key": key, "released": released })
        );
    } else if released {
        println!("released `{key}`");
    } else {
        eprintln!("lock `{key}` was not held");
    }
    Ok(if released { Exit::Ok } else { Exit::NotFound })
}

fn confirm(key: &str) -> Result<bool, CliError> {
    eprint!("release `{key}` whoever holds it? [y/N] ");
    let _ = std::io::stderr().flush();
    let mut answer = String::new();
    std::io::stdin()
        .lock()
        .read_line(&mut answer)
        .map_err(|e| CliError::new(format!("reading the confirmation: {e}")))?;
    Ok(matches!(answer.trim(), "y" | "Y" | "yes" | "YES" | "Yes"))
}
