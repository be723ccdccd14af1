//! The index templates of `mappings/`, installed by `cairn bootstrap`: put each
//! template, create each missing index, and check that existing indices have the
//! mapping the templates describe.

use crate::INDICES;
use crate::client::{Cluster, Engine, failure};
use cairn_core::{Error, Result};
use elasticsearch::http::Method;
use serde_json::{Value, json};

const OPENSEARCH: &str = include_str!("../../../mappings/opensearch.json");
const ELASTICSEARCH: &str = include_str!("../../../mappings/elasticsearch.json");

/// What bootstrap did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct BootstrapReport {
    pub created: Vec<String>,
    pub existing: Vec<String>,
    /// Existing indices that lacked fields a newer template adds, and got them.
    pub extended: Vec<String>,
}

/// The template of one index kind, for an engine, with the prefix and vector dimension
/// filled in.
pub fn template(engine: Engine, prefix: &str, kind: &str, dimension: usize) -> Result<Value> {
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
    Ok(template)
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

pub async fn bootstrap(
    cluster: &Cluster,
    engine: Engine,
    prefix: &str,
    dimension: usize,
) -> Result<BootstrapReport> {
    let mut report = BootstrapReport::default();
    let mut problems = Vec::new();
    for kind in INDICES {
        let name = format!("{prefix}-{kind}");
        let template = template(engine, prefix, kind, dimension)?;
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
        let actual = mapping
            .as_object()
            .and_then(|indices| indices.values().next())
            .map(|index| index["mappings"]["properties"].clone())
            .unwrap_or(Value::Null);
        let (missing, found) = compare(&template["template"]["mappings"]["properties"], &actual);
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
        report.existing.push(name);
    }
    if problems.is_empty() {
        Ok(report)
    } else {
        Err(Error::Conflict {
            code: "mapping_mismatch",
            message: format!(
                "existing indices do not match the templates in mappings/ (nothing was written to them): {}",
                problems.join("; ")
            ),
        })
    }
}
