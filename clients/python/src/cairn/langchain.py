"""LangChain integration (`pip install "cairn-memory[langchain]"`): a retriever over
recall, and tools to remember, recall, retract and forget.

The tenant comes from the client's token and the user is fixed when the retriever or
the tools are made: a model calling the tools can never name another user."""

from __future__ import annotations

from typing import Any, List, Optional, Sequence

from langchain_core.callbacks import AsyncCallbackManagerForRetrieverRun, CallbackManagerForRetrieverRun
from langchain_core.documents import Document
from langchain_core.retrievers import BaseRetriever
from langchain_core.tools import BaseTool, StructuredTool
from pydantic import ConfigDict

from ._client import AsyncCairn, Cairn
from ._errors import CairnError
from ._models import RecallHit

__all__ = ["CairnRetriever", "cairn_tools"]


def _document(hit: RecallHit) -> Document:
    metadata = {"id": hit.id, "tier": hit.tier, "score": hit.score, "status": hit.status}
    for key in ("fact_type", "session_id", "name", "version"):
        value = getattr(hit, key)
        if value is not None:
            metadata[key] = value
    return Document(page_content=hit.text, metadata=metadata, id=hit.id)


class CairnRetriever(BaseRetriever):
    """Recall as a LangChain retriever: one Document per hit, best first, with the
    hit's id, tier, score and status in its metadata."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    client: Optional[Cairn] = None
    async_client: Optional[AsyncCairn] = None
    user: str
    k: int = 5
    tiers: Optional[List[str]] = None
    include_history: bool = False

    def _get_relevant_documents(self, query: str, *, run_manager: CallbackManagerForRetrieverRun) -> List[Document]:
        if self.client is None:
            raise ValueError("CairnRetriever needs `client` for synchronous use")
        result = self.client.recall(self.user, query, k=self.k, tiers=self.tiers,
                                    include_history=self.include_history or None)
        return [_document(hit) for hit in result.hits]

    async def _aget_relevant_documents(self, query: str, *,
                                       run_manager: AsyncCallbackManagerForRetrieverRun) -> List[Document]:
        if self.async_client is None:
            return await super()._aget_relevant_documents(query, run_manager=run_manager)
        result = await self.async_client.recall(self.user, query, k=self.k, tiers=self.tiers,
                                                include_history=self.include_history or None)
        return [_document(hit) for hit in result.hits]


def _failed(error: CairnError) -> str:
    # The model sees why a call failed and may correct itself; the request id is kept
    # for whoever reads the trace.
    return f"error {error.code}: {error.message} (request {error.request_id})"


def cairn_tools(client: Cairn, user: str, *, k: int = 5) -> List[BaseTool]:
    """`remember`, `recall_memories`, `retract_memory` and `forget_memory`, each acting on
    `user` with the client's token (which decides what is allowed)."""

    def remember(text: str, supersedes: Optional[str] = None) -> str:
        """Save one lasting fact about the user, stated as a short self-contained
        sentence. Pass `supersedes` with an old fact's id when this fact replaces it."""
        try:
            written = client.write_fact(user, text, supersedes=supersedes)
        except CairnError as error:
            return _failed(error)
        if not written.created:
            return f"Already known as {written.fact.id}."
        return f"Saved as {written.fact.id}."

    def recall_memories(query: str) -> str:
        """Look up what is known about the user that is relevant to `query`."""
        try:
            hits = client.recall(user, query, k=k).hits
        except CairnError as error:
            return _failed(error)
        if not hits:
            return "Nothing relevant is known."
        return "\n".join(f"[{hit.id}] {hit.text}" for hit in hits)

    def retract_memory(memory_id: str, reason: Optional[str] = None) -> str:
        """Retract a fact that was never true (the user says it was wrong); the value is
        refused from then on."""
        try:
            fact = client.retract_fact(user, memory_id, reason=reason)
        except CairnError as error:
            return _failed(error)
        return f"Retracted {fact.id}: {fact.text}"

    def forget_memory(memory_id: str) -> str:
        """Forget a fact the user asks to have erased."""
        try:
            client.forget_fact(user, memory_id)
        except CairnError as error:
            return _failed(error)
        return f"Forgot {memory_id}."

    functions: Sequence[Any] = (remember, recall_memories, retract_memory, forget_memory)
    return [StructuredTool.from_function(function) for function in functions]
