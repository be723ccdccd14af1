//! The index templates of `mappings/`, installed by `cairn bootstrap`: put each
//! template, create each missing index, and check that existing indices have the
//! mapping the templates describe.
//!
//! Recall finds its candidates through fields Cairn fills with its own Porter stems
//! (`terms`, `context_terms`), indexed with the `whitespace` analyzer that every node
//! has. The `text` fields that people search in Discover get the `cairn_text` analyzer
//! (lower case, ASCII folding, Porter stemming) where the node has those filters
//! (`analysis-common`), and the `standard` analyzer where it does not (a bare
//! Elasticsearch or OpenSearch distribution).

use crate::INDICES;
use crate::client::{Cluster, Engine, Method, failure};
use crate::recalled;
use cairn_core::bm25::index_terms;
use cairn_core::{Error, Result};
use serde_json::{Value, json};

const OPENSEARCH: &str = include_str!("../../../mappings/opensearch.json");
const ELASTICSEARCH: &str = include_str!("../../../mappings/elasticsearch.json");

/// The analyzer of the `text` fields, chosen from what the node offers.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Analysis {
    /// `cairn_text`: standard tokenizer, lowercase, asciifolding, porter_stem.
    #[default]
    Stemming,
    /// The node lacks `asciifolding` or `porter_stem`: the built-in `standard` analyzer.
    Standard,
}

impl Analysis {
    pub fn describe(self) -> &'static str {
        match self {
            Analysis::Stemming => {
                "recall matches Cairn's Porter stems (whitespace analyzer); text fields use cairn_text (porter_stem, asciifolding)"
            }
            Analysis::Standard => {
                "recall matches Cairn's Porter stems (whitespace analyzer); text fields use the standard analyzer (the node has no porter_stem or asciifolding)"
            }
        }
    }
}

/// The cluster and index layout bootstrap installs for.
pub struct Target<'a> {
    pub engine: Engine,
    pub version: &'a str,
    pub prefix: &'a str,
    pub dimension: usize,
    /// Configured replicas; `None`: 1 on a cluster of several data nodes, 0 on one.
    pub replicas: Option<u32>,
}

/// What bootstrap did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct BootstrapReport {
    /// Replicas per index, and whether they were configured or chosen.
    pub replicas: u32,
    pub replicas_configured: bool,
    pub data_nodes: u64,
    /// Existing indices whose replica count was changed to `replicas`.
    pub replicas_changed: Vec<String>,
    pub created: Vec<String>,
    pub existing: Vec<String>,
    /// Existing indices that lacked fields a newer template adds, and got them.
    pub extended: Vec<String>,
    /// Documents written before their index had the stem fields, given them now.
    pub backfilled: u64,
    /// Existing indices made before vectors left `_source` (see `vectors`): their
    /// documents keep the float array too, so recall reads more of every hit.
    pub vectors_in_source: Vec<String>,
    /// Existing indices made before `record` or `record_vector` (see `recalled`): their
    /// documents keep these in `_source` too.
    pub records_in_source: Vec<String>,
    /// Documents written without a `record`, given theirs now.
    pub recorded: u64,
    pub analysis: Analysis,
}

/// Whether the node has the filters `cairn_text` needs: an `_analyze` request with them.
pub async fn detect_analysis(cluster: &Cluster) -> Result<Analysis> {
    let probe = json!({
        "tokenizer": "standard",
        "filter": ["lowercase", "asciifolding", "porter_stem"],
        "text": "Running"
    });
    let answer = cluster.call(Method::Post, "/_analyze", &[], Some(probe)).await?;
    if answer.ok() {
        return Ok(Analysis::Stemming);
    }
    if answer.status == 400 {
        return Ok(Analysis::Standard);
    }
    Err(failure("/_analyze", &answer))
}

/// The template of one index kind, for an engine, with the prefix and vector dimension
/// filled in, and `cairn_text` analysis.
pub fn template(engine: Engine, prefix: &str, kind: &str, dimension: usize) -> Result<Value> {
    template_with(engine, prefix, kind, dimension, Analysis::Stemming)
}

