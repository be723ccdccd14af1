//! Page cursors. Rows are numbered across every tenant, so a cursor that carried the
//! row number would let a tenant count other tenants' writes between two of its own
//! pages. A cursor is instead the row number enciphered (a four-round Feistel network
//! over 64 bits, HMAC-SHA256 rounds) under the store's secret and the scope: it says
//! nothing about the numbering, and it is refused in any other scope.

use cairn_core::Scope;
use cairn_core::text::hmac_sha256;

/// Marks a genuine cursor in its low 16 bits; row numbers fit the other 48.
const TAG: u64 = 0xCA1E;
const ROUNDS: u8 = 4;

fn round(key: &[u8; 32], scope: &Scope, round: u8, half: u32) -> u32 {
    let input = format!(
        "{}\u{1f}{}\u{1f}{round}\u{1f}{half}",
        scope.tenant(),
        scope.user()
    );
    let digest = hmac_sha256(key, input.as_bytes());
    u32::from_be_bytes([digest[0], digest[1], digest[2], digest[3]])
}

/// The cursor of the row numbered `seq` in `scope`.
pub fn seal(key: &[u8; 32], scope: &Scope, seq: i64) -> String {
    let block = (u64::try_from(seq).unwrap_or(0) << 16) | TAG;
    let (mut left, mut right) = ((block >> 32) as u32, block as u32);
    for index in 0..ROUNDS {
        (left, right) = (right, left ^ round(key, scope, index, right));
    }
    format!("{:016x}", (u64::from(left) << 32) | u64::from(right))
}

/// The row number a cursor of `scope` stands for; `None` for anything else.
pub fn open(key: &[u8; 32], scope: &Scope, cursor: &str) -> Option<i64> {
    if cursor.len() != 16 {
        return None;
    }
    let block = u64::from_str_radix(cursor, 16).ok()?;
    let (mut left, mut right) = ((block >> 32) as u32, block as u32);
    for index in (0..ROUNDS).rev() {
        (left, right) = (right ^ round(key, scope, index, left), left);
    }
    let block = (u64::from(left) << 32) | u64::from(right);
    if block & 0xFFFF != TAG {
        return None;
    }
    i64::try_from(block >> 16).ok().filter(|seq| *seq > 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[allow(clippy::disallowed_methods)]
    fn scope(tenant: &str) -> Scope {
        let tenant = cairn_core::TenantId::parse(tenant).expect("tenant");
        cairn_core::Principal::from_verified_credential(
            "test".into(),
            tenant,
            None,
            vec![cairn_core::Permission::Read],
        )
        .scope_for("u", cairn_core::Permission::Read)
        .expect("scope")
    }

    #[test]
    fn cursors_round_trip_in_their_scope_only_and_hide_the_numbering() {
        let key = [7u8; 32];
        let (acme, other) = (scope("acme"), scope("other"));
        for seq in [1, 2, 3, 1_000, 123_456_789, (1 << 47) - 1] {
            let cursor = seal(&key, &acme, seq);
            assert_eq!(open(&key, &acme, &cursor), Some(seq));
            assert_eq!(open(&key, &other, &cursor), None, "refused in another scope");
            assert_eq!(
                open(&[8u8; 32], &acme, &cursor),
                None,
                "refused under another key"
            );
            assert!(!cursor.contains(&seq.to_string()) || seq < 10);
        }
        // Consecutive row numbers give unrelated cursors.
        let (one, two) = (seal(&key, &acme, 500), seal(&key, &acme, 501));
        let differing = one.chars().zip(two.chars()).filter(|(a, b)| a != b).count();
        assert!(differing > 8, "{one} {two}");
        for bad in ["", "12", "zzzzzzzzzzzzzzzz", "00000000000000000"] {
            assert_eq!(open(&key, &acme, bad), None, "{bad:?}");
        }
    }
}
