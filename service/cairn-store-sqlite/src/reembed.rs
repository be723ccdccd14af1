//! Moving every stored vector to another embedding space (`cairn reembed`).
//!
//! The new vectors are built into the `reembedding` table beside the current ones,
//! which keep serving; triggers drop a built vector when its record is deleted or its
//! text or vector changes. When nothing is left to build, one transaction copies the
//! built vectors over the current ones and claims the new space.

use crate::rows::{PLAYBOOK_COLUMNS, embedding_bytes, playbook};
use crate::storage;
use cairn_core::{Error, Reembedded, Reembedding, Result, Tier, ToReembed};
use rusqlite::{Connection, OptionalExtension, params};

/// Each tier's table, and the expression of the text its vectors are made from (a
/// playbook's is built in Rust: [`cairn_core::Playbook::searchable_text`]).
const TABLES: [(Tier, &str); 3] = [
    (Tier::Episodic, "episodes"),
    (Tier::Semantic, "facts"),
    (Tier::Procedural, "playbooks"),
];

fn meta(connection: &Connection, key: &str) -> Result<Option<String>> {
    connection
        .query_row("SELECT value FROM schema_meta WHERE key = ?1", [key], |row| {
            row.get(0)
        })
        .optional()
        .map_err(storage)
}

fn set_meta(connection: &Connection, key: &str, value: &str) -> Result<()> {
    connection
        .execute(
            "INSERT INTO schema_meta (key, value) VALUES (?1, ?2) \
             ON CONFLICT (key) DO UPDATE SET value = excluded.value",
            params![key, value],
        )
        .map(|_| ())
        .map_err(storage)
}

/// The space the stored vectors are in, if any was claimed.
pub fn current_space(connection: &Connection) -> Result<Option<String>> {
    meta(connection, "embedding_space")
}

/// Where the move stands; an error when none was started.
pub fn status(connection: &Connection) -> Result<Reembedding> {
    let target = meta(connection, "reembed_target")?
        .ok_or_else(|| Error::invalid("reembedding", "no re-embedding was started"))?;
    let built: i64 = connection
        .query_row("SELECT count(*) FROM reembedding", [], |row| row.get(0))
        .map_err(storage)?;
    let mut remaining = 0i64;
    for (tier, table) in TABLES {
        let left: i64 = connection
            .query_row(
                &format!(
                    "SELECT count(*) FROM {table} t WHERE t.embedding IS NOT NULL AND NOT EXISTS \
                     (SELECT 1 FROM reembedding r WHERE r.tier = ?1 AND r.id = t.id)"
                ),
                [tier.as_str()],
                |row| row.get(0),
            )
            .map_err(storage)?;
        remaining += left;
    }
    Ok(Reembedding {
        current: current_space(connection)?,
        target,
        built: u64::try_from(built).unwrap_or(0),
        remaining: u64::try_from(remaining).unwrap_or(0),
    })
}

pub fn start(connection: &mut Connection, target: &str) -> Result<Reembedding> {
    if target
        .split_once('/')
        .is_none_or(|(model, dimension)| model.is_empty() || dimension.parse::<usize>().is_err())
    {
        return Err(Error::invalid("target", "must be model/dimension"));
    }
    let transaction = connection.transaction().map_err(storage)?;
    let current = current_space(&transaction)?;
    if current.as_deref() == Some(target) {
        // Already there: nothing to build (an unfinished move elsewhere is dropped).
        transaction
            .execute("DELETE FROM reembedding", [])
            .map_err(storage)?;
        transaction
            .execute("DELETE FROM schema_meta WHERE key = 'reembed_target'", [])
            .map_err(storage)?;
        transaction.commit().map_err(storage)?;
        return Ok(Reembedding {
            current,
            target: target.to_owned(),
            built: 0,
            remaining: 0,
        });
    }
    if meta(&transaction, "reembed_target")?.as_deref() != Some(target) {
        transaction
            .execute("DELETE FROM reembedding", [])
            .map_err(storage)?;
        set_meta(&transaction, "reembed_target", target)?;
    }
    let status = status(&transaction)?;
    transaction.commit().map_err(storage)?;
    Ok(status)
}

