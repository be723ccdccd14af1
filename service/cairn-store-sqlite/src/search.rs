//! Retrieval legs per tier: BM25 through FTS5 and brute-force cosine kNN over stored
//! vectors. Both apply scope and currency inside the query, before ranking.

use crate::rows::{self, micros, scope_key};
use crate::vectors::{RowVector, VectorCache};
use cairn_core::text::query_terms;
use cairn_core::{Error, Memory, Result, Scope, SearchFilter, TextHit, TextQuery, Tier, VectorQuery, cosine};
use rusqlite::Connection;
use rusqlite::types::Value;
use std::sync::Arc;

fn storage(error: rusqlite::Error) -> Error {
    Error::Storage(error.to_string())
}

/// Builds an FTS5 query from free text: the scope token is required, and the text's
/// tokens are alternatives. Every token is quoted, so no user input is ever parsed as
/// FTS5 syntax. `None` when the text has no searchable token.
fn match_expression(scope: &Scope, text: &str) -> Option<String> {
    let terms = query_terms(text);
    if terms.is_empty() {
        return None;
    }
    let alternatives = terms
        .iter()
        .map(|term| format!("\"{}\"", term.replace('"', "")))
        .collect::<Vec<_>>()
        .join(" OR ");
    Some(format!(
        "scope_key : \"{}\" AND text : ({alternatives})",
        scope_key(scope)
    ))
}

/// Appends a parameter and returns its placeholder.
fn bind(parameters: &mut Vec<Value>, value: Value) -> String {
    parameters.push(value);
    format!("?{}", parameters.len())
}

/// The table, its alias, its columns and the WHERE conditions (scope, then currency at
/// `as_of`) of one tier.
fn restrictions(
    scope: &Scope,
    restrict: &SearchFilter,
    parameters: &mut Vec<Value>,
) -> (&'static str, String) {
    let tenant = bind(parameters, Value::Text(scope.tenant().as_str().to_owned()));
    let user = bind(parameters, Value::Text(scope.user().as_str().to_owned()));
    let as_of = bind(parameters, Value::Integer(micros(restrict.as_of)));
    match restrict.tier {
        Tier::Semantic => {
            let mut conditions = format!(
                "f.tenant = {tenant} AND f.user_id = {user} AND f.created_at <= {as_of} \
                 AND f.status IN ('active', 'superseded') \
                 AND (f.expires_at IS NULL OR f.expires_at > {as_of}) \
                 AND (f.valid_from IS NULL OR f.valid_from <= {as_of}) \
                 AND (f.valid_to IS NULL OR f.valid_to > {as_of})"
            );
            if !restrict.include_history {
                conditions.push_str(&format!(
                    " AND (f.superseded_at IS NULL OR f.superseded_at > {as_of})"
                ));
            }
            if !restrict.fact_types.is_empty() {
                let placeholders: Vec<String> = restrict
                    .fact_types
                    .iter()
                    .map(|fact_type| bind(parameters, Value::Text(fact_type.as_str().to_owned())))
                    .collect();
                conditions.push_str(&format!(" AND f.fact_type IN ({})", placeholders.join(", ")));
            }
            ("facts f", conditions)
        }
        Tier::Episodic => {
            let mut conditions =
                format!("e.tenant = {tenant} AND e.user_id = {user} AND e.ingested_at <= {as_of}");
            if let Some(session_id) = &restrict.session_id {
                let session = bind(parameters, Value::Text(session_id.clone()));
                conditions.push_str(&format!(" AND e.session_id = {session}"));
            }
            ("episodes e", conditions)
        }
        Tier::Procedural => (
            "playbooks p",
            format!("p.tenant = {tenant} AND p.user_id = {user} AND p.created_at <= {as_of}"),
        ),
    }
}

fn columns(tier: Tier) -> (&'static str, &'static str) {
    match tier {
        Tier::Semantic => (rows::FACT_COLUMNS, "f"),
        Tier::Episodic => (rows::EPISODE_COLUMNS, "e"),
        Tier::Procedural => (rows::PLAYBOOK_COLUMNS, "p"),
    }
}

fn memory(tier: Tier, row: &rusqlite::Row<'_>) -> rusqlite::Result<Memory> {
    Ok(match tier {
        Tier::Semantic => Memory::Fact(rows::fact(row)?),
        Tier::Episodic => Memory::Episode(rows::episode(row)?),
        Tier::Procedural => Memory::Playbook(rows::playbook(row)?),
    })
}

