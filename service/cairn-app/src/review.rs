//! Human review: which outcomes wait for a person (the policy, per tenant), holding
//! them as pending facts with a review, and the reviewer's approval or rejection.
//!
//! A held outcome is a fact stored with status `pending` plus a [`Review`] naming what
//! approving it changes (the fact it supersedes or retracts, the tombstone it lifts) and
//! the `HELD_FOR_REVIEW` decision that proposed it. Until then the fact is recalled
//! only on request (`include_pending`) and whatever it would replace stays current.
//! Approval applies the change through the same preconditions as any write, in one
//! change set with the review's resolution; of two reviewers deciding at once, one
//! commits and the other gets a conflict.

use crate::facts::Contradiction;
use crate::gates;
use crate::{Cairn, RequestContext, audit_event, decision, now};
use cairn_core::text::fingerprint;
use cairn_core::{
    Change, ChangeSet, Decision, DecisionKind, Error, ErrorCode, Fact, FactStatus, FactType, Page,
    PageRequest, Result, Review, ReviewKind, ReviewStatus, ReviewSummary, Scope, TenantScope, UserReview,
    new_id,
};
use std::collections::HashMap;

/// Which outcomes one tenant holds for review. The default holds nothing.
#[derive(Clone, Debug, PartialEq)]
pub struct ReviewPolicy {
    pub all: bool,
    pub supersession: bool,
    pub retraction: bool,
    pub tombstone_lift: bool,
    pub low_confidence: bool,
    pub fact_types: Vec<FactType>,
    /// Below this confidence, `low_confidence` holds a fact.
    pub min_confidence: f32,
}

impl Default for ReviewPolicy {
    fn default() -> Self {
        ReviewPolicy {
            all: false,
            supersession: false,
            retraction: false,
            tombstone_lift: false,
            low_confidence: false,
            fact_types: Vec::new(),
            min_confidence: 0.5,
        }
    }
}

impl ReviewPolicy {
    /// Reads `supersession, retraction, tombstone_lift, low_confidence,
    /// fact_type:<type>, all` (comma-separated; empty holds nothing).
    pub fn parse(spec: &str, min_confidence: f32) -> Result<Self> {
        if !(0.0..=1.0).contains(&min_confidence) {
            return Err(Error::invalid("review_min_confidence", "must be between 0 and 1"));
        }
        let mut policy = ReviewPolicy {
            min_confidence,
            ..ReviewPolicy::default()
        };
        for rule in spec.split(',').map(str::trim).filter(|rule| !rule.is_empty()) {
            match rule {
                "all" => policy.all = true,
                "supersession" => policy.supersession = true,
                "retraction" => policy.retraction = true,
                "tombstone_lift" => policy.tombstone_lift = true,
                "low_confidence" => policy.low_confidence = true,
                other => match other.strip_prefix("fact_type:") {
                    Some(kind) => policy.fact_types.push(FactType::parse(kind).map_err(|_| {
                        Error::invalid(
                            "review",
                            format!(
                                "unknown fact type in {other:?}: one of identity, preference, constraint, world, event"
                            ),
                        )
                    })?),
                    None => {
                        return Err(Error::invalid(
                            "review",
                            format!(
                                "unknown rule {other:?}: use supersession, retraction, tombstone_lift, \
                                 low_confidence, fact_type:<type> or all"
                            ),
                        ));
                    }
                },
            }
        }
        Ok(policy)
    }

    /// Whether the policy holds anything at all.
    pub fn holds_anything(&self) -> bool {
        self.all
            || self.supersession
            || self.retraction
            || self.tombstone_lift
            || self.low_confidence
            || !self.fact_types.is_empty()
    }

    /// The rule that holds an outcome of `kind` making `fact` current, if one does.
    pub fn rule_for(&self, kind: ReviewKind, fact: &Fact) -> Option<String> {
        self.rule_of(kind, fact.fact_type, fact.confidence)
    }

    /// [`ReviewPolicy::rule_for`] by the fact's type and confidence.
    pub fn rule_of(&self, kind: ReviewKind, fact_type: FactType, confidence: f32) -> Option<String> {
        if self.all {
            return Some("all".into());
        }
        let by_kind = match kind {
            ReviewKind::Supersession => self.supersession,
            ReviewKind::Retraction => self.retraction,
            ReviewKind::TombstoneLift => self.tombstone_lift,
            ReviewKind::NewFact => false,
        };
        if by_kind {
            return Some(kind.as_str().into());
        }
        if self.fact_types.contains(&fact_type) {
            return Some(format!("fact_type:{}", fact_type.as_str()));
        }
        if self.low_confidence && confidence < self.min_confidence {
            return Some("low_confidence".into());
        }
        None
    }
}

