//! How recall reads the records it finds without touching stored fields.
//!
//! A search's fetch phase reads each hit's `_source` from Lucene's stored fields, which
//! are compressed in blocks of many documents: every hit costs the node a block's
//! decompression, however small its own source (about 0.15 ms per hit at 10k facts,
//! two thirds of a 50-hit text search). Episodes, facts and playbooks therefore also
//! carry `record`: the document as recall needs it (without `tenant`, `user`, its stems
//! and its vector), as base64 of its JSON, kept as a binary doc value and left out of
//! `_source`. Recall's searches ask for no stored field at all, only the `id` and
//! `record` doc values ([`read_from_doc_values`]); on a kept 10k index that made a
//! 50-hit text search 2 ms of node time instead of 9.
//!
//! The vector has a doc value of its own, `record_vector` (its 4 bytes per dimension;
//! base64 in the answer, 2 KB at 384 dimensions against a few hundred bytes for the
//! rest of a record), read only by a search whose caller needs vectors. Most legs do
//! not: a recall's text legs read about a sixth of what they read when the vector was
//! part of `record`.
//!
//! Every document on its way to one of these indices gets its `record` and
//! `record_vector` made afresh from the document itself ([`attach`]), whatever path
//! writes it: a commit, a roll-back of a document as it was read, a context, a backfill.
//! A document written before `record` existed (or by an older process) has none: its
//! hit names only its `id`, and the store reads its `_source` by id (see
//! `ClusterStore::search_legs`); `cairn bootstrap` gives such documents their record.
//! A document written before `record_vector` existed keeps its vector inside `record`,
//! which is read as it is (the vector dropped unless asked for) until the document is
//! next written. Indices made before these fields cannot leave them out of `_source`
//! (`_source.excludes` cannot change): their sources carry them too, and every read of
//! a source drops them.

use base64::Engine as _;
use cairn_core::{Error, Result};
use serde_json::{Value, json};

use crate::vectors::CODEC;

/// The indices whose documents carry `record`.
pub const KINDS: [&str; 3] = ["episodes", "facts", "playbooks"];

/// The field.
pub const FIELD: &str = "record";

/// The doc value of a record's vector.
pub const VECTOR: &str = "record_vector";

/// Fields of a document that `record` leaves out: the scope (every search filters on
/// it), the stems (only matched, never read) and the vector (the float array, and
/// `vector`, which [`VECTOR`] holds).
const LEFT_OUT: [&str; 8] = [
    "tenant",
    "user",
    "terms",
    "context_terms",
    "embedding",
    "vector",
    FIELD,
    VECTOR,
];

/// Sets `record` and `record_vector` on a document of one of [`KINDS`] from the
/// document's own fields (a document without a vector gets no `record_vector`).
pub fn attach(document: &mut Value) -> Result<()> {
    let Value::Object(fields) = document else {
        return Ok(());
    };
    let kept: serde_json::Map<String, Value> = fields
        .iter()
        .filter(|(name, _)| !LEFT_OUT.contains(&name.as_str()))
        .map(|(name, value)| (name.clone(), value.clone()))
        .collect();
    // A document of an index made before `vector` holds its vector as the float array.
    let vector = match (fields.get("vector"), fields.get("embedding")) {
        (Some(Value::String(vector)), _) => Some(vector.clone()),
        (_, Some(Value::Array(values))) => {
            let values: Option<Vec<f32>> = values
                .iter()
                .map(|value| value.as_f64().map(|v| v as f32))
                .collect();
            let values =
                values.ok_or_else(|| Error::Storage("field embedding: not an array of numbers".into()))?;
            Some(crate::vectors::encode(&values))
        }
        _ => None,
    };
    let bytes =
        serde_json::to_vec(&kept).map_err(|error| Error::Storage(format!("field record: {error}")))?;
    fields.insert(FIELD.to_owned(), json!(CODEC.encode(bytes)));
    match vector {
        Some(vector) => fields.insert(VECTOR.to_owned(), json!(vector)),
        None => fields.remove(VECTOR),
    };
    Ok(())
}

/// A record from its doc value.
pub fn read(encoded: &str) -> Result<Value> {
    let bytes = CODEC
        .decode(encoded)
        .map_err(|error| Error::Storage(format!("field record: {error}")))?;
    serde_json::from_slice(&bytes).map_err(|error| Error::Storage(format!("field record: {error}")))
}

