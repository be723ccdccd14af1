"""Typed models of Cairn's responses, read from JSON by their field names (which are
the API's); fields a newer server adds are ignored."""

from __future__ import annotations

import dataclasses
import sys
import typing
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Dict, List, Optional, Type, TypeVar, Union

T = TypeVar("T")


def _parse_time(value: str) -> datetime:
    if value.endswith("Z"):
        value = value[:-1] + "+00:00"
    # Python before 3.11 reads at most six fractional digits, which Cairn never exceeds.
    return datetime.fromisoformat(value)


def _convert(kind: Any, value: Any) -> Any:
    if value is None:
        return None
    origin = typing.get_origin(kind)
    if origin is Union:
        options = [option for option in typing.get_args(kind) if option is not type(None)]
        return _convert(options[0], value) if len(options) == 1 else value
    if origin in (list, List):
        (item,) = typing.get_args(kind)
        return [_convert(item, entry) for entry in value]
    if kind is datetime:
        return _parse_time(value)
    if dataclasses.is_dataclass(kind) and isinstance(kind, type):
        return from_dict(kind, value)
    return value


def from_dict(cls: Type[T], data: Dict[str, Any]) -> T:
    """Builds a model from its JSON object."""
    hints = typing.get_type_hints(cls, vars(sys.modules[cls.__module__]))
    values = {}
    for item in dataclasses.fields(cls):  # type: ignore[arg-type]
        if item.name in data:
            values[item.name] = _convert(hints[item.name], data[item.name])
    return cls(**values)


@dataclass
class Fact:
    id: str
    text: str
    fact_type: str
    confidence: float
    status: str
    created_at: datetime
    source_episode_ids: List[str] = field(default_factory=list)
    source_span: Optional[str] = None
    superseded_at: Optional[datetime] = None
    superseded_by: Optional[str] = None
    retracted_at: Optional[datetime] = None
    retraction_reason: Optional[str] = None
    valid_from: Optional[datetime] = None
    valid_to: Optional[datetime] = None
    expires_at: Optional[datetime] = None
    last_used_at: Optional[datetime] = None
    use_count: int = 0


@dataclass
class Decision:
    id: str
    kind: str
    reason: str
    origin: str
    created_at: datetime
    gate: str = ""
    fact_id: Optional[str] = None
    target_ids: List[str] = field(default_factory=list)


@dataclass
class FactWrite:
    """A fact write: the fact (new, or the active one that already held the value), the
    gate's decision, and whether a fact was created."""

    fact: Fact
    decision: Decision
    created: bool


@dataclass
class Episode:
    id: str
    text: str
    occurred_at: datetime
    ingested_at: datetime
    session_id: Optional[str] = None


@dataclass
class Playbook:
    id: str
    name: str
    trigger: str
    steps: List[str]
    version: int
    success_count: int
    failure_count: int
    created_at: datetime
    updated_at: datetime
    last_used_at: Optional[datetime] = None
    use_count: int = 0


@dataclass
class Explanation:
    fused_score: float
    prior: float
    name_boost: float = 1.0
    time_boost: float = 1.0
    bm25_rank: Optional[int] = None
    bm25_score: Optional[float] = None
    knn_rank: Optional[int] = None
    knn_similarity: Optional[float] = None
    rerank_score: Optional[float] = None
    possibly_outdated_by: Optional[str] = None


@dataclass
class RecallHit:
    """One recalled memory. Tier-specific fields are set for their tier only."""

    id: str
    tier: str
    text: str
    score: float
    status: str
    explain: Optional[Explanation] = None
    # semantic
    fact_type: Optional[str] = None
    confidence: Optional[float] = None
    created_at: Optional[datetime] = None
    superseded_by: Optional[str] = None
    valid_from: Optional[datetime] = None
    valid_to: Optional[datetime] = None
    expires_at: Optional[datetime] = None
    # episodic
    session_id: Optional[str] = None
    occurred_at: Optional[datetime] = None
    # procedural
    name: Optional[str] = None
    trigger: Optional[str] = None
    steps: Optional[List[str]] = None
    version: Optional[int] = None


