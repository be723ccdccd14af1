//! Retrieval legs per tier: BM25 through FTS5, and kNN over a per-scope in-memory
//! index rescored by exact cosine. Both apply scope and currency before ranking.

use crate::rows::{self, micros, scope_key};
use crate::storage;
use crate::vectors::{Currency, Delta, ScopeIndex, VectorIndexes};
use cairn_core::bm25::{self, ScopeStatistics, Term};
use cairn_core::{
    Error, FactType, Memory, Result, Scope, SearchFilter, TextHit, TextQuery, Tier, VectorQuery, cosine,
};
use rusqlite::Connection;
use rusqlite::types::Value;
use std::borrow::Cow;
use std::collections::HashMap;

/// An FTS5 query: the scope token is required, and any of `terms` in the searched
/// `columns`. Every word is quoted, so no user input is ever parsed as FTS5 syntax.
fn match_expression(scope: &Scope, columns: &str, terms: &[Term]) -> String {
    let alternatives = terms
        .iter()
        .map(|term| quoted(&term.word))
        .collect::<Vec<_>>()
        .join(" OR ");
    format!(
        "scope_key : {} AND {columns} : ({alternatives})",
        quoted(&scope_key(scope))
    )
}

fn quoted(word: &str) -> String {
    format!("\"{}\"", word.replace('"', ""))
}

/// Appends a parameter and returns its placeholder.
fn bind(parameters: &mut Vec<Value>, value: Value) -> String {
    parameters.push(value);
    format!("?{}", parameters.len())
}

