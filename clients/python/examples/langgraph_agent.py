"""A LangGraph agent whose memory is Cairn: the model calls `remember` and
`recall_memories` in a loop until it answers.

    CAIRN_URL=... CAIRN_TOKEN=... python examples/langgraph_agent.py

Any LangChain chat model that supports tool calling fits `build_agent`; `main` uses
the model named by `--model` through `langchain.chat_models.init_chat_model`."""


import argparse
import os
from typing import Annotated, Any, Sequence, TypedDict

from langchain_core.messages import AnyMessage, HumanMessage, SystemMessage
from langchain_core.tools import BaseTool
from langgraph.graph import END, START, StateGraph
from langgraph.graph.message import add_messages
from langgraph.prebuilt import ToolNode

from cairn import Cairn
from cairn.langchain import cairn_tools

SYSTEM = ("You are a helpful assistant with a long-term memory of the user. Call recall_memories before "
          "answering questions about the user, and remember when the user states a lasting fact.")


class State(TypedDict):
    messages: Annotated[list[AnyMessage], add_messages]


def build_agent(model: Any, tools: Sequence[BaseTool]) -> Any:
    """The agent loop: the model, then its tool calls, until it answers without one."""
    bound = model.bind_tools(list(tools))

    def think(state: State) -> dict:
        return {"messages": [bound.invoke([SystemMessage(SYSTEM), *state["messages"]])]}

    def route(state: State) -> str:
        last = state["messages"][-1]
        return "tools" if getattr(last, "tool_calls", None) else END

    graph = StateGraph(State)
    graph.add_node("agent", think)
    graph.add_node("tools", ToolNode(list(tools)))
    graph.add_edge(START, "agent")
    graph.add_conditional_edges("agent", route, {"tools": "tools", END: END})
    graph.add_edge("tools", "agent")
    return graph.compile()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--user", default="alice")
    parser.add_argument("--model", required=True, help="e.g. openai:gpt-4o-mini")
    parser.add_argument("message")
    arguments = parser.parse_args()
    from langchain.chat_models import init_chat_model

    client = Cairn(os.environ.get("CAIRN_URL"), os.environ.get("CAIRN_TOKEN"))
    agent = build_agent(init_chat_model(arguments.model), cairn_tools(client, arguments.user))
    result = agent.invoke({"messages": [HumanMessage(arguments.message)]})
    print(result["messages"][-1].content)


if __name__ == "__main__":
    main()
