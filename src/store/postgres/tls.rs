//! PostgreSQL over TLS (SPEC section 14), through rustls: `sslmode` and `sslrootcert` read
//! from the URL as libpq reads them.
//!
//! | `sslmode` | TLS | the server's certificate |
//! |---|---|---|
//! | `disable` | never | - |
//! | `prefer` (default) | if the server offers it | not checked |
//! | `require` | always | not checked; checked as `verify-ca` when `sslrootcert` is given (libpq) |
//! | `verify-ca` | always | signed by a CA of `sslrootcert` (the system's roots without it) |
//! | `verify-full` | always | as `verify-ca`, and issued for the host connected to |

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Context;
use postgres::config::SslMode;
use rustls::client::WebPkiServerVerifier;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{CertificateError, DigitallySignedStruct, Error, RootCertStore, SignatureScheme};
use tokio_postgres_rustls::MakeRustlsConnect;

/// libpq's `sslmode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    Disable,
    Prefer,
    Require,
    VerifyCa,
    VerifyFull,
}

impl Mode {
    fn parse(value: &str) -> anyhow::Result<Mode> {
        Ok(match value {
            "disable" => Mode::Disable,
            "prefer" => Mode::Prefer,
            "require" => Mode::Require,
            "verify-ca" => Mode::VerifyCa,
            "verify-full" => Mode::VerifyFull,
            other => anyhow::bail!(
                "sslmode `{other}` is not one of disable, prefer, require, verify-ca, verify-full"
            ),
        })
    }

    /// What the client asks the server for.
    pub fn ssl_mode(self) -> SslMode {
        match self {
            Mode::Disable => SslMode::Disable,
            Mode::Prefer => SslMode::Prefer,
            Mode::Require | Mode::VerifyCa | Mode::VerifyFull => SslMode::Require,
        }
    }
}

/// The TLS settings of a URL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tls {
    pub mode: Mode,
    pub root_cert: Option<PathBuf>,
}

/// Take `sslmode` and `sslrootcert` out of a `postgres://` URL: the URL left, which the
/// client parses, and the TLS settings.
pub fn split_url(url: &str) -> anyhow::Result<(String, Tls)> {
    let mut parsed = reqwest::Url::parse(url).context("not a URL")?;
    let mut tls = Tls {
        mode: Mode::Prefer,
        root_cert: None,
    };
    let mut kept = Vec::new();
    for (key, value) in parsed.query_pairs() {
        match key.as_ref() {
            "sslmode" => tls.mode = Mode::parse(&value)?,
            "sslrootcert" => tls.root_cert = Some(PathBuf::from(value.as_ref())),
            _ => kept.push((key.into_owned(), value.into_owned())),
        }
    }
    if kept.is_empty() {
        parsed.set_query(None);
    } else {
        parsed.query_pairs_mut().clear().extend_pairs(kept);
    }
    Ok((parsed.to_string(), tls))
}

/// The connector of these settings (used for every connection, also without TLS).
pub fn connector(tls: &Tls) -> anyhow::Result<MakeRustlsConnect> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let check_chain = match tls.mode {
        Mode::VerifyCa | Mode::VerifyFull => true,
        Mode::Require => tls.root_cert.is_some(),
        Mode::Disable | Mode::Prefer => false,
    };
    let verifier: Arc<dyn ServerCertVerifier> = if check_chain {
        let webpki = WebPkiServerVerifier::builder_with_provider(
            Arc::new(roots(tls.root_cert.as_ref())?),
            Arc::clone(&provider),
        )
        .build()
        .context("the TLS verifier")?;
        Arc::new(Verifier {
            webpki,
            check_name: tls.mode == Mode::VerifyFull,
        })
    } else {
        Arc::new(Unchecked(provider.clone()))
    };
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .context("TLS versions")?
        .dangerous()
        .with_custom_certificate_verifier(verifier)
        .with_no_client_auth();
    Ok(MakeRustlsConnect::new(config))
}

/// The CAs of `sslrootcert`, or the system's.
fn roots(file: Option<&PathBuf>) -> anyhow::Result<RootCertStore> {
    let mut roots = RootCertStore::empty();
    match file {
        Some(path) => {
            use rustls::pki_types::pem::PemObject;
            let certs = CertificateDer::pem_file_iter(path)
                .with_context(|| format!("reading sslrootcert {}", path.display()))?
                .collect::<Result<Vec<_>, _>>()
                .with_context(|| format!("sslrootcert {} is not PEM", path.display()))?;
            anyhow::ensure!(
                !certs.is_empty(),
                "sslrootcert {} holds no certificate",
                path.display()
            );
            for cert in certs {
                roots.add(cert).context("a certificate of sslrootcert")?;
            }
        }
        None => {
            for cert in rustls_native_certs::load_native_certs().certs {
                let _ = roots.add(cert);
            }
        }
    }
    Ok(roots)
}

/// `verify-ca` and `verify-full`: the chain to a trusted CA; the host name for `verify-full`
/// only (libpq's `verify-ca` accepts a certificate of another host).
#[derive(Debug)]
struct Verifier {
    webpki: Arc<WebPkiServerVerifier>,
    check_name: bool,
}

impl ServerCertVerifier for Verifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, Error> {
        match self
            .webpki
            .verify_server_cert(end_entity, intermediates, server_name, ocsp, now)
        {
            Err(Error::InvalidCertificate(
                CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
            )) if !self.check_name => Ok(ServerCertVerified::assertion()),
            other => other,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, Error> {
        self.webpki.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, Error> {
        self.webpki.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.webpki.supported_verify_schemes()
    }
}

/// `prefer` and `require` without `sslrootcert`: encrypted, the certificate not checked (as
/// libpq does); the handshake's signatures still are.
#[derive(Debug)]
struct Unchecked(Arc<rustls::crypto::CryptoProvider>);

impl ServerCertVerifier for Unchecked {
    fn verify_server_cert(
        &self,
        _: &CertificateDer<'_>,
        _: &[CertificateDer<'_>],
        _: &ServerName<'_>,
        _: &[u8],
        _: UnixTime,
    ) -> Result<ServerCertVerified, Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sslmode_and_sslrootcert_are_taken_out_of_the_url() {
        let (url, tls) = split_url(
            "postgres://u:p@db.internal:5432/inbox?sslmode=verify-full&sslrootcert=/etc/ca.pem&application_name=x",
        )
        .unwrap();
        assert_eq!(
            url,
            "postgres://u:p@db.internal:5432/inbox?application_name=x"
        );
        assert_eq!(tls.mode, Mode::VerifyFull);
        assert_eq!(tls.root_cert, Some(PathBuf::from("/etc/ca.pem")));
        let (url, tls) = split_url("postgres://u@h/db").unwrap();
        assert_eq!(
            (url.as_str(), tls.mode),
            ("postgres://u@h/db", Mode::Prefer)
        );
        let err = split_url("postgres://u@h/db?sslmode=allow-ish").unwrap_err();
        assert!(err.to_string().contains("allow-ish"), "{err}");
    }
}
