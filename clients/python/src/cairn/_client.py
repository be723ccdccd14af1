"""The clients: `Cairn` (blocking) and `AsyncCairn` (asyncio), over httpx. Both expose
the same methods, declared once in `_Endpoints`; the async client's return awaitables
(and async iterators for lists)."""

from __future__ import annotations

import asyncio
import email.utils
import os
import time
from datetime import datetime, timezone
from typing import Any, AsyncIterator, Dict, Iterable, Iterator, List, Mapping, Optional, Sequence, Type, TypeVar, Union
from urllib.parse import quote

import httpx

from . import _models as models
from ._errors import ConnectionFailed, error_for

__all__ = ["Cairn", "AsyncCairn", "DEFAULT_URL"]

T = TypeVar("T")
DEFAULT_URL = "http://127.0.0.1:8080"
RETRIED = (429, 503)
Message = Union[Mapping[str, Any], Sequence[str]]


def _segment(value: str) -> str:
    return quote(value, safe="")


def _time(value: Optional[Union[datetime, str]]) -> Optional[str]:
    if value is None or isinstance(value, str):
        return value
    if value.tzinfo is None:
        value = value.replace(tzinfo=timezone.utc)
    return value.isoformat()


def _clean(values: Mapping[str, Any]) -> Dict[str, Any]:
    """Drops unset (None) fields: the server applies its defaults."""
    return {key: value for key, value in values.items() if value is not None}


def _message(message: Message) -> Dict[str, Any]:
    """A message as `{"role", "content"[, "timestamp"]}`, or a `(role, content)` pair."""
    if isinstance(message, Mapping):
        result = dict(message)
        if "timestamp" in result:
            result["timestamp"] = _time(result["timestamp"])
        return result
    role, content = message
    return {"role": role, "content": content}


def _retry_after(header: Optional[str]) -> Optional[float]:
    """`Retry-After` in seconds, from delta-seconds or an HTTP date."""
    if not header:
        return None
    try:
        return max(0.0, float(header))
    except ValueError:
        pass
    try:
        moment = email.utils.parsedate_to_datetime(header)
    except (TypeError, ValueError):
        return None
    return max(0.0, (moment - datetime.now(timezone.utc)).total_seconds())


class _Policy:
    """Authentication, timeouts and the retry rule shared by both clients."""

    def __init__(self, base_url: Optional[str], token: Optional[str], max_retries: int, max_retry_wait: float):
        self.base_url = (base_url or os.environ.get("CAIRN_URL") or DEFAULT_URL).rstrip("/")
        self.token = token if token is not None else os.environ.get("CAIRN_TOKEN")
        self.max_retries = max_retries
        self.max_retry_wait = max_retry_wait

    def headers(self) -> Dict[str, str]:
        headers = {"accept": "application/json", "user-agent": "cairn-python/0.1.0"}
        if self.token:
            headers["authorization"] = f"Bearer {self.token}"
        return headers

    def delay(self, attempt: int, response: httpx.Response) -> Optional[float]:
        """How long to wait before retrying `response`, or None to give up."""
        if response.status_code not in RETRIED or attempt >= self.max_retries:
            return None
        wait = _retry_after(response.headers.get("retry-after"))
        if wait is None:
            wait = min(0.25 * (2**attempt), 8.0)
        return min(wait, self.max_retry_wait)

    @staticmethod
    def result(response: httpx.Response) -> Any:
        try:
            body = response.json() if response.content else None
        except ValueError:
            body = response.text
        if response.status_code >= 400:
            raise error_for(response.status_code, body, response.headers.get("x-request-id"),
                            _retry_after(response.headers.get("retry-after")))
        return body


