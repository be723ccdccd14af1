//! Use counts live in their own index, `<prefix>-usage`: one small document per used
//! fact or playbook (tenant, user, id, `use_count`, `last_used_at`). Counting rewrote
//! the record itself before, and a rewrite re-indexes everything, the vector included:
//! each second's batch of counts cost the node a new kNN graph segment and merges,
//! which recalls felt. A usage document has nothing to index but its numbers.
//!
//! A record's count is its usage document's when there is one, else the count stored
//! in the record (records counted before this index, and imported ones). Reads of
//! records by id and listings apply the usage documents; recall applies them to the
//! hits it answers (`MemoryStore::apply_usage`). Erasure deletes them with the scope,
//! forgetting a fact deletes its own.

use crate::client::Method;
use crate::records::{self, Hit};
use crate::{ClusterStore, bulk_results, docs};
use cairn_core::{Error, Fact, Memory, Playbook, Result, Scope, UseCount};
use chrono::{DateTime, Utc};
use serde_json::{Value, json};
use std::collections::{HashMap, HashSet};

/// A count as stored.
struct Counted {
    use_count: u64,
    last_used_at: Option<i64>,
}

fn time(micros: Option<i64>) -> Option<DateTime<Utc>> {
    micros.and_then(DateTime::from_timestamp_micros)
}

impl ClusterStore {
    fn owned_hit(&self, scope: &Scope, hit: &Hit) -> bool {
        hit.found == Some(true) && docs::in_scope(scope, &hit.source)
    }

    /// Documents of one index by id (realtime), in the order asked, reading only
    /// `fields` of each when given.
    async fn multi_get(
        &self,
        index: &str,
        routing: &str,
        ids: &[&str],
        fields: Option<&[&str]>,
    ) -> Result<Vec<Hit>> {
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        let mut query = vec![("routing", routing.to_owned())];
        if let Some(fields) = fields {
            query.push(("_source_includes", fields.join(",")));
        }
        let path = format!("/{index}/_mget");
        let answer = self
            .cluster
            .expect(Method::Post, &path, &query, Some(json!({ "ids": ids })))
            .await?;
        let hits: Vec<Hit> = records::parse("multi-get answer docs", &answer["docs"])?;
        if hits.len() != ids.len() {
            return Err(Error::Storage(format!(
                "{path}: {} answers to {} ids",
                hits.len(),
                ids.len()
            )));
        }
        Ok(hits)
    }

    /// The usage documents of `ids` in the scope, in one multi-get. A realtime read of a
    /// document written since the last refresh makes the node refresh the index first,
    /// so recall, which reads counts with every answer, reads them as of the last
    /// refresh (at most the refresh interval behind); reads by id are realtime.
    async fn counts(&self, scope: &Scope, ids: &[&str], realtime: bool) -> Result<HashMap<String, Counted>> {
        if ids.is_empty() {
            return Ok(HashMap::new());
        }
        let index = self.index("usage");
        let tenant = scope.tenant().as_str();
        let docs: Vec<Value> = ids
            .iter()
            .map(|id| json!({ "_index": index, "_id": id, "routing": tenant }))
            .collect();
        let answer = self
            .cluster
            .expect(
                Method::Post,
                "/_mget",
                &[("realtime", realtime.to_string())],
                Some(json!({ "docs": docs })),
            )
            .await?;
        let hits: Vec<Hit> = records::parse("multi-get answer docs", &answer["docs"])?;
        hits.into_iter()
            .filter(|hit| hit.found == Some(true) && docs::in_scope(scope, &hit.source))
            .map(|hit| {
                let usage: records::Usage = hit.read()?;
                Ok((
                    hit.id,
                    Counted {
                        use_count: usage.use_count,
                        last_used_at: usage.last_used_at,
                    },
                ))
            })
            .collect()
    }

    pub(crate) async fn counted_facts(&self, scope: &Scope, mut facts: Vec<Fact>) -> Result<Vec<Fact>> {
        let ids: Vec<&str> = facts.iter().map(|fact| fact.id.as_str()).collect();
        let counts = self.counts(scope, &ids, true).await?;
        for fact in &mut facts {
            if let Some(counted) = counts.get(&fact.id) {
                fact.use_count = counted.use_count;
                fact.last_used_at = time(counted.last_used_at);
            }
        }
        Ok(facts)
    }