pub fn search_text(connection: &Connection, scope: &Scope, query: &TextQuery) -> Result<Vec<TextHit>> {
    let Some(expression) = match_expression(scope, &query.text) else {
        return Ok(Vec::new());
    };
    let mut parameters = Vec::new();
    let matched = bind(&mut parameters, Value::Text(expression));
    let restrict = &query.filter;
    let (table, conditions) = restrictions(scope, restrict, &mut parameters);
    let limit = bind(
        &mut parameters,
        Value::Integer(i64::try_from(query.filter.limit).unwrap_or(i64::MAX)),
    );
    let (columns, alias) = columns(query.filter.tier);
    let fts = match query.filter.tier {
        Tier::Semantic => "facts_fts",
        Tier::Episodic => "episodes_fts",
        Tier::Procedural => "playbooks_fts",
    };
    // CROSS JOIN keeps the full-text match as the outer loop: the planner must not
    // walk the scope's rows and probe the FTS index once per row.
    let sql = format!(
        "SELECT {columns}, bm25({fts}, 1.0, 0.0) AS rank FROM {fts} CROSS JOIN {table} ON {alias}.seq = {fts}.rowid \
         WHERE {fts} MATCH {matched} AND {conditions} ORDER BY rank LIMIT {limit}"
    );
    let mut statement = connection.prepare_cached(&sql).map_err(storage)?;
    let tier = query.filter.tier;
    let hits = statement
        .query_map(rusqlite::params_from_iter(parameters.iter()), |row| {
            let rank: f64 = row.get(row.as_ref().column_count() - 1)?;
            // FTS5's bm25() is negated so that smaller sorts first; report the score.
            Ok(TextHit {
                memory: memory(tier, row)?,
                score: -rank,
            })
        })
        .map_err(storage)?
        .collect::<rusqlite::Result<Vec<_>>>()
        .map_err(storage)?;
    Ok(hits)
}

/// Exact cosine kNN: reads the ids of the records that pass the restrictions, scores
/// their vectors (from the cache, loading what is missing), then loads the best rows.
pub fn search_vector(
    connection: &Connection,
    cache: &VectorCache,
    scope: &Scope,
    query: &VectorQuery,
) -> Result<Vec<TextHit>> {
    if query.filter.limit == 0 {
        return Ok(Vec::new());
    }
    let mut parameters = Vec::new();
    let restrict = &query.filter;
    let (table, conditions) = restrictions(scope, restrict, &mut parameters);
    let (columns, alias) = columns(query.filter.tier);
    // Only index columns are read here; rows without a vector are cached as empty.
    let candidates_sql = format!("SELECT {alias}.seq FROM {table} WHERE {conditions}");
    let seqs: Vec<i64> = connection
        .prepare_cached(&candidates_sql)
        .map_err(storage)?
        .query_map(rusqlite::params_from_iter(parameters.iter()), |row| row.get(0))
        .map_err(storage)?
        .collect::<rusqlite::Result<_>>()
        .map_err(storage)?;
    let (mut vectors, missing) = cache.lookup(query.filter.tier, &seqs);
    if !missing.is_empty() {
        let loaded = load_vectors(connection, table, alias, &missing)?;
        cache.remember(query.filter.tier, &loaded);
        vectors.extend(loaded);
    }
    let mut scored: Vec<(f32, i64)> = vectors
        .iter()
        .filter(|(_, vector)| vector.len() == query.vector.len())
        .map(|(seq, vector)| (cosine(&query.vector, vector), *seq))
        .collect();
    let keep = query.filter.limit.min(scored.len());
    if keep == 0 {
        return Ok(Vec::new());
    }
    scored.select_nth_unstable_by(keep - 1, |a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
    scored.truncate(keep);
    scored.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));

    let placeholders = vec!["?"; scored.len()].join(", ");
    let rows_sql = format!("SELECT {columns} FROM {table} WHERE {alias}.seq IN ({placeholders})");
    let mut statement = connection.prepare(&rows_sql).map_err(storage)?;
    let tier = query.filter.tier;
    let mut by_seq: std::collections::HashMap<i64, Memory> = statement
        .query_map(
            rusqlite::params_from_iter(scored.iter().map(|(_, seq)| *seq)),
            |row| Ok((row.get::<_, i64>(0)?, memory(tier, row)?)),
        )
        .map_err(storage)?
        .collect::<rusqlite::Result<_>>()
        .map_err(storage)?;
    Ok(scored
        .into_iter()
        .filter_map(|(similarity, seq)| {
            by_seq.remove(&seq).map(|memory| TextHit {
                memory,
                score: f64::from(similarity),
            })
        })
        .collect())
}

/// Reads the vectors of the given rows, in chunks that stay under SQLite's parameter limit.
fn load_vectors(connection: &Connection, table: &str, alias: &str, seqs: &[i64]) -> Result<Vec<RowVector>> {
    let mut loaded = Vec::with_capacity(seqs.len());
    for chunk in seqs.chunks(500) {
        let placeholders = vec!["?"; chunk.len()].join(", ");
        let sql = format!(
            "SELECT {alias}.seq, {alias}.embedding FROM {table} WHERE {alias}.seq IN ({placeholders})"
        );
        let mut statement = connection.prepare(&sql).map_err(storage)?;
        let mut rows = statement
            .query(rusqlite::params_from_iter(chunk.iter()))
            .map_err(storage)?;
        while let Some(row) = rows.next().map_err(storage)? {
            let seq: i64 = row.get(0).map_err(storage)?;
            // A row without a vector is cached as an empty one and never scores.
            let bytes = row
                .get_ref(1)
                .map_err(storage)?
                .as_blob_or_null()
                .map_err(|e| Error::Storage(e.to_string()))?
                .unwrap_or_default();
            let vector: Arc<[f32]> = bytes
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect();
            loaded.push((seq, vector));
        }
    }
    Ok(loaded)
}
