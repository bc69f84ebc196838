//! The embedded default: with no config file, `serve` runs on SQLite under `./data/` with a
//! `demo` source whose secret, like the admin token, is generated once and kept in `data/`.

use std::io::Write as _;
use std::path::{Path, PathBuf};

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use rand::RngCore;

use super::{MismatchPolicy, Settings, SourceSettings};
use crate::signature::{Scheme, Secret};

pub const DEMO_SOURCE: &str = "demo";

/// Read a generated secret, or create it (mode 0600) on first use. Two processes starting at
/// once agree on one value: each writes its own value to a private file and links it into
/// place, which fails when the name exists; the loser reads the winner's complete file.
fn kept_secret(path: &Path, generate: impl FnOnce() -> String) -> anyhow::Result<Secret> {
    use anyhow::Context;
    if let Some(secret) = read_secret(path)? {
        return Ok(secret);
    }
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    let value = generate();
    let (draft, written) = write_draft(path, &value);
    let linked = written.and_then(|()| std::fs::hard_link(&draft, path));
    let _ = std::fs::remove_file(&draft);
    match linked {
        Ok(()) => Ok(Secret::new(value)),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
            read_secret(path)?.with_context(|| format!("{} exists but is empty", path.display()))
        }
        Err(e) => Err(e).with_context(|| format!("writing {}", path.display())),
    }
}

/// The secret kept at `path`, or `None` when there is none yet.
fn read_secret(path: &Path) -> anyhow::Result<Option<Secret>> {
    use anyhow::Context;
    match std::fs::read_to_string(path) {
        Ok(s) if !s.trim().is_empty() => Ok(Some(Secret::new(s.trim()))),
        Ok(_) => Ok(None),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e).with_context(|| format!("reading {}", path.display())),
    }
}

/// A new Standard Webhooks signing secret (`whsec_` and 32 random bytes in base64).
pub fn new_signing_secret() -> String {
    format!("whsec_{}", STANDARD.encode(random_bytes::<32>()))
}

/// A new bearer token for a `pull` subscription's routes.
pub fn new_pull_token() -> String {
    hex::encode(random_bytes::<24>())
}

fn random_bytes<const N: usize>() -> [u8; N] {
    let mut bytes = [0u8; N];
    rand::rng().fill_bytes(&mut bytes);
    bytes
}

/// The directory that holds generated secrets: the SQLite database's directory, or `data`.
pub fn data_dir(settings: &Settings) -> PathBuf {
    match settings.database() {
        Ok(super::Database::Sqlite(path)) => path.parent().map(Path::to_path_buf),
        _ => None,
    }
    .filter(|p| !p.as_os_str().is_empty())
    .unwrap_or_else(|| PathBuf::from("data"))
}

/// Fill an empty `admin_token` from `<data dir>/admin-token`, generating it once.
pub fn ensure_admin_token(settings: &mut Settings) -> anyhow::Result<Option<PathBuf>> {
    if !settings.admin_token.is_empty() {
        return Ok(None);
    }
    let path = data_dir(settings).join("admin-token");
    settings.admin_token = kept_secret(&path, || hex::encode(random_bytes::<24>()))?;
    Ok(Some(path))
}

/// The signing secret of an `http` subscription that names none: generated once and shared
/// by every node through the store (`share`: offered a candidate, it answers the one kept),
/// and kept in `<data dir>/subscription-<name>-secret` too (its receiver is configured with
/// it). The file's secret, when there is one, is the candidate: a single node's secret
/// survives the upgrade to a shared one.
pub fn subscription_secret(
    settings: &Settings,
    name: &str,
    share: impl FnOnce(&str) -> anyhow::Result<String>,
) -> anyhow::Result<(Secret, PathBuf)> {
    let path = crate::subscriptions::HttpTarget::secret_file(&data_dir(settings), name);
    let secret = shared_file(&path, share, new_signing_secret)?;
    Ok((secret, path))
}

