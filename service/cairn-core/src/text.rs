//! Text normalisation shared by fingerprints, duplicate detection and query building.

use sha2::{Digest, Sha256};

/// The words of `text` as written: runs of letters and digits, in order.
pub fn words(text: &str) -> impl Iterator<Item = &str> {
    text.split(|c: char| !c.is_alphanumeric())
        .filter(|word| !word.is_empty())
}

/// Lower-cased alphanumeric tokens of `text`, in order.
pub fn tokens(text: &str) -> Vec<String> {
    words(text).map(str::to_lowercase).collect()
}

/// Common English function words, plus "user": facts are written about the user in the
/// third person, so it appears in nearly every record. Full-text queries leave these out.
const STOPWORDS: &[&str] = &[
    "a", "about", "an", "and", "are", "as", "at", "be", "been", "but", "by", "can", "could", "did", "do",
    "does", "for", "from", "had", "has", "have", "he", "her", "him", "his", "how", "i", "if", "in", "into",
    "is", "it", "its", "me", "my", "of", "on", "or", "our", "she", "so", "that", "the", "their", "them",
    "then", "there", "these", "they", "this", "to", "user", "users", "was", "we", "were", "what", "when",
    "where", "which", "who", "whom", "why", "will", "with", "would", "you", "your",
];

/// The distinct tokens of a search query, without stopwords (unless the query holds
/// nothing else), in first-seen order.
pub fn query_terms(text: &str) -> Vec<String> {
    let mut all = tokens(text);
    let mut seen = std::collections::HashSet::new();
    all.retain(|token| seen.insert(token.clone()));
    let content: Vec<String> = all
        .iter()
        // Single letters are clitics ("user's", "don't") rather than words.
        .filter(|token| !STOPWORDS.contains(&token.as_str()))
        .filter(|token| token.chars().count() > 1 || token.chars().all(|c| c.is_numeric()))
        .cloned()
        .collect();
    if content.is_empty() { all } else { content }
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

/// HMAC-SHA256 (RFC 2104) of `data` under `key`.
pub fn hmac_sha256(key: &[u8], data: &[u8]) -> [u8; 32] {
    const BLOCK: usize = 64;
    let mut block = [0u8; BLOCK];
    if key.len() > BLOCK {
        block[..32].copy_from_slice(&Sha256::digest(key));
    } else {
        block[..key.len()].copy_from_slice(key);
    }
    let inner = Sha256::new()
        .chain_update(block.map(|byte| byte ^ 0x36))
        .chain_update(data)
        .finalize();
    Sha256::new()
        .chain_update(block.map(|byte| byte ^ 0x5c))
        .chain_update(inner)
        .finalize()
        .into()
}

/// `hmac-sha256:<hex>` of the normalized text under a scope's audit key: what the audit
/// trail keeps of a forgotten or refused value. Unlike [`fingerprint`] it differs
/// between scopes, and once the scope is erased (and its key with it) nobody can
/// confirm a guessed value against it.
pub fn keyed_fingerprint(key: &[u8], text: &str) -> String {
    format!(
        "hmac-sha256:{}",
        hex::encode(hmac_sha256(key, normalize(text).as_bytes()))
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hmac_matches_rfc_4231_and_keyed_fingerprints_depend_on_the_key() {
        assert_eq!(
            hex::encode(hmac_sha256(b"Jefe", b"what do ya want for nothing?")),
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
        // Test case 6: a key longer than the block is hashed first.
        assert_eq!(
            hex::encode(hmac_sha256(
                &[0xaa; 131],
                b"Test Using Larger Than Block-Size Key - Hash Key First"
            )),
            "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54"
        );
        let one = keyed_fingerprint(b"scope one", "Lives in Paris.");
        assert_eq!(one, keyed_fingerprint(b"scope one", "lives   in paris"));
        assert_ne!(one, keyed_fingerprint(b"scope two", "Lives in Paris."));
        assert!(one.starts_with("hmac-sha256:") && !one.contains(&fingerprint("Lives in Paris.")[7..]));
    }

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
    fn query_terms_drop_stopwords_and_repeats() {
        assert_eq!(
            query_terms("Where does the user's cat live? The cat!"),
            vec!["cat", "live"]
        );
        assert_eq!(query_terms("born in 7 BC"), vec!["born", "7", "bc"]);
        assert_eq!(query_terms("who is it"), vec!["who", "is", "it"]);
        assert!(query_terms("...").is_empty());
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
