//! The MongoDB roles of Disbatch, one per user of the spec, with exactly the privileges our
//! programs use, all in the Disbatch database. This table is the one place they are
//! defined: `disbatch create-users` creates them from it, `--dry-run` prints it, and
//! docs/security.md shows it (a test keeps the two equal).

use std::collections::BTreeMap;

use bson::{doc, Document};

/// A resource's collection meaning every collection of the database (not `system.*`).
pub const ANY_COLLECTION: &str = "";

/// Actions on one collection of the Disbatch database.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Privilege {
    /// The collection ([`ANY_COLLECTION`] for all).
    pub collection: &'static str,
    /// MongoDB privilege actions.
    pub actions: &'static [&'static str],
}

/// One role, created with a user of the same name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Role {
    /// Role and user name: a key of the config's `auth`.
    pub name: &'static str,
    /// Who connects as it.
    pub used_by: &'static str,
    /// What it may do.
    pub privileges: &'static [Privilege],
}

const fn p(collection: &'static str, actions: &'static [&'static str]) -> Privilege {
    Privilege { collection, actions }
}

/// Every role, in the order they are created.
pub const ROLES: [Role; 5] = [
    Role {
        name: "disbatchd",
        used_by: "the DEN (`den`): claims and runs tasks, heartbeats, QueueBalance slots and \
                  lease, rate grants, the schedules' tasks, deletes tasks past their retention, task outputs in GridFS, the per-minute counters, reads plugins from the store; \
                  creates the indexes",
        privileges: &[
            p("tasks", &["find", "insert", "update", "remove", "createIndex", "changeStream"]),
            p("queues", &["find", "update", "createIndex"]),
            p("nodes", &["find", "insert", "update", "createIndex"]),
            p("slots", &["find", "insert", "update", "createIndex"]),
            p("rates", &["find", "insert", "update", "createIndex"]),
            p("balance", &["find", "insert", "update"]),
            p("batches", &["find", "update"]),
            p("leases", &["find", "insert", "update"]),
            p("schedules", &["find", "update"]),
            p("minute_stats", &["find", "insert", "update", "remove", "createIndex"]),
            p("tasks.files", &["find", "insert", "update", "remove", "createIndex"]),
            p("tasks.chunks", &["find", "insert", "remove", "createIndex"]),
            p("plugins.files", &["find", "createIndex"]),
            p("plugins.chunks", &["find", "createIndex"]),
        ],
    },
    Role {
        name: "disbatch_web",
        used_by: "the DCI (`disbatch web`): reads everything (`create-tasks --collection` reads \
                  any collection of the database), writes queues, tasks, batches, the balance, \
                  schedules, nodes' maxthreads and stored plugins, follows tasks by change stream; creates \
                  the indexes at start as the DEN does",
        privileges: &[
            p(ANY_COLLECTION, &["find"]),
            p("tasks", &["find", "insert", "update", "createIndex", "changeStream"]),
            p("queues", &["find", "insert", "update", "remove", "createIndex"]),
            p("nodes", &["find", "update", "createIndex"]),
            p("slots", &["find", "remove", "createIndex"]),
            p("rates", &["find", "createIndex"]),
            p("balance", &["find", "insert", "update"]),
            p("batches", &["find", "insert", "update"]),
            p("leases", &["find"]),
            p("schedules", &["find", "insert", "update", "remove"]),
            p("minute_stats", &["find", "createIndex"]),
            p("tasks.files", &["find", "createIndex"]),
            p("tasks.chunks", &["find", "createIndex"]),
            p("plugins.files", &["find", "insert", "update", "remove", "createIndex"]),
            p("plugins.chunks", &["find", "insert", "remove", "createIndex"]),
        ],
    },
    Role {
        name: "task_runner",
        used_by: "nothing here: tasks run inside the DEN, as `disbatchd`. Kept for Disbatch 4 \
                  configs; no privileges unless `--additional-perms` gives some (e.g. for a \
                  Disbatch 4 task_runner during a migration)",
        privileges: &[],
    },
    Role {
        name: "queuebalance",
        used_by: "nothing here: the QueueBalance runs inside the DEN, as `disbatchd`. Kept for \
                  Disbatch 4 configs; no privileges unless `--additional-perms` gives some",
        privileges: &[],
    },
    Role {
        name: "plugin",
        used_by: "plugins: ours have no database access (WebAssembly, host calls only); the \
                  role holds what `--plugin-perms` grants, for Disbatch 4 plugins' own collections",
        privileges: &[],
    },
];

/// Extra actions per collection (Disbatch 4's `plugin-permissions.json` format).
pub type Perms = BTreeMap<String, Vec<String>>;

/// The `privileges` of role `role` in database `db` for `createRole`: the table's, then
/// `extra`'s actions added (a collection of its own, or actions merged into the table's).
pub fn privileges(role: &Role, db: &str, extra: Option<&Perms>) -> Vec<Document> {
    let mut merged: Vec<(String, Vec<String>)> = role
        .privileges
        .iter()
        .map(|p| {
            (
                p.collection.to_owned(),
                p.actions.iter().map(|a| a.to_string()).collect(),
            )
        })
        .collect();
    for (collection, actions) in extra.into_iter().flatten() {
        let i = match merged.iter().position(|(c, _)| c == collection) {
            Some(i) => i,
            None => {
                merged.push((collection.clone(), Vec::new()));
                merged.len() - 1
            }
        };
        for a in actions {
            if !merged[i].1.contains(a) {
                merged[i].1.push(a.clone());
            }
        }
    }
    merged
        .into_iter()
        .filter(|(_, actions)| !actions.is_empty())
        .map(|(collection, actions)| doc! { "resource": { "db": db, "collection": collection }, "actions": actions })
        .collect()
}

/// The table as Markdown: role, who uses it, and one line per collection.
pub fn markdown() -> String {
    let mut s = String::from("| Role (user) | Used by | Collection: actions |\n|---|---|---|\n");
    for r in ROLES {
        let privileges = if r.privileges.is_empty() {
            "none".to_owned()
        } else {
            r.privileges
                .iter()
                .map(|p| {
                    let c = if p.collection == ANY_COLLECTION {
                        "(every collection)"
                    } else {
                        p.collection
                    };
                    format!("`{c}`: {}", p.actions.join(", "))
                })
                .collect::<Vec<_>>()
                .join("<br>")
        };
        s.push_str(&format!("| `{}` | {} | {privileges} |\n", r.name, r.used_by));
    }
    s
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;

    /// Every `const NAME: &str = "value";` of the MongoDB store's sources that names a
    /// collection (files of `src/store/mongo*`).
    fn store_collections() -> Vec<(String, String)> {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/store");
        let mut files = vec![root.join("mongo.rs")];
        files.extend(crate::test_support::rust_files(&root.join("mongo")));
        let mut found = Vec::new();
        for file in files {
            let text = std::fs::read_to_string(&file).unwrap();
            for line in text.lines() {
                let line = line
                    .trim_start()
                    .trim_start_matches("pub ")
                    .trim_start_matches("pub(super) ");
                let Some(rest) = line.strip_prefix("const ") else {
                    continue;
                };
                let Some((name, value)) = rest.split_once(": &str = \"") else {
                    continue;
                };
                let Some(value) = value.strip_suffix("\";") else {
                    continue;
                };
                // The leader lease's document id, not a collection.
                if name == "LEADER" {
                    continue;
                }
                found.push((format!("{}: {name}", file.display()), value.to_owned()));
            }
        }
        found
    }

    #[test]
    fn every_store_collection_has_privileges_for_the_den_and_the_dci() {
        let found = store_collections();
        for must in [
            "tasks",
            "queues",
            "nodes",
            "slots",
            "balance",
            "batches",
            "leases",
            "schedules",
            "tasks.files",
        ] {
            assert!(found.iter().any(|(_, v)| v == must), "{must} not found in {found:?}");
        }
        for role in ["disbatchd", "disbatch_web"] {
            let r = ROLES.iter().find(|r| r.name == role).unwrap();
            for (whence, collection) in &found {
                assert!(
                    r.privileges.iter().any(|p| p.collection == collection),
                    "{whence} = {collection:?} has no privileges in role {role}: add it to ROLES"
                );
            }
            // And nothing in the table that the store does not use.
            for p in r.privileges.iter().filter(|p| p.collection != ANY_COLLECTION) {
                assert!(
                    found.iter().any(|(_, v)| v == p.collection),
                    "{role}: unknown {}",
                    p.collection
                );
            }
        }
    }

    #[test]
    fn roles_are_the_config_auth_roles() {
        let names: Vec<&str> = ROLES.iter().map(|r| r.name).collect();
        let mut sorted = names.clone();
        sorted.sort_unstable();
        let mut auth = crate::config::AUTH_ROLES.to_vec();
        auth.sort_unstable();
        assert_eq!(sorted, auth);
    }

    #[test]
    fn extra_perms_merge() {
        let r = ROLES.iter().find(|r| r.name == "disbatchd").unwrap();
        let extra: Perms = [
            ("tasks".to_owned(), vec!["remove".to_owned(), "find".to_owned()]),
            ("reports".to_owned(), vec!["insert".to_owned()]),
        ]
        .into();
        let docs = privileges(r, "d", Some(&extra));
        let tasks = &docs[0];
        assert_eq!(
            tasks.get_document("resource").unwrap(),
            &doc! {"db": "d", "collection": "tasks"}
        );
        let actions = tasks.get_array("actions").unwrap();
        assert_eq!(actions.iter().filter(|a| a.as_str() == Some("find")).count(), 1);
        assert!(actions.iter().any(|a| a.as_str() == Some("remove")));
        assert_eq!(
            docs.last().unwrap(),
            &doc! {"resource": {"db": "d", "collection": "reports"}, "actions": ["insert"]}
        );
        let plugin = ROLES.iter().find(|r| r.name == "plugin").unwrap();
        assert!(privileges(plugin, "d", None).is_empty());
    }

    #[test]
    fn the_docs_show_this_table() {
        let doc = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/security.md")).unwrap();
        assert!(
            doc.contains(&markdown()),
            "docs/security.md must hold the table of roles as cli::roles::markdown() prints it:\n{}",
            markdown()
        );
    }
}
