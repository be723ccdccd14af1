//! How recall reads the records it finds without touching stored fields.
//!
//! A search's fetch phase reads each hit's `_source` from Lucene's stored fields, which
//! are compressed in blocks of many documents: every hit costs the node a block's
//! decompression, however small its own source (about 0.15 ms per hit at 10k facts,
//! two thirds of a 50-hit text search). Episodes, facts and playbooks therefore also
//! carry `record`: the document as recall needs it (without `tenant`, `user`, its stems
//! and the float vector), as base64 of its JSON, kept as a binary doc value and left out
//! of `_source`. Recall's searches ask for no stored field at all, only the `id` and
//! `record` doc values ([`read_from_doc_values`]); on a kept 10k index that made a
//! 50-hit text search 2 ms of node time instead of 9.
//!
//! Every document on its way to one of these indices gets its `record` made afresh
//! from the document itself ([`attach`]), whatever path writes it: a commit, a
//! roll-back of a document as it was read, a context, a backfill. A document written
//! before `record` existed (or by an older process) has none: its hit names only its
//! `id`, and the store reads its `_source` by id (see `ClusterStore::search_legs`);
//! `cairn bootstrap` gives such documents their record. Indices made before `record`
//! cannot leave it out of `_source` (`_source.excludes` cannot change): their sources
//! carry it too, and every read of a source drops it.

use base64::Engine as _;
use base64::engine::{DecodePaddingMode, GeneralPurpose, GeneralPurposeConfig};
use cairn_core::{Error, Result};
use serde_json::{Value, json};

/// The indices whose documents carry `record`.
pub const KINDS: [&str; 3] = ["episodes", "facts", "playbooks"];

/// The field.
pub const FIELD: &str = "record";

/// Fields of a document that `record` leaves out: the scope (every search filters on
/// it), the stems (only matched, never read) and the float vector (`vector` holds it).
const LEFT_OUT: [&str; 6] = ["tenant", "user", "terms", "context_terms", "embedding", FIELD];

/// Standard base64; OpenSearch answers doc values without padding, Elasticsearch with.
const CODEC: GeneralPurpose = GeneralPurpose::new(
    &base64::alphabet::STANDARD,
    GeneralPurposeConfig::new().with_decode_padding_mode(DecodePaddingMode::Indifferent),
);

/// Sets `record` on a document of one of [`KINDS`] from the document's own fields.
pub fn attach(document: &mut Value) -> Result<()> {
    let Value::Object(fields) = document else {
        return Ok(());
    };
    let mut kept: serde_json::Map<String, Value> = fields
        .iter()
        .filter(|(name, _)| !LEFT_OUT.contains(&name.as_str()))
        .map(|(name, value)| (name.clone(), value.clone()))
        .collect();
    // A document of an index made before `vector` holds its vector as the float array.
    if !kept.contains_key("vector")
        && let Some(values) = fields.get("embedding").and_then(Value::as_array)
    {
        let values: Option<Vec<f32>> = values
            .iter()
            .map(|value| value.as_f64().map(|v| v as f32))
            .collect();
        let values =
            values.ok_or_else(|| Error::Storage("field embedding: not an array of numbers".into()))?;
        kept.insert("vector".to_owned(), json!(crate::vectors::encode(&values)));
    }
    let bytes =
        serde_json::to_vec(&kept).map_err(|error| Error::Storage(format!("field record: {error}")))?;
    fields.insert(FIELD.to_owned(), json!(CODEC.encode(bytes)));
    Ok(())
}

/// A record from its doc value.
pub fn read(encoded: &str) -> Result<Value> {
    let bytes = CODEC
        .decode(encoded)
        .map_err(|error| Error::Storage(format!("field record: {error}")))?;
    serde_json::from_slice(&bytes).map_err(|error| Error::Storage(format!("field record: {error}")))
}

/// Makes a search read its hits' `id` and `record` doc values and no stored field
/// (no `_source`, and no `_id`: that is a stored field too).
pub fn read_from_doc_values(body: &mut Value) {
    body["_source"] = json!(false);
    body["stored_fields"] = json!("_none_");
    body["docvalue_fields"] = json!(["id", FIELD]);
}

/// One hit of a search made with [`read_from_doc_values`].
#[derive(Clone, Debug, PartialEq)]
pub struct Found {
    pub id: String,
    pub score: f64,
    /// The record; `None` for a document written without one.
    pub source: Option<Value>,
}

/// The hits of a search made with [`read_from_doc_values`], in the answer's order.
pub fn found(answer: &Value) -> Result<Vec<Found>> {
    let Some(hits) = answer["hits"]["hits"].as_array() else {
        return Err(Error::Storage("search answer without hits".into()));
    };
    hits.iter()
        .map(|hit| {
            let id = hit["fields"]["id"][0]
                .as_str()
                .ok_or_else(|| Error::Storage(format!("{}: a hit without an id", hit["_index"])))?;
            let score = hit["_score"]
                .as_f64()
                .ok_or_else(|| Error::Storage(format!("{}: hit {id} has no score", hit["_index"])))?;
            let source = hit["fields"][FIELD][0].as_str().map(read).transpose()?;
            Ok(Found {
                id: id.to_owned(),
                score,
                source,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_holds_what_recall_reads_and_round_trips_with_or_without_padding() {
        let mut document = json!({
            "tenant": "t", "user": "u", "id": "f1", "text": "Ana moved to Lisbon",
            "terms": "ana move lisbon", "embedding": [0.5], "vector": "AAAAPw==",
            "record": "stale"
        });
        attach(&mut document).expect("attach");
        let encoded = document[FIELD].as_str().expect("a string").to_owned();
        let record = read(&encoded).expect("reads");
        assert_eq!(
            record,
            json!({ "id": "f1", "text": "Ana moved to Lisbon", "vector": "AAAAPw==" })
        );
        assert_eq!(read(encoded.trim_end_matches('=')).expect("unpadded"), record);
        assert!(matches!(read("%%"), Err(Error::Storage(_))));
        // A document of the layout before `vector`: the record holds the vector as one.
        let mut older = json!({ "id": "f0", "embedding": [0.5, -1.0] });
        attach(&mut older).expect("attach");
        let record = read(older[FIELD].as_str().expect("a string")).expect("reads");
        assert_eq!(
            record,
            json!({ "id": "f0", "vector": crate::vectors::encode(&[0.5, -1.0]) })
        );
        assert!(matches!(read(&CODEC.encode(b"not json")), Err(Error::Storage(_))));
    }

    #[test]
    fn hits_name_their_id_score_and_record_and_a_hit_without_id_is_an_error() {
        let mut document = json!({ "id": "f1", "text": "x" });
        attach(&mut document).expect("attach");
        let answer = json!({ "hits": { "hits": [
            { "_index": "i", "_score": 1.5, "fields": { "id": ["f1"], "record": [document[FIELD]] } },
            { "_index": "i", "_score": 0.5, "fields": { "id": ["f2"] } }
        ] } });
        assert_eq!(
            found(&answer).expect("parses"),
            vec![
                Found {
                    id: "f1".into(),
                    score: 1.5,
                    source: Some(json!({ "id": "f1", "text": "x" }))
                },
                Found {
                    id: "f2".into(),
                    score: 0.5,
                    source: None
                },
            ]
        );
        let broken = json!({ "hits": { "hits": [{ "_index": "i", "_score": 1.0, "fields": {} }] } });
        assert!(matches!(found(&broken), Err(Error::Storage(_))));
    }
}
