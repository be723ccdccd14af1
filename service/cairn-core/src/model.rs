//! Memory records of the three tiers and the records kept about them.
//!
//! Two clocks run through these types: `created_at` / `superseded_at` / `retracted_at`
//! say when Cairn learned or retired something; `valid_from` / `valid_to` say when it
//! was true in the world, and are set only when the user dated it.

use crate::error::{Error, Result};
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

/// What kind of statement a fact is. Identity, preference and constraint facts are
/// lasting; world and event facts are dynamic.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum FactType {
    Identity,
    Preference,
    Constraint,
    World,
    Event,
}

impl FactType {
    pub const ALL: [FactType; 5] = [
        FactType::Identity,
        FactType::Preference,
        FactType::Constraint,
        FactType::World,
        FactType::Event,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            FactType::Identity => "identity",
            FactType::Preference => "preference",
            FactType::Constraint => "constraint",
            FactType::World => "world",
            FactType::Event => "event",
        }
    }

    pub fn parse(value: &str) -> Result<Self> {
        FactType::ALL
            .into_iter()
            .find(|kind| kind.as_str() == value)
            .ok_or_else(|| {
                Error::invalid(
                    "fact_type",
                    "must be one of identity, preference, constraint, world, event",
                )
            })
    }

    /// Lasting facts describe who the user is; they form the static part of a profile.
    pub fn is_lasting(self) -> bool {
        matches!(
            self,
            FactType::Identity | FactType::Preference | FactType::Constraint
        )
    }
}

/// The life-cycle state of a fact.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum FactStatus {
    /// Believed true now.
    Active,
    /// Was true, stopped being true; kept as history.
    Superseded,
    /// Was never true; never recounted.
    Retracted,
    /// Time-bound and past its expiry.
    Expired,
    /// Erased. Stores never return a forgotten record; the status exists for the audit.
    Forgotten,
    /// Held for a person's review (see [`Review`]): not recalled unless asked for, and
    /// changing nothing until approved.
    Pending,
}

impl FactStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            FactStatus::Active => "active",
            FactStatus::Superseded => "superseded",
            FactStatus::Retracted => "retracted",
            FactStatus::Expired => "expired",
            FactStatus::Forgotten => "forgotten",
            FactStatus::Pending => "pending",
        }
    }

    pub fn parse(value: &str) -> Result<Self> {
        match value {
            "active" => Ok(FactStatus::Active),
            "superseded" => Ok(FactStatus::Superseded),
            "retracted" => Ok(FactStatus::Retracted),
            "expired" => Ok(FactStatus::Expired),
            "forgotten" => Ok(FactStatus::Forgotten),
            "pending" => Ok(FactStatus::Pending),
            _ => Err(Error::invalid(
                "status",
                "must be one of active, superseded, retracted, expired, pending, all",
            )),
        }
    }
}

/// One message or event the user produced: the evidence facts are distilled from.
#[derive(Clone, Debug, PartialEq)]
pub struct Episode {
    pub id: String,
    pub session_id: Option<String>,
    pub text: String,
    /// When the user said it (the message timestamp, or the ingest time without one).
    pub occurred_at: DateTime<Utc>,
    pub ingested_at: DateTime<Utc>,
    pub embedding: Option<Vec<f32>>,
}

/// One short, self-contained statement about the user or their world.
#[derive(Clone, Debug, PartialEq)]
pub struct Fact {
    pub id: String,
    pub fact_type: FactType,
    pub text: String,
    pub confidence: f32,
    /// The stored state; [`Fact::status_at`] derives expiry and history from the clocks.
    pub status: FactStatus,
    pub source_episode_ids: Vec<String>,
    pub source_span: Option<String>,
    pub created_at: DateTime<Utc>,
    pub superseded_at: Option<DateTime<Utc>>,
    pub superseded_by: Option<String>,
    pub retracted_at: Option<DateTime<Utc>>,
    pub retraction_reason: Option<String>,
    pub valid_from: Option<DateTime<Utc>>,
    pub valid_to: Option<DateTime<Utc>>,
    pub expires_at: Option<DateTime<Utc>>,
    pub last_used_at: Option<DateTime<Utc>>,
    pub use_count: u64,
    pub embedding: Option<Vec<f32>>,
}