/// [`template`] with the text analysis the node supports.
pub fn template_with(
    engine: Engine,
    prefix: &str,
    kind: &str,
    dimension: usize,
    analysis: Analysis,
) -> Result<Value> {
    let all: Value = serde_json::from_str(match engine {
        Engine::OpenSearch => OPENSEARCH,
        Engine::Elasticsearch => ELASTICSEARCH,
    })
    .map_err(|error| Error::Storage(format!("mappings: {error}")))?;
    let mut template = all[kind].clone();
    if template.is_null() {
        return Err(Error::Storage(format!("mappings: no template for {kind}")));
    }
    template["index_patterns"] = json!([format!("{prefix}-{kind}")]);
    // `get_mut`, not indexing: indexing a missing key would insert a null field.
    if let Some(vector) = template
        .pointer_mut("/template/mappings/properties/embedding")
        .filter(|vector| vector.is_object())
    {
        match engine {
            Engine::OpenSearch => vector["dimension"] = json!(dimension),
            Engine::Elasticsearch => vector["dims"] = json!(dimension),
        }
    }
    if analysis == Analysis::Standard {
        if let Some(settings) = template
            .pointer_mut("/template/settings")
            .and_then(Value::as_object_mut)
        {
            settings.remove("analysis");
        }
        if let Some(properties) = template
            .pointer_mut("/template/mappings/properties")
            .and_then(Value::as_object_mut)
        {
            for field in properties.values_mut() {
                if field["analyzer"] == "cairn_text" {
                    field["analyzer"] = json!("standard");
                }
            }
        }
    }
    Ok(template)
}

/// Elasticsearch 9.1 and later leave `dense_vector` values out of `_source` by default
/// and derive them on request. Cairn's templates say themselves what `_source` keeps
/// (see `vectors`: the `vector` string, never the float array), and indices of earlier
/// versions kept the float array, so its indices turn that default off
/// (`index.mapping.exclude_source_vectors: false`, a setting older versions refuse):
/// every engine stores exactly what the mapping says.
pub fn keep_vectors_in_source(template: &mut Value, engine: Engine, version: &str) {
    let mut parts = version.split('.').map(|part| part.parse::<u32>().unwrap_or(0));
    let (major, minor) = (parts.next().unwrap_or(0), parts.next().unwrap_or(0));
    if engine == Engine::Elasticsearch
        && (major, minor) >= (9, 1)
        && let Some(settings) = template
            .pointer_mut("/template/settings")
            .and_then(Value::as_object_mut)
    {
        settings.insert("index.mapping.exclude_source_vectors".into(), json!(false));
    }
}

/// The indices whose records recall searches by their stems.
const STEMMED: [&str; 3] = ["episodes", "facts", "playbooks"];

/// Gives the documents of an index that predate its `terms` field their stems: pages of
/// documents without `terms`, each updated in one bulk request, until none is left.
async fn backfill_terms(cluster: &Cluster, index: &str) -> Result<u64> {
    let mut total = 0;
    loop {
        let search = json!({
            "size": 500,
            "_source": ["text", "context", "vector"],
            "query": { "bool": { "must_not": { "exists": { "field": "terms" } } } }
        });
        let path = format!("/{index}/_search");
        let found = cluster.expect(Method::Post, &path, &[], Some(search)).await?;
        let hits = crate::records::hits(&found)?;
        if hits.is_empty() {
            return Ok(total);
        }
        let mut body = String::new();
        for hit in &hits {
            let source = &hit.source;
            let mut update = json!({ "terms": index_terms(source["text"].as_str().unwrap_or_default()) });
            if let Some(context) = source["context"].as_str() {
                update["context_terms"] = json!(index_terms(context));
            }
            // An update re-indexes the stored source merged with `doc`, and the stored
            // source has no `embedding` (see `vectors`): it must come with the update.
            if let Some(vector) = source.get("vector") {
                update["vector"] = vector.clone();
                crate::vectors::indexable(&mut update)?;
            }
            let action = json!({ "update": { "_index": index, "_id": hit.id, "routing": hit.routing()? } });
            body.push_str(&action.to_string());
            body.push('\n');
            body.push_str(&json!({ "doc": update }).to_string());
            body.push('\n');
        }
        let answer = cluster.bulk(body, true).await?;
        if answer["errors"] == json!(true) {
            return Err(Error::Storage(format!(
                "{index}: giving older documents their stems failed"
            )));
        }
        total += hits.len() as u64;
    }
}

