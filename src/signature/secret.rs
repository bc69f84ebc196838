use std::sync::OnceLock;

use hmac::Mac;
use serde::Deserialize;

use super::{HmacSha256, standard};

/// A secret string (signing secret, bearer token) whose `Debug` never shows its value, so that
/// logging a config or an error cannot leak it.
///
/// A signing secret also keeps its HMAC keyed once, on first use: keying hashes the padded key
/// (two SHA-256 blocks) and a Standard Webhooks secret is base64 to decode first, work that
/// would otherwise be done again for every delivery.
#[derive(Clone, Default, Deserialize)]
#[serde(transparent)]
pub struct Secret {
    value: String,
    #[serde(skip)]
    keyed: OnceLock<HmacSha256>,
    #[serde(skip)]
    standard: OnceLock<Result<HmacSha256, String>>,
}

impl Secret {
    pub fn new(value: impl Into<String>) -> Self {
        Secret {
            value: value.into(),
            ..Secret::default()
        }
    }

    pub fn expose(&self) -> &str {
        &self.value
    }

    pub fn is_empty(&self) -> bool {
        self.value.is_empty()
    }

    /// The HMAC keyed with the secret's bytes as they are (Stripe, GitHub, Shopify, generic).
    pub(super) fn keyed(&self) -> &HmacSha256 {
        self.keyed.get_or_init(|| {
            HmacSha256::new_from_slice(self.value.as_bytes()).expect("HMAC takes keys of any size")
        })
    }

    /// The HMAC keyed with the Standard Webhooks key (the base64 after `whsec_`), or why the
    /// secret is not one.
    pub(super) fn standard_keyed(&self) -> Result<&HmacSha256, &str> {
        self.standard
            .get_or_init(|| {
                let key = standard::key(self)?;
                Ok(HmacSha256::new_from_slice(&key).expect("HMAC takes keys of any size"))
            })
            .as_ref()
            .map_err(String::as_str)
    }
}

impl PartialEq for Secret {
    fn eq(&self, other: &Self) -> bool {
        self.value == other.value
    }
}

impl Eq for Secret {}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("[redacted]")
    }
}
