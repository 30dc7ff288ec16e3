//! The host API a plugin imports (`disbatch:plugin/host`): `progress` and `submit`.

use super::bindings::disbatch::plugin::host;
use super::{Progress, TaskState, MAX_PROGRESS, MAX_PROGRESS_INFO};

impl host::Host for TaskState {
    fn progress(&mut self, percent: Option<f32>, info: Option<String>) {
        let percent = percent.filter(|p| !p.is_nan()).map(|p| p.clamp(0.0, 100.0));
        // Copy the kept prefix: truncating in place would keep the whole allocation.
        let info = info.map(|s| {
            if s.len() > MAX_PROGRESS_INFO {
                let mut end = MAX_PROGRESS_INFO;
                while !s.is_char_boundary(end) {
                    end -= 1;
                }
                s[..end].to_owned()
            } else {
                s
            }
        });
        let p = Progress {
            at: self.started.elapsed(),
            percent,
            info,
        };
        if let Some(sink) = &self.sink {
            sink(&p);
        }
        if self.progress.len() == MAX_PROGRESS {
            self.progress.remove(0);
        }
        self.progress.push(p);
    }

    fn submit(&mut self, queue: String, params: String) -> Result<(), String> {
        self.submits.submit(queue, &params)
    }
}