/// Up to `limit` records without a built vector whose `seq` is past `after` in each
/// tier (the caller's cursor); `after` moves past what is returned.
pub fn pending(connection: &Connection, after: &mut [i64; 3], limit: usize) -> Result<Vec<ToReembed>> {
    let mut found = Vec::new();
    for (index, (tier, table)) in TABLES.into_iter().enumerate() {
        if found.len() >= limit {
            break;
        }
        let wanted = i64::try_from(limit - found.len()).unwrap_or(i64::MAX);
        let absent = "t.embedding IS NOT NULL AND NOT EXISTS \
                      (SELECT 1 FROM reembedding r WHERE r.tier = ?1 AND r.id = t.id) \
                      AND t.seq > ?2 ORDER BY t.seq LIMIT ?3";
        let rows: Vec<(i64, ToReembed)> = if tier == Tier::Procedural {
            let sql = format!(
                "SELECT {PLAYBOOK_COLUMNS} FROM playbooks p JOIN playbooks t ON t.seq = p.seq WHERE {absent}"
            );
            let mut statement = connection.prepare(&sql).map_err(storage)?;
            statement
                .query_map(params![tier.as_str(), after[index], wanted], |row| {
                    let seq: i64 = row.get(0)?;
                    let playbook = playbook(row)?;
                    Ok((
                        seq,
                        ToReembed {
                            tier,
                            text: playbook.searchable_text(),
                            id: playbook.id,
                        },
                    ))
                })
                .map_err(storage)?
                .collect::<rusqlite::Result<_>>()
                .map_err(storage)?
        } else {
            let sql = format!("SELECT t.seq, t.id, t.text FROM {table} t WHERE {absent}");
            let mut statement = connection.prepare(&sql).map_err(storage)?;
            statement
                .query_map(params![tier.as_str(), after[index], wanted], |row| {
                    Ok((
                        row.get(0)?,
                        ToReembed {
                            tier,
                            id: row.get(1)?,
                            text: row.get(2)?,
                        },
                    ))
                })
                .map_err(storage)?
                .collect::<rusqlite::Result<_>>()
                .map_err(storage)?
        };
        for (seq, record) in rows {
            after[index] = after[index].max(seq);
            found.push(record);
        }
    }
    Ok(found)
}

/// The text a stored record's vector is made from now, if it still holds a vector.
fn text_now(connection: &Connection, tier: Tier, id: &str) -> Result<Option<String>> {
    match tier {
        Tier::Procedural => connection
            .query_row(
                &format!(
                    "SELECT {PLAYBOOK_COLUMNS} FROM playbooks p WHERE p.id = ?1 AND p.embedding IS NOT NULL"
                ),
                [id],
                |row| playbook(row).map(|playbook| playbook.searchable_text()),
            )
            .optional()
            .map_err(storage),
        Tier::Episodic | Tier::Semantic => {
            let table = if tier == Tier::Episodic {
                "episodes"
            } else {
                "facts"
            };
            connection
                .query_row(
                    &format!("SELECT text FROM {table} WHERE id = ?1 AND embedding IS NOT NULL"),
                    [id],
                    |row| row.get(0),
                )
                .optional()
                .map_err(storage)
        }
    }
}

pub fn store(connection: &mut Connection, vectors: Vec<Reembedded>) -> Result<()> {
    let transaction = connection.transaction().map_err(storage)?;
    let target = meta(&transaction, "reembed_target")?
        .ok_or_else(|| Error::invalid("reembedding", "no re-embedding was started"))?;
    let dimension = target
        .rsplit_once('/')
        .and_then(|(_, dimension)| dimension.parse::<usize>().ok())
        .unwrap_or(0);
    for built in vectors {
        if built.vector.len() != dimension {
            return Err(Error::invalid(
                "vector",
                format!("has {} values where {target} has {dimension}", built.vector.len()),
            ));
        }
        // Erased, changed or never embedded since it was read: skipped.
        if text_now(&transaction, built.tier, &built.id)?.as_deref() != Some(built.text.as_str()) {
            continue;
        }
        transaction
            .execute(
                "INSERT INTO reembedding (tier, id, embedding) VALUES (?1, ?2, ?3) \
                 ON CONFLICT (tier, id) DO UPDATE SET embedding = excluded.embedding",
                params![
                    built.tier.as_str(),
                    built.id,
                    embedding_bytes(Some(&built.vector))
                ],
            )
            .map_err(storage)?;
    }
    transaction.commit().map_err(storage)
}

/// Switches when nothing is left to build; answers where the move stands, and whether
/// this call switched.
pub fn finish(connection: &mut Connection) -> Result<(Reembedding, bool)> {
    let transaction = connection.transaction().map_err(storage)?;
    let before = status(&transaction)?;
    if before.remaining > 0 {
        return Ok((before, false));
    }
    for (tier, table) in TABLES {
        transaction
            .execute(
                &format!(
                    "UPDATE {table} SET embedding = (SELECT r.embedding FROM reembedding r \
                     WHERE r.tier = ?1 AND r.id = {table}.id) WHERE embedding IS NOT NULL"
                ),
                [tier.as_str()],
            )
            .map_err(storage)?;
    }
    transaction
        .execute("DELETE FROM reembedding", [])
        .map_err(storage)?;
    set_meta(&transaction, "embedding_space", &before.target)?;
    transaction
        .execute("DELETE FROM schema_meta WHERE key = 'reembed_target'", [])
        .map_err(storage)?;
    transaction.commit().map_err(storage)?;
    Ok((
        Reembedding {
            current: Some(before.target.clone()),
            target: before.target,
            built: before.built,
            remaining: 0,
        },
        true,
    ))
}