@dataclass
class RecallResult:
    hits: List[RecallHit]
    as_of: datetime


@dataclass
class EntityGroup:
    """The profile's facts about one entity."""

    id: str
    name: str
    kind: str
    fact_ids: List[str]


@dataclass
class EntitySummary:
    """A person, pet, place or organisation the user's facts name."""

    id: str
    name: str
    kind: str
    aliases: List[str]
    facts: int
    history: int


@dataclass
class Entity:
    """An entity's card: its current facts and their history."""

    id: str
    name: str
    kind: str
    aliases: List[str]
    facts: List[Fact]
    history: List[Fact]


@dataclass
class Answer:
    """An answer from memory alone: `known` is False, with no answer and no citations,
    when the memories do not support one."""

    answer: str
    known: bool
    citations: List[str]


@dataclass
class Profile:
    static: List[Fact]
    dynamic: List[Fact]
    entities: List[EntityGroup]
    hits: List[RecallHit]
    context: str


@dataclass
class ModelUsage:
    llm_calls: int
    input_tokens: int
    output_tokens: int
    cost_usd: float


@dataclass
class TokenBudget:
    tokens_per_day: int
    used_today: int
    resets_at: datetime


@dataclass
class Consolidation:
    run_id: str
    dry_run: bool
    episodes_read: int
    watermark: int
    extractor: str
    judge: str
    decisions: List[Decision]
    facts_created: List[Fact]
    playbooks_created: int
    usage: ModelUsage
    deferred_until: Optional[datetime] = None
    token_budget: Optional[TokenBudget] = None


@dataclass
class IngestConsolidation:
    requested: str
    ran: bool
    queued: bool
    job_id: Optional[str] = None
    run: Optional[Consolidation] = None
    error: Optional[str] = None


@dataclass
class IngestResult:
    episode_ids: List[str]
    consolidation: IngestConsolidation


@dataclass
class Tombstone:
    """A retracted or forgotten value, refused from then on (the value itself is not kept here)."""

    id: str
    fact_id: str
    reason: str
    created_at: datetime


@dataclass
class Job:
    id: str
    state: str
    created_at: datetime
    run_after: datetime
    attempts: int
    last_error: Optional[str] = None
    dead_at: Optional[datetime] = None


@dataclass
class AuditEvent:
    id: str
    at: datetime
    subject: str
    tenant: str
    user: str
    action: str
    request_id: str
    target_ids: List[str] = field(default_factory=list)
    detail: Any = None


@dataclass
class UserSummary:
    user: str
    episodes: int
    facts: int
    active_facts: int
    playbooks: int
    last_activity: Optional[datetime] = None


@dataclass
class ErasedCounts:
    episodes: int
    facts: int
    playbooks: int
    playbook_versions: int
    edges: int
    tombstones: int
    decisions: int
    jobs: int
    reviews: int = 0


@dataclass
class ErasureReceipt:
    deleted: ErasedCounts


@dataclass
class ImportResult:
    """What an import wrote: per kind for a Cairn export; created, duplicates and
    tombstoned for a mem0 document."""

    format: str
    imported: Dict[str, int]


@dataclass
class Review:
    """An outcome held for a person's review: the pending fact approval makes current,
    the fact it would retire (`target`), and why it waits (`rule`, `reason`)."""

    id: str
    user: str
    kind: str
    status: str
    rule: str
    reason: str
    decision_id: str
    origin: str
    proposed_by: str
    created_at: datetime
    evidence_episode_ids: List[str] = field(default_factory=list)
    fact: Optional[Fact] = None
    target_id: Optional[str] = None
    target: Optional[Fact] = None
    resolved_at: Optional[datetime] = None
    resolved_by: Optional[str] = None
    note: Optional[str] = None


@dataclass
class ReviewCounts:
    """A tenant's pending reviews by kind, and when the oldest was held."""

    total: int
    new_fact: int
    supersession: int
    retraction: int
    tombstone_lift: int
    oldest: Optional[datetime] = None


@dataclass
class ReviewDecision:
    """An approval or rejection: the review, its fact after it, the decision logged."""

    review: Review
    fact: Fact
    decision: Decision