impl Fact {
    /// A fact as it is first stored: active, never used, superseded or retracted, and
    /// without evidence, event time, expiry or vector (struct update syntax adds those).
    pub fn new_active(
        id: String,
        fact_type: FactType,
        text: String,
        confidence: f32,
        created_at: DateTime<Utc>,
    ) -> Fact {
        Fact {
            id,
            fact_type,
            text,
            confidence,
            status: FactStatus::Active,
            source_episode_ids: Vec::new(),
            source_span: None,
            created_at,
            superseded_at: None,
            superseded_by: None,
            retracted_at: None,
            retraction_reason: None,
            valid_from: None,
            valid_to: None,
            expires_at: None,
            last_used_at: None,
            use_count: 0,
            embedding: None,
        }
    }

    /// The status this fact had at `as_of`, on both clocks: a fact superseded after
    /// `as_of` was still active then, and an active fact past its expiry is expired.
    /// `None` means Cairn had not learned it yet at `as_of`.
    pub fn status_at(&self, as_of: DateTime<Utc>) -> Option<FactStatus> {
        if self.created_at > as_of {
            return None;
        }
        match self.status {
            FactStatus::Retracted | FactStatus::Forgotten | FactStatus::Pending => Some(self.status),
            FactStatus::Superseded if self.superseded_at.is_some_and(|at| at <= as_of) => {
                Some(FactStatus::Superseded)
            }
            FactStatus::Active | FactStatus::Superseded | FactStatus::Expired => {
                if self.expires_at.is_some_and(|at| at <= as_of) {
                    Some(FactStatus::Expired)
                } else {
                    Some(FactStatus::Active)
                }
            }
        }
    }

    /// Whether the fact held in the world at `as_of`, by its validity interval.
    pub fn valid_at(&self, as_of: DateTime<Utc>) -> bool {
        self.valid_from.is_none_or(|from| from <= as_of) && self.valid_to.is_none_or(|to| to > as_of)
    }
}

/// A reusable procedure; new versions replace it, nothing is edited in place.
#[derive(Clone, Debug, PartialEq)]
pub struct Playbook {
    pub id: String,
    pub name: String,
    pub trigger: String,
    pub steps: Vec<String>,
    pub version: u32,
    pub success_count: u64,
    pub failure_count: u64,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
    pub last_used_at: Option<DateTime<Utc>>,
    pub use_count: u64,
    pub embedding: Option<Vec<f32>>,
}

impl Playbook {
    /// The text indexed and shown for this playbook: name, trigger and steps.
    pub fn searchable_text(&self) -> String {
        let mut text = format!("{}. When: {}.", self.name, self.trigger);
        for (index, step) in self.steps.iter().enumerate() {
            text.push_str(&format!(" {}. {}", index + 1, step));
        }
        text
    }
}

/// How a new fact relates to an existing one.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum EdgeKind {
    /// The new fact retires the old one.
    Updates,
    /// Both stay current; the new one adds detail.
    Extends,
}

impl EdgeKind {
    pub fn as_str(self) -> &'static str {
        match self {
            EdgeKind::Updates => "UPDATES",
            EdgeKind::Extends => "EXTENDS",
        }
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct Edge {
    pub from_fact_id: String,
    pub to_fact_id: String,
    pub kind: EdgeKind,
    pub created_at: DateTime<Utc>,
}

/// A fingerprint of a retracted or forgotten value, so writes cannot bring it back.
#[derive(Clone, Debug, PartialEq)]
pub struct Tombstone {
    pub id: String,
    /// `sha256:` of the normalized text (see [`crate::text::fingerprint`]).
    pub fingerprint: String,
    pub fact_id: String,
    pub reason: TombstoneReason,
    pub created_at: DateTime<Utc>,
    pub lifted_at: Option<DateTime<Utc>>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum TombstoneReason {
    Retracted,
    Forgotten,
}

impl TombstoneReason {
    pub fn as_str(self) -> &'static str {
        match self {
            TombstoneReason::Retracted => "retracted",
            TombstoneReason::Forgotten => "forgotten",
        }
    }
}

/// The outcome of one write or consolidation decision.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum DecisionKind {
    New,
    Updates,
    Extends,
    Duplicate,
    DroppedUngrounded,
    BlockedByTombstone,
    TombstoneLifted,
    Retracted,
    Forgotten,
    Refused,
    // An outcome the review policy holds: its change waits for a person.
    HeldForReview,
    // A reviewer applied a held change.
    Approved,
    // A reviewer dropped a held change.
    Rejected,
}

