"""`roborl serve`: a real server process on a real socket answers metadata, health and inference
exactly as the artifact does, refuses clients without the token, and survives 1000 malformed messages."""
import threading

import msgpack
import numpy as np
import pytest
from deploy_helpers import exported_artifact

from roborl.deploy.artifact import Artifact
from roborl.deploy.client import PolicyClient, PolicyRejected, PolicyUnavailable
from roborl.deploy.server import start_server
from roborl.wire import pack, unpack


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    path = exported_artifact(tmp_path_factory, "flow", "onnx")
    proc, uri = start_server(path, "--token", "s3cret")
    yield Artifact(path), uri
    proc.kill()
    proc.wait()


def test_metadata_health_and_inference_match_the_artifact(served):
    artifact, uri = served
    dim = artifact.observation["state"]["shape"][0]
    rng = np.random.default_rng(0)
    with PolicyClient(uri, token="s3cret") as client:
        assert client.metadata == artifact.metadata
        one = rng.normal(size=dim).astype(np.float32)
        reply = client.infer({"state": one})
        np.testing.assert_array_equal(reply["action"], artifact({"state": one[None]})["action"][0])
        batch = rng.normal(size=(5, dim)).astype(np.float32)
        reply = client.request({"type": "infer", "obs": {"state": batch}, "id": 7})
        assert reply["id"] == 7 and reply["action"].shape == (5, 4, 4)
        np.testing.assert_array_equal(reply["command"], artifact({"state": batch})["command"])
        assert client.health()["status"] == "ok"


def test_clients_without_the_token_are_refused(served):
    _, uri = served
    for token in (None, "wrong"):
        with pytest.raises(PolicyUnavailable, match="401"):
            PolicyClient(uri, token=token)


def malformed_messages(dim: int, rng: np.random.Generator):
    """1000 messages the server must refuse: noise, text, wrong structure, wrong keys, dtypes, shapes,
    values, and arrays whose encoding lies about their size or asks for object dtype."""
    def arr(data: bytes, dtype: str, shape: list) -> dict:
        return {b"__ndarray__": True, b"data": data, b"dtype": dtype, b"shape": shape}

    good = np.zeros(dim, np.float32)
    fixed = [
        "a text frame", b"", b"\xc1", msgpack.packb([1, 2, 3]), msgpack.packb(42), msgpack.packb(None),
        msgpack.packb({"obs": {}}), msgpack.packb({"type": "launch"}), msgpack.packb({"type": 5}),
        pack({"type": "infer"}), pack({"type": "infer", "obs": [1, 2]}), pack({"type": "infer", "obs": {}}),
        pack({"type": "infer", "obs": {"state": good, "extra": good}}), pack({"type": "infer", "obs": {"rgb": good}}),
        pack({"type": "infer", "obs": {"state": good.astype(np.float64)}}),
        pack({"type": "infer", "obs": {"state": good.astype(np.int32)}}),
        pack({"type": "infer", "obs": {"state": np.zeros(dim + 1, np.float32)}}),
        pack({"type": "infer", "obs": {"state": np.zeros((2, 2, dim), np.float32)}}),
        pack({"type": "infer", "obs": {"state": np.zeros((0, dim), np.float32)}}),
        pack({"type": "infer", "obs": {"state": np.full(dim, np.nan, np.float32)}}),
        pack({"type": "infer", "obs": {"state": np.full(dim, np.inf, np.float32)}}),
        pack({"type": "infer", "obs": {"state": [0.0] * dim}}), pack({"type": "infer", "obs": {"state": "zeros"}}),
        msgpack.packb({"type": "infer", "obs": {"state": arr(b"\x00" * 3, "<f4", [dim])}}),
        msgpack.packb({"type": "infer", "obs": {"state": arr(b"\x00" * 4 * dim, "|O", [dim])}}),
        msgpack.packb({"type": "infer", "obs": {"state": arr(b"\x00" * 4 * dim, "<f4", [-dim])}}),
        msgpack.packb({"type": "infer", "obs": {"state": arr(b"", "<f4", [2 ** 40])}}),
        msgpack.packb({"type": "infer", "obs": {"state": arr(b"\x00" * 4 * dim, "no-such-dtype", [dim])}}),
        msgpack.packb({"type": "infer", "obs": {"state": {b"__ndarray__": True}}}),
        pack({"type": "infer", "obs": {"state": np.zeros((2000, dim), np.float32)}}),  # above --max-batch
    ]
    valid = pack({"type": "infer", "obs": {"state": good}})
    messages = list(fixed)
    while len(messages) < 1000:
        kind = rng.integers(4)
        if kind == 0:  # random bytes
            messages.append(rng.bytes(int(rng.integers(1, 200))))
        elif kind == 1:  # a valid request, truncated
            messages.append(valid[: int(rng.integers(1, len(valid) - 1))])
        elif kind == 2:  # a valid request with a byte flipped inside the msgpack header
            data = bytearray(valid)
            data[int(rng.integers(0, 30))] ^= int(rng.integers(1, 256))
            messages.append(bytes(data))
        else:  # a random fixed case again, so every kind is exercised many times
            messages.append(fixed[int(rng.integers(len(fixed)))])
    return messages