/// The policy of every tenant: a default, and overrides by tenant name.
#[derive(Clone, Debug, Default)]
pub struct ReviewPolicies {
    pub default: ReviewPolicy,
    pub tenants: HashMap<String, ReviewPolicy>,
}

impl ReviewPolicies {
    pub fn for_tenant(&self, tenant: &str) -> &ReviewPolicy {
        self.tenants.get(tenant).unwrap_or(&self.default)
    }
}

/// A pending review with the facts it concerns, as a reviewer sees it.
#[derive(Clone, Debug)]
pub struct ReviewItem {
    pub user: String,
    pub review: Review,
    /// The pending fact (gone only if the scope was erased meanwhile).
    pub fact: Option<Fact>,
    /// The fact a supersession or retraction would retire, as it is now.
    pub target: Option<Fact>,
}

/// A page of the tenant's queue, with its counts.
#[derive(Clone, Debug)]
pub struct TenantQueue {
    pub page: Page<ReviewItem>,
    pub summary: ReviewSummary,
}

/// What a review decision did.
#[derive(Clone, Debug)]
pub struct ReviewOutcome {
    pub review: Review,
    pub decision: Decision,
    /// The review's fact after the decision (active when approved, retracted when rejected).
    pub fact: Fact,
}

/// What a proposing path (consolidation, an explicit write) holds instead of applying.
pub(crate) struct Hold {
    pub kind: ReviewKind,
    pub rule: String,
    pub target_id: Option<String>,
    /// Why the path chose the outcome (the judge's reason, the write's).
    pub reason: String,
    /// `api`, or a consolidation run id.
    pub origin: String,
}

impl Hold {
    /// The changes and decision that hold `fact` (its status set to pending): the fact
    /// itself, its review, and the `HELD_FOR_REVIEW` decision with `decision_id`.
    pub(crate) fn changes(
        self,
        scope: &Scope,
        fact: &mut Fact,
        decision_id: String,
    ) -> (Vec<Change>, Decision) {
        fact.status = FactStatus::Pending;
        let mut targets = Vec::new();
        targets.extend(self.target_id.clone());
        let review = Review {
            id: new_id("rev"),
            kind: self.kind,
            fact_id: fact.id.clone(),
            target_id: self.target_id,
            rule: self.rule.clone(),
            reason: self.reason.clone(),
            decision_id: decision_id.clone(),
            evidence_episode_ids: fact.source_episode_ids.clone(),
            fingerprint: fingerprint(&fact.text),
            origin: self.origin.clone(),
            proposed_by: scope.subject().to_owned(),
            created_at: fact.created_at,
            status: ReviewStatus::Pending,
            resolved_at: None,
            resolved_by: None,
            note: None,
        };
        targets.insert(0, review.id.clone());
        let held = Decision {
            id: decision_id,
            kind: DecisionKind::HeldForReview,
            reason: format!(
                "{} held for review ({}): {}",
                self.kind.as_str(),
                self.rule,
                self.reason
            ),
            fact_id: Some(fact.id.clone()),
            target_ids: targets,
            origin: self.origin,
            created_at: now(),
        };
        (
            vec![Change::InsertFact(fact.clone()), Change::InsertReview(review)],
            held,
        )
    }
}

/// A review whose change no longer applies.
fn stale(message: String) -> Error {
    Error::Conflict {
        code: ErrorCode::ReviewStale,
        message,
    }
}

impl Cairn {
    /// The review policy of the scope's tenant.
    pub(crate) fn review_policy(&self, tenant: &str) -> &ReviewPolicy {
        self.settings.review.for_tenant(tenant)
    }

    /// The scope's pending reviews, oldest first, with their facts.
    pub async fn reviews(&self, scope: &Scope, page: &PageRequest) -> Result<Page<ReviewItem>> {
        let page = self.store.list_reviews(scope, page).await?;
        Ok(Page {
            items: self.review_items(scope, page.items).await?,
            next_cursor: page.next_cursor,
        })
    }

    /// One review of the scope, of any status.
    pub async fn review(&self, scope: &Scope, review_id: &str) -> Result<ReviewItem> {
        let review = self
            .store
            .get_review(scope, review_id)
            .await?
            .ok_or(Error::NotFound { what: "review" })?;
        let mut items = self.review_items(scope, vec![review]).await?;
        items.pop().ok_or(Error::NotFound { what: "review" })
    }