/// Makes a search read its hits' `id` and `record` doc values, and `record_vector`
/// when `with_vectors`, and no stored field (no `_source`, and no `_id`: that is a
/// stored field too).
pub fn read_from_doc_values(body: &mut Value, with_vectors: bool) {
    body["_source"] = json!(false);
    body["stored_fields"] = json!("_none_");
    body["docvalue_fields"] = if with_vectors {
        json!(["id", FIELD, VECTOR])
    } else {
        json!(["id", FIELD])
    };
}

/// One hit of a search made with [`read_from_doc_values`].
#[derive(Clone, Debug, PartialEq)]
pub struct Found {
    pub id: String,
    pub score: f64,
    /// The record, with its `vector` when the search read `record_vector`; `None` for a
    /// document written without one.
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
            let mut source = hit["fields"][FIELD][0].as_str().map(read).transpose()?;
            if let (Some(Value::Object(record)), Some(vector)) =
                (source.as_mut(), hit["fields"][VECTOR][0].as_str())
            {
                record.insert("vector".to_owned(), json!(vector));
            }
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
            "record": "stale", "record_vector": "stale"
        });
        attach(&mut document).expect("attach");
        let encoded = document[FIELD].as_str().expect("a string").to_owned();
        let record = read(&encoded).expect("reads");
        assert_eq!(record, json!({ "id": "f1", "text": "Ana moved to Lisbon" }));
        assert_eq!(
            document[VECTOR],
            json!("AAAAPw=="),
            "the vector has its own doc value"
        );
        assert_eq!(read(encoded.trim_end_matches('=')).expect("unpadded"), record);
        assert!(matches!(read("%%"), Err(Error::Storage(_))));
        // A document of the layout before `vector`: its float array becomes the doc value.
        let mut older = json!({ "id": "f0", "embedding": [0.5, -1.0] });
        attach(&mut older).expect("attach");
        let record = read(older[FIELD].as_str().expect("a string")).expect("reads");
        assert_eq!(record, json!({ "id": "f0" }));
        assert_eq!(older[VECTOR], json!(crate::vectors::encode(&[0.5, -1.0])));
        // A document without a vector has none, whatever it was read with.
        let mut unembedded = json!({ "id": "f2", "record_vector": "stale" });
        attach(&mut unembedded).expect("attach");
        assert!(unembedded.get(VECTOR).is_none());
        assert!(matches!(read(&CODEC.encode(b"not json")), Err(Error::Storage(_))));
    }

    #[test]
    fn only_a_search_that_asks_for_vectors_reads_them() {
        let mut body = json!({ "size": 5 });
        read_from_doc_values(&mut body, false);
        assert_eq!(body["docvalue_fields"], json!(["id", "record"]));
        assert_eq!(body["_source"], json!(false));
        read_from_doc_values(&mut body, true);
        assert_eq!(body["docvalue_fields"], json!(["id", "record", "record_vector"]));
    }

    #[test]
    fn hits_name_their_id_score_and_record_and_a_hit_without_id_is_an_error() {
        let mut document = json!({ "id": "f1", "text": "x" });
        attach(&mut document).expect("attach");
        let answer = json!({ "hits": { "hits": [
            { "_index": "i", "_score": 1.5, "fields": { "id": ["f1"], "record": [document[FIELD]] } },
            { "_index": "i", "_score": 0.5, "fields": { "id": ["f2"] } },
            // As OpenSearch answers a vector's doc value: unpadded.
            { "_index": "i", "_score": 0.25, "fields": {
                "id": ["f3"], "record": [document[FIELD]], "record_vector": ["AAAAPwAAgL8"]
            } }
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
                Found {
                    id: "f3".into(),
                    score: 0.25,
                    source: Some(json!({ "id": "f1", "text": "x", "vector": "AAAAPwAAgL8" }))
                },
            ]
        );
        let vector = found(&answer).expect("parses")[2]
            .source
            .as_ref()
            .expect("a record")["vector"]
            .clone();
        assert_eq!(
            crate::vectors::decode(vector.as_str().expect("a string")).expect("unpadded decodes"),
            vec![0.5, -1.0]
        );
        let broken = json!({ "hits": { "hits": [{ "_index": "i", "_score": 1.0, "fields": {} }] } });
        assert!(matches!(found(&broken), Err(Error::Storage(_))));
    }
}