impl DecisionKind {
    pub const ALL: [DecisionKind; 13] = [
        DecisionKind::New,
        DecisionKind::Updates,
        DecisionKind::Extends,
        DecisionKind::Duplicate,
        DecisionKind::DroppedUngrounded,
        DecisionKind::BlockedByTombstone,
        DecisionKind::TombstoneLifted,
        DecisionKind::Retracted,
        DecisionKind::Forgotten,
        DecisionKind::Refused,
        DecisionKind::HeldForReview,
        DecisionKind::Approved,
        DecisionKind::Rejected,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            DecisionKind::New => "NEW",
            DecisionKind::Updates => "UPDATES",
            DecisionKind::Extends => "EXTENDS",
            DecisionKind::Duplicate => "DUPLICATE",
            DecisionKind::DroppedUngrounded => "DROPPED_UNGROUNDED",
            DecisionKind::BlockedByTombstone => "BLOCKED_BY_TOMBSTONE",
            DecisionKind::TombstoneLifted => "TOMBSTONE_LIFTED",
            DecisionKind::Retracted => "RETRACTED",
            DecisionKind::Forgotten => "FORGOTTEN",
            DecisionKind::Refused => "REFUSED",
            DecisionKind::HeldForReview => "HELD_FOR_REVIEW",
            DecisionKind::Approved => "APPROVED",
            DecisionKind::Rejected => "REJECTED",
        }
    }

    pub fn parse(value: &str) -> Option<Self> {
        DecisionKind::ALL.into_iter().find(|kind| kind.as_str() == value)
    }

    /// The gate of the write path that takes decisions of this kind: `validation`
    /// (malformed or out-of-bounds candidates), `grounding`, `tombstones`, `dedup`,
    /// `judge` (new, updating or extending), `request` (an owner's retraction or
    /// erasure), or `review` (held for a person, and that person's decision).
    pub fn gate(self) -> &'static str {
        match self {
            DecisionKind::Refused => "validation",
            DecisionKind::DroppedUngrounded => "grounding",
            DecisionKind::BlockedByTombstone | DecisionKind::TombstoneLifted => "tombstones",
            DecisionKind::Duplicate => "dedup",
            DecisionKind::New | DecisionKind::Updates | DecisionKind::Extends => "judge",
            DecisionKind::Retracted | DecisionKind::Forgotten => "request",
            DecisionKind::HeldForReview | DecisionKind::Approved | DecisionKind::Rejected => "review",
        }
    }
}

/// One record per write decision, with the reason it was taken.
#[derive(Clone, Debug, PartialEq)]
pub struct Decision {
    pub id: String,
    pub kind: DecisionKind,
    pub reason: String,
    /// The fact the decision produced or kept, when there is one.
    pub fact_id: Option<String>,
    /// Existing records the decision refers to (the superseded fact, the duplicate, ...).
    pub target_ids: Vec<String>,
    /// Which path took it: `api` for explicit writes, a consolidation run id otherwise.
    pub origin: String,
    pub created_at: DateTime<Utc>,
}

/// One append-only record per mutation. It holds ids and hashes, never content.
#[derive(Clone, Debug, PartialEq)]
pub struct AuditEvent {
    pub id: String,
    pub at: DateTime<Utc>,
    pub subject: String,
    pub tenant: String,
    pub user: String,
    pub action: String,
    pub target_ids: Vec<String>,
    pub request_id: String,
    /// Small structured detail (counts, a content hash); never record text.
    pub detail: serde_json::Value,
}