    /// Reviews of one scope with their facts, read together.
    async fn review_items(&self, scope: &Scope, reviews: Vec<Review>) -> Result<Vec<ReviewItem>> {
        let target = |review: &Review| match (review.kind, &review.target_id) {
            (ReviewKind::Supersession | ReviewKind::Retraction, Some(id)) => Some(id.clone()),
            _ => None,
        };
        let mut ids: Vec<String> = Vec::with_capacity(reviews.len() * 2);
        for review in &reviews {
            ids.push(review.fact_id.clone());
            ids.extend(target(review));
        }
        let facts: HashMap<String, Fact> = self
            .store
            .get_facts(scope, &ids)
            .await?
            .into_iter()
            .map(|fact| (fact.id.clone(), fact))
            .collect();
        Ok(reviews
            .into_iter()
            .map(|review| ReviewItem {
                user: scope.user().as_str().to_owned(),
                fact: facts.get(&review.fact_id).cloned(),
                target: target(&review).and_then(|id| facts.get(&id).cloned()),
                review,
            })
            .collect())
    }

    /// The tenant's pending reviews, oldest first, and their counts by kind. Each item's
    /// facts are read in its user's scope, which `scope_of` gives (from the same
    /// credential that produced `tenant`).
    pub async fn tenant_reviews(
        &self,
        tenant: &TenantScope,
        page: &PageRequest,
        scope_of: impl Fn(&str) -> Result<Scope>,
    ) -> Result<TenantQueue> {
        let summary = self.store.review_summary(tenant).await?;
        let listed = self.store.list_tenant_reviews(tenant, page).await?;
        // One read of facts per user on the page, the queue's order kept.
        let mut by_user: Vec<(String, Vec<Review>)> = Vec::new();
        let mut order = Vec::with_capacity(listed.items.len());
        for UserReview { user, review } in listed.items {
            order.push(review.id.clone());
            match by_user.iter_mut().find(|(name, _)| *name == user) {
                Some((_, reviews)) => reviews.push(review),
                None => by_user.push((user, vec![review])),
            }
        }
        let mut found: HashMap<String, ReviewItem> = HashMap::new();
        for (user, reviews) in by_user {
            let scope = scope_of(&user)?;
            for item in self.review_items(&scope, reviews).await? {
                found.insert(item.review.id.clone(), item);
            }
        }
        let items: Vec<ReviewItem> = order.iter().filter_map(|id| found.remove(id)).collect();
        Ok(TenantQueue {
            page: Page {
                items,
                next_cursor: listed.next_cursor,
            },
            summary,
        })
    }

    /// The queue of the scope's tenant: depth by kind and the oldest pending review (for
    /// metrics, after a review is held or decided in the scope).
    /// Every tenant's pending review queue, the deepest `limit` first: for the
    /// operator's metrics alone (it names tenants).
    pub async fn review_queues(&self, limit: usize) -> Result<Vec<cairn_core::TenantQueue>> {
        self.store.review_queues(limit).await
    }

    pub async fn review_summary(&self, scope: &Scope) -> Result<ReviewSummary> {
        #[allow(clippy::disallowed_methods)]
        let tenant = TenantScope::counting_reviews_of(scope);
        self.store.review_summary(&tenant).await
    }

    async fn pending_review(&self, scope: &Scope, review_id: &str) -> Result<(Review, Fact)> {
        let review = self
            .store
            .get_review(scope, review_id)
            .await?
            .ok_or(Error::NotFound { what: "review" })?;
        if review.status != ReviewStatus::Pending {
            return Err(Error::review_resolved(review_id));
        }
        let fact = self
            .store
            .get_fact(scope, &review.fact_id)
            .await?
            .filter(|fact| fact.status == FactStatus::Pending)
            .ok_or_else(|| stale(format!("review {review_id}: its pending fact is gone")))?;
        Ok((review, fact))
    }

