//! How a record's vector is kept. The kNN index is built from `embedding` (a float
//! array), but the stored `_source` leaves it out (`_source.excludes` in `mappings/`) and
//! keeps `vector` instead: the same values as base64 of little-endian `f32`s, a single
//! string of about 2 KB at 384 dimensions. Parsing 384 floats of JSON for every hit was
//! most of what a recall's fetch phase cost; skipping one string costs nearly nothing.
//!
//! Documents are written with `vector` only; [`indexable`] gives every document on its
//! way to the cluster the `embedding` its `vector` holds, so a rewrite of a document as
//! it was read (a use count, a roll-back, a context) keeps its place in the kNN index.
//! Indices made before this layout keep `embedding` in their source too; reads take
//! either.

use base64::Engine as _;
use base64::engine::{DecodePaddingMode, GeneralPurpose, GeneralPurposeConfig};
use cairn_core::{Error, Result};
use serde_json::{Value, json};

/// Standard base64, written padded and read either way: OpenSearch answers binary doc
/// values (`record`, `record_vector`) without padding, Elasticsearch with.
pub(crate) const CODEC: GeneralPurpose = GeneralPurpose::new(
    &base64::alphabet::STANDARD,
    GeneralPurposeConfig::new().with_decode_padding_mode(DecodePaddingMode::Indifferent),
);

/// The stored form of a vector.
pub fn encode(values: &[f32]) -> String {
    let bytes: Vec<u8> = values.iter().flat_map(|value| value.to_le_bytes()).collect();
    CODEC.encode(bytes)
}

/// A vector from its stored form.
pub fn decode(text: &str) -> Result<Vec<f32>> {
    let bytes = CODEC
        .decode(text)
        .map_err(|error| Error::Storage(format!("field vector: {error}")))?;
    if bytes.len() % 4 != 0 {
        return Err(Error::Storage(format!(
            "field vector: {} bytes is not a whole number of 32-bit floats",
            bytes.len()
        )));
    }
    Ok(bytes
        .chunks_exact(4)
        .map(|chunk| f32::from_le_bytes([chunk[0], chunk[1], chunk[2], chunk[3]]))
        .collect())
}

/// A record's vector as read: `vector`, or `embedding` in a document of an index made
/// before `vector` existed.
pub fn stored(vector: Option<String>, embedding: Option<Vec<f32>>) -> Result<Option<Vec<f32>>> {
    match vector {
        Some(text) => decode(&text).map(Some),
        None => Ok(embedding),
    }
}

/// Sets `embedding` from `vector` on a document about to be indexed (any other document
/// is left as it is).
pub fn indexable(document: &mut Value) -> Result<()> {
    if let Some(text) = document.get("vector").and_then(Value::as_str) {
        let values = decode(text)?;
        document["embedding"] = json!(values);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vectors_round_trip_exactly_and_bad_ones_are_storage_errors() {
        let values = vec![0.25, -1.5, f32::MIN_POSITIVE, 3.0e-8, 0.0];
        let text = encode(&values);
        assert_eq!(decode(&text).expect("decodes"), values);
        assert!(matches!(decode("not base64!"), Err(Error::Storage(_))));
        // Three bytes: not a float.
        assert!(matches!(decode("AAAA"), Err(Error::Storage(message)) if message.contains("32-bit")));
        assert_eq!(
            stored(None, Some(vec![1.0])).expect("old layout"),
            Some(vec![1.0])
        );
        assert_eq!(
            stored(Some(text), Some(vec![9.0])).expect("new layout"),
            Some(values)
        );
    }

    #[test]
    fn documents_with_a_vector_are_indexed_with_its_embedding() {
        let mut document = json!({ "id": "f1", "vector": encode(&[0.5, -0.5]) });
        indexable(&mut document).expect("indexable");
        assert_eq!(document["embedding"], json!([0.5, -0.5]));
        let mut plain = json!({ "id": "a1", "text": "x" });
        indexable(&mut plain).expect("indexable");
        assert_eq!(plain, json!({ "id": "a1", "text": "x" }));
        let mut broken = json!({ "vector": "%%%" });
        assert!(indexable(&mut broken).is_err());
    }
}
