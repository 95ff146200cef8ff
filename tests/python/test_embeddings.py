"""`POST /v1/embeddings` through the real `openai` package, against a server of the tiny
Qwen3-Embedding-shaped fixture (`tests/fixtures/tiny-qwen3-embedding`, made by
`scripts/make_embedding_fixture.py`). The vectors are checked against a numpy forward pass of
the fixture's weights: last-token pooling (the tokenizer appends `<|endoftext|>`), the final
norm, L2 normalization and Matryoshka truncation.
"""

import base64
import http.client
import json
import ssl
import struct
import tempfile
from pathlib import Path

import numpy as np
import openai
import pytest

from test_openai_client import API_KEY, REPO, RunningServer

FIXTURE = REPO / "tests" / "fixtures" / "tiny-qwen3-embedding"
ENDOFTEXT = 5


@pytest.fixture(scope="module")
def server():
    with tempfile.TemporaryDirectory() as workdir:
        running = RunningServer(Path(workdir), ("--model", str(FIXTURE)))
        yield running
        running.stop()
        assert running.process.returncode == 0, "".join(running.log)


@pytest.fixture(scope="module")
def model_id(server):
    return server.client().models.list().data[0].id


def _weights():
    with open(FIXTURE / "model.safetensors", "rb") as f:
        size = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(size))
        data = f.read()
    tensors = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        start, end = info["data_offsets"]
        raw = np.frombuffer(data[start:end], dtype="<u2").astype(np.uint32) << 16
        tensors[name] = raw.view(np.float32).reshape(info["shape"]).astype(np.float64)
    return tensors


def _rms_norm(x, weight, eps):
    return x / np.sqrt((x * x).mean(axis=-1, keepdims=True) + eps) * weight


def _rope(x, theta):
    # x: [tokens, heads, head_dim]; Hugging Face's rotate-half form.
    tokens, _, dim = x.shape
    inv = 1.0 / theta ** (np.arange(0, dim, 2) / dim)
    angles = np.arange(tokens)[:, None] * inv[None, :]
    cos = np.cos(np.concatenate([angles, angles], axis=-1))[:, None, :]
    sin = np.sin(np.concatenate([angles, angles], axis=-1))[:, None, :]
    half = dim // 2
    rotated = np.concatenate([-x[..., half:], x[..., :half]], axis=-1)
    return x * cos + rotated * sin


