//! `disbatch create-users`: the roles of [`super::roles`] and a user per role in the
//! Disbatch database, each user's password from the config's `auth.<role>`, created as a
//! MongoDB user with the `root` role (as Disbatch 4's `disbatch-create-users`).

use std::io::IsTerminal as _;
use std::path::{Path, PathBuf};

use bson::{doc, Document};
use serde_json::{json, Value};

use super::roles::{privileges, Perms, ROLES};
use super::CliError;
use crate::config::Config;
use crate::store::mongo::MongoOptions;

/// Where `--plugin-perms` is looked for when not given (Disbatch 4's path): used when it
/// exists.
pub const DEFAULT_PLUGIN_PERMS: &str = "/etc/disbatch/plugin-permissions.json";

/// Environment variable holding the root password (instead of a prompt).
pub const ROOT_PASSWORD_ENV: &str = "DISBATCH_ROOT_PASSWORD";

/// MongoDB error codes that mean "already gone" for `dropRole`, `dropUser`.
const ROLE_NOT_FOUND: i32 = 31;
const USER_NOT_FOUND: i32 = 11;

/// The arguments of `create-users` (the config file is the global `--config`).
#[derive(Debug, Clone, clap::Args)]
pub struct CreateUsersArgs {
    /// MongoDB user with the `root` role to create them as.
    #[arg(
        long = "root-user",
        alias = "root_user",
        value_name = "USER",
        required_unless_present = "dry_run"
    )]
    pub root_user: Option<String>,
    /// File whose first line is the root user's password (else env DISBATCH_ROOT_PASSWORD,
    /// else a prompt on the terminal).
    #[arg(long = "root-password-file", value_name = "FILE")]
    pub root_password_file: Option<PathBuf>,
    /// Database holding the root user.
    #[arg(long = "root-auth-db", value_name = "DB", default_value = "admin")]
    pub root_auth_db: String,
    /// JSON `{collection: [actions]}` granted to the `plugin` role (default
    /// /etc/disbatch/plugin-permissions.json when it exists).
    #[arg(long = "plugin-perms", alias = "plugin_perms", value_name = "FILE")]
    pub plugin_perms: Option<PathBuf>,
    /// JSON `{role: {collection: [actions]}}` added to the roles.
    #[arg(long = "additional-perms", alias = "additional_perms", value_name = "FILE")]
    pub additional_perms: Option<PathBuf>,
    /// First create the root user in `admin` (works only while the server has no users).
    #[arg(long = "create-root", alias = "create_root")]
    pub create_root: bool,
    /// Drop these roles and users first (those missing are skipped).
    #[arg(long = "drop-roles", alias = "drop_roles")]
    pub drop_roles: bool,
    /// Print the roles and users as JSON (no passwords) and change nothing.
    #[arg(long = "dry-run")]
    pub dry_run: bool,
}

/// The `createRole` and `createUser` commands for `config`'s database (passwords left out).
pub fn commands(database: &str, plugin: Option<&Perms>, extra: &BTreeMapPerms) -> Vec<(Document, Document)> {
    ROLES
        .iter()
        .map(|r| {
            let mut more = extra.get(r.name).cloned().unwrap_or_default();
            if r.name == "plugin" {
                for (c, a) in plugin.into_iter().flatten() {
                    more.entry(c.clone()).or_default().extend(a.iter().cloned());
                }
            }
            let role = doc! {
                "createRole": r.name,
                "privileges": privileges(r, database, Some(&more)),
                "roles": [],
            };
            let user = doc! { "createUser": r.name, "roles": [{ "role": r.name, "db": database }] };
            (role, user)
        })
        .collect()
}

/// Role name → extra perms.
pub type BTreeMapPerms = std::collections::BTreeMap<String, Perms>;

