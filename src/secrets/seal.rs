//! Optional encryption at rest of the secrets the store keeps whole (signing secrets, claims
//! keys), under a key every node is given in `WEBHOOK_INBOX_SECRETS_KEY` (`secrets_key`: 32
//! bytes, base64). ChaCha20-Poly1305 from `ring` (already built for TLS), a random nonce per
//! value, and the subscription's name and the secret's purpose as associated data, so that a
//! sealed value moved to another row does not open.
//!
//! Without a key, values are kept plain: whoever can read the database can read them. A node
//! whose key is missing or wrong cannot open them and says so (its start fails, a route answers
//! 500 with the cause in the log); it never makes a new secret in their place.

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use ring::aead::{Aad, CHACHA20_POLY1305, LessSafeKey, NONCE_LEN, Nonce, UnboundKey};

use crate::store::secrets::SEALED;

/// Seals and opens with the nodes' key, if they have one.
pub struct Sealer {
    key: Option<LessSafeKey>,
}

#[derive(Debug, thiserror::Error)]
pub enum SealError {
    #[error(
        "the secrets of subscription `{0}` are sealed and this node has no secrets key: give it \
         the other nodes' WEBHOOK_INBOX_SECRETS_KEY"
    )]
    NoKey(String),
    #[error(
        "a secret of subscription `{0}` does not open with this node's secrets key: it is not \
         the key the secret was sealed with (WEBHOOK_INBOX_SECRETS_KEY must be the same on \
         every node)"
    )]
    WrongKey(String),
}

impl Sealer {
    /// No key: values are kept plain.
    pub fn plain() -> Sealer {
        Sealer { key: None }
    }

    /// The key from its base64 form (`secrets_key`); empty: none.
    pub fn from_base64(key: &str) -> anyhow::Result<Sealer> {
        if key.is_empty() {
            return Ok(Sealer::plain());
        }
        let bytes = STANDARD
            .decode(key.trim())
            .map_err(|_| anyhow::anyhow!("secrets_key: not base64"))?;
        anyhow::ensure!(
            bytes.len() == 32,
            "secrets_key: must be 32 bytes (base64 of 32 random bytes), not {}",
            bytes.len()
        );
        let key = UnboundKey::new(&CHACHA20_POLY1305, &bytes)
            .map_err(|_| anyhow::anyhow!("secrets_key: not a usable key"))?;
        Ok(Sealer {
            key: Some(LessSafeKey::new(key)),
        })
    }

    pub fn has_key(&self) -> bool {
        self.key.is_some()
    }

    fn aad(name: &str, purpose: &str) -> Vec<u8> {
        format!("{name}\0{purpose}").into_bytes()
    }

    /// `plain` as it is kept: sealed with the key, as it is without one.
    pub fn seal(&self, name: &str, purpose: &str, plain: &str) -> String {
        let Some(key) = &self.key else {
            return plain.to_string();
        };
        let nonce: [u8; NONCE_LEN] = rand::random();
        let mut sealed = plain.as_bytes().to_vec();
        key.seal_in_place_append_tag(
            Nonce::assume_unique_for_key(nonce),
            Aad::from(Self::aad(name, purpose)),
            &mut sealed,
        )
        .expect("ChaCha20-Poly1305 seals any short value");
        let mut out = nonce.to_vec();
        out.extend_from_slice(&sealed);
        format!("{SEALED}{}", STANDARD.encode(out))
    }

    /// A kept value as it was given. A plain one (kept before the nodes had a key) is taken
    /// as it is.
    pub fn open(&self, name: &str, purpose: &str, kept: &str) -> Result<String, SealError> {
        let Some(encoded) = kept.strip_prefix(SEALED) else {
            return Ok(kept.to_string());
        };
        let key = self
            .key
            .as_ref()
            .ok_or_else(|| SealError::NoKey(name.into()))?;
        let wrong = || SealError::WrongKey(name.into());
        let mut bytes = STANDARD.decode(encoded).map_err(|_| wrong())?;
        if bytes.len() < NONCE_LEN {
            return Err(wrong());
        }
        let mut sealed = bytes.split_off(NONCE_LEN);
        let nonce: [u8; NONCE_LEN] = bytes.try_into().map_err(|_| wrong())?;
        let plain = key
            .open_in_place(
                Nonce::assume_unique_for_key(nonce),
                Aad::from(Self::aad(name, purpose)),
                &mut sealed,
            )
            .map_err(|_| wrong())?;
        String::from_utf8(plain.to_vec()).map_err(|_| wrong())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(byte: u8) -> Sealer {
        Sealer::from_base64(&STANDARD.encode([byte; 32])).unwrap()
    }

    /// Sealed values hide the secret, open with the key only, for their own row only; a
    /// missing or wrong key is an error, never a value.
    #[test]
    fn a_sealed_secret_opens_with_its_key_only() {
        let sealer = key(7);
        let sealed = sealer.seal("billing", "signing", "whsec_c2VjcmV0");
        assert!(sealed.starts_with(SEALED) && !sealed.contains("c2VjcmV0"));
        assert_eq!(
            sealer.open("billing", "signing", &sealed).unwrap(),
            "whsec_c2VjcmV0"
        );
        assert!(matches!(
            key(8).open("billing", "signing", &sealed),
            Err(SealError::WrongKey(_))
        ));
        assert!(matches!(
            sealer.open("ledger", "signing", &sealed),
            Err(SealError::WrongKey(_))
        ));
        assert!(matches!(
            Sealer::plain().open("billing", "signing", &sealed),
            Err(SealError::NoKey(_))
        ));
        assert_eq!(
            Sealer::plain().seal("billing", "signing", "whsec_x"),
            "whsec_x"
        );
        assert!(Sealer::from_base64("c2hvcnQ=").is_err(), "5 bytes");
    }
}