    pub(crate) async fn counted_playbooks(
        &self,
        scope: &Scope,
        mut playbooks: Vec<Playbook>,
    ) -> Result<Vec<Playbook>> {
        let ids: Vec<&str> = playbooks.iter().map(|playbook| playbook.id.as_str()).collect();
        let counts = self.counts(scope, &ids, true).await?;
        for playbook in &mut playbooks {
            if let Some(counted) = counts.get(&playbook.id) {
                playbook.use_count = counted.use_count;
                playbook.last_used_at = time(counted.last_used_at);
            }
        }
        Ok(playbooks)
    }

    pub(crate) async fn counted_memories(&self, scope: &Scope, memories: &mut [Memory]) -> Result<()> {
        let ids: Vec<&str> = memories
            .iter()
            .filter(|memory| !matches!(memory, Memory::Episode(_)))
            .map(Memory::id)
            .collect();
        let counts = self.counts(scope, &ids, false).await?;
        for memory in memories {
            let Some(counted) = counts.get(memory.id()) else {
                continue;
            };
            match memory {
                Memory::Fact(fact) => {
                    fact.use_count = counted.use_count;
                    fact.last_used_at = time(counted.last_used_at);
                }
                Memory::Playbook(playbook) => {
                    playbook.use_count = counted.use_count;
                    playbook.last_used_at = time(counted.last_used_at);
                }
                Memory::Episode(_) => {}
            }
        }
        Ok(())
    }

    /// Adds counts to the scope's facts and playbooks by compare-and-set on their usage
    /// documents. A record without one yet (checked to be the scope's, and not gone)
    /// starts from the count it holds itself; ids of other scopes and of records that
    /// are gone are skipped.
    pub(crate) async fn add_usage(&self, scope: &Scope, uses: &[UseCount]) -> Result<()> {
        let tenant = scope.tenant().as_str();
        let usage_index = self.index("usage");
        let mut left: HashMap<&str, &UseCount> =
            uses.iter().map(|usage| (usage.id.as_str(), usage)).collect();
        for _ in 0..20 {
            if left.is_empty() {
                return Ok(());
            }
            let ids: Vec<&str> = left.keys().copied().collect();
            let counters = self.multi_get(&usage_index, tenant, &ids, None).await?;
            let uncounted: Vec<&str> = ids
                .iter()
                .zip(&counters)
                .filter(|(_, counter)| !self.owned_hit(scope, counter))
                .map(|(id, _)| *id)
                .collect();
            // The records without a usage document: their own counts, and whether they
            // are the scope's.
            let read = ["tenant", "user", "use_count", "last_used_at"];
            let facts = self
                .multi_get(&self.index("facts"), tenant, &uncounted, Some(&read))
                .await?;
            let playbooks = self
                .multi_get(&self.index("playbooks"), tenant, &uncounted, Some(&read))
                .await?;
            let mut records: HashMap<&str, &Hit> = HashMap::new();
            for (id, (fact, playbook)) in uncounted.iter().zip(facts.iter().zip(&playbooks)) {
                if let Some(record) = [fact, playbook]
                    .into_iter()
                    .find(|hit| self.owned_hit(scope, hit))
                {
                    records.insert(id, record);
                }
            }
            let mut lines = Vec::new();
            for (id, counter) in ids.iter().zip(&counters) {
                let Some(usage) = left.get(id) else {
                    continue;
                };
                let (before, action) = if self.owned_hit(scope, counter) {
                    let (seq_no, primary_term) = counter.version()?;
                    let action = json!({ "index": {
                        "_index": usage_index, "_id": id, "routing": tenant,
                        "if_seq_no": seq_no, "if_primary_term": primary_term
                    } });
                    (counter.read::<records::Usage>()?, action)
                } else if let Some(record) = records.get(id) {
                    let action = json!({ "create": { "_index": usage_index, "_id": id, "routing": tenant } });
                    (record.read::<records::Usage>()?, action)
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
}