def test_the_server_answers_1000_malformed_messages_with_errors_and_keeps_serving(served):
    artifact, uri = served
    dim = artifact.observation["state"]["shape"][0]
    messages = malformed_messages(dim, np.random.default_rng(0))
    from websockets.sync.client import connect

    conn = connect(uri, additional_headers={"Authorization": "Bearer s3cret"}, proxy=None, max_size=None, legacy=True)
    assert unpack(conn.recv(timeout=10))["type"] == "metadata"
    other = PolicyClient(uri, token="s3cret")  # a second client is served while the first one misbehaves
    answers: list[dict] = []
    errors_before = other.health()["errors"]

    def well_behaved() -> None:
        for _ in range(50):
            answers.append(other.infer({"state": np.zeros(dim, np.float32)}))

    thread = threading.Thread(target=well_behaved)
    thread.start()
    replies = []
    for message in messages:
        conn.send(message)
        frame = conn.recv(timeout=10)  # text: an error of openpi's bare form (a map without 'type')
        replies.append(frame if isinstance(frame, str) else unpack(frame))
    thread.join()
    errors = [r if isinstance(r, str) else r["error"] for r in replies if isinstance(r, str) or r["type"] == "error"]
    assert len(errors) == 1000 and all(e and "\n" not in e for e in errors)
    assert len(answers) == 50 and all(a["action"].shape == (4, 4) for a in answers)
    conn.send(pack({"type": "infer", "obs": {"state": np.zeros(dim, np.float32)}}))
    assert unpack(conn.recv(timeout=10))["type"] == "action"  # the misbehaving client is still served too
    assert other.health()["errors"] - errors_before == len(replies)
    with pytest.raises(PolicyRejected, match="shape"):
        other.infer({"state": np.zeros(dim + 1, np.float32)})
    conn.close()
    other.close()


def test_openpis_own_client_gets_actions_and_errors_from_the_server(served):
    """openpi-client's WebsocketClientPolicy (the real package): metadata first, the bare observation in
    (unbatched or batched), the action dict out; a wrong observation raises its RuntimeError with our reason
    and the connection goes on; its Api-Key header is the token."""
    from openpi_client.websocket_client_policy import WebsocketClientPolicy
    from websockets.exceptions import InvalidStatus

    artifact, uri = served
    dim = artifact.observation["state"]["shape"][0]
    policy = WebsocketClientPolicy(uri, api_key="s3cret")
    assert policy.get_server_metadata()["metadata"] == artifact.metadata
    one = np.random.default_rng(1).normal(size=dim).astype(np.float32)
    result = policy.infer({"state": one})
    np.testing.assert_array_equal(result["actions"], artifact({"state": one[None]})["action"][0])
    assert result["server_timing"]["infer_ms"] > 0
    batch = np.random.default_rng(2).normal(size=(3, dim)).astype(np.float32)
    np.testing.assert_array_equal(policy.infer({"state": batch})["actions"], artifact({"state": batch})["action"])
    with pytest.raises(RuntimeError, match="must have shape"):
        policy.infer({"state": np.zeros(dim + 1, np.float32)})
    with pytest.raises(RuntimeError, match="keys must be"):
        policy.infer({"observation/state": one, "prompt": "push the cube"})
    assert policy.infer({"state": one})["actions"].shape == (4, 4)
    with pytest.raises(InvalidStatus, match="401"):
        WebsocketClientPolicy(uri, api_key="wrong")
