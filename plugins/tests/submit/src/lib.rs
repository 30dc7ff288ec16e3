//! `submit`: submits the follow-up tasks `params.submit` lists, in order, and prints one
//! stdout line per call: `ok <queue>` or `err <queue>: <message>`. Each entry is
//! `{"queue": …, "params": {…}}`, or `{"queue": …, "text": "…"}` to pass params as raw
//! JSON text (say an array). `params.repeat` submits the whole list that many times
//! (default 1). It then fails (status 2) when `params.fail` is true, succeeds otherwise.
//! Params without `submit` just print `ran` and succeed, so the plugin can run its own
//! follow-ups. `params.again: {"queue": …, "times": n}` submits its own params (`{"again":
//! …}`) n times to that queue: granted its own queue, every follow-up does the same, without
//! end but for the host's bounds.

use serde::{Deserialize, Serialize};

#[derive(Deserialize, Serialize)]
struct Again {
    queue: String,
    times: u32,
}

#[derive(Deserialize)]
struct Entry {
    queue: String,
    #[serde(default)]
    params: serde_json::Value,
    text: Option<String>,
}

#[derive(Deserialize)]
struct Params {
    #[serde(default)]
    submit: Vec<Entry>,
    #[serde(default)]
    fail: bool,
    repeat: Option<u32>,
    again: Option<Again>,
}

fn run(p: Params) -> Result<u32, String> {
    if let Some(a) = &p.again {
        let own = serde_json::json!({ "again": a });
        for _ in 0..a.times {
            match disbatch_plugin::submit(&a.queue, &own) {
                Ok(()) => println!("ok {}", a.queue),
                Err(msg) => println!("err {}: {msg}", a.queue),
            }
        }
    } else if p.submit.is_empty() {
        println!("ran");
    }
    for _ in 0..p.repeat.unwrap_or(1) {
        for e in &p.submit {
            let answer = match &e.text {
                Some(text) => disbatch_plugin::submit_json(&e.queue, text),
                None => disbatch_plugin::submit(&e.queue, &e.params),
            };
            match answer {
                Ok(()) => println!("ok {}", e.queue),
                Err(msg) => println!("err {}: {msg}", e.queue),
            }
        }
    }
    Ok(if p.fail {
        disbatch_plugin::FAILED
    } else {
        disbatch_plugin::SUCCEEDED
    })
}

disbatch_plugin::plugin!(run);
