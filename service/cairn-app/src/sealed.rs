//! Tombstoned values as an export file carries them: sealed (AES-256-GCM, a random
//! nonce each) under a key the file never holds, so that nobody who reads the file can
//! confirm a guess of a forgotten value by hashing it, while an import into a service
//! with the same key opens them and keeps blocking those values.
//!
//! The key is the operator's `export_key` when one is configured (the same on every
//! deployment that exchanges exports), else the tenant's key kept in the store
//! (`MemoryStore::tenant_key`: the same for every user of the tenant, through erasures,
//! on this store alone).

use crate::Cairn;
use aws_lc_rs::aead::{AES_256_GCM, Aad, LessSafeKey, NONCE_LEN, Nonce, UnboundKey};
use base64::Engine as _;
use cairn_core::text::hmac_sha256;
use cairn_core::{Error, Result, Scope};

/// The prefix of a sealed value in an export.
pub const SEALED: &str = "sealed-v1:";
const AAD: &[u8] = b"cairn-export tombstone";
const DERIVATION: &[u8] = b"cairn export sealing v1";

/// The sealing key of one export or import.
pub(crate) struct Sealer {
    key: LessSafeKey,
}

impl Sealer {
    fn from_material(material: &[u8]) -> Result<Self> {
        let derived = hmac_sha256(material, DERIVATION);
        let key = UnboundKey::new(&AES_256_GCM, &derived)
            .map_err(|_| Error::Storage("the export sealing key could not be made".into()))?;
        Ok(Sealer {
            key: LessSafeKey::new(key),
        })
    }

    /// `value` sealed under a fresh random nonce.
    pub(crate) fn seal(&self, value: &str) -> Result<String> {
        let nonce_bytes: [u8; NONCE_LEN] = rand::random();
        let mut sealed = value.as_bytes().to_vec();
        self.key
            .seal_in_place_append_tag(
                Nonce::assume_unique_for_key(nonce_bytes),
                Aad::from(AAD),
                &mut sealed,
            )
            .map_err(|_| Error::Storage("a tombstone could not be sealed".into()))?;
        let mut out = nonce_bytes.to_vec();
        out.extend(sealed);
        Ok(format!(
            "{SEALED}{}",
            base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(out)
        ))
    }

    /// The value sealed in `text` (`None`: not sealed with this key, or not sealed
    /// at all).
    pub(crate) fn open(&self, text: &str) -> Option<String> {
        let encoded = text.strip_prefix(SEALED)?;
        let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
            .decode(encoded)
            .ok()?;
        if bytes.len() < NONCE_LEN {
            return None;
        }
        let (nonce, sealed) = bytes.split_at(NONCE_LEN);
        let nonce = Nonce::try_assume_unique_for_key(nonce).ok()?;
        let mut sealed = sealed.to_vec();
        let opened = self.key.open_in_place(nonce, Aad::from(AAD), &mut sealed).ok()?;
        String::from_utf8(opened.to_vec()).ok()
    }
}

impl Cairn {
    /// The sealer of `scope`'s exports and imports (see the module documentation).
    pub(crate) async fn sealer(&self, scope: &Scope) -> Result<Sealer> {
        match &self.settings.export_key {
            Some(key) => Sealer::from_material(key.as_bytes()),
            None => {
                let candidate: [u8; 32] = rand::random();
                let key = self.store.tenant_key(scope, candidate).await?;
                Sealer::from_material(&key)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sealed_value_opens_with_its_key_only_and_never_seals_the_same_twice() {
        let sealer = Sealer::from_material(b"one key").expect("key");
        let value = "sha256:5e884898da28047151d0e56f8dc6292773603d0d6aabbdd62a11ef721d1542d8";
        let first = sealer.seal(value).expect("seal");
        let second = sealer.seal(value).expect("seal");
        assert!(first.starts_with(SEALED));
        assert_ne!(
            first, second,
            "a fresh nonce each time: equal values cannot be matched"
        );
        assert!(!first.contains("5e8848"), "{first}");
        assert_eq!(sealer.open(&first).as_deref(), Some(value));
        assert_eq!(sealer.open(&second).as_deref(), Some(value));
        let other = Sealer::from_material(b"another key").expect("key");
        assert_eq!(other.open(&first), None, "another key cannot open it");
        let mut tampered = first.clone();
        tampered.pop();
        tampered.push(if first.ends_with('A') { 'B' } else { 'A' });
        assert_eq!(sealer.open(&tampered), None, "a changed seal does not open");
        assert_eq!(sealer.open(value), None, "an unsealed value is not opened");
    }
}
