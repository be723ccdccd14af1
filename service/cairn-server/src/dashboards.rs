//! Saved objects for the search cluster's own console: data views, saved searches,
//! visualizations and one overview dashboard over the indices of one
//! `CAIRN_INDEX_PREFIX`, as the NDJSON file Kibana and OpenSearch Dashboards import
//! (Stack Management / Dashboards Management, Saved objects, Import).
//!
//! Both products take the same legacy object types (`index-pattern`, `search`,
//! `visualization` with a `visState`, `dashboard` with a `panelsJSON`); they differ in
//! how an object says which release of its type it was written for. Kibana 8 reads
//! `coreMigrationVersion` and `typeMigrationVersion`; OpenSearch Dashboards, forked from
//! Kibana 7.10, reads a `migrationVersion` map. Either migrates older objects forward on
//! import, so each object names the release whose shape it has. Indices are never named
//! inline: searches and visualizations point at a data view through `indexRefName` and
//! a reference, and dashboards at their panels through `panelRefName`.

use serde_json::{Value, json};

/// Which product the objects are for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Target {
    Kibana,
    OpenSearchDashboards,
}

impl Target {
    pub fn parse(text: &str) -> anyhow::Result<Target> {
        match text {
            "kibana" => Ok(Target::Kibana),
            "opensearch-dashboards" => Ok(Target::OpenSearchDashboards),
            other => anyhow::bail!("--target: {other:?} is not kibana or opensearch-dashboards"),
        }
    }
}

/// The release whose shape each object type has: Kibana 8 type migrations and the
/// OpenSearch Dashboards (Kibana 7.10) ones.
fn versions(target: Target, kind: &str) -> Value {
    match target {
        Target::Kibana => {
            let type_version = match kind {
                "index-pattern" => "8.0.0",
                "search" => "8.0.0",
                "visualization" => "8.5.0",
                _ => "8.7.0",
            };
            json!({ "coreMigrationVersion": "8.8.0", "typeMigrationVersion": type_version })
        }
        Target::OpenSearchDashboards => {
            let version = match kind {
                "index-pattern" => "7.6.0",
                "search" => "7.9.3",
                "visualization" => "7.10.0",
                _ => "7.9.3",
            };
            json!({ "migrationVersion": { kind: version } })
        }
    }
}

/// One saved object in the export shape of `target`.
fn object(target: Target, kind: &str, id: &str, attributes: Value, references: Vec<Value>) -> Value {
    let mut object = json!({
        "type": kind,
        "id": id,
        "attributes": attributes,
        "references": references,
    });
    if let (Some(object), Value::Object(versions)) = (object.as_object_mut(), versions(target, kind)) {
        object.extend(versions);
        if target == Target::Kibana {
            object.insert("managed".into(), json!(false));
        }
    }
    object
}

/// The reference every search and visualization makes to its data view.
fn data_view_reference(data_view: &str) -> Vec<Value> {
    vec![json!({
        "name": "kibanaSavedObjectMeta.searchSourceJSON.index",
        "type": "index-pattern",
        "id": data_view,
    })]
}

/// A `searchSourceJSON`: a KQL query over the referenced data view.
fn search_source(query: &str) -> Value {
    json!({
        "searchSourceJSON": json!({
            "query": { "query": query, "language": "kuery" },
            "filter": [],
            "indexRefName": "kibanaSavedObjectMeta.searchSourceJSON.index",
        })
        .to_string()
    })
}

struct Search {
    id: &'static str,
    title: &'static str,
    index: &'static str,
    query: &'static str,
    columns: &'static [&'static str],
}

const SEARCHES: &[Search] = &[
    Search {
        id: "audit-trail",
        title: "audit trail",
        index: "audit",
        query: "",
        columns: &["tenant", "user", "subject", "action", "target_ids", "request_id"],
    },
    Search {
        id: "decision-log",
        title: "consolidation decisions",
        index: "decisions",
        query: "",
        columns: &["tenant", "user", "kind", "reason", "fact_id", "origin"],
    },
    Search {
        id: "refusals",
        title: "refused and blocked writes",
        index: "decisions",
        query: "kind:(\"BLOCKED_BY_TOMBSTONE\" or \"REFUSED\" or \"DROPPED_UNGROUNDED\")",
        columns: &["tenant", "user", "kind", "reason", "origin"],
    },
    Search {
        id: "consolidation-failures",
        title: "consolidation failures",
        index: "jobs",
        query: "last_error:*",
        columns: &["tenant", "user", "attempts", "last_error", "dead_at"],
    },
];

