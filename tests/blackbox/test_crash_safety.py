"""Acknowledged writes survive SIGKILL of the server."""


def test_acknowledged_writes_survive_kill_9(make_server, tmp_path):
    data = tmp_path / "crash"
    first = make_server(data).start()
    token = first.mint("acme")
    fact_ids, episode_ids = [], []
    for index in range(40):
        response = first.call("POST", "/v1/users/u1/facts", token, {"text": f"Crash-safe fact number {index}"})
        assert response.status == 201, response.body
        fact_ids.append(response.json()["fact"]["id"])
        episode = first.call("POST", "/v1/users/u1/episodes", token,
                             {"messages": [{"role": "user", "content": f"episode {index}"}]})
        assert episode.status == 201
        episode_ids.extend(episode.json()["episode_ids"])
    first.kill()

    second = make_server(data).start()
    for fact_id in fact_ids:
        response = second.call("GET", f"/v1/users/u1/facts/{fact_id}", token)
        assert response.status == 200, f"{fact_id} lost after kill -9"
    for episode_id in episode_ids:
        assert second.call("GET", f"/v1/users/u1/episodes/{episode_id}", token).status == 200
    audit = second.call("GET", "/v1/users/u1/audit?limit=200", token).json()["items"]
    writes = [event for event in audit if event["action"] in ("fact.create", "episode.ingest")]
    assert len(writes) == 80