/// Runs `create-users` with the config at `config_path`.
pub async fn run(config_path: Option<&Path>, args: &CreateUsersArgs) -> Result<(), CliError> {
    let path = config_path.ok_or_else(|| {
        CliError::Usage("create-users needs the config file: give --config FILE (or set DISBATCH_CONFIG)".into())
    })?;
    let config = Config::load(path).map_err(|e| CliError::Usage(e.to_string()))?;
    let plugin = read_perms(args.plugin_perms.as_deref())?;
    let extra = read_additional(args.additional_perms.as_deref())?;
    let commands = commands(&config.database, plugin.as_ref(), &extra);
    if args.dry_run {
        let list: Vec<Value> = commands
            .iter()
            .flat_map(|(r, u)| [r, u])
            .map(|d| bson::Bson::Document(d.clone()).into_relaxed_extjson())
            .collect();
        let out = json!({"database": config.database, "commands": list});
        println!("{}", serde_json::to_string_pretty(&out).unwrap_or_default());
        return Ok(());
    }
    let missing: Vec<String> = ROLES
        .iter()
        .filter(|r| !config.auth.passwords.contains_key(r.name))
        .map(|r| format!("auth.{}", r.name))
        .collect();
    if !missing.is_empty() {
        return Err(CliError::Usage(format!(
            "{} has no password for {}: every role gets a user whose password is its auth.<role>",
            path.display(),
            missing.join(", ")
        )));
    }
    let root_user = args.root_user.clone().unwrap_or_default();
    let root_password = root_password(args, &root_user)?;
    let base = config.mongo_options("");
    let host = crate::config::redact_uri(&config.mongohost);
    let failed = |what: &str, e: &dyn std::fmt::Display| CliError::Server(format!("{what} on {host}: {e}"));
    if args.create_root {
        println!("creating user {root_user:?} in database \"admin\" with the root role");
        let client = base
            .client(&config.mongohost)
            .await
            .map_err(|e| failed("connect", &e))?;
        client
            .database("admin")
            .run_command(doc! {
                "createUser": &root_user, "pwd": &root_password, "roles": [{ "role": "root", "db": "admin" }],
            })
            .await
            .map_err(|e| failed("create the root user (only possible while the server has no users)", &e))?;
    }
    let options = MongoOptions {
        username: Some(root_user.clone()),
        password: Some(root_password),
        auth_source: Some(args.root_auth_db.clone()),
        ..base
    };
    let client = options
        .client(&config.mongohost)
        .await
        .map_err(|e| failed("connect", &e))?;
    let db = client.database(&config.database);
    let names: Vec<&str> = ROLES.iter().map(|r| r.name).collect();
    if args.drop_roles {
        println!(
            "dropping roles and users {} in database {:?} on {host}",
            names.join(", "),
            config.database
        );
        for name in &names {
            for (command, missing) in [("dropRole", ROLE_NOT_FOUND), ("dropUser", USER_NOT_FOUND)] {
                match db.run_command(doc! { command: *name }).await {
                    Ok(_) => {}
                    Err(e) if error_code(&e) == Some(missing) => {
                        println!("{command} {name}: not there, skipped");
                    }
                    Err(e) => return Err(failed(&format!("{command} {name}"), &e)),
                }
            }
        }
    }
    println!(
        "creating roles and users {} in database {:?} on {host}",
        names.join(", "),
        config.database
    );
    for (role, mut user) in commands {
        let name = role.get_str("createRole").unwrap_or_default().to_owned();
        db.run_command(role.clone())
            .await
            .map_err(|e| failed(&format!("createRole {name}"), &format!("{e}{}", exists_hint(&e))))?;
        user.insert("pwd", config.auth.passwords[&name].clone());
        db.run_command(user)
            .await
            .map_err(|e| failed(&format!("createUser {name}"), &format!("{e}{}", exists_hint(&e))))?;
    }
    println!("created the roles and users");
    Ok(())
}

fn exists_hint(e: &mongodb::error::Error) -> &'static str {
    // DuplicateKey (11000) and the "already exists" codes of createRole/createUser.
    match error_code(e) {
        Some(11000 | 51002 | 51003) => " (give --drop-roles to replace the existing ones)",
        _ => "",
    }
}

fn error_code(e: &mongodb::error::Error) -> Option<i32> {
    match e.kind.as_ref() {
        mongodb::error::ErrorKind::Command(c) => Some(c.code),
        _ => None,
    }
}

/// The root password: `--root-password-file`'s first line, else the environment, else a
/// prompt without echo on the terminal.
fn root_password(args: &CreateUsersArgs, user: &str) -> Result<String, CliError> {
    if let Some(path) = &args.root_password_file {
        let text = std::fs::read_to_string(path)
            .map_err(|e| CliError::Usage(format!("cannot read --root-password-file {}: {e}", path.display())))?;
        let line = text.lines().next().unwrap_or_default().to_owned();
        if line.is_empty() {
            return Err(CliError::Usage(format!("{}: the first line is empty", path.display())));
        }
        return Ok(line);
    }
    if let Some(p) = std::env::var(ROOT_PASSWORD_ENV).ok().filter(|p| !p.is_empty()) {
        return Ok(p);
    }
    if !std::io::stdin().is_terminal() {
        return Err(CliError::Usage(format!(
            "no password for {user:?}: give --root-password-file FILE or set {ROOT_PASSWORD_ENV} (standard input is not a terminal to ask on)"
        )));
    }
    rpassword::prompt_password(format!("password of MongoDB user {user}: "))
        .map_err(|e| CliError::Usage(format!("cannot read the password from the terminal: {e}")))
}