    /// Applies a held change: with the same owner checks and preconditions as any write,
    /// in one commit with the review's resolution. When the world moved on (the fact it
    /// replaces was superseded, retracted or forgotten meanwhile, the tombstone lifted,
    /// the evidence erased), the answer is a conflict and nothing changes.
    pub async fn approve_review(
        &self,
        scope: &Scope,
        context: &RequestContext,
        review_id: &str,
    ) -> Result<ReviewOutcome> {
        let (review, mut fact) = self.pending_review(scope, review_id).await?;
        let at = now();
        let mut changes = vec![Change::ResolveReview {
            review_id: review.id.clone(),
            status: ReviewStatus::Approved,
            at,
            by: scope.subject().to_owned(),
            note: None,
        }];
        let mut targets = vec![review.id.clone()];
        match (review.kind, review.target_id.as_deref()) {
            (ReviewKind::NewFact, _) => {}
            (ReviewKind::Supersession | ReviewKind::Retraction, Some(old_id)) => {
                let old =
                    self.store.get_fact(scope, old_id).await?.ok_or_else(|| {
                        stale(format!("fact {old_id} was forgotten since the review was held"))
                    })?;
                if old.status_at(at) != Some(FactStatus::Active) {
                    return Err(stale(format!(
                        "fact {old_id} is {} since the review was held",
                        old.status_at(at).unwrap_or(old.status).as_str()
                    )));
                }
                let contradiction = if review.kind == ReviewKind::Supersession {
                    Contradiction::Natural
                } else {
                    Contradiction::Harsh
                };
                changes.extend(gates::supersede(&old, &fact, at, contradiction));
                targets.push(old.id);
            }
            (ReviewKind::TombstoneLift, Some(tombstone_id)) => {
                changes.push(gates::lift(tombstone_id, at));
                targets.push(tombstone_id.to_owned());
            }
            (kind, None) => {
                return Err(Error::Storage(format!(
                    "review {} of kind {} has no target",
                    review.id,
                    kind.as_str()
                )));
            }
        }
        if !review.evidence_episode_ids.is_empty() {
            changes.push(Change::RequireEpisodes(review.evidence_episode_ids.clone()));
        }
        // A value that became active meanwhile (written again with a supersession) is not
        // made active twice.
        changes.push(Change::RequireNoActiveValue {
            fingerprint: review.fingerprint.clone(),
        });
        changes.push(Change::ActivateFact {
            fact_id: fact.id.clone(),
            at,
        });
        let approved = decision(
            DecisionKind::Approved,
            format!("{} approved by {}", review.kind.as_str(), scope.subject()),
            Some(fact.id.clone()),
            targets.clone(),
        );
        let mut audited = targets;
        audited.insert(1, fact.id.clone());
        let event = audit_event(
            scope,
            context,
            "review.approve",
            audited,
            serde_json::json!({ "kind": review.kind.as_str(), "rule": review.rule }),
        );
        let mut change_set = ChangeSet::new(event).with_decision(approved.clone());
        change_set.changes = changes;
        match self.store.commit(scope, change_set).await {
            Ok(()) => {}
            // What the review would change vanished between the read and the commit.
            Err(Error::NotFound { what }) if what != "review" => {
                return Err(stale(format!("the {what} this review changes is gone")));
            }
            Err(Error::Conflict {
                code: ErrorCode::NotActive,
                message,
            }) => return Err(stale(message)),
            Err(Error::Conflict {
                code: ErrorCode::Duplicate,
                ..
            }) => {
                return Err(stale(
                    "an active fact holds the same value since the review was held".to_owned(),
                ));
            }
            Err(Error::Tombstoned { tombstone_id }) => {
                return Err(stale(format!(
                    "the value matches tombstone {tombstone_id}, retracted or forgotten since the review was held"
                )));
            }
            Err(other) => return Err(other),
        }
        fact.status = FactStatus::Active;
        fact.created_at = at;
        Ok(ReviewOutcome {
            review: Review {
                status: ReviewStatus::Approved,
                resolved_at: Some(at),
                resolved_by: Some(scope.subject().to_owned()),
                ..review
            },
            decision: approved,
            fact,
        })
    }