/// Gives the documents of an index of records that have no `record` (written before it
/// existed, or by an older process) theirs: pages of them, each rewritten whole in one
/// bulk request at the version read, so a document changed meanwhile is read again
/// (and one deleted meanwhile stays deleted). Stops when none is left, or when pages
/// keep losing to concurrent writes (recall reads such documents by id meanwhile).
async fn backfill_records(cluster: &Cluster, index: &str) -> Result<u64> {
    const FRUITLESS_PAGES: usize = 5;
    let mut total = 0;
    let mut fruitless = 0;
    while fruitless < FRUITLESS_PAGES {
        let search = json!({
            "size": 500,
            "seq_no_primary_term": true,
            "query": { "bool": { "must_not": { "exists": { "field": recalled::FIELD } } } }
        });
        let path = format!("/{index}/_search");
        let found = cluster.expect(Method::Post, &path, &[], Some(search)).await?;
        let hits = crate::records::hits(&found)?;
        if hits.is_empty() {
            break;
        }
        let mut body = String::new();
        for hit in &hits {
            let (seq_no, primary_term) = hit.version()?;
            let action = json!({ "index": {
                "_index": index, "_id": hit.id, "routing": hit.routing()?,
                "if_seq_no": seq_no, "if_primary_term": primary_term
            } });
            let mut document = hit.source.clone();
            crate::outgoing(&mut document, true)?;
            body.push_str(&action.to_string());
            body.push('\n');
            body.push_str(&document.to_string());
            body.push('\n');
        }
        let answer = cluster.bulk(body, true).await?;
        let mut written = 0;
        for result in crate::bulk_results(&answer) {
            match result["status"].as_u64() {
                Some(200..=299) => written += 1,
                Some(409) => {}
                _ => {
                    return Err(Error::Storage(format!(
                        "{index}: giving older documents their record failed: {}",
                        result["error"]
                    )));
                }
            }
        }
        total += written;
        fruitless = if written == 0 { fruitless + 1 } else { 0 };
    }
    Ok(total)
}

/// Compares an existing index's properties with the template's: the fields it lacks
/// (a mapping can gain fields in place) and the differences that no in-place change
/// can fix.
fn compare(expected: &Value, actual: &Value) -> (serde_json::Map<String, Value>, Vec<String>) {
    let mut missing = serde_json::Map::new();
    let mut problems = Vec::new();
    let Some(expected) = expected.as_object() else {
        return (missing, problems);
    };
    for (field, wanted) in expected {
        let found = &actual[field];
        if found.is_null() {
            missing.insert(field.clone(), wanted.clone());
            continue;
        }
        let wanted_type = wanted["type"].as_str().unwrap_or("object");
        let found_type = found["type"].as_str().unwrap_or("object");
        if wanted_type != found_type {
            problems.push(format!("{field} is {found_type}, expected {wanted_type}"));
            continue;
        }
        for key in ["dimension", "dims", "similarity"] {
            if !wanted[key].is_null() && wanted[key] != found[key] {
                problems.push(format!(
                    "{field}.{key} is {}, expected {}",
                    found[key], wanted[key]
                ));
            }
        }
        if !wanted["method"]["engine"].is_null() && wanted["method"]["engine"] != found["method"]["engine"] {
            problems.push(format!(
                "{field} uses the {} engine, expected {}",
                found["method"]["engine"], wanted["method"]["engine"]
            ));
        }
    }
    (missing, problems)
}

/// The number of data nodes in the cluster.
async fn data_nodes(cluster: &Cluster) -> Result<u64> {
    let path = "/_nodes/data:true";
    let answer = cluster
        .expect(
            Method::Get,
            path,
            &[("filter_path", "_nodes.total".to_owned())],
            None,
        )
        .await?;
    answer["_nodes"]["total"]
        .as_u64()
        .ok_or_else(|| Error::Storage(format!("{path}: no node count in the answer")))
}