class _Endpoints:
    """Every route of the API, declared once."""

    def _send(self, method: str, path: str, *, json: Any = None, params: Optional[Mapping[str, Any]] = None,
              model: Optional[Type[Any]] = None) -> Any:
        raise NotImplementedError

    def _paginate(self, path: str, params: Mapping[str, Any], model: Type[Any], page_size: int) -> Any:
        raise NotImplementedError

    @staticmethod
    def _user(user: str) -> str:
        return f"/v1/users/{_segment(user)}"

    # Episodes
    def ingest(self, user: str, messages: Iterable[Message], *, session_id: Optional[str] = None,
               consolidate: Optional[str] = None) -> models.IngestResult:
        """Stores the user's messages as episodes (assistant messages are context for
        extraction only). `consolidate`: "async" (default), "sync" or "none"."""
        body = _clean({"messages": [_message(message) for message in messages], "session_id": session_id,
                       "consolidate": consolidate})
        return self._send("POST", f"{self._user(user)}/episodes", json=body, model=models.IngestResult)

    def episodes(self, user: str, *, session_id: Optional[str] = None, page_size: int = 50) -> Iterator[models.Episode]:
        """Every episode of the user (of one session when given), newest first, a page at a time."""
        return self._paginate(f"{self._user(user)}/episodes", {"session_id": session_id}, models.Episode, page_size)

    def get_episode(self, user: str, episode_id: str) -> models.Episode:
        return self._send("GET", f"{self._user(user)}/episodes/{_segment(episode_id)}", model=models.Episode)

    # Facts
    def write_fact(self, user: str, text: str, *, fact_type: Optional[str] = None,
                   confidence: Optional[float] = None, supersedes: Optional[str] = None,
                   contradiction: Optional[str] = None, valid_from: Optional[Union[datetime, str]] = None,
                   valid_to: Optional[Union[datetime, str]] = None, expires_at: Optional[Union[datetime, str]] = None,
                   reassert: Optional[bool] = None, evidence_episode_id: Optional[str] = None) -> models.FactWrite:
        """Writes a fact through the gates (tombstones, duplicates, supersession)."""
        body = _clean({"text": text, "fact_type": fact_type, "confidence": confidence, "supersedes": supersedes,
                       "contradiction": contradiction, "valid_from": _time(valid_from), "valid_to": _time(valid_to),
                       "expires_at": _time(expires_at), "reassert": reassert,
                       "evidence_episode_id": evidence_episode_id})
        return self._send("POST", f"{self._user(user)}/facts", json=body, model=models.FactWrite)

    def facts(self, user: str, *, status: Optional[str] = None, as_of: Optional[Union[datetime, str]] = None,
              page_size: int = 50) -> Iterator[models.Fact]:
        """The user's facts with a status at `as_of` (default active), a page at a time."""
        return self._paginate(f"{self._user(user)}/facts", {"status": status, "as_of": _time(as_of)}, models.Fact,
                              page_size)

    def get_fact(self, user: str, fact_id: str) -> models.Fact:
        return self._send("GET", f"{self._user(user)}/facts/{_segment(fact_id)}", model=models.Fact)

    def fact_history(self, user: str, fact_id: str) -> List[models.Fact]:
        """The fact's supersession history, oldest first: what it replaced, itself, what replaced it."""
        return self._send("GET", f"{self._user(user)}/facts/{_segment(fact_id)}/history", model=_FactList)

    def entities(self, user: str) -> List[models.EntitySummary]:
        """The people, pets, places and organisations the user's facts name, most mentioned first."""
        return self._send("GET", f"{self._user(user)}/entities", model=_EntitySummaryList)

    def entity(self, user: str, name: str) -> models.Entity:
        """One entity's card, by id or name ("Anna", "my sister"): its facts and their history."""
        return self._send("GET", f"{self._user(user)}/entities/{_segment(name)}", model=models.Entity)

    def tombstones(self, user: str) -> List[models.Tombstone]:
        """Values retracted or forgotten and refused from then on, newest first."""
        return self._send("GET", f"{self._user(user)}/tombstones", model=_TombstoneList)

    def retract_fact(self, user: str, fact_id: str, *, reason: Optional[str] = None) -> models.Fact:
        """Retracts a fact that was never true; its value is refused from then on."""
        return self._send("POST", f"{self._user(user)}/facts/{_segment(fact_id)}/retract",
                          json=_clean({"reason": reason}), model=_FactEnvelope)

    def forget_fact(self, user: str, fact_id: str) -> str:
        """Erases a fact; its value cannot come back unless the user restates it."""
        return self._send("DELETE", f"{self._user(user)}/facts/{_segment(fact_id)}", model=_Forgotten)

    # Playbooks
    def create_playbook(self, user: str, name: str, trigger: str, steps: Sequence[str]) -> models.Playbook:
        body = {"name": name, "trigger": trigger, "steps": list(steps)}
        return self._send("POST", f"{self._user(user)}/playbooks", json=body, model=_PlaybookEnvelope)

    def playbooks(self, user: str, *, page_size: int = 50) -> Iterator[models.Playbook]:
        return self._paginate(f"{self._user(user)}/playbooks", {}, models.Playbook, page_size)

    def get_playbook(self, user: str, playbook_id: str) -> models.Playbook:
        return self._send("GET", f"{self._user(user)}/playbooks/{_segment(playbook_id)}", model=models.Playbook)

    def playbook_versions(self, user: str, playbook_id: str) -> List[models.Playbook]:
        return self._send("GET", f"{self._user(user)}/playbooks/{_segment(playbook_id)}/versions",
                          model=_PlaybookVersions)

    def add_playbook_version(self, user: str, playbook_id: str, steps: Sequence[str], *, name: Optional[str] = None,
                             trigger: Optional[str] = None, base_version: Optional[int] = None) -> models.Playbook:
        """A new version; with `base_version`, a ConflictError when another came first."""
        body = _clean({"steps": list(steps), "name": name, "trigger": trigger, "base_version": base_version})
        return self._send("POST", f"{self._user(user)}/playbooks/{_segment(playbook_id)}/versions", json=body,
                          model=_PlaybookEnvelope)

    def record_outcome(self, user: str, playbook_id: str, success: bool) -> models.Playbook:
        return self._send("POST", f"{self._user(user)}/playbooks/{_segment(playbook_id)}/outcome",
                          json={"success": success}, model=_PlaybookEnvelope)

    # Recall
    def recall(self, user: str, query: str, *, k: Optional[int] = None, tiers: Optional[Sequence[str]] = None,
               as_of: Optional[Union[datetime, str]] = None, include_history: Optional[bool] = None,
               explain: Optional[bool] = None, fact_types: Optional[Sequence[str]] = None,
               session_id: Optional[str] = None,
               valid_at: Optional[Union[datetime, str]] = None, entity: Optional[str] = None,
               include_pending: Optional[bool] = None) -> models.RecallResult:
        """The memories most relevant to `query`, best first: current at `as_of` (what Cairn
        believed then), or that held in the world at `valid_at` (event time);
        `include_pending` adds facts held for review, marked pending."""
        body = _clean({"query": query, "k": k, "tiers": list(tiers) if tiers else None, "as_of": _time(as_of),
                       "valid_at": _time(valid_at), "entity": entity,
                       "include_history": include_history, "include_pending": include_pending, "explain": explain,
                       "fact_types": list(fact_types) if fact_types else None, "session_id": session_id})
        return self._send("POST", f"{self._user(user)}/recall", json=body, model=models.RecallResult)

    def answer(self, user: str, query: str, *, as_of: Optional[Union[datetime, str]] = None) -> models.Answer:
        """Answers `query` from memory alone, citing memory ids, or `known=False`."""
        body = _clean({"query": query, "as_of": _time(as_of)})
        return self._send("POST", f"{self._user(user)}/answer", json=body, model=models.Answer)

    def profile(self, user: str, *, query: Optional[str] = None, k: Optional[int] = None,
                as_of: Optional[Union[datetime, str]] = None, max_tokens: Optional[int] = None) -> models.Profile:
        """Lasting and recent facts, optional recall hits, and a context block for a prompt."""
        params = _clean({"query": query, "k": k, "as_of": _time(as_of), "max_tokens": max_tokens})
        return self._send("GET", f"{self._user(user)}/profile", params=params, model=models.Profile)

    # Consolidation
    def consolidate(self, user: str, *, dry_run: bool = False, from_start: bool = False) -> models.Consolidation:
        body = {"dry_run": dry_run, "from_start": from_start}
        return self._send("POST", f"{self._user(user)}/consolidate", json=body, model=models.Consolidation)

    def decisions(self, user: str, *, kind: Optional[str] = None, page_size: int = 50) -> Iterator[models.Decision]:
        """The decision log, newest first; `kind` (e.g. "UPDATES") keeps one kind."""
        return self._paginate(f"{self._user(user)}/decisions", {"kind": kind}, models.Decision, page_size)

    def jobs(self, user: str) -> List[models.Job]:
        return self._send("GET", f"{self._user(user)}/jobs", model=_JobList)

    def retry_job(self, user: str, job_id: str) -> models.Job:
        return self._send("POST", f"{self._user(user)}/jobs/{_segment(job_id)}/retry", model=_JobEnvelope)

    # Review (memory:review)
    def reviews(self, user: str, *, page_size: int = 50) -> Iterator[models.Review]:
        """The user's outcomes held for review, oldest first."""
        return self._paginate(f"{self._user(user)}/reviews", {}, models.Review, page_size)

    def tenant_reviews(self, *, page_size: int = 50) -> Iterator[models.Review]:
        """The tenant's review queue, oldest first (a token bound to no user)."""
        return self._paginate("/v1/reviews", {}, models.Review, page_size)

    def review_counts(self) -> models.ReviewCounts:
        """The tenant's pending reviews by kind, and when the oldest was held."""
        return self._send("GET", "/v1/reviews", params={"limit": 1}, model=_ReviewQueueCounts)

    def approve_review(self, user: str, review_id: str) -> models.ReviewDecision:
        """Applies a held change; a ConflictError when what it changes moved on."""
        return self._send("POST", f"{self._user(user)}/reviews/{_segment(review_id)}/approve",
                          model=models.ReviewDecision)

    def reject_review(self, user: str, review_id: str, *, reason: Optional[str] = None,
                      tombstone: bool = False) -> models.ReviewDecision:
        """Drops a held change; with `tombstone`, the value was never true and stays out."""
        body = _clean({"reason": reason, "tombstone": tombstone or None})
        return self._send("POST", f"{self._user(user)}/reviews/{_segment(review_id)}/reject", json=body,
                          model=models.ReviewDecision)

    # Administration (memory:admin)
    def audit(self, user: str, *, page_size: int = 50) -> Iterator[models.AuditEvent]:
        return self._paginate(f"{self._user(user)}/audit", {}, models.AuditEvent, page_size)

    def users(self, *, page_size: int = 50) -> Iterator[models.UserSummary]:
        return self._paginate("/v1/users", {}, models.UserSummary, page_size)

    def erase_user(self, user: str) -> models.ErasureReceipt:
        return self._send("DELETE", self._user(user), model=models.ErasureReceipt)

    def export_user(self, user: str) -> Dict[str, Any]:
        """Everything of the user, as the JSON document `import_user` takes back."""
        return self._send("GET", f"{self._user(user)}/export")

    def import_user(self, user: str, document: Any, *, format: str = "cairn") -> models.ImportResult:
        """A Cairn export, or with `format="mem0"` a mem0 `get_all` document."""
        return self._send("POST", f"{self._user(user)}/import", json=document, params={"format": format},
                          model=models.ImportResult)

    # Operations
    def health(self) -> Dict[str, Any]:
        return self._send("GET", "/healthz")


