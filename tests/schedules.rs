//! Schedules end to end: the API and the CLI verbs (`schedules/api.rs`)
//! and real `den` processes creating a 1-second schedule's tasks through a kill, a restart
//! and a paused leader (`schedules/den.rs`). The store mechanics and the two-leader races
//! are in `tests/store_shared/schedules.rs`.

#[path = "schedules/api.rs"]
mod api;
#[path = "schedules/den.rs"]
mod den;
