//! Text normalisation shared by fingerprints, duplicate detection and query building.

use sha2::{Digest, Sha256};

/// Lower-cased alphanumeric tokens of `text`, in order.
pub fn tokens(text: &str) -> Vec<String> {
    text.split(|c: char| !c.is_alphanumeric())
        .filter(|token| !token.is_empty())
        .map(str::to_lowercase)
        .collect()
}

/// The canonical form two values must share to count as the same value:
/// lower-case alphanumeric tokens joined by single spaces.
pub fn normalize(text: &str) -> String {
    tokens(text).join(" ")
}

/// `sha256:<hex>` of the normalized text. Tombstones and the audit keep this instead of
/// the text, so an erased value can be recognised without being retained.
pub fn fingerprint(text: &str) -> String {
    let digest = Sha256::digest(normalize(text).as_bytes());
    format!("sha256:{}", hex::encode(digest))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn normalization_ignores_case_punctuation_and_spacing() {
        assert_eq!(
            normalize("  The user's  city is PARIS! "),
            "the user s city is paris"
        );
        assert_eq!(fingerprint("Lives in Paris."), fingerprint("lives   in paris"));
        assert_ne!(fingerprint("Lives in Paris"), fingerprint("Lives in Lyon"));
        assert!(fingerprint("x").starts_with("sha256:"));
    }

    #[test]
    fn tokens_keep_unicode_letters_and_digits() {
        assert_eq!(
            tokens("Zoë moved to Köln in 2024"),
            vec!["zoë", "moved", "to", "köln", "in", "2024"]
        );
        assert!(tokens("!!! ---").is_empty());
    }
}