def reference_embedding(ids):
    """The fixture's last-token embedding, computed from its weights in float64."""
    config = json.loads((FIXTURE / "config.json").read_text())
    w = _weights()
    eps, d = config["rms_norm_eps"], config["head_dim"]
    heads, kv_heads = config["num_attention_heads"], config["num_key_value_heads"]
    theta = config["rope_parameters"]["rope_theta"]
    x = w["model.embed_tokens.weight"][ids]
    t = len(ids)
    for layer in range(config["num_hidden_layers"]):
        p = f"model.layers.{layer}."
        h = _rms_norm(x, w[p + "input_layernorm.weight"], eps)
        q = (h @ w[p + "self_attn.q_proj.weight"].T).reshape(t, heads, d)
        k = (h @ w[p + "self_attn.k_proj.weight"].T).reshape(t, kv_heads, d)
        v = (h @ w[p + "self_attn.v_proj.weight"].T).reshape(t, kv_heads, d)
        q = _rope(_rms_norm(q, w[p + "self_attn.q_norm.weight"], eps), theta)
        k = _rope(_rms_norm(k, w[p + "self_attn.k_norm.weight"], eps), theta)
        group = heads // kv_heads
        out = np.zeros((t, heads, d))
        mask = np.triu(np.full((t, t), -np.inf), 1)
        for head in range(heads):
            scores = q[:, head] @ k[:, head // group].T / np.sqrt(d) + mask
            probs = np.exp(scores - scores.max(axis=-1, keepdims=True))
            probs /= probs.sum(axis=-1, keepdims=True)
            out[:, head] = probs @ v[:, head // group]
        x = x + out.reshape(t, heads * d) @ w[p + "self_attn.o_proj.weight"].T
        h = _rms_norm(x, w[p + "post_attention_layernorm.weight"], eps)
        gate = h @ w[p + "mlp.gate_proj.weight"].T
        up = h @ w[p + "mlp.up_proj.weight"].T
        x = x + (gate / (1 + np.exp(-gate)) * up) @ w[p + "mlp.down_proj.weight"].T
    last = _rms_norm(x, w["model.norm.weight"], eps)[-1]
    return last / np.linalg.norm(last)


def test_a_list_of_inputs_matches_the_reference(server, model_id):
    client = server.client()
    token_inputs = [[10, 11, 12, ENDOFTEXT], [300, 200, 100, 50, 25, ENDOFTEXT]]
    for encoding_format in ("float", "base64"):
        response = client.embeddings.create(
            model=model_id, input=token_inputs, encoding_format=encoding_format
        )
        assert response.object == "list"
        assert [item.index for item in response.data] == [0, 1]
        assert response.usage.prompt_tokens == 10
        for item, ids in zip(response.data, token_inputs):
            if encoding_format == "base64":
                # Asked for explicitly, base64 comes back as sent: little-endian f32.
                vector = np.frombuffer(base64.b64decode(item.embedding), dtype="<f4")
            else:
                vector = np.array(item.embedding)
            assert vector.shape == (64,)
            assert abs(np.linalg.norm(vector) - 1.0) < 1e-5
            assert np.abs(vector - reference_embedding(ids)).max() < 1e-4


def test_text_inputs_end_with_endoftext(server, model_id):
    client = server.client()
    texts = ["confidential retrieval", "a second, longer document about enclaves"]
    # The SDK asks for base64 and decodes it when no format is given.
    response = client.embeddings.create(model=model_id, input=texts)
    context = ssl.create_default_context(cafile=str(server.cert_path))
    connection = http.client.HTTPSConnection("localhost", server.port, context=context)
    try:
        connection.request(
            "POST",
            "/tokenize",
            body=json.dumps({"prompt": texts[0]}),
            headers={"Authorization": f"Bearer {API_KEY}", "Content-Type": "application/json"},
        )
        tokenized = json.loads(connection.getresponse().read())
    finally:
        connection.close()
    assert tokenized["tokens"][-1] == ENDOFTEXT
    vector = np.array(response.data[0].embedding)
    assert np.abs(vector - reference_embedding(tokenized["tokens"])).max() < 1e-4
    assert len(response.data) == 2


def test_dimensions_cut_and_renormalize(server, model_id):
    client = server.client()
    ids = [10, 11, 12, ENDOFTEXT]
    response = client.embeddings.create(model=model_id, input=[ids], dimensions=16)
    vector = np.array(response.data[0].embedding)
    assert vector.shape == (16,)
    full = reference_embedding(ids)[:16]
    assert np.abs(vector - full / np.linalg.norm(full)).max() < 1e-4
    with pytest.raises(openai.BadRequestError) as raised:
        client.embeddings.create(model=model_id, input="x", dimensions=24)
    assert raised.value.param == "dimensions"


def test_a_generative_model_refuses_embeddings():
    with tempfile.TemporaryDirectory() as workdir:
        running = RunningServer(Path(workdir))
        try:
            model = running.client().models.list().data[0].id
            with pytest.raises(openai.BadRequestError) as raised:
                running.client().embeddings.create(model=model, input="x")
            assert "not an embedding model" in raised.value.message
        finally:
            running.stop()


def test_the_published_layout_embeds_and_refuses_generation():
    # The same weights as Qwen3-Embedding publishes them: no `model.` prefix, no LM head.
    published = REPO / "tests" / "fixtures" / "tiny-qwen3-embedding-published"
    with tempfile.TemporaryDirectory() as workdir:
        running = RunningServer(Path(workdir), ("--model", str(published)))
        try:
            client = running.client()
            model = client.models.list().data[0].id
            inputs = [[10, 11, 12, ENDOFTEXT], [300, 200, 100, 50, 25, ENDOFTEXT]]
            response = client.embeddings.create(model=model, input=inputs, encoding_format="float")
            for item, ids in zip(response.data, inputs):
                assert np.abs(np.array(item.embedding) - reference_embedding(ids)).max() < 1e-4
            with pytest.raises(openai.BadRequestError) as raised:
                client.chat.completions.create(model=model, messages=[{"role": "user", "content": "hi"}])
            assert "without an LM head" in raised.value.message
            with pytest.raises(openai.BadRequestError) as raised:
                client.completions.create(model=model, prompt="hi", max_tokens=2)
            assert "without an LM head" in raised.value.message
            with pytest.raises(openai.BadRequestError) as raised:
                client.responses.create(model=model, input="hi", store=False)
            assert "without an LM head" in raised.value.message
        finally:
            running.stop()