# Envelopes the clients unwrap.
class _Unwrap:
    key = ""
    inner: Any = None

    @classmethod
    def read(cls, body: Any) -> Any:
        value = body[cls.key]
        if isinstance(value, list):
            return [models.from_dict(cls.inner, item) for item in value]
        return models.from_dict(cls.inner, value) if cls.inner else value


class _FactEnvelope(_Unwrap):
    key, inner = "fact", models.Fact


class _Forgotten(_Unwrap):
    key = "forgotten"


class _PlaybookEnvelope(_Unwrap):
    key, inner = "playbook", models.Playbook


class _PlaybookVersions(_Unwrap):
    key, inner = "versions", models.Playbook


class _JobList(_Unwrap):
    key, inner = "items", models.Job


class _FactList(_Unwrap):
    key, inner = "items", models.Fact


class _TombstoneList(_Unwrap):
    key, inner = "items", models.Tombstone


class _EntitySummaryList(_Unwrap):
    key, inner = "items", models.EntitySummary


class _ReviewQueueCounts(_Unwrap):
    key, inner = "counts", models.ReviewCounts


class _JobEnvelope(_Unwrap):
    key, inner = "job", models.Job


def _read(body: Any, model: Optional[Type[Any]]) -> Any:
    if model is None:
        return body
    if isinstance(model, type) and issubclass(model, _Unwrap):
        return model.read(body)
    return models.from_dict(model, body)


