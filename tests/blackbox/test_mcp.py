"""The MCP endpoint with an independent client: the official MCP Python SDK against the
real binary, checked against the REST API."""

import json

import anyio
from mcp import ClientSession
from mcp.client.streamable_http import create_mcp_http_client, streamable_http_client


async def with_session(server, token, scenario):
    async with create_mcp_http_client(headers={"Authorization": f"Bearer {token}"}) as http:
        async with streamable_http_client(server.base + "/mcp", http_client=http) as (read, write):
            async with ClientSession(read, write) as session:
                await session.initialize()
                return await scenario(session)


def test_fact_saved_over_mcp_is_read_over_rest_and_superseded(server):
    token = server.mint("acme", scope="memory:read,memory:write", user="alice")

    async def scenario(session):
        tools = {tool.name: tool for tool in (await session.list_tools()).tools}
        assert set(tools) == {"recall_memory", "write_memory", "forget_memory", "retract_memory",
                              "get_profile", "record_playbook_outcome", "answer_from_memory", "get_entity"}
        assert tools["answer_from_memory"].annotations.read_only_hint is True
        assert tools["recall_memory"].annotations.read_only_hint is True
        assert "text" in tools["write_memory"].input_schema["properties"]

        saved = await session.call_tool("write_memory", {"text": "The user drinks oolong tea", "fact_type": "preference"})
        assert not saved.is_error
        fact_id = saved.structured_content["fact"]["id"]
        over_rest = server.call("GET", f"/v1/users/alice/facts/{fact_id}", token)
        assert over_rest.status == 200 and over_rest.json()["text"] == "The user drinks oolong tea"

        replaced = await session.call_tool("write_memory", {"text": "The user drinks jasmine tea", "supersedes": fact_id})
        assert replaced.structured_content["decision"]["kind"] == "UPDATES"
        recalled = await session.call_tool("recall_memory", {"query": "what tea does the user drink"})
        texts = [hit["text"] for hit in recalled.structured_content["hits"]]
        assert texts == ["The user drinks jasmine tea"], texts
        assert "jasmine" in recalled.content[0].text
        answered = await session.call_tool("answer_from_memory", {"query": "Which tea do I drink?"})
        assert answered.structured_content["known"] is True, answered
        assert answered.structured_content["citations"][0] == replaced.structured_content["fact"]["id"]
        assert "jasmine" in answered.structured_content["answer"]

        prompt = await session.get_prompt("context")
        assert "jasmine tea" in prompt.messages[0].content.text
        return fact_id

    old_id = anyio.run(with_session, server, token, scenario)
    assert server.call("GET", f"/v1/users/alice/facts/{old_id}", token).json()["status"] == "superseded"
    rest_recall = server.call("POST", "/v1/users/alice/recall", token, {"query": "tea"}).json()["hits"]
    assert [hit["text"] for hit in rest_recall] == ["The user drinks jasmine tea"]


def test_refusals_over_mcp(server):
    owner = server.mint("acme", user="alice")
    saved = server.call("POST", "/v1/users/alice/facts", owner, {"text": "Alice's passport expires in May"}).json()
    fact_id = saved["fact"]["id"]
    stranger = server.mint("globex")
    reader = server.mint("acme", scope="memory:read", user="alice")

    async def as_stranger(session):
        result = await session.call_tool("forget_memory", {"id": fact_id, "user": "alice"})
        assert result.is_error and result.structured_content["error"]["code"] == "not_found"

    async def as_reader(session):
        result = await session.call_tool("write_memory", {"text": "nope"})
        assert result.is_error and result.structured_content["error"]["code"] == "insufficient_scope"
        crossing = await session.call_tool("recall_memory", {"query": "passport", "user": "bob"})
        assert crossing.structured_content["error"]["code"] == "user_mismatch"

    anyio.run(with_session, server, stranger, as_stranger)
    anyio.run(with_session, server, reader, as_reader)
    assert server.call("GET", f"/v1/users/alice/facts/{fact_id}", owner).json()["status"] == "active"

    unauthenticated = server.call("POST", "/mcp", None, {"jsonrpc": "2.0", "id": 1, "method": "tools/list"},
                                  headers={"accept": "application/json, text/event-stream"})
    assert unauthenticated.status == 401
    assert unauthenticated.headers.get("www-authenticate", unauthenticated.headers.get("WWW-Authenticate", "")).startswith("Bearer")


def test_malformed_and_oversized_messages_are_protocol_errors(server):
    token = server.mint("acme", user="alice")
    headers = {"accept": "application/json, text/event-stream"}
    malformed = server.call("POST", "/mcp", token, raw=b"{this is not json", headers=headers)
    assert 400 <= malformed.status < 500, malformed.status
    wrong_shape = server.call("POST", "/mcp", token, raw=json.dumps({"hello": "world"}).encode(), headers=headers)
    assert 400 <= wrong_shape.status < 500, wrong_shape.status
    huge = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
                       "params": {"name": "write_memory", "arguments": {"text": "x" * (2 * 1024 * 1024)}}}).encode()
    oversized = server.call("POST", "/mcp", token, raw=huge, headers=headers)
    assert oversized.status == 413, oversized.status
    assert server.call("GET", "/healthz").status == 200

    async def still_works(session):
        result = await session.call_tool("write_memory", {"text": "The service survived bad input"})
        assert not result.is_error

    anyio.run(with_session, server, token, still_works)