    /// Drops a held change: its pending fact is retracted, so it is never recalled, and
    /// a consolidation that extracts the same value again takes it for a duplicate of
    /// the rejected one. With `tombstone`, the reviewer says the value was never true: it
    /// is tombstoned like any retraction, and no write brings it back without the user
    /// restating it.
    pub async fn reject_review(
        &self,
        scope: &Scope,
        context: &RequestContext,
        review_id: &str,
        reason: Option<String>,
        tombstone: bool,
    ) -> Result<ReviewOutcome> {
        let reason = reason
            .map(|reason| crate::validate::text("reason", &reason, self.settings.max_text_chars))
            .transpose()?;
        let (review, mut fact) = self.pending_review(scope, review_id).await?;
        let at = now();
        let retraction = match &reason {
            Some(reason) => format!("rejected in review: {reason}"),
            None => "rejected in review".to_owned(),
        };
        let mut change_set = ChangeSet::new(audit_event(
            scope,
            context,
            "review.reject",
            vec![review.id.clone(), fact.id.clone()],
            serde_json::json!({ "kind": review.kind.as_str(), "tombstone": tombstone }),
        ))
        .with(Change::ResolveReview {
            review_id: review.id.clone(),
            status: ReviewStatus::Rejected,
            at,
            by: scope.subject().to_owned(),
            note: reason.clone(),
        })
        .with(gates::retract(&fact, Some(&retraction), at));
        if tombstone {
            change_set = change_set.with(gates::tombstone(&fact, at));
        }
        let rejected = decision(
            DecisionKind::Rejected,
            format!(
                "{} rejected by {}{}{}",
                review.kind.as_str(),
                scope.subject(),
                reason
                    .as_deref()
                    .map(|reason| format!(": {reason}"))
                    .unwrap_or_default(),
                if tombstone {
                    "; the value is tombstoned"
                } else {
                    ""
                }
            ),
            Some(fact.id.clone()),
            vec![review.id.clone()],
        );
        change_set = change_set.with_decision(rejected.clone());
        match self.store.commit(scope, change_set).await {
            Err(Error::NotFound { what }) if what != "review" => {
                return Err(stale(format!("the {what} this review concerns is gone")));
            }
            other => other?,
        }
        fact.status = FactStatus::Retracted;
        fact.retracted_at = Some(at);
        fact.retraction_reason = Some(retraction);
        Ok(ReviewOutcome {
            review: Review {
                status: ReviewStatus::Rejected,
                resolved_at: Some(at),
                resolved_by: Some(scope.subject().to_owned()),
                note: reason,
                ..review
            },
            decision: rejected,
            fact,
        })
    }

    /// A review of the scope, pending or rejected, whose value is `text`'s: consolidation
    /// does not propose a held or rejected value again.
    pub(crate) async fn reviewed_value(&self, scope: &Scope, text: &str) -> Result<Option<Review>> {
        let value = fingerprint(text);
        let mut found = self
            .store
            .held_or_rejected_values(scope, std::slice::from_ref(&value))
            .await?;
        Ok(found.remove(&value))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_policy_reads_its_rules_and_refuses_unknown_ones() {
        let policy = ReviewPolicy::parse(" supersession, fact_type:health ", 0.5);
        assert!(policy.is_err(), "health is not a fact type");
        let policy =
            ReviewPolicy::parse("supersession,fact_type:identity,low_confidence", 0.6).expect("valid");
        assert!(policy.supersession && policy.low_confidence && !policy.all);
        assert_eq!(policy.fact_types, vec![FactType::Identity]);
        assert!(ReviewPolicy::parse("everything", 0.5).is_err());
        assert!(ReviewPolicy::parse("all", 1.5).is_err());
        assert!(!ReviewPolicy::parse("", 0.5).expect("empty").holds_anything());
    }

    #[test]
    fn each_rule_holds_its_outcomes() {
        let mut fact = cairn_store_tests::fact("The user lives in Lisbon", now());
        fact.fact_type = FactType::World;
        fact.confidence = 0.9;
        let supersessions = ReviewPolicy::parse("supersession", 0.5).expect("valid");
        assert_eq!(
            supersessions.rule_for(ReviewKind::Supersession, &fact).as_deref(),
            Some("supersession")
        );
        assert_eq!(supersessions.rule_for(ReviewKind::NewFact, &fact), None);
        let identity = ReviewPolicy::parse("fact_type:identity", 0.5).expect("valid");
        assert_eq!(identity.rule_for(ReviewKind::NewFact, &fact), None);
        fact.fact_type = FactType::Identity;
        assert_eq!(
            identity.rule_for(ReviewKind::NewFact, &fact).as_deref(),
            Some("fact_type:identity")
        );
        let unsure = ReviewPolicy::parse("low_confidence", 0.7).expect("valid");
        assert_eq!(unsure.rule_for(ReviewKind::NewFact, &fact), None);
        fact.confidence = 0.6;
        assert_eq!(
            unsure.rule_for(ReviewKind::NewFact, &fact).as_deref(),
            Some("low_confidence")
        );
        let everything = ReviewPolicy::parse("all", 0.5).expect("valid");
        for kind in ReviewKind::ALL {
            assert_eq!(everything.rule_for(kind, &fact).as_deref(), Some("all"));
        }
        assert_eq!(
            ReviewPolicy::default().rule_for(ReviewKind::Retraction, &fact),
            None
        );
    }
}