class Cairn(_Endpoints):
    """The blocking client. The tenant comes from the token; pass the user to each call.

    `base_url` and `token` default to the `CAIRN_URL` and `CAIRN_TOKEN` environment
    variables. 429 and 503 answers are retried up to `max_retries` times, waiting as
    `Retry-After` says (at most `max_retry_wait` seconds)."""

    def __init__(self, base_url: Optional[str] = None, token: Optional[str] = None, *, timeout: float = 30.0,
                 max_retries: int = 3, max_retry_wait: float = 30.0, http_client: Optional[httpx.Client] = None):
        self._policy = _Policy(base_url, token, max_retries, max_retry_wait)
        self._http = http_client or httpx.Client(timeout=timeout)
        self.retries = 0

    def __enter__(self) -> "Cairn":
        return self

    def __exit__(self, *_: Any) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    def _send(self, method: str, path: str, *, json: Any = None, params: Optional[Mapping[str, Any]] = None,
              model: Optional[Type[Any]] = None) -> Any:
        attempt = 0
        while True:
            try:
                response = self._http.request(method, self._policy.base_url + path, json=json,
                                              params=_clean(params or {}), headers=self._policy.headers())
            except httpx.TransportError as error:
                raise ConnectionFailed(0, "connection_failed", str(error)) from error
            wait = self._policy.delay(attempt, response)
            if wait is None:
                return _read(_Policy.result(response), model)
            attempt += 1
            self.retries += 1
            time.sleep(wait)

    def _paginate(self, path: str, params: Mapping[str, Any], model: Type[T], page_size: int) -> Iterator[T]:
        cursor: Optional[str] = None
        while True:
            page = self._send("GET", path, params={**params, "limit": page_size, "cursor": cursor})
            for item in page["items"]:
                yield models.from_dict(model, item)
            cursor = page.get("next_cursor")
            if not cursor:
                return


