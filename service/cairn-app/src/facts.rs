//! Explicit fact writes, supersession, retraction and forgetting, through the gates.

use crate::gates;
use crate::review::Hold;
use crate::{Cairn, RequestContext, audit_event, decision, now, validate};
use cairn_core::text::{fingerprint, keyed_fingerprint};
use cairn_core::{
    Change, ChangeSet, Decision, DecisionKind, Episode, Error, Fact, FactStatus, FactType, Memory, Page,
    PageRequest, Result, ReviewKind, Scope, SearchFilter, StatusFilter, TextQuery, Tier, Tombstone,
    TombstoneReason, new_id,
};
use chrono::{DateTime, Utc};

/// Best text matches of a value searched for a restatement of it.
const RESTATEMENT_CANDIDATES: usize = 20;

/// How a superseding write treats the old value.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Contradiction {
    /// The old value was true and stopped being true: it is superseded, kept as history.
    #[default]
    Natural,
    /// The old value was never true: it is retracted and tombstoned.
    Harsh,
}

#[derive(Clone, Debug, Default)]
pub struct FactInput {
    pub text: String,
    pub fact_type: Option<FactType>,
    pub confidence: Option<f32>,
    pub supersedes: Option<String>,
    pub contradiction: Contradiction,
    pub valid_from: Option<DateTime<Utc>>,
    pub valid_to: Option<DateTime<Utc>>,
    pub expires_at: Option<DateTime<Utc>>,
    /// The user restated a retracted or forgotten value first-hand: lift its tombstone.
    /// Accepted only with evidence (see [`Cairn::restatement`]).
    pub reassert: bool,
    /// The episode in which the user restated the value; without it, the scope's
    /// episodes ingested after the tombstone are searched for one.
    pub evidence_episode_id: Option<String>,
    /// Hold this write for review whatever the tenant's policy (rule `request`); a
    /// request can add review, never take it away.
    pub review: bool,
}

#[derive(Clone, Debug)]
pub struct FactWriteOutcome {
    pub fact: Fact,
    pub decision: Decision,
    /// False when the write matched an existing active fact (a duplicate).
    pub created: bool,
}

impl Cairn {
    /// Writes one fact through the gates: tombstones, exact duplicates, and
    /// owner-checked supersession, all committed with their decision and audit event.
    pub async fn write_fact(
        &self,
        scope: &Scope,
        context: &RequestContext,
        input: FactInput,
    ) -> Result<FactWriteOutcome> {
        self.write_fact_once(scope, context, input, false).await
    }

