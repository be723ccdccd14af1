//! Use counts live in their own index, `<prefix>-usage`: one small document per used
//! fact or playbook (tenant, user, id, `use_count`, `last_used_at`). Counting rewrote
//! the record itself before, and a rewrite re-indexes everything, the vector included:
//! each second's batch of counts cost the node a new kNN graph segment and merges,
//! which recalls felt. A usage document has nothing to index but its numbers.
//!
//! A record's count is its usage document's when there is one, else the count stored
//! in the record (records counted before this index, and imported ones). Reads of
//! records by id and listings apply the usage documents; recall applies them to its
//! candidates when the usage prior weighs them (`MemoryStore::apply_usage`; no answer
//! shows a hit's count, so otherwise it reads none). Erasure deletes them with the scope,
//! forgetting a fact deletes its own.

use crate::{ClusterStore, bulk_results, docs, query, records};
use cairn_core::{Error, Fact, Memory, Playbook, Result, Scope, UseCount};
use chrono::{DateTime, Utc};
use serde_json::json;
use std::collections::{HashMap, HashSet};

/// A record whose use counts a usage document may override.
pub(crate) trait Counted {
    fn counted_id(&self) -> Option<&str>;
    fn set_counts(&mut self, use_count: u64, last_used_at: Option<DateTime<Utc>>);
}

impl Counted for Fact {
    fn counted_id(&self) -> Option<&str> {
        Some(&self.id)
    }

    fn set_counts(&mut self, use_count: u64, last_used_at: Option<DateTime<Utc>>) {
        self.use_count = use_count;
        self.last_used_at = last_used_at;
    }
}

impl Counted for Playbook {
    fn counted_id(&self) -> Option<&str> {
        Some(&self.id)
    }

    fn set_counts(&mut self, use_count: u64, last_used_at: Option<DateTime<Utc>>) {
        self.use_count = use_count;
        self.last_used_at = last_used_at;
    }
}

impl Counted for Memory {
    fn counted_id(&self) -> Option<&str> {
        match self {
            Memory::Fact(fact) => fact.counted_id(),
            Memory::Playbook(playbook) => playbook.counted_id(),
            Memory::Episode(_) => None,
        }
    }

    fn set_counts(&mut self, use_count: u64, last_used_at: Option<DateTime<Utc>>) {
        match self {
            Memory::Fact(fact) => fact.set_counts(use_count, last_used_at),
            Memory::Playbook(playbook) => playbook.set_counts(use_count, last_used_at),
            Memory::Episode(_) => {}
        }
    }
}

impl Counted for &mut Memory {
    fn counted_id(&self) -> Option<&str> {
        (**self).counted_id()
    }

    fn set_counts(&mut self, use_count: u64, last_used_at: Option<DateTime<Utc>>) {
        (**self).set_counts(use_count, last_used_at);
    }
}

impl ClusterStore {
    /// Gives `records` the counts of their usage documents. Reads by id and listings
    /// read them realtime; recall, which reads counts on every request when the usage
    /// prior weighs them, reads them as of the last refresh (at most the refresh
    /// interval behind), because a realtime read of a document written since makes the
    /// node refresh the index first.
    pub(crate) async fn apply_counts<T: Counted>(
        &self,
        scope: &Scope,
        records: &mut [T],
        realtime: bool,
    ) -> Result<()> {
        let ids: Vec<&str> = records.iter().filter_map(Counted::counted_id).collect();
        let found = self
            .scoped_multi_get(scope, "usage", &ids, None, realtime)
            .await?;
        let mut counts = HashMap::new();
        for (id, hit) in ids.iter().zip(found) {
            if let Some(hit) = hit {
                let usage: records::Usage = hit.read()?;
                counts.insert(id.to_string(), usage);
            }
        }
        for record in records {
            let Some(usage) = record.counted_id().and_then(|id| counts.get(id)) else {
                continue;
            };
            let (use_count, last_used_at) = (usage.use_count, usage.last_used_at);
            record.set_counts(use_count, last_used_at.and_then(DateTime::from_timestamp_micros));
        }
        Ok(())
    }