/// The bearer token of a `pull` subscription that names none, made once: kept in
/// `<data dir>/subscription-<name>-token` (its clients are given it) and offered to the store,
/// which keeps only its digest (`share`: whether the offered token is the one kept). A node
/// whose file holds another token than the one kept (made by another node, or rotated since)
/// removes its file, which no longer opens the routes: `None` then.
pub fn subscription_token(
    settings: &Settings,
    name: &str,
    share: impl FnOnce(&str) -> anyhow::Result<bool>,
) -> anyhow::Result<Option<(Secret, PathBuf)>> {
    use anyhow::Context;
    let path = crate::subscriptions::token_file(&data_dir(settings), name);
    let candidate = kept_secret(&path, new_pull_token)?;
    if share(candidate.expose())? {
        return Ok(Some((candidate, path)));
    }
    std::fs::remove_file(&path).with_context(|| format!("removing {}", path.display()))?;
    Ok(None)
}

/// Random bytes for a new secret.
pub fn new_secret_bytes<const N: usize>() -> [u8; N] {
    random_bytes()
}

/// The value the store keeps (the file's, or a new one, offered as the candidate), written to
/// the file when the file held none or another.
fn shared_file(
    path: &Path,
    share: impl FnOnce(&str) -> anyhow::Result<String>,
    generate: impl FnOnce() -> String,
) -> anyhow::Result<Secret> {
    let candidate = kept_secret(path, generate)?;
    let shared = share(candidate.expose())?;
    if shared != candidate.expose() {
        replace_secret(path, &shared)?;
    }
    Ok(Secret::new(shared))
}

/// `value` in a private file (mode 0600) beside `path`, synced: the draft's path, and whether
/// it was written.
fn write_draft(path: &Path, value: &str) -> (PathBuf, std::io::Result<()>) {
    let mut draft = path.as_os_str().to_owned();
    draft.push(format!(".{}.new", hex::encode(random_bytes::<8>())));
    let draft = PathBuf::from(draft);
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create(true).truncate(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
    let written = options.open(&draft).and_then(|mut file| {
        writeln!(file, "{value}")?;
        file.sync_all()
    });
    (draft, written)
}

/// Put `value` at `path` in one step (a private draft renamed over it, mode 0600).
fn replace_secret(path: &Path, value: &str) -> anyhow::Result<()> {
    use anyhow::Context;
    let (draft, written) = write_draft(path, value);
    let renamed = written.and_then(|()| std::fs::rename(&draft, path));
    if renamed.is_err() {
        let _ = std::fs::remove_file(&draft);
    }
    renamed.with_context(|| format!("writing {}", path.display()))
}

/// Add the `demo` source with its kept secret.
pub fn add_demo_source(settings: &mut Settings) -> anyhow::Result<PathBuf> {
    let path = data_dir(settings).join("demo-secret");
    let secret = kept_secret(&path, || {
        format!("whsec_{}", STANDARD.encode(random_bytes::<24>()))
    })?;
    settings.sources.push(SourceSettings {
        name: DEMO_SOURCE.into(),
        scheme: Scheme::StandardWebhooks,
        secrets: vec![secret],
        tolerance_seconds: 300,
        on_payload_mismatch: MismatchPolicy::Duplicate,
        allow_from: Vec::new(),
    });
    Ok(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two processes starting at once on a fresh `data/` must keep one secret, the one in the
    /// file: with create-then-truncate, the second writer replaced the first one's value while
    /// the first went on using it. Eight threads race through a barrier, many rounds.
    #[test]
    fn concurrent_first_starts_agree_on_one_kept_secret() {
        for round in 0..20 {
            let dir = tempfile::tempdir().unwrap();
            let path = dir.path().join("data").join("admin-token");
            let barrier = std::sync::Barrier::new(8);
            let values: Vec<String> = std::thread::scope(|s| {
                let threads: Vec<_> = (0..8)
                    .map(|i| {
                        let (path, barrier) = (&path, &barrier);
                        s.spawn(move || {
                            barrier.wait();
                            kept_secret(path, || format!("token-{round}-{i}"))
                                .unwrap()
                                .expose()
                                .to_string()
                        })
                    })
                    .collect();
                threads.into_iter().map(|t| t.join().unwrap()).collect()
            });
            let kept = std::fs::read_to_string(&path).unwrap().trim().to_string();
            assert!(values.iter().all(|v| *v == kept), "{values:?} vs {kept}");
        }
    }
}
