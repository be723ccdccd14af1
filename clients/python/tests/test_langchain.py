"""The LangChain integration against the real binary: the retriever, the tools, and
the LangGraph example driven by langchain-core's fake chat model, so the real
tool-calling path (the graph, ToolNode, the tools, the client) runs offline."""

import importlib.util
import sys
from pathlib import Path

from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage

from cairn import Cairn
from cairn.langchain import CairnRetriever, cairn_tools

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "langgraph_agent.py"


class ScriptedChatModel(GenericFakeChatModel):
    """langchain-core's fake chat model, answering with scripted messages (tool calls
    included); binding tools changes nothing about what it says."""

    def bind_tools(self, tools, **kwargs):
        return self


def load_example():
    spec = importlib.util.spec_from_file_location("langgraph_agent", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_the_retriever_returns_recall_hits_as_documents(service):
    client = Cairn(service.base, service.mint("acme"))
    client.write_fact("alice", "The user is allergic to peanuts.")
    client.write_fact("alice", "The user lives in Lisbon.")
    documents = CairnRetriever(client=client, user="alice", k=2, tiers=["semantic"]).invoke("food allergy")
    assert documents[0].page_content == "The user is allergic to peanuts."
    assert documents[0].metadata["tier"] == "semantic" and documents[0].metadata["id"].startswith("fact_")
    assert len(documents) == 2


def test_the_tools_act_on_the_fixed_user_only(service):
    client = Cairn(service.base, service.mint("acme"))
    tools = {tool.name: tool for tool in cairn_tools(client, "bob")}
    assert set(tools) == {"remember", "recall_memories", "retract_memory", "forget_memory"}
    assert "user" not in tools["remember"].args  # the model cannot name another user
    saved = tools["remember"].invoke({"text": "The user plays the cello."})
    fact_id = saved.split()[-1].rstrip(".")
    assert "cello" in tools["recall_memories"].invoke({"query": "instrument"})
    assert [fact.text for fact in client.facts("alice")] == []
    assert tools["retract_memory"].invoke({"memory_id": fact_id, "reason": "joke"}).startswith("Retracted")
    assert "tombstoned" in tools["remember"].invoke({"text": "The user plays the cello."})
    other = tools["remember"].invoke({"text": "The user plays chess."}).split()[-1].rstrip(".")
    assert tools["forget_memory"].invoke({"memory_id": other}) == f"Forgot {other}."
    assert client.get_fact("bob", fact_id).status == "retracted"
    reader_tools = {tool.name: tool for tool in cairn_tools(Cairn(service.base, service.mint("acme", "memory:read")), "bob")}
    assert "insufficient_scope" in reader_tools["remember"].invoke({"text": "The user likes tea."})


def test_the_langgraph_example_runs_its_tool_loop(service):
    client = Cairn(service.base, service.mint("acme"))
    example = load_example()
    model = ScriptedChatModel(messages=iter([
        AIMessage("", tool_calls=[{"name": "remember", "args": {"text": "The user is allergic to peanuts."},
                                   "id": "call-1"}]),
        AIMessage("", tool_calls=[{"name": "recall_memories", "args": {"query": "allergies"}, "id": "call-2"}]),
        AIMessage("Noted: you are allergic to peanuts, so I will leave them out."),
    ]))
    agent = example.build_agent(model, cairn_tools(client, "carol"))
    result = agent.invoke({"messages": [HumanMessage("I'm allergic to peanuts. What do you know about me?")]})
    tool_messages = [message for message in result["messages"] if isinstance(message, ToolMessage)]
    assert [message.name for message in tool_messages] == ["remember", "recall_memories"]
    assert tool_messages[0].content.startswith("Saved as fact_")
    assert "allergic to peanuts" in tool_messages[1].content
    assert result["messages"][-1].content.startswith("Noted")
    assert [fact.text for fact in client.facts("carol")] == ["The user is allergic to peanuts."]
