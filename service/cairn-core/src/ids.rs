//! Opaque, time-ordered record identifiers.

/// A new identifier such as `fact_01933c5e8c6e7f6b9a0e2c4d6f8a0b1c`: a kind prefix and
/// a UUIDv7, so ids sort by creation time and say what they name.
pub fn new_id(prefix: &str) -> String {
    format!("{prefix}_{}", uuid::Uuid::now_v7().simple())
}