    async fn write_fact_once(
        &self,
        scope: &Scope,
        context: &RequestContext,
        input: FactInput,
        retried: bool,
    ) -> Result<FactWriteOutcome> {
        let text = validate::text("text", &input.text, self.settings.max_text_chars)?;
        let confidence = validate::confidence(input.confidence)?;
        validate::interval(input.valid_from, input.valid_to)?;
        let created_at = now();
        if input.expires_at.is_some_and(|at| at <= created_at) {
            return Err(Error::invalid("expires_at", "must be in the future"));
        }
        let value_fingerprint = fingerprint(&text);
        let embedding = self.embed_one(&text).await?;
        let mut fact = Fact {
            valid_from: input.valid_from,
            valid_to: input.valid_to,
            expires_at: input.expires_at,
            embedding,
            ..Fact::new_active(
                new_id("fact"),
                input.fact_type.unwrap_or(FactType::World),
                text,
                confidence,
                created_at,
            )
        };

        let mut changes = Vec::new();
        let mut decisions = Vec::new();

        // Gate: tombstones. A retracted or forgotten value comes back only when asked
        // for explicitly and backed by evidence: a user episode of this scope, ingested
        // after the tombstone, that states the value.
        let mut lift_event = None;
        let mut lifted = None;
        if let Some(tombstone) = self.store.find_tombstone(scope, &value_fingerprint).await? {
            let evidence = if input.reassert {
                self.restatement(
                    scope,
                    &tombstone,
                    &fact.text,
                    input.evidence_episode_id.as_deref(),
                )
                .await?
            } else {
                None
            };
            let Some(evidence) = evidence else {
                let reason = if input.reassert {
                    format!(
                        "the value matches tombstone {} ({}) and no user episode ingested after it states the value",
                        tombstone.id,
                        tombstone.reason.as_str()
                    )
                } else {
                    format!(
                        "the value matches tombstone {} ({})",
                        tombstone.id,
                        tombstone.reason.as_str()
                    )
                };
                let blocked = decision(
                    DecisionKind::BlockedByTombstone,
                    reason,
                    None,
                    vec![tombstone.id.clone()],
                );
                let event = audit_event(
                    scope,
                    context,
                    "fact.write_refused",
                    vec![tombstone.id.clone()],
                    serde_json::json!({
                        "fingerprint": self.audit_fingerprint(scope, &fact.text).await?,
                        "reassert": input.reassert
                    }),
                );
                self.store
                    .commit(scope, ChangeSet::new(event).with_decision(blocked))
                    .await?;
                return Err(Error::Tombstoned {
                    tombstone_id: tombstone.id,
                });
            };
            lifted = Some(tombstone.id.clone());
            changes.push(gates::lift(&tombstone.id, created_at));
            // The restatement is the new fact's evidence, and must still be stored when
            // the lift commits.
            changes.push(Change::RequireEpisodes(vec![evidence.id.clone()]));
            fact.source_episode_ids = vec![evidence.id.clone()];
            decisions.push(decision(
                DecisionKind::TombstoneLifted,
                format!(
                    "episode {} ingested after the tombstone states the value",
                    evidence.id
                ),
                Some(fact.id.clone()),
                vec![tombstone.id.clone(), evidence.id.clone()],
            ));
            lift_event = Some(audit_event(
                scope,
                context,
                "tombstone.lift",
                vec![tombstone.id, fact.id.clone()],
                serde_json::json!({ "evidence_episode_id": evidence.id }),
            ));
        }

        // Gate: exact duplicates of an active fact are kept once.
        if input.supersedes.is_none()
            && let Some(existing) = self
                .store
                .find_active_facts_by_fingerprint(scope, &value_fingerprint)
                .await?
                .into_iter()
                .next()
        {
            let duplicate = decision(
                DecisionKind::Duplicate,
                "an active fact with the same normalized text exists",
                Some(existing.id.clone()),
                vec![existing.id.clone()],
            );
            let event = audit_event(
                scope,
                context,
                "fact.write_duplicate",
                vec![existing.id.clone()],
                serde_json::Value::Null,
            );
            let mut change_set = ChangeSet::new(event).with_decision(duplicate.clone());
            change_set.changes = changes;
            change_set.decisions.extend(decisions);
            change_set.audit.extend(lift_event);
            self.store.commit(scope, change_set).await?;
            return Ok(FactWriteOutcome {
                fact: existing,
                decision: duplicate,
                created: false,
            });
        }

        // A value already waiting for review is not held twice.
        if input.supersedes.is_none()
            && let Some(review) = self
                .reviewed_value(scope, &fact.text)
                .await?
                .filter(|review| review.status == cairn_core::ReviewStatus::Pending)
            && let Some(pending) = self.store.get_fact(scope, &review.fact_id).await?
        {
            let duplicate = decision(
                DecisionKind::Duplicate,
                format!("the same value is pending review {}", review.id),
                Some(pending.id.clone()),
                vec![pending.id.clone(), review.id.clone()],
            );
            let event = audit_event(
                scope,
                context,
                "fact.write_duplicate",
                vec![pending.id.clone()],
                serde_json::Value::Null,
            );
            self.store
                .commit(scope, ChangeSet::new(event).with_decision(duplicate.clone()))
                .await?;
            return Ok(FactWriteOutcome {
                fact: pending,
                decision: duplicate,
                created: false,
            });
        }

        // Gate: owner-checked supersession. The store re-checks scope and status inside
        // the transaction, so of two concurrent supersessions exactly one wins.
        let (action, main_decision) = match &input.supersedes {
            None => (
                "fact.create",
                decision(
                    DecisionKind::New,
                    "explicit write",
                    Some(fact.id.clone()),
                    Vec::new(),
                ),
            ),
            Some(old_id) => {
                let old = self.get_fact(scope, old_id).await?;
                if old.status != FactStatus::Active {
                    return Err(Error::not_active(&format!("fact {old_id}")));
                }
                changes.extend(gates::supersede(&old, &fact, created_at, input.contradiction));
                let (action, reason) = match input.contradiction {
                    Contradiction::Natural => ("fact.supersede", "explicit write superseding an active fact"),
                    Contradiction::Harsh => (
                        "fact.replace_retracted",
                        "explicit write; the old value was never true and is retracted",
                    ),
                };
                (
                    action,
                    decision(
                        DecisionKind::Updates,
                        reason,
                        Some(fact.id.clone()),
                        vec![old.id.clone()],
                    ),
                )
            }
        };
        // Gate: review. An outcome the tenant's policy holds is stored pending with its
        // review, and changes nothing else until a person approves it.
        let (kind, target) = match (&lifted, &input.supersedes, input.contradiction) {
            (Some(tombstone_id), _, _) => (ReviewKind::TombstoneLift, Some(tombstone_id.clone())),
            (None, Some(old_id), Contradiction::Natural) => (ReviewKind::Supersession, Some(old_id.clone())),
            (None, Some(old_id), Contradiction::Harsh) => (ReviewKind::Retraction, Some(old_id.clone())),
            (None, None, _) => (ReviewKind::NewFact, None),
        };
        let policy = self.review_policy(scope.tenant().as_str());
        if let Some(rule) = policy
            .rule_for(kind, &fact)
            .or_else(|| input.review.then(|| "request".to_owned()))
        {
            let hold = Hold {
                kind,
                rule,
                target_id: target,
                reason: main_decision.reason.clone(),
                origin: "api".into(),
            };
            let (held_changes, held) = hold.changes(scope, &mut fact, new_id("dec"));
            // A held lift still needs its evidence; nothing else of the outcome is applied.
            let mut held_set = ChangeSet::new(audit_event(
                scope,
                context,
                "fact.hold",
                held.target_ids.iter().chain([&fact.id]).cloned().collect(),
                serde_json::json!({ "kind": kind.as_str() }),
            ))
            .with_decision(held.clone());
            held_set.changes = changes
                .into_iter()
                .filter(|change| matches!(change, Change::RequireEpisodes(_)))
                .chain(held_changes)
                .collect();
            self.store.commit(scope, held_set).await?;
            return Ok(FactWriteOutcome {
                fact,
                decision: held,
                created: true,
            });
        }
        let mut target_ids = vec![fact.id.clone()];
        target_ids.extend(input.supersedes.iter().cloned());
        let event = audit_event(scope, context, action, target_ids, serde_json::Value::Null);
        // The new fact goes in after retiring the old one and lifting any tombstone. A
        // plain write also requires, inside the commit, that no identical value became
        // active meanwhile: of two identical writes racing, the second is a duplicate.
        let racing_duplicate = input.supersedes.is_none();
        if racing_duplicate {
            changes.push(Change::RequireNoActiveValue {
                fingerprint: value_fingerprint.clone(),
            });
        }
        changes.push(Change::InsertFact(fact.clone()));
        let mut change_set = ChangeSet::new(event);
        change_set.changes = changes;
        change_set.decisions = decisions;
        change_set.decisions.push(main_decision.clone());
        change_set.audit.extend(lift_event);
        match self.store.commit(scope, change_set).await {
            Err(Error::Conflict {
                code: cairn_core::ErrorCode::Duplicate,
                ..
            }) if racing_duplicate && !retried => {
                // Written again, the duplicate gate now finds the value and says so.
                return Box::pin(self.write_fact_once(scope, context, input, true)).await;
            }
            other => other?,
        }
        Ok(FactWriteOutcome {
            fact,
            decision: main_decision,
            created: true,
        })
    }