fn read_json_file(path: &Path) -> Result<Value, CliError> {
    let text =
        std::fs::read_to_string(path).map_err(|e| CliError::Usage(format!("cannot read {}: {e}", path.display())))?;
    crate::config::parse_relaxed(&text, &path.display().to_string()).map_err(|e| CliError::Usage(e.to_string()))
}

/// `{collection: [action, …]}` from `value`, or an error naming `file`.
fn perms(value: &Value, file: &Path, at: &str) -> Result<Perms, CliError> {
    let bad = || {
        CliError::Usage(format!(
            "{}: {at} must be {{\"collection\": [\"action\", …]}}",
            file.display()
        ))
    };
    let Value::Object(m) = value else { return Err(bad()) };
    m.iter()
        .map(|(c, a)| {
            let actions = a
                .as_array()
                .and_then(|a| {
                    a.iter()
                        .map(|x| x.as_str().map(str::to_owned))
                        .collect::<Option<Vec<_>>>()
                })
                .ok_or_else(bad)?;
            Ok((c.clone(), actions))
        })
        .collect()
}

fn read_perms(path: Option<&Path>) -> Result<Option<Perms>, CliError> {
    let path = match path {
        Some(p) => p,
        None if Path::new(DEFAULT_PLUGIN_PERMS).is_file() => Path::new(DEFAULT_PLUGIN_PERMS),
        None => return Ok(None),
    };
    perms(&read_json_file(path)?, path, "the file").map(Some)
}

fn read_additional(path: Option<&Path>) -> Result<BTreeMapPerms, CliError> {
    let Some(path) = path else {
        return Ok(BTreeMapPerms::new());
    };
    let value = read_json_file(path)?;
    let Value::Object(m) = &value else {
        return Err(CliError::Usage(format!(
            "{}: must be {{\"role\": {{\"collection\": [\"action\", …]}}}}",
            path.display()
        )));
    };
    m.iter()
        .map(|(role, v)| {
            if !ROLES.iter().any(|r| r.name == role) {
                let names: Vec<&str> = ROLES.iter().map(|r| r.name).collect();
                return Err(CliError::Usage(format!(
                    "{}: unknown role {role:?} (roles are {})",
                    path.display(),
                    names.join(", ")
                )));
            }
            Ok((role.clone(), perms(v, path, role)?))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commands_carry_the_plugin_and_additional_perms() {
        let plugin: Perms = [("reports".to_owned(), vec!["insert".to_owned()])].into();
        let extra: BTreeMapPerms = [(
            "disbatch_web".to_owned(),
            [("reports".to_owned(), vec!["find".to_owned()])].into(),
        )]
        .into();
        let cmds = commands("dsb", Some(&plugin), &extra);
        assert_eq!(cmds.len(), 5);
        let by_name = |n: &str| cmds.iter().find(|(r, _)| r.get_str("createRole") == Ok(n)).unwrap();
        let (role, user) = by_name("plugin");
        assert_eq!(
            role.get_array("privileges").unwrap()[0],
            bson::Bson::Document(doc! {"resource": {"db": "dsb", "collection": "reports"}, "actions": ["insert"]})
        );
        assert_eq!(
            user,
            &doc! {"createUser": "plugin", "roles": [{"role": "plugin", "db": "dsb"}]}
        );
        let (web, _) = by_name("disbatch_web");
        assert!(web.to_string().contains("reports"));
        let (q, _) = by_name("queuebalance");
        assert!(q.get_array("privileges").unwrap().is_empty());
    }

    #[test]
    fn perms_files_are_checked() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("p.json");
        std::fs::write(
            &f,
            r#"{"reports": ["insert"], # relaxed
        }"#,
        )
        .unwrap();
        assert_eq!(read_perms(Some(&f)).unwrap().unwrap()["reports"], ["insert"]);
        std::fs::write(&f, r#"{"reports": "insert"}"#).unwrap();
        assert!(read_perms(Some(&f)).unwrap_err().to_string().contains("p.json"));
        std::fs::write(&f, r#"{"disbatchdd": {"x": ["find"]}}"#).unwrap();
        assert!(read_additional(Some(&f))
            .unwrap_err()
            .to_string()
            .contains("unknown role \"disbatchdd\""));
    }
}