/// A bar chart over time (`histogram`), optionally split by a field, or a donut of a
/// field's values (`pie`).
enum Chart {
    OverTime { split: &'static str },
    Share { field: &'static str },
}

struct Visualization {
    id: &'static str,
    title: &'static str,
    index: &'static str,
    query: &'static str,
    chart: Chart,
}

const VISUALIZATIONS: &[Visualization] = &[
    Visualization {
        id: "decisions-by-kind",
        title: "decisions by kind",
        index: "decisions",
        query: "",
        chart: Chart::OverTime { split: "kind" },
    },
    Visualization {
        id: "refusals-and-tombstones",
        title: "write refusals and tombstones",
        index: "audit",
        query: "action:(\"fact.write_refused\" or \"fact.retract\" or \"fact.forget\" or \"tombstone.lift\")",
        chart: Chart::OverTime { split: "action" },
    },
    Visualization {
        id: "audit-by-action",
        title: "audit events by action",
        index: "audit",
        query: "",
        chart: Chart::Share { field: "action" },
    },
    Visualization {
        id: "episodes-per-tenant",
        title: "episode volume per tenant",
        index: "episodes",
        query: "",
        chart: Chart::OverTime { split: "tenant" },
    },
    Visualization {
        id: "consolidation-failures",
        title: "consolidation failures",
        index: "jobs",
        query: "last_error:*",
        chart: Chart::OverTime { split: "tenant" },
    },
];

/// The data views: the indices with a `timestamp` date.
const DATA_VIEWS: &[&str] = &["audit", "decisions", "facts", "episodes", "jobs"];

fn vis_state(title: &str, chart: &Chart) -> Value {
    let count = json!({ "id": "1", "enabled": true, "type": "count", "params": {}, "schema": "metric" });
    match chart {
        Chart::OverTime { split } => json!({
            "title": title,
            "type": "histogram",
            "aggs": [
                count,
                { "id": "2", "enabled": true, "type": "date_histogram", "schema": "segment",
                  "params": { "field": "timestamp", "interval": "auto", "min_doc_count": 1, "extended_bounds": {} } },
                { "id": "3", "enabled": true, "type": "terms", "schema": "group",
                  "params": { "field": split, "size": 10, "order": "desc", "orderBy": "1" } }
            ],
            "params": {
                "type": "histogram",
                "addTooltip": true,
                "addLegend": true,
                "legendPosition": "right",
                "times": [],
                "addTimeMarker": false,
                "grid": { "categoryLines": false },
                "categoryAxes": [{ "id": "CategoryAxis-1", "type": "category", "position": "bottom", "show": true,
                                   "style": {}, "scale": { "type": "linear" },
                                   "labels": { "show": true, "filter": true, "truncate": 100 }, "title": {} }],
                "valueAxes": [{ "id": "ValueAxis-1", "name": "LeftAxis-1", "type": "value", "position": "left",
                                "show": true, "style": {}, "scale": { "type": "linear", "mode": "normal" },
                                "labels": { "show": true, "rotate": 0, "filter": false, "truncate": 100 },
                                "title": { "text": "Count" } }],
                "seriesParams": [{ "show": true, "type": "histogram", "mode": "stacked",
                                   "data": { "label": "Count", "id": "1" }, "valueAxis": "ValueAxis-1",
                                   "drawLinesBetweenPoints": true, "showCircles": true }]
            }
        }),
        Chart::Share { field } => json!({
            "title": title,
            "type": "pie",
            "aggs": [
                count,
                { "id": "2", "enabled": true, "type": "terms", "schema": "segment",
                  "params": { "field": field, "size": 20, "order": "desc", "orderBy": "1" } }
            ],
            "params": {
                "type": "pie",
                "addTooltip": true,
                "addLegend": true,
                "legendPosition": "right",
                "isDonut": true,
                "labels": { "show": false, "values": true, "last_level": true, "truncate": 100 }
            }
        }),
    }
}

/// The saved objects of `prefix` for `target`, one JSON document per line, ending with
/// the export summary line both products write.
pub fn export(target: Target, prefix: &str) -> String {
    let name = |kind: &str| format!("{prefix}-{kind}");
    let titled = |title: &str| format!("Cairn ({prefix}): {title}");
    let mut objects = Vec::new();
    for index in DATA_VIEWS {
        let mut attributes = json!({ "title": name(index), "timeFieldName": "timestamp", "fields": "[]" });
        if target == Target::Kibana {
            attributes["name"] = json!(titled(index));
        }
        objects.push(object(
            target,
            "index-pattern",
            &name(index),
            attributes,
            Vec::new(),
        ));
    }
    for search in SEARCHES {
        let attributes = json!({
            "title": titled(search.title),
            "description": "",
            "columns": search.columns,
            "sort": [["timestamp", "desc"]],
            "kibanaSavedObjectMeta": search_source(search.query),
        });
        objects.push(object(
            target,
            "search",
            &name(search.id),
            attributes,
            data_view_reference(&name(search.index)),
        ));
    }
    let mut panels = Vec::new();
    let mut panel_references = Vec::new();
    for (position, visualization) in VISUALIZATIONS.iter().enumerate() {
        let title = titled(visualization.title);
        let attributes = json!({
            "title": title,
            "description": "",
            "visState": vis_state(&title, &visualization.chart).to_string(),
            "uiStateJSON": "{}",
            "version": 1,
            "kibanaSavedObjectMeta": search_source(visualization.query),
        });
        let id = name(&format!("viz-{}", visualization.id));
        objects.push(object(
            target,
            "visualization",
            &id,
            attributes,
            data_view_reference(&name(visualization.index)),
        ));
        let panel = format!("panel_{position}");
        panels.push(json!({
            "version": if target == Target::Kibana { "8.8.0" } else { "7.10.0" },
            "type": "visualization",
            "gridData": { "x": (position % 2) * 24, "y": (position / 2) * 15, "w": 24, "h": 15,
                          "i": (position + 1).to_string() },
            "panelIndex": (position + 1).to_string(),
            "embeddableConfig": {},
            "panelRefName": panel,
        }));
        panel_references.push(json!({ "name": panel, "type": "visualization", "id": id }));
    }
    let dashboard = json!({
        "title": titled("overview"),
        "description": "Decisions, refusals and tombstones, audit events, episode volume and consolidation failures of Cairn",
        "panelsJSON": Value::Array(panels).to_string(),
        "optionsJSON": json!({ "useMargins": true, "hidePanelTitles": false }).to_string(),
        "timeRestore": true,
        "timeFrom": "now-7d",
        "timeTo": "now",
        "refreshInterval": { "pause": true, "value": 0 },
        "version": 1,
        "kibanaSavedObjectMeta": {
            "searchSourceJSON": json!({ "query": { "query": "", "language": "kuery" }, "filter": [] }).to_string()
        },
    });
    objects.push(object(
        target,
        "dashboard",
        &name("overview"),
        dashboard,
        panel_references,
    ));
    let count = objects.len();
    let mut summary = json!({ "exportedCount": count, "missingRefCount": 0, "missingReferences": [] });
    if target == Target::Kibana {
        summary["excludedObjects"] = json!([]);
        summary["excludedObjectsCount"] = json!(0);
    }
    objects.push(summary);
    let mut out = String::new();
    for object in objects {
        out.push_str(&object.to_string());
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    fn lines(target: Target, prefix: &str) -> Vec<Value> {
        export(target, prefix)
            .lines()
            .map(|line| serde_json::from_str(line).expect("each line is JSON"))
            .collect()
    }

    #[test]
    fn every_reference_resolves_and_no_index_is_named_inline() {
        for target in [Target::Kibana, Target::OpenSearchDashboards] {
            let all = lines(target, "acme-mem");
            let (summary, objects) = all.split_last().expect("lines");
            assert_eq!(summary["exportedCount"], objects.len(), "{target:?}");
            assert_eq!(summary["missingRefCount"], 0);
            let ids: HashSet<(String, String)> = objects
                .iter()
                .map(|object| {
                    (
                        object["type"].as_str().expect("type").to_owned(),
                        object["id"].as_str().expect("id").to_owned(),
                    )
                })
                .collect();
            assert_eq!(ids.len(), objects.len(), "ids are unique");
            for object in objects {
                let kind = object["type"].as_str().expect("type");
                assert!(object["id"].as_str().expect("id").starts_with("acme-mem-"));
                for reference in object["references"].as_array().expect("references") {
                    let target_id = (
                        reference["type"].as_str().expect("type").to_owned(),
                        reference["id"].as_str().expect("id").to_owned(),
                    );
                    assert!(ids.contains(&target_id), "{kind} refers to {target_id:?}");
                }
                let attributes = &object["attributes"];
                if let Some(source) = attributes["kibanaSavedObjectMeta"]["searchSourceJSON"].as_str() {
                    let source: Value = serde_json::from_str(source).expect("searchSourceJSON");
                    assert!(source["index"].is_null(), "no inline index in {kind}");
                    if kind == "search" || kind == "visualization" {
                        assert_eq!(
                            source["indexRefName"],
                            "kibanaSavedObjectMeta.searchSourceJSON.index"
                        );
                        assert_eq!(
                            object["references"][0]["name"],
                            "kibanaSavedObjectMeta.searchSourceJSON.index"
                        );
                    }
                }
                match kind {
                    "index-pattern" => {
                        assert!(
                            attributes["title"]
                                .as_str()
                                .expect("title")
                                .starts_with("acme-mem-")
                        );
                        assert_eq!(attributes["timeFieldName"], "timestamp");
                    }
                    "visualization" => {
                        let state: Value =
                            serde_json::from_str(attributes["visState"].as_str().expect("visState"))
                                .expect("visState JSON");
                        assert!(state["aggs"].as_array().is_some_and(|aggs| !aggs.is_empty()));
                        assert_eq!(state["title"], attributes["title"]);
                    }
                    "dashboard" => {
                        let panels: Vec<Value> =
                            serde_json::from_str(attributes["panelsJSON"].as_str().expect("panels"))
                                .expect("panelsJSON");
                        assert_eq!(panels.len(), VISUALIZATIONS.len());
                        for panel in &panels {
                            assert!(panel["id"].is_null(), "panels point through panelRefName");
                            let name = panel["panelRefName"].as_str().expect("panelRefName");
                            assert!(
                                object["references"]
                                    .as_array()
                                    .expect("refs")
                                    .iter()
                                    .any(|reference| reference["name"] == name)
                            );
                        }
                    }
                    _ => {}
                }
                match target {
                    Target::Kibana => {
                        assert_eq!(object["coreMigrationVersion"], "8.8.0");
                        assert!(
                            object["typeMigrationVersion"].is_string()
                                && object["migrationVersion"].is_null()
                        );
                    }
                    Target::OpenSearchDashboards => {
                        assert!(object["migrationVersion"][kind].is_string(), "{kind}");
                        assert!(
                            object["coreMigrationVersion"].is_null()
                                && object["typeMigrationVersion"].is_null()
                        );
                    }
                }
            }
            let kinds: HashSet<&str> = objects
                .iter()
                .filter_map(|object| object["type"].as_str())
                .collect();
            assert_eq!(
                kinds,
                HashSet::from(["index-pattern", "search", "visualization", "dashboard"])
            );
        }
    }

    #[test]
    fn the_shipped_files_are_the_default_prefix_export() {
        assert_eq!(
            include_str!("../../../deploy/dashboards/kibana.ndjson"),
            export(Target::Kibana, "cairn"),
            "regenerate with: cairn dashboards export --target kibana --out deploy/dashboards/kibana.ndjson"
        );
        assert_eq!(
            include_str!("../../../deploy/dashboards/opensearch-dashboards.ndjson"),
            export(Target::OpenSearchDashboards, "cairn"),
            "regenerate with: cairn dashboards export --target opensearch-dashboards --out deploy/dashboards/opensearch-dashboards.ndjson"
        );
    }

    #[test]
    fn the_prefix_names_every_index_and_title() {
        let text = export(Target::Kibana, "tenant7");
        assert!(!text.contains("\"cairn-"), "no default prefix left");
        assert!(text.contains("\"title\":\"tenant7-audit\""));
        assert!(Target::parse("grafana").is_err());
    }
}