/// The WHERE conditions (scope, then currency at `as_of`) of one tier, over the alias
/// of its [`layout`].
fn restrictions(scope: &Scope, restrict: &SearchFilter, parameters: &mut Vec<Value>) -> String {
    let tenant = bind(parameters, Value::Text(scope.tenant().as_str().to_owned()));
    let user = bind(parameters, Value::Text(scope.user().as_str().to_owned()));
    let as_of = bind(parameters, Value::Integer(micros(restrict.as_of)));
    // Validity and expiry are event time: `valid_at` when asked, else `as_of`.
    let event = match restrict.valid_at {
        Some(valid_at) => bind(parameters, Value::Integer(micros(valid_at))),
        None => as_of.clone(),
    };
    match restrict.tier {
        Tier::Semantic => {
            let mut conditions = format!(
                "f.tenant = {tenant} AND f.user_id = {user} AND f.created_at <= {as_of} \
                 AND f.status IN ('active', 'superseded'{}) \
                 AND (f.expires_at IS NULL OR f.expires_at > {event}) \
                 AND (f.valid_from IS NULL OR f.valid_from <= {event})",
                if restrict.include_pending {
                    ", 'pending'"
                } else {
                    ""
                }
            );
            if restrict.valid_at.is_some() {
                // What held then, whether or not it has been superseded since.
                conditions.push_str(&format!(" AND (f.valid_to IS NULL OR f.valid_to > {event})"));
            } else if !restrict.include_history {
                conditions.push_str(&format!(
                    " AND (f.valid_to IS NULL OR f.valid_to > {as_of}) \
                     AND (f.superseded_at IS NULL OR f.superseded_at > {as_of})"
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
            conditions
        }
        Tier::Episodic => {
            let mut conditions =
                format!("e.tenant = {tenant} AND e.user_id = {user} AND e.ingested_at <= {as_of}");
            if restrict.valid_at.is_some() {
                conditions.push_str(&format!(" AND MIN(e.occurred_at, e.ingested_at) <= {event}"));
            }
            if let Some(session_id) = &restrict.session_id {
                let session = bind(parameters, Value::Text(session_id.clone()));
                conditions.push_str(&format!(" AND e.session_id = {session}"));
            }
            conditions
        }
        Tier::Procedural => format!("p.tenant = {tenant} AND p.user_id = {user} AND p.created_at <= {as_of}"),
    }
}

/// A tier's row columns, table (with its alias) and alias.
fn layout(tier: Tier) -> (&'static str, &'static str, &'static str) {
    match tier {
        Tier::Semantic => (rows::FACT_COLUMNS, "facts f", "f"),
        Tier::Episodic => (rows::EPISODE_COLUMNS, "episodes e", "e"),
        Tier::Procedural => (rows::PLAYBOOK_COLUMNS, "playbooks p", "p"),
    }
}

fn memory(tier: Tier, row: &rusqlite::Row<'_>) -> rusqlite::Result<Memory> {
    Ok(match tier {
        Tier::Semantic => Memory::Fact(rows::fact(row)?),
        Tier::Episodic => Memory::Episode(rows::episode(row)?),
        Tier::Procedural => Memory::Playbook(rows::playbook(row)?),
    })
}

/// A query's full-text table, the columns it searches and the BM25 weights of its
/// columns: text, the scope token (nothing) and, for episodes, the context at the
/// query's context weight (not searched at 0).
fn full_text(query: &TextQuery) -> (&'static str, &'static str, Vec<f64>) {
    match query.filter.tier {
        Tier::Semantic => ("facts_fts", "text", vec![1.0, 0.0]),
        Tier::Episodic if query.searches_context() => (
            "episodes_fts",
            "{text context}",
            vec![1.0, 0.0, query.context_weight],
        ),
        Tier::Episodic => ("episodes_fts", "text", vec![1.0, 0.0, 0.0]),
        Tier::Procedural => ("playbooks_fts", "text", vec![1.0, 0.0]),
    }
}

/// BM25 over the records that pass the restrictions, scored with the scope's own
/// statistics ([`bm25`]): FTS5 finds the candidates, reading only row ids and the
/// columns the conditions test; their rows are loaded and scored afresh.
pub fn search_text(connection: &Connection, scope: &Scope, query: &TextQuery) -> Result<Vec<TextHit>> {
    let terms = bm25::query_terms(&query.text);
    if terms.is_empty() || query.filter.limit == 0 {
        return Ok(Vec::new());
    }
    let (fts, searched, weights) = full_text(query);
    let mut parameters = Vec::new();
    let weights: Vec<String> = weights
        .into_iter()
        .map(|weight| bind(&mut parameters, Value::Real(weight)))
        .collect();
    let rank = format!("bm25({fts}, {})", weights.join(", "));
    let matched = bind(
        &mut parameters,
        Value::Text(match_expression(scope, searched, &terms)),
    );
    let restrict = &query.filter;
    let conditions = restrictions(scope, restrict, &mut parameters);
    let limit = bind(
        &mut parameters,
        Value::Integer(i64::try_from(query.filter.limit).unwrap_or(i64::MAX)),
    );
    let (_, table, alias) = layout(query.filter.tier);
    // CROSS JOIN keeps the full-text match as the outer loop: the planner must not
    // walk the scope's rows and probe the FTS index once per row.
    let sql = format!(
        "SELECT {fts}.rowid FROM {fts} CROSS JOIN {table} ON {alias}.seq = {fts}.rowid \
         WHERE {fts} MATCH {matched} AND {conditions} ORDER BY {rank} LIMIT {limit}"
    );
    let seqs: Vec<i64> = connection
        .prepare_cached(&sql)
        .map_err(storage)?
        .query_map(rusqlite::params_from_iter(parameters.iter()), |row| row.get(0))
        .map_err(storage)?
        .collect::<rusqlite::Result<_>>()
        .map_err(storage)?;
    if seqs.is_empty() {
        return Ok(Vec::new());
    }
    let mut by_seq = load_rows(connection, scope, query.filter.tier, seqs.iter().copied())?;
    let candidates: Vec<(i64, Memory)> = seqs
        .iter()
        .filter_map(|seq| by_seq.remove(seq).map(|memory| (*seq, memory)))
        .collect();
    let contexts = if query.searches_context() {
        contexts(connection, &seqs)?
    } else {
        HashMap::new()
    };
    let texts: Vec<Cow<'_, str>> = candidates
        .iter()
        .map(|(_, memory)| searchable_text(memory))
        .collect();
    let fields: Vec<bm25::Fields<'_>> = candidates
        .iter()
        .zip(&texts)
        .map(|((seq, _), text)| {
            let mut fields = vec![(text.as_ref(), 1.0)];
            if let Some(context) = contexts.get(seq) {
                fields.push((context.as_str(), query.context_weight));
            }
            fields
        })
        .collect();
    let statistics = statistics(connection, scope, query, &terms)?;
    let scores = bm25::scores(&terms, &statistics, &fields);
    let mut hits: Vec<TextHit> = candidates
        .into_iter()
        .zip(scores)
        .map(|((_, memory), score)| TextHit { memory, score })
        .collect();
    // Stable: candidates that score alike keep the index's order.
    hits.sort_by(|a, b| b.score.total_cmp(&a.score));
    Ok(hits)
}

/// The text a tier's full-text index holds for a record.
fn searchable_text(memory: &Memory) -> Cow<'_, str> {
    match memory {
        Memory::Fact(fact) => Cow::Borrowed(&fact.text),
        Memory::Episode(episode) => Cow::Borrowed(&episode.text),
        Memory::Playbook(playbook) => Cow::Owned(playbook.searchable_text()),
    }
}

/// The context indexed beside each of these episodes.
fn contexts(connection: &Connection, seqs: &[i64]) -> Result<HashMap<i64, String>> {
    let placeholders = vec!["?"; seqs.len()].join(", ");
    let sql = format!("SELECT rowid, context FROM episodes_fts WHERE rowid IN ({placeholders})");
    let mut statement = connection.prepare(&sql).map_err(storage)?;
    let rows: Vec<(i64, Option<String>)> = statement
        .query_map(rusqlite::params_from_iter(seqs), |row| {
            Ok((row.get(0)?, row.get(1)?))
        })
        .map_err(storage)?
        .collect::<rusqlite::Result<_>>()
        .map_err(storage)?;
    Ok(rows
        .into_iter()
        .filter_map(|(seq, context)| Some((seq, context?)))
        .collect())
}

/// The scope's record count in the query's tier, and how many of those records hold
/// each term in the searched columns. Rows are tied to the scope by their tenant and
/// user columns, not by the scope token alone.
fn statistics(
    connection: &Connection,
    scope: &Scope,
    query: &TextQuery,
    terms: &[Term],
) -> Result<ScopeStatistics> {
    let (fts, searched, _) = full_text(query);
    let (_, table, alias) = layout(query.filter.tier);
    let mut parameters = vec![
        Value::Text(scope.tenant().as_str().to_owned()),
        Value::Text(scope.user().as_str().to_owned()),
    ];
    let mut counts = vec![format!(
        "(SELECT count(*) FROM {table} WHERE {alias}.tenant = ?1 AND {alias}.user_id = ?2)"
    )];
    for term in terms {
        let matched = bind(
            &mut parameters,
            Value::Text(match_expression(scope, searched, std::slice::from_ref(term))),
        );
        counts.push(format!(
            "(SELECT count(*) FROM {fts} CROSS JOIN {table} ON {alias}.seq = {fts}.rowid \
             WHERE {fts} MATCH {matched} AND {alias}.tenant = ?1 AND {alias}.user_id = ?2)"
        ));
    }
    let sql = format!("SELECT {}", counts.join(", "));
    let counts: Vec<u64> = connection
        .prepare_cached(&sql)
        .map_err(storage)?
        .query_row(rusqlite::params_from_iter(parameters), |row| {
            (0..=terms.len())
                .map(|column| row.get::<_, i64>(column).map(|count| count.max(0).unsigned_abs()))
                .collect()
        })
        .map_err(storage)?;
    Ok(ScopeStatistics {
        documents: counts.first().copied().unwrap_or(0),
        containing: counts.into_iter().skip(1).collect(),
    })
}

/// Loads whole rows of a tier by row id, within the scope.
fn load_rows(
    connection: &Connection,
    scope: &Scope,
    tier: Tier,
    seqs: impl ExactSizeIterator<Item = i64>,
) -> Result<HashMap<i64, Memory>> {
    if seqs.len() == 0 {
        return Ok(HashMap::new());
    }
    let (columns, table, alias) = layout(tier);
    let placeholders = vec!["?"; seqs.len()].join(", ");
    let sql = format!(
        "SELECT {columns} FROM {table} WHERE {alias}.tenant = ? AND {alias}.user_id = ? \
         AND {alias}.seq IN ({placeholders})"
    );
    let mut statement = connection.prepare(&sql).map_err(storage)?;
    let mut parameters = vec![
        Value::Text(scope.tenant().as_str().to_owned()),
        Value::Text(scope.user().as_str().to_owned()),
    ];
    parameters.extend(seqs.map(Value::Integer));
    let rows: HashMap<i64, Memory> = statement
        .query_map(rusqlite::params_from_iter(parameters), |row| {
            Ok((row.get::<_, i64>(0)?, memory(tier, row)?))
        })
        .map_err(storage)?
        .collect::<rusqlite::Result<_>>()
        .map_err(storage)?;
    Ok(rows)
}

/// How many approximate candidates are rescored exactly per requested hit.
const RESCORED_PER_HIT: usize = 4;
/// The fewest candidates rescored, so small limits still see past quantisation noise.
const RESCORED_AT_LEAST: usize = 40;

/// kNN over the records that pass the restrictions: the scope's in-memory index gives
/// approximate candidates, which are rescored by exact cosine on their stored vectors.
pub fn search_vector(
    connection: &Connection,
    indexes: &VectorIndexes,
    scope: &Scope,
    query: &VectorQuery,
) -> Result<Vec<TextHit>> {
    let limit = query.filter.limit;
    if limit == 0 {
        return Ok(Vec::new());
    }
    let tier = query.filter.tier;
    let shared = indexes.get_or_build(tier, scope, || {
        build_index(connection, scope, tier, query.vector.len())
    })?;
    let candidates = {
        let index = shared
            .read()
            .map_err(|_| Error::Storage("vector index lock poisoned".into()))?;
        if index.dimension() != query.vector.len() {
            return Ok(Vec::new());
        }
        index.candidates(
            &query.vector,
            &query.filter,
            limit.saturating_mul(RESCORED_PER_HIT).max(RESCORED_AT_LEAST),
        )
    };
    let by_seq = load_rows(connection, scope, tier, candidates.iter().map(|(_, seq)| *seq))?;
    let mut scored: Vec<(f32, i64, Memory)> = by_seq
        .into_iter()
        .filter_map(|(seq, memory)| {
            let similarity = embedding(&memory)
                .filter(|vector| vector.len() == query.vector.len())
                .map(|vector| cosine(&query.vector, vector))?;
            Some((similarity, seq, memory))
        })
        .collect();
    scored.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
    scored.truncate(limit);
    Ok(scored
        .into_iter()
        .map(|(similarity, _, memory)| TextHit {
            memory,
            score: f64::from(similarity),
        })
        .collect())
}

fn embedding(memory: &Memory) -> Option<&[f32]> {
    match memory {
        Memory::Fact(fact) => fact.embedding.as_deref(),
        Memory::Episode(episode) => episode.embedding.as_deref(),
        Memory::Playbook(playbook) => playbook.embedding.as_deref(),
    }
}

/// The columns an index row is read from, per tier: row id, known-from, expiry,
/// end of validity, start of validity, supersession, fact type, session, vector, and
/// whether the row may be indexed at all (retracted facts may not), and whether it is
/// a fact pending review.
fn index_columns(tier: Tier) -> &'static str {
    match tier {
        Tier::Semantic => {
            "SELECT seq, created_at, expires_at, valid_to, valid_from, superseded_at, fact_type, NULL, embedding, \
             status IN ('active', 'superseded', 'pending'), status = 'pending' FROM facts"
        }
        Tier::Episodic => {
            "SELECT seq, ingested_at, NULL, NULL, MIN(occurred_at, ingested_at), NULL, NULL, session_id, embedding, 1, 0 \
             FROM episodes"
        }
        Tier::Procedural => {
            "SELECT seq, created_at, NULL, NULL, NULL, NULL, NULL, NULL, embedding, 1, 0 FROM playbooks"
        }
    }
}

/// One row read with [`index_columns`]: its currency, and its vector when it may be indexed.
fn index_row(row: &rusqlite::Row<'_>) -> Result<(Currency, Option<Vec<f32>>)> {
    let bound = |column: usize, absent: i64| -> Result<i64> {
        Ok(row
            .get::<_, Option<i64>>(column)
            .map_err(storage)?
            .unwrap_or(absent))
    };
    let kind = match row.get::<_, Option<String>>(6).map_err(storage)? {
        Some(fact_type) => FactType::parse(&fact_type)? as u8,
        None => 0,
    };
    let currency = Currency {
        seq: row.get(0).map_err(storage)?,
        known_from: row.get(1).map_err(storage)?,
        expires: bound(2, i64::MAX)?,
        valid_to: bound(3, i64::MAX)?,
        valid_from: bound(4, i64::MIN)?,
        superseded_at: bound(5, i64::MAX)?,
        kind,
        pending: row.get(10).map_err(storage)?,
        session: row
            .get::<_, Option<String>>(7)
            .map_err(storage)?
            .map(String::into_boxed_str),
    };
    let indexable: bool = row.get(9).map_err(storage)?;
    let vector = match row.get_ref(8).map_err(storage)?.as_blob_or_null() {
        Ok(Some(bytes)) if indexable => Some(rows::embedding_values(bytes).collect()),
        Ok(_) => None,
        Err(error) => return Err(Error::Storage(error.to_string())),
    };
    Ok((currency, vector))
}

/// Reads a scope's rows of a tier into a vector index: row ids, the columns the
/// currency conditions test (statuses that can never match are left out), and vectors.
fn build_index(connection: &Connection, scope: &Scope, tier: Tier, dimension: usize) -> Result<ScopeIndex> {
    let sql = format!(
        "{} WHERE tenant = ?1 AND user_id = ?2 AND embedding IS NOT NULL ORDER BY seq",
        index_columns(tier)
    );
    let mut statement = connection.prepare_cached(&sql).map_err(storage)?;
    let mut rows = statement
        .query(rusqlite::params![scope.tenant().as_str(), scope.user().as_str()])
        .map_err(storage)?;
    let mut index = ScopeIndex::new(dimension);
    while let Some(row) = rows.next().map_err(storage)? {
        if let (currency, Some(vector)) = index_row(row)? {
            index.push(currency, &vector);
        }
    }
    Ok(index)
}

/// What a commit did to the index rows of the records `ids` of a tier, read after it:
/// each row that may be indexed is (re)added, any other is removed.
pub fn delta(connection: &Connection, scope: &Scope, tier: Tier, ids: &[&str]) -> Result<Delta> {
    let sql = format!(
        "{} WHERE id = ?1 AND tenant = ?2 AND user_id = ?3",
        index_columns(tier)
    );
    let mut statement = connection.prepare_cached(&sql).map_err(storage)?;
    let mut delta = Delta::default();
    for id in ids {
        let mut rows = statement
            .query(rusqlite::params![
                id,
                scope.tenant().as_str(),
                scope.user().as_str()
            ])
            .map_err(storage)?;
        if let Some(row) = rows.next().map_err(storage)? {
            match index_row(row)? {
                (currency, Some(vector)) => delta.upserts.push((currency, vector)),
                (currency, None) => delta.removals.push(currency.seq),
            }
        }
    }
    Ok(delta)
}

#[cfg(test)]
mod tests {
    use cairn_core::porter;

    /// The stems that scoring compares words by are the stems FTS5 indexes.
    #[test]
    fn the_porter_stemmer_agrees_with_fts5() {
        let words = cairn_store_tests::vocabulary();
        assert!(words.len() > 1_500, "{} words", words.len());
        let connection = rusqlite::Connection::open_in_memory().expect("open");
        connection
            .execute_batch(
                "CREATE VIRTUAL TABLE words USING fts5 (word, tokenize = 'porter unicode61 remove_diacritics 2');
                 CREATE VIRTUAL TABLE stems USING fts5vocab (words, 'instance');",
            )
            .expect("schema");
        let mut insert = connection
            .prepare("INSERT INTO words (rowid, word) VALUES (?1, ?2)")
            .expect("prepare");
        let by_row: Vec<&String> = words.iter().collect();
        for (row, word) in by_row.iter().enumerate() {
            insert
                .execute(rusqlite::params![row as i64, word])
                .expect("insert");
        }
        let mut statement = connection
            .prepare("SELECT doc, term FROM stems")
            .expect("prepare");
        let stems: Vec<(i64, String)> = statement
            .query_map([], |row| Ok((row.get(0)?, row.get(1)?)))
            .expect("query")
            .collect::<rusqlite::Result<_>>()
            .expect("rows");
        assert_eq!(stems.len(), words.len());
        let disagreements: Vec<String> = stems
            .iter()
            .filter_map(|(row, fts5)| {
                let word = by_row[usize::try_from(*row).ok()?];
                let ours = porter::stem(word);
                (ours != *fts5).then(|| format!("{word}: fts5 {fts5}, ours {ours}"))
            })
            .collect();
        assert!(disagreements.is_empty(), "{disagreements:?}");
    }
}
