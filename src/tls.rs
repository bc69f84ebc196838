//! HTTPS without a proxy: `tls_cert` and `tls_key` (PEM files) make `serve` listen with rustls,
//! TLS 1.2 and 1.3, no OpenSSL. The certificate is looked up at each handshake
//! ([`Certificates`] resolves it), so that SIGHUP can read the files again: new connections get
//! the renewed certificate, connections already open keep theirs and their requests, and files
//! that do not load are logged and the certificate in use is kept.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::Context;
use parking_lot::RwLock;
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;

/// The server's certificate chain and key, read from their files, swapped on reload.
pub struct Certificates {
    cert: PathBuf,
    key: PathBuf,
    provider: Arc<CryptoProvider>,
    current: RwLock<Arc<CertifiedKey>>,
}

impl std::fmt::Debug for Certificates {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Certificates")
            .field("cert", &self.cert)
            .field("key", &self.key)
            .finish_non_exhaustive()
    }
}

impl Certificates {
    /// Read both files; an error names the setting (`tls_cert` or `tls_key`) and the file.
    pub fn load(cert: &Path, key: &Path) -> anyhow::Result<Arc<Certificates>> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let current = read(cert, key, &provider)?;
        Ok(Arc::new(Certificates {
            cert: cert.to_path_buf(),
            key: key.to_path_buf(),
            provider,
            current: RwLock::new(Arc::new(current)),
        }))
    }

    /// Read the files again (a renewed certificate). On error the certificate in use stays.
    pub fn reload(&self) -> anyhow::Result<()> {
        let fresh = read(&self.cert, &self.key, &self.provider)?;
        *self.current.write() = Arc::new(fresh);
        Ok(())
    }

    /// The server configuration: TLS 1.3 and 1.2, no client certificates, this resolver.
    pub fn server_config(self: &Arc<Self>) -> anyhow::Result<rustls::ServerConfig> {
        Ok(
            rustls::ServerConfig::builder_with_provider(Arc::clone(&self.provider))
                .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])
                .context("TLS protocol versions")?
                .with_no_client_auth()
                .with_cert_resolver(Arc::clone(self) as Arc<dyn ResolvesServerCert>),
        )
    }
}

impl ResolvesServerCert for Certificates {
    fn resolve(&self, _: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(Arc::clone(&self.current.read()))
    }
}

fn read(cert: &Path, key: &Path, provider: &CryptoProvider) -> anyhow::Result<CertifiedKey> {
    let chain = CertificateDer::pem_file_iter(cert)
        .and_then(|certs| certs.collect::<Result<Vec<_>, _>>())
        .with_context(|| format!("tls_cert: reading {}", cert.display()))?;
    if chain.is_empty() {
        anyhow::bail!(
            "tls_cert: {} holds no PEM certificate (BEGIN CERTIFICATE)",
            cert.display()
        );
    }
    let der = PrivateKeyDer::from_pem_file(key)
        .with_context(|| format!("tls_key: reading a PEM private key from {}", key.display()))?;
    let signing = provider
        .key_provider
        .load_private_key(der)
        .with_context(|| format!("tls_key: {} is not a usable private key", key.display()))?;
    let certified = CertifiedKey::new(chain, signing);
    certified.keys_match().with_context(|| {
        format!(
            "tls_key: {} is not the key of the certificate in {}",
            key.display(),
            cert.display()
        )
    })?;
    Ok(certified)
}