    /// The user episode that restates a tombstoned value: ingested after the tombstone,
    /// and holding every content word of the value (stemmed; function words and the
    /// words "user"/"I" that the third-person rewrite changes are left out). The named
    /// episode when one is given, else the newest such episode among the best text
    /// matches of the value.
    async fn restatement(
        &self,
        scope: &Scope,
        tombstone: &Tombstone,
        value: &str,
        named: Option<&str>,
    ) -> Result<Option<Episode>> {
        let states = |episode: &Episode| gates::restates(tombstone, episode, value);
        if let Some(episode_id) = named {
            let episode = self
                .store
                .get_episode(scope, episode_id)
                .await?
                .ok_or(Error::NotFound { what: "episode" })?;
            return Ok(states(&episode).then_some(episode));
        }
        let query = TextQuery {
            // The episode's own words: its neighbours' words are not the user's statement.
            context_weight: 0.0,
            ..TextQuery::new(
                SearchFilter {
                    tier: Tier::Episodic,
                    as_of: now(),
                    include_history: false,
                    include_pending: false,
                    valid_at: None,
                    fact_types: Vec::new(),
                    session_id: None,
                    limit: RESTATEMENT_CANDIDATES,
                    with_vectors: true,
                },
                value.to_owned(),
            )
        };
        // The restatement may be the ingest just before this write.
        self.store.make_ingests_searchable().await?;
        let found = self.store.search_text(scope, &query).await?;
        Ok(found
            .into_iter()
            .filter_map(|hit| match hit.memory {
                Memory::Episode(episode) if states(&episode) => Some(episode),
                _ => None,
            })
            .max_by_key(|episode| episode.ingested_at))
    }

    /// What the audit keeps of a value: a fingerprint keyed by the scope's secret, so it
    /// matches nothing in another scope and nothing at all once the scope is erased.
    async fn audit_fingerprint(&self, scope: &Scope, value: &str) -> Result<String> {
        let candidate: [u8; 32] = rand::random();
        let key = self.store.audit_key(scope, candidate).await?;
        Ok(keyed_fingerprint(&key, value))
    }

