//! `tasks [filter]`: `GET /tasks` with Disbatch 4's options (`--limit`, default 20,
//! `--skip`, `--count`, `--fields`, `--epoch`, `--terse`/`--noterse`, `--full`); `--limit 0`
//! lists every match, following the `disbatch-next` cursor page by page.

use serde_json::Value;

use super::client::{encode, Client};
use super::options::{Cli, DEFAULT_TASKS_LIMIT};
use super::output::{tasks_table, Output};
use super::table::cell;
use super::CliError;

/// Tasks per request with `--limit 0` (the DCI's largest `limit`).
const PAGE: u64 = 10_000;
/// Tasks per request with `--limit 0 --full` (the DCI's largest `limit` with `full`).
const FULL_PAGE: u64 = crate::api::MAX_FULL_LIMIT;

/// The query of `GET /tasks` for these options, without `limit`.
pub(super) fn query(cli: &Cli, filter: Option<&str>) -> Result<Vec<String>, CliError> {
    let mut q = Vec::new();
    if let Some(f) = filter {
        let value: Value =
            serde_json::from_str(f).map_err(|e| CliError::Usage(format!("the filter is not valid JSON: {e}")))?;
        q.push(format!("filter={}", encode(&value.to_string())));
    }
    if let Some(s) = cli.skip {
        q.push(format!("skip={s}"));
    }
    if cli.count {
        q.push("count=1".into());
    }
    if let Some(f) = &cli.fields {
        q.push(format!("fields={}", encode(f)));
    }
    for (set, name) in [(cli.epoch, "epoch"), (cli.terse_flag()?, "terse"), (cli.full, "full")] {
        if set {
            q.push(format!("{name}=1"));
        }
    }
    Ok(q)
}

/// Runs `tasks`.
pub(super) async fn tasks(client: &Client, cli: &Cli, filter: Option<&str>) -> Result<Output, CliError> {
    let mut q = query(cli, filter)?;
    if cli.count {
        let v = client.get(&format!("/tasks?{}", q.join("&"))).await?;
        return Ok(Output::new(v, |v| format!("{}\n", cell(&v["count"]))));
    }
    let limit = cli.limit.unwrap_or(DEFAULT_TASKS_LIMIT);
    if limit > 0 {
        q.push(format!("limit={limit}"));
        return Ok(Output::new(
            client.get(&format!("/tasks?{}", q.join("&"))).await?,
            tasks_table,
        ));
    }
    q.push(format!("limit={}", if cli.full { FULL_PAGE } else { PAGE }));
    let mut all = Vec::new();
    let mut next: Option<String> = None;
    loop {
        let mut page_query = q.clone();
        if let Some(cursor) = &next {
            // The cursor replaces `skip`, which applies to the first page only.
            page_query.retain(|p| !p.starts_with("skip="));
            page_query.push(format!("next={}", encode(cursor)));
        }
        let (page, cursor) = client.get_page(&format!("/tasks?{}", page_query.join("&"))).await?;
        match page {
            Value::Array(items) => all.extend(items),
            other => {
                return Err(CliError::Http(format!(
                    "GET /tasks answered {other} instead of a list of tasks"
                )))
            }
        }
        match cursor {
            Some(c) if Some(&c) != next.as_ref() => next = Some(c),
            _ => break,
        }
    }
    Ok(Output::new(Value::Array(all), tasks_table))
}

#[cfg(test)]
mod tests {
    use clap::Parser as _;

    use super::*;

    fn query_of(args: &[&str], filter: Option<&str>) -> String {
        let cli = Cli::try_parse_from(std::iter::once("disbatch").chain(args.iter().copied())).unwrap();
        query(&cli, filter).unwrap().join("&")
    }

    #[test]
    fn options_become_the_query() {
        assert_eq!(query_of(&["tasks"], None), "");
        assert_eq!(
            query_of(
                &["tasks", "--skip", "4", "--fields", "status,node", "--epoch", "--terse"],
                Some(r#"{"queue": "q"}"#)
            ),
            "filter=%7B%22queue%22%3A%22q%22%7D&skip=4&fields=status%2Cnode&epoch=1&terse=1"
        );
        assert_eq!(query_of(&["tasks", "--terse", "--noterse", "--full"], None), "full=1");
        assert_eq!(query_of(&["tasks", "--count"], None), "count=1");
    }
}