    /// Adds counts to the scope's facts and playbooks by compare-and-set on their usage
    /// documents. A record without one yet (checked to be the scope's, and not gone)
    /// starts from the count it holds itself; ids of other scopes and of records that
    /// are gone are skipped.
    ///
    /// A flush reads as of the last refresh first: usage documents by id, and the
    /// records without one by a search that reads their counts from doc values (no
    /// stored source). Fact and playbook changes wait for a refresh, so that read is
    /// current for them; a usage document written since the last refresh makes its
    /// write conflict, and the ids that conflicted are read again realtime.
    pub(crate) async fn add_usage(&self, scope: &Scope, uses: &[UseCount]) -> Result<()> {
        let tenant = scope.tenant().as_str();
        let usage_index = self.index("usage");
        let mut left: HashMap<&str, &UseCount> =
            uses.iter().map(|usage| (usage.id.as_str(), usage)).collect();
        for attempt in 0..20 {
            if left.is_empty() {
                return Ok(());
            }
            let ids: Vec<&str> = left.keys().copied().collect();
            let counters = self
                .scoped_multi_get(scope, "usage", &ids, None, attempt > 0)
                .await?;
            let uncounted: Vec<&str> = ids
                .iter()
                .zip(&counters)
                .filter(|(_, counter)| counter.is_none())
                .map(|(id, _)| *id)
                .collect();
            let mut records = self.own_counts(scope, &uncounted).await?;
            let mut lines = Vec::new();
            for (id, counter) in ids.iter().zip(&counters) {
                let Some(usage) = left.get(id) else {
                    continue;
                };
                let (before, action) = if let Some(counter) = counter {
                    let (seq_no, primary_term) = counter.version()?;
                    let action = json!({ "index": {
                        "_index": usage_index, "_id": id, "routing": tenant,
                        "if_seq_no": seq_no, "if_primary_term": primary_term
                    } });
                    (counter.read::<records::Usage>()?, action)
                } else if let Some(own) = records.remove(*id) {
                    let action = json!({ "create": { "_index": usage_index, "_id": id, "routing": tenant } });
                    (own, action)
                } else {
                    left.remove(id);
                    continue;
                };
                let at = docs::micros(usage.last_used_at);
                lines.push(action);
                lines.push(json!({
                    "tenant": tenant, "user": scope.user().as_str(), "id": id,
                    "use_count": before.use_count + usage.count,
                    "last_used_at": before.last_used_at.map_or(at, |before| before.max(at)),
                }));
            }
            let answer = self.bulk_with(lines, &[409], false).await?;
            let conflicted: HashSet<&str> = bulk_results(&answer)
                .filter(|result| result["status"] == 409)
                .filter_map(|result| result["_id"].as_str())
                .collect();
            left.retain(|id, _| conflicted.contains(id));
        }
        Err(Error::Unavailable("usage counts: too much contention".into()))
    }

    /// The counts the scope's facts and playbooks among `ids` hold themselves, read from
    /// doc values as of the last refresh; ids of other scopes and of records that are gone
    /// are missing from the answer.
    async fn own_counts(&self, scope: &Scope, ids: &[&str]) -> Result<HashMap<String, records::Usage>> {
        let indices = [self.index("facts"), self.index("playbooks")].join(",");
        let number = |hit: &records::Hit, field: &str| hit.fields[field][0].as_i64();
        let mut counts = HashMap::new();
        // A page of ids per search, well inside the default result window.
        for chunk in ids.chunks(1_000) {
            let mut filter = query::scope_filter(scope);
            filter.push(json!({ "ids": { "values": chunk } }));
            let body = json!({
                "size": chunk.len(),
                "track_total_hits": false,
                "_source": false,
                "docvalue_fields": ["use_count", "last_used_at"],
                "query": { "bool": { "filter": filter } }
            });
            let answer = self
                .search_in(&indices, Some(scope.tenant().as_str()), body)
                .await?;
            for hit in records::hits(&answer)? {
                let usage = records::Usage {
                    use_count: number(&hit, "use_count").unwrap_or(0).max(0) as u64,
                    last_used_at: number(&hit, "last_used_at"),
                };
                counts.insert(hit.id, usage);
            }
        }
        Ok(counts)
    }
}