class AsyncCairn(_Endpoints):
    """The asyncio client: the same methods as `Cairn`, awaited; lists are async
    iterators (`async for fact in client.facts(user)`)."""

    def __init__(self, base_url: Optional[str] = None, token: Optional[str] = None, *, timeout: float = 30.0,
                 max_retries: int = 3, max_retry_wait: float = 30.0,
                 http_client: Optional[httpx.AsyncClient] = None):
        self._policy = _Policy(base_url, token, max_retries, max_retry_wait)
        self._http = http_client or httpx.AsyncClient(timeout=timeout)
        self.retries = 0

    async def __aenter__(self) -> "AsyncCairn":
        return self

    async def __aexit__(self, *_: Any) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._http.aclose()

    async def _send(self, method: str, path: str, *, json: Any = None,  # type: ignore[override]
                    params: Optional[Mapping[str, Any]] = None, model: Optional[Type[Any]] = None) -> Any:
        attempt = 0
        while True:
            try:
                response = await self._http.request(method, self._policy.base_url + path, json=json,
                                                    params=_clean(params or {}), headers=self._policy.headers())
            except httpx.TransportError as error:
                raise ConnectionFailed(0, "connection_failed", str(error)) from error
            wait = self._policy.delay(attempt, response)
            if wait is None:
                return _read(_Policy.result(response), model)
            attempt += 1
            self.retries += 1
            await asyncio.sleep(wait)

    async def _paginate(self, path: str, params: Mapping[str, Any],  # type: ignore[override]
                        model: Type[T], page_size: int) -> AsyncIterator[T]:
        cursor: Optional[str] = None
        while True:
            page = await self._send("GET", path, params={**params, "limit": page_size, "cursor": cursor})
            for item in page["items"]:
                yield models.from_dict(model, item)
            cursor = page.get("next_cursor")
            if not cursor:
                return
