//! BM25 full-text search per tier, with scope and currency inside the query.

use crate::rows::{self, micros, scope_key};
use cairn_core::text::query_terms;
use cairn_core::{Error, Memory, Result, Scope, TextHit, TextQuery, Tier};
use rusqlite::Connection;
use rusqlite::types::Value;

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

pub fn search_text(connection: &Connection, scope: &Scope, query: &TextQuery) -> Result<Vec<TextHit>> {
    let Some(expression) = match_expression(scope, &query.text) else {
        return Ok(Vec::new());
    };
    let as_of = micros(query.as_of);
    let limit = i64::try_from(query.limit).unwrap_or(i64::MAX);
    let mut parameters: Vec<Value> = vec![
        Value::Text(expression),
        Value::Text(scope.tenant().as_str().to_owned()),
        Value::Text(scope.user().as_str().to_owned()),
        Value::Integer(as_of),
        Value::Integer(limit),
    ];
    let sql = match query.tier {
        Tier::Semantic => {
            let history = if query.include_history {
                "f.status IN ('active', 'superseded')"
            } else {
                "f.status IN ('active', 'superseded') AND (f.superseded_at IS NULL OR f.superseded_at > ?4)"
            };
            let mut type_filter = String::new();
            if !query.fact_types.is_empty() {
                let placeholders: Vec<String> = query
                    .fact_types
                    .iter()
                    .map(|fact_type| {
                        parameters.push(Value::Text(fact_type.as_str().to_owned()));
                        format!("?{}", parameters.len())
                    })
                    .collect();
                type_filter = format!(" AND f.fact_type IN ({})", placeholders.join(", "));
            }
            format!(
                "SELECT {}, bm25(facts_fts, 1.0, 0.0) AS rank FROM facts_fts \
                 JOIN facts f ON f.seq = facts_fts.rowid \
                 WHERE facts_fts MATCH ?1 AND f.tenant = ?2 AND f.user_id = ?3 \
                 AND f.created_at <= ?4 AND {history} \
                 AND (f.expires_at IS NULL OR f.expires_at > ?4) \
                 AND (f.valid_from IS NULL OR f.valid_from <= ?4) \
                 AND (f.valid_to IS NULL OR f.valid_to > ?4){type_filter} \
                 ORDER BY rank LIMIT ?5",
                rows::FACT_COLUMNS
            )
        }
        Tier::Episodic => {
            let mut session_filter = String::new();
            if let Some(session_id) = &query.session_id {
                parameters.push(Value::Text(session_id.clone()));
                session_filter = format!(" AND e.session_id = ?{}", parameters.len());
            }
            format!(
                "SELECT {}, bm25(episodes_fts, 1.0, 0.0) AS rank FROM episodes_fts \
                 JOIN episodes e ON e.seq = episodes_fts.rowid \
                 WHERE episodes_fts MATCH ?1 AND e.tenant = ?2 AND e.user_id = ?3 \
                 AND e.ingested_at <= ?4{session_filter} ORDER BY rank LIMIT ?5",
                rows::EPISODE_COLUMNS
            )
        }
        Tier::Procedural => format!(
            "SELECT {}, bm25(playbooks_fts, 1.0, 0.0) AS rank FROM playbooks_fts \
             JOIN playbooks p ON p.seq = playbooks_fts.rowid \
             WHERE playbooks_fts MATCH ?1 AND p.tenant = ?2 AND p.user_id = ?3 \
             AND p.created_at <= ?4 ORDER BY rank LIMIT ?5",
            rows::PLAYBOOK_COLUMNS
        ),
    };
    let storage = |error: rusqlite::Error| Error::Storage(error.to_string());
    let mut statement = connection.prepare_cached(&sql).map_err(storage)?;
    let tier = query.tier;
    let hits = statement
        .query_map(rusqlite::params_from_iter(parameters.iter()), |row| {
            let memory = match tier {
                Tier::Semantic => Memory::Fact(rows::fact(row)?),
                Tier::Episodic => Memory::Episode(rows::episode(row)?),
                Tier::Procedural => Memory::Playbook(rows::playbook(row)?),
            };
            let column_count = row.as_ref().column_count();
            let rank: f64 = row.get(column_count - 1)?;
            // FTS5's bm25() is negated so that smaller sorts first; report the score.
            Ok(TextHit { memory, score: -rank })
        })
        .map_err(storage)?
        .collect::<rusqlite::Result<Vec<_>>>()
        .map_err(storage)?;
    Ok(hits)
}
