//! A `listen` session (SPEC section 13, "Sessions"): a `pull` subscription of its own, made
//! through `POST /subscriptions?session=true` with the admin token (found as every API command
//! finds it), named after this machine, taking the events stored from now on, and deleted when
//! the session ends (its pending states finished, outcome `removed`). One that is never deleted
//! (the laptop lost power) is removed by the server after `session_idle_seconds` without a
//! claim.

use serde_json::json;

use crate::cli::client::{Api, ApiClient, Before, Remote};

/// The subscription a session made, with the token answered once.
pub struct Session {
    api: ApiClient,
    pub name: String,
    pub token: String,
}

impl Session {
    /// Make the session's subscription on the server: `sources` and `types` its route, and
    /// `transform` what it makes of each event.
    pub fn open(
        config: Option<&std::path::Path>,
        url: Option<String>,
        admin_token: Option<String>,
        sources: &[String],
        (types, transform): (&[String], Option<&str>),
    ) -> anyhow::Result<Session> {
        let before = Before::default();
        let remote = Remote {
            url,
            token: admin_token,
        };
        let api = ApiClient::new(
            &Api {
                config,
                before: &before,
            },
            &remote,
        )?;
        let name = name_for(
            &host_name(),
            &uuid::Uuid::new_v4().simple().to_string()[..6],
        );
        let mut body = json!({"name": name, "kind": "pull", "sources": sources});
        if !types.is_empty() {
            body["types"] = json!(types);
        }
        if let Some(program) = transform {
            body["transform"] = json!(program);
        }
        let made = api
            .post("/subscriptions", &[("session", "true".into())], Some(&body))
            .map_err(|e| anyhow::anyhow!("cannot open a session on {}: {e}", api.base()))?;
        let token = made["token"]
            .as_str()
            .ok_or_else(|| anyhow::anyhow!("the server answered no token for session `{name}`"))?
            .to_string();
        Ok(Session { api, name, token })
    }

    /// The server's URL.
    pub fn base(&self) -> &str {
        self.api.base()
    }

    /// Delete the session's subscription: how many of its states were finished, `None` when it
    /// was gone already (removed for idling, or by an operator).
    pub fn close(&self) -> anyhow::Result<Option<u64>> {
        let path = format!("/subscriptions/{}", self.name);
        match self.api.call(reqwest::Method::DELETE, &path, None) {
            Ok(answer) => Ok(Some(answer["finished"].as_u64().unwrap_or(0))),
            Err(crate::cli::client::CliError::Api { code, .. }) if code == "not_found" => Ok(None),
            Err(e) => Err(anyhow::anyhow!(
                "cannot delete session `{}`: {e}",
                self.name
            )),
        }
    }
}

/// This machine's name, as the kernel has it (no dependency for one read).
fn host_name() -> String {
    ["/proc/sys/kernel/hostname", "/etc/hostname"]
        .iter()
        .find_map(|f| std::fs::read_to_string(f).ok())
        .or_else(|| std::env::var("HOSTNAME").ok())
        .or_else(|| std::env::var("COMPUTERNAME").ok())
        .unwrap_or_default()
}

/// `listen-<host>-<suffix>`, a valid subscription name (`[a-z0-9][a-z0-9-]{0,62}`): the host
/// lowercased, each run of other characters one `-`, cut so that the whole fits.
fn name_for(host: &str, suffix: &str) -> String {
    const MAX: usize = 63;
    let mut clean = String::new();
    for c in host.trim().chars().flat_map(char::to_lowercase) {
        if c.is_ascii_lowercase() || c.is_ascii_digit() {
            clean.push(c);
        } else if !clean.is_empty() && !clean.ends_with('-') {
            clean.push('-');
        }
    }
    let room = MAX - "listen-".len() - 1 - suffix.len();
    clean.truncate(room);
    let clean = clean.trim_end_matches('-');
    if clean.is_empty() {
        format!("listen-{suffix}")
    } else {
        format!("listen-{clean}-{suffix}")
    }
}

#[cfg(test)]
mod tests {
    use super::name_for;

    #[test]
    fn a_session_name_is_a_valid_subscription_name_whatever_the_host() {
        let valid = |n: &str| {
            n.len() <= 63
                && n.starts_with(|c: char| c.is_ascii_lowercase() || c.is_ascii_digit())
                && n.chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
        };
        for (host, want) in [
            ("Dev-Laptop.local\n", "listen-dev-laptop-local-a1b2c3"),
            ("", "listen-a1b2c3"),
            ("___", "listen-a1b2c3"),
            ("Éloïse's MacBook", "listen-lo-se-s-macbook-a1b2c3"),
        ] {
            let name = name_for(host, "a1b2c3");
            assert_eq!(name, want);
            assert!(valid(&name), "{name}");
        }
        let long = name_for(&"a".repeat(40).replace('a', "ab."), "a1b2c3");
        assert!(valid(&long) && long.ends_with("-a1b2c3"), "{long}");
        assert!(!long.contains("--"), "{long}");
    }
}