pub async fn bootstrap(cluster: &Cluster, target: &Target<'_>) -> Result<BootstrapReport> {
    let Target {
        engine,
        version,
        prefix,
        dimension,
        ..
    } = *target;
    let analysis = detect_analysis(cluster).await?;
    let data_nodes = data_nodes(cluster).await?;
    let replicas = target.replicas.unwrap_or(if data_nodes > 1 { 1 } else { 0 });
    let mut report = BootstrapReport {
        analysis,
        replicas,
        replicas_configured: target.replicas.is_some(),
        data_nodes,
        ..BootstrapReport::default()
    };
    let mut problems = Vec::new();
    for kind in INDICES {
        let name = format!("{prefix}-{kind}");
        let mut template = template_with(engine, prefix, kind, dimension, analysis)?;
        keep_vectors_in_source(&mut template, engine, version);
        template["template"]["settings"]["number_of_replicas"] = json!(replicas);
        cluster
            .expect(
                Method::Put,
                &format!("/_index_template/{name}"),
                &[],
                Some(template.clone()),
            )
            .await?;
        let path = format!("/{name}");
        let exists = cluster.call(Method::Head, &path, &[], None).await?;
        if exists.status == 404 {
            let created = cluster.call(Method::Put, &path, &[], Some(json!({}))).await?;
            if created.ok() {
                report.created.push(name);
                continue;
            }
            // Created concurrently by another instance: check it like any existing one.
            if created.body["error"]["type"] != "resource_already_exists_exception" {
                return Err(failure(&path, &created));
            }
        }
        let mapping = cluster
            .expect(Method::Get, &format!("{path}/_mapping"), &[], None)
            .await?;
        let actual_mappings = mapping
            .as_object()
            .and_then(|indices| indices.values().next())
            .map(|index| index["mappings"].clone())
            .unwrap_or(Value::Null);
        let actual = &actual_mappings["properties"];
        let wanted_excludes = &template["template"]["mappings"]["_source"]["excludes"];
        let left_out = |field: &str| {
            actual_mappings["_source"]["excludes"]
                .as_array()
                .is_some_and(|excludes| excludes.iter().any(|excluded| excluded == field))
        };
        if wanted_excludes.is_array() && !left_out("embedding") {
            report.vectors_in_source.push(name.clone());
        }
        if recalled::KINDS.contains(&kind) && !(left_out(recalled::FIELD) && left_out(recalled::VECTOR)) {
            report.records_in_source.push(name.clone());
        }
        let (missing, found) = compare(&template["template"]["mappings"]["properties"], actual);
        if !found.is_empty() {
            problems.push(format!("{name}: {}", found.join(", ")));
            continue;
        }
        if !missing.is_empty() {
            // Documents written before have no value for the new fields.
            cluster
                .expect(
                    Method::Put,
                    &format!("{path}/_mapping"),
                    &[],
                    Some(json!({ "properties": missing })),
                )
                .await?;
            report.extended.push(name.clone());
        }
        let settings = cluster
            .expect(
                Method::Get,
                &format!("{path}/_settings/index.number_of_replicas"),
                &[],
                None,
            )
            .await?;
        let current = settings
            .as_object()
            .and_then(|indices| indices.values().next())
            .and_then(|index| index["settings"]["index"]["number_of_replicas"].as_str())
            .and_then(|count| count.parse::<u32>().ok());
        if current != Some(replicas) {
            cluster
                .expect(
                    Method::Put,
                    &format!("{path}/_settings"),
                    &[],
                    Some(json!({ "index": { "number_of_replicas": replicas } })),
                )
                .await?;
            report.replicas_changed.push(name.clone());
        }
        // Also after an earlier bootstrap that added the field but stopped half-way.
        if STEMMED.contains(&kind) {
            report.backfilled += backfill_terms(cluster, &name).await?;
        }
        if recalled::KINDS.contains(&kind) {
            report.recorded += backfill_records(cluster, &name).await?;
        }
        report.existing.push(name);
    }
    if problems.is_empty() {
        Ok(report)
    } else {
        Err(Error::Conflict {
            code: cairn_core::ErrorCode::MappingMismatch,
            message: format!(
                "existing indices do not match the templates in mappings/ (nothing was written to them): {}",
                problems.join("; ")
            ),
        })
    }
}