    /// One fact of the scope, any status.
    pub async fn get_fact(&self, scope: &Scope, fact_id: &str) -> Result<Fact> {
        self.store
            .get_fact(scope, fact_id)
            .await?
            .ok_or(Error::NotFound { what: "fact" })
    }

    /// A fact's supersession history, oldest first: the facts it replaced (and what
    /// those replaced, back to the first), the fact itself, and what replaced it since.
    /// A fact that replaced several holds them all; the walk stops after `HISTORY_LIMIT`.
    pub async fn fact_history(&self, scope: &Scope, fact_id: &str) -> Result<Vec<Fact>> {
        const HISTORY_LIMIT: usize = 100;
        let fact = self.get_fact(scope, fact_id).await?;
        let mut earlier = Vec::new();
        let mut frontier = vec![fact.id.clone()];
        while let Some(id) = frontier.pop() {
            if earlier.len() >= HISTORY_LIMIT {
                break;
            }
            for predecessor in self.store.list_superseded_by(scope, &id).await? {
                frontier.push(predecessor.id.clone());
                earlier.push(predecessor);
            }
        }
        earlier.sort_by_key(|fact| fact.created_at);
        let mut later = Vec::new();
        let mut next = fact.superseded_by.clone();
        while let Some(id) = next {
            if later.len() >= HISTORY_LIMIT {
                break;
            }
            let Some(successor) = self.store.get_fact(scope, &id).await? else {
                break;
            };
            next = successor.superseded_by.clone();
            later.push(successor);
        }
        earlier.push(fact);
        earlier.extend(later);
        Ok(earlier)
    }

    pub async fn list_facts(
        &self,
        scope: &Scope,
        status: StatusFilter,
        as_of: Option<DateTime<Utc>>,
        page: &PageRequest,
    ) -> Result<Page<Fact>> {
        self.store
            .list_facts(scope, status, as_of.unwrap_or_else(now), page)
            .await
    }

    /// "That was never true": the fact is retracted and its value tombstoned.
    pub async fn retract_fact(
        &self,
        scope: &Scope,
        context: &RequestContext,
        fact_id: &str,
        reason: Option<String>,
    ) -> Result<Fact> {
        let reason = reason
            .map(|reason| validate::text("reason", &reason, self.settings.max_text_chars))
            .transpose()?;
        let fact = self.get_fact(scope, fact_id).await?;
        if !matches!(fact.status, FactStatus::Active | FactStatus::Superseded) {
            return Err(Error::Conflict {
                code: cairn_core::ErrorCode::NotActive,
                message: format!("fact {fact_id} is already {}", fact.status.as_str()),
            });
        }
        let at = now();
        let event = audit_event(
            scope,
            context,
            "fact.retract",
            vec![fact.id.clone()],
            serde_json::Value::Null,
        );
        let mut change_set = ChangeSet::new(event).with_decision(decision(
            DecisionKind::Retracted,
            reason
                .clone()
                .unwrap_or_else(|| "retracted by request".to_owned()),
            Some(fact.id.clone()),
            Vec::new(),
        ));
        change_set.changes = gates::retraction(&fact, reason.as_deref(), at);
        self.store.commit(scope, change_set).await?;
        self.get_fact(scope, fact_id).await
    }

    /// Erasure: the fact, its vector and its edges are removed. The audit keeps the id
    /// and a fingerprint, and a tombstone keeps the value from coming back.
    pub async fn forget_fact(&self, scope: &Scope, context: &RequestContext, fact_id: &str) -> Result<()> {
        let fact = self.get_fact(scope, fact_id).await?;
        let value_fingerprint = fingerprint(&fact.text);
        let at = now();
        let event = audit_event(
            scope,
            context,
            "fact.forget",
            vec![fact.id.clone()],
            serde_json::json!({ "fingerprint": self.audit_fingerprint(scope, &fact.text).await? }),
        );
        let mut change_set = ChangeSet::new(event)
            .with(Change::EraseFact {
                fact_id: fact.id.clone(),
            })
            .with_decision(decision(
                DecisionKind::Forgotten,
                "erased by request",
                None,
                vec![fact.id.clone()],
            ));
        if self
            .store
            .find_tombstone(scope, &value_fingerprint)
            .await?
            .is_none()
        {
            change_set.changes.push(Change::InsertTombstone(Tombstone {
                id: new_id("tomb"),
                fingerprint: value_fingerprint,
                fact_id: fact.id.clone(),
                reason: TombstoneReason::Forgotten,
                created_at: at,
                lifted_at: None,
            }));
        }
        self.store.commit(scope, change_set).await
    }
}