/// A pending consolidation of one scope, kept in the store so it survives a restart.
/// It carries the assistant text sent with the episodes: transient context for
/// extraction, deleted with the job, never evidence.
#[derive(Clone, Debug, PartialEq)]
pub struct ConsolidationJob {
    pub id: String,
    /// The token subject whose ingest enqueued it (for the audit trail of the run).
    pub subject: String,
    pub request_id: String,
    pub assistant_context: Vec<String>,
    pub created_at: DateTime<Utc>,
    /// Not claimed before this time (retry backoff).
    pub run_after: DateTime<Utc>,
    pub attempts: u32,
    pub last_error: Option<String>,
    /// Set when the job failed too often to be retried by itself (dead-lettered): it is
    /// not claimed again until retried.
    pub dead_at: Option<DateTime<Utc>>,
}

/// An episode with its position in the scope's ingest order (what a watermark counts).
#[derive(Clone, Debug, PartialEq)]
pub struct LoggedEpisode {
    pub position: u64,
    pub episode: Episode,
}

/// What a held outcome would change when approved.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize, schemars::JsonSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum ReviewKind {
    // A new fact (held for its confidence, its type, or by a policy holding everything).
    NewFact,
    // A new fact that supersedes a current one, which stays current until approval.
    Supersession,
    // A new fact whose value says the current one was never true: approval retracts
    // and tombstones the old one.
    Retraction,
    // A new fact restating a retracted or forgotten value: approval lifts its tombstone.
    TombstoneLift,
}

impl ReviewKind {
    pub const ALL: [ReviewKind; 4] = [
        ReviewKind::NewFact,
        ReviewKind::Supersession,
        ReviewKind::Retraction,
        ReviewKind::TombstoneLift,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            ReviewKind::NewFact => "new_fact",
            ReviewKind::Supersession => "supersession",
            ReviewKind::Retraction => "retraction",
            ReviewKind::TombstoneLift => "tombstone_lift",
        }
    }

    pub fn parse(value: &str) -> Option<Self> {
        ReviewKind::ALL.into_iter().find(|kind| kind.as_str() == value)
    }
}

/// Where a review stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum ReviewStatus {
    Pending,
    Approved,
    Rejected,
}

impl ReviewStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            ReviewStatus::Pending => "pending",
            ReviewStatus::Approved => "approved",
            ReviewStatus::Rejected => "rejected",
        }
    }

    pub fn parse(value: &str) -> Option<Self> {
        [
            ReviewStatus::Pending,
            ReviewStatus::Approved,
            ReviewStatus::Rejected,
        ]
        .into_iter()
        .find(|status| status.as_str() == value)
    }
}

/// An outcome held for a person's decision: the pending fact it would make current,
/// what else it would change, and the decision that proposed it.
#[derive(Clone, Debug, PartialEq)]
pub struct Review {
    pub id: String,
    pub kind: ReviewKind,
    /// The pending fact (status [`FactStatus::Pending`]) approval makes active.
    pub fact_id: String,
    /// The fact a supersession or retraction retires, or the tombstone a lift lifts.
    pub target_id: Option<String>,
    /// The policy rule that held it (`supersession`, `low_confidence`, `fact_type:health`, `all`…).
    pub rule: String,
    /// Why the proposing path chose this outcome (the judge's reason, for instance).
    pub reason: String,
    /// The `HELD_FOR_REVIEW` decision.
    pub decision_id: String,
    /// The episodes the change rests on.
    pub evidence_episode_ids: Vec<String>,
    /// `sha256:` of the pending fact's normalized text, so a rejected value is known again.
    pub fingerprint: String,
    /// Which path proposed it: `api`, or a consolidation run id.
    pub origin: String,
    /// The token subject that proposed it.
    pub proposed_by: String,
    pub created_at: DateTime<Utc>,
    pub status: ReviewStatus,
    pub resolved_at: Option<DateTime<Utc>>,
    pub resolved_by: Option<String>,
    /// The reviewer's reason, when one was given.
    pub note: Option<String>,
}
