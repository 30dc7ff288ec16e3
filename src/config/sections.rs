//! The `attributes` (TLS), `auth` and `balance` sections of the config file.

use std::path::PathBuf;

use serde_json::Value;

use super::{describe, hint, Auth, Balance, ConfigError, Parser, Tls, AUTH_ROLES, BALANCE_KEYS, TLS_KEYS};

impl Parser<'_> {
    /// `attributes`: the spec's Perl-style `ssl` and our `tls*` keys, normalised.
    pub(super) fn tls(&mut self) -> Result<Tls, ConfigError> {
        let Some(attrs) = self.object("attributes")? else {
            return Ok(Tls::default());
        };
        // Each setting with the key that gave it.
        let mut enabled: Option<(bool, &str)> = None;
        let mut ca_file: Option<(PathBuf, &str)> = None;
        let mut allow_invalid: Option<(bool, &str)> = None;
        match attrs.get("ssl") {
            None | Some(Value::Null) => {}
            Some(Value::Object(ssl)) => {
                enabled = Some((true, "attributes.ssl"));
                for (k, v) in ssl {
                    match k.as_str() {
                        "SSL_ca_file" => {
                            let key = "attributes.ssl.SSL_ca_file";
                            ca_file = Some((self.ca_file(key, v)?, key));
                        }
                        "SSL_verify_mode" => {
                            let key = "attributes.ssl.SSL_verify_mode";
                            let mode = v.as_u64().filter(|m| *m <= 1).ok_or_else(|| {
                                self.invalid(
                                    key,
                                    format!("must be 0 (no verification) or 1 (verify), got {}", describe(v)),
                                )
                            })?;
                            allow_invalid = Some((mode == 0, key));
                        }
                        _ => self.warnings.push(format!(
                            "attributes.ssl.{k} has no effect here: only SSL_ca_file and SSL_verify_mode are read"
                        )),
                    }
                }
            }
            Some(v) => {
                let b = self.opt_bool("attributes.ssl", Some(v)).map_err(|_| {
                    self.invalid(
                        "attributes.ssl",
                        format!("must be 1, 0, true, false or an object, got {}", describe(v)),
                    )
                })?;
                enabled = b.map(|b| (b, "attributes.ssl"));
            }
        }
        if let Some(b) = self.opt_bool("attributes.tls", attrs.get("tls"))? {
            if let Some((other, by)) = enabled.filter(|(e, _)| *e != b) {
                return Err(self.invalid("attributes.tls", format!("is {b} but {by} says {other}")));
            }
            enabled = Some((b, "attributes.tls"));
        }
        if let Some(v) = attrs.get("tls_ca_file").filter(|v| !v.is_null()) {
            let key = "attributes.tls_ca_file";
            let path = self.ca_file(key, v)?;
            if let Some((other, by)) = ca_file.as_ref().filter(|(p, _)| *p != path) {
                return Err(self.invalid(key, format!("conflicts with {by} ({})", other.display())));
            }
            ca_file = Some((path, key));
        }
        let key = "attributes.tls_allow_invalid_certificates";
        if let Some(b) = self.opt_bool(key, attrs.get("tls_allow_invalid_certificates"))? {
            if let Some((other, by)) = allow_invalid.filter(|(a, _)| *a != b) {
                return Err(self.invalid(key, format!("is {b} but {by} says {}", !other)));
            }
            allow_invalid = Some((b, key));
        }
        for k in attrs.keys().filter(|k| !TLS_KEYS.contains(&k.as_str())) {
            self.warnings.push(format!(
                "attributes.{k} has no effect here: only TLS settings are read ({}){}",
                TLS_KEYS.join(", "),
                hint(k, &TLS_KEYS)
            ));
        }
        let allow_invalid = allow_invalid.filter(|(a, _)| *a);
        let needs_tls = ca_file.as_ref().map(|(_, k)| *k).or(allow_invalid.map(|(_, k)| k));
        if let (Some((false, by)), Some(key)) = (enabled, needs_tls) {
            return Err(self.invalid(key, format!("is set but {by} turns TLS off")));
        }
        if let Some((_, key)) = allow_invalid {
            self.warnings
                .push(format!("{key}: the MongoDB server certificate is not verified"));
        }
        Ok(Tls {
            enabled: enabled.map_or(ca_file.is_some() || allow_invalid.is_some(), |(e, _)| e),
            ca_file: ca_file.map(|(p, _)| p),
            allow_invalid_certificates: allow_invalid.is_some(),
        })
    }

    fn ca_file(&self, key: &str, v: &Value) -> Result<PathBuf, ConfigError> {
        let path = v
            .as_str()
            .filter(|s| !s.is_empty())
            .map(PathBuf::from)
            .ok_or_else(|| self.invalid(key, format!("must be a file path, got {}", describe(v))))?;
        if !path.is_file() {
            return Err(self.invalid(key, format!("{} does not exist or is not a file", path.display())));
        }
        Ok(path)
    }

    pub(super) fn auth(&mut self) -> Result<Auth, ConfigError> {
        let Some(auth) = self.object("auth")? else {
            return Ok(Auth::default());
        };
        let mut out = Auth::default();
        for (role, v) in auth {
            let key = format!("auth.{role}");
            let Some(text) = v.as_str().filter(|s| !s.is_empty()) else {
                // Never echo the value: it may be a password.
                return Err(self.invalid(&key, "must be a non-empty string"));
            };
            if role == "auth_source" {
                out.auth_source = Some(text.to_owned());
            } else if AUTH_ROLES.contains(&role.as_str()) {
                out.passwords.insert(role.clone(), text.to_owned());
            } else {
                let mut known = AUTH_ROLES.to_vec();
                known.push("auth_source");
                self.warnings.push(format!(
                    "{key}: unknown role ignored{} (roles are {})",
                    hint(role, &known),
                    AUTH_ROLES.join(", ")
                ));
            }
        }
        Ok(out)
    }

    pub(super) fn balance(&mut self) -> Result<Balance, ConfigError> {
        let Some(b) = self.object("balance")? else {
            return Ok(Balance::default());
        };
        for k in b.keys().filter(|k| !BALANCE_KEYS.contains(&k.as_str())) {
            self.warnings
                .push(format!("unknown key \"balance.{k}\" ignored{}", hint(k, &BALANCE_KEYS)));
        }
        let flag = |k: &str| {
            self.opt_bool(&format!("balance.{k}"), b.get(k))
                .map(Option::unwrap_or_default)
        };
        Ok(Balance {
            enabled: flag("enabled")?,
            log: flag("log")?,
            verbose: flag("verbose")?,
            pretend: flag("pretend")?,
        })
    }
}
