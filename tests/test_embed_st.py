"""SentenceTransformerEmbedder with the real bundled all-MiniLM-L6-v2 on a handful of texts."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import minilm_embedder

from negsynth.embed.st import dedupe

pytest.importorskip("sentence_transformers")


@pytest.fixture(scope="module")
def minilm():
    return minilm_embedder(batch_size=4)


def test_dedupe_keeps_first_seen_order():
    uniq, inv = dedupe(["b", "a", "b", "c", "a"])
    assert uniq == ["b", "a", "c"] and inv.tolist() == [0, 1, 0, 2, 1]


def test_minilm_loads_offline_and_embeds_unit_vectors(minilm):
    assert minilm.name == "st:all-MiniLM-L6-v2" and minilm.dim == 384 and minilm.device == "cpu"
    v = minilm.encode(["A man is playing a guitar.", "Someone plays an instrument.", "The stock market fell sharply today."])
    assert v.shape == (3, 384) and v.dtype == np.float32
    assert np.allclose(np.linalg.norm(v, axis=1), 1.0, atol=1e-5)
    sims = v @ v.T
    assert sims[0, 1] > sims[0, 2] + 0.2  # related pair far above the unrelated one


def test_identical_texts_embedded_once_and_match_bare_encode(minilm):
    texts = ["a cat sat on the mat", "a dog", "a cat sat on the mat", "a dog", "a cat sat on the mat"]
    before = minilm.texts_encoded
    v = minilm.encode(texts)
    assert minilm.texts_encoded - before == 2
    assert np.array_equal(v[0], v[2]) and np.array_equal(v[1], v[3])
    bare = minilm.model.encode(texts, normalize_embeddings=True, batch_size=4)
    assert np.allclose(v, bare, atol=1e-5)


def test_query_instruction_template(minilm):
    minilm.instruct_queries = True
    try:
        assert minilm.format_query("what is a cat", "Retrieve a definition") == "Instruct: Retrieve a definition\nQuery: what is a cat"
        q = minilm.encode_queries(["what is a cat"], "Retrieve a definition")
        plain = minilm.encode_documents(["what is a cat"])
        assert not np.allclose(q, plain)  # the instruction reached the model; documents stay plain
    finally:
        minilm.instruct_queries = False


def test_bad_model_path_is_one_line_user_error(tmp_path):
    from negsynth.embed.st import SentenceTransformerEmbedder
    from negsynth.errors import UserError

    f = tmp_path / "weights.bin"
    f.write_bytes(b"x")
    with pytest.raises(UserError, match="is a file"):
        SentenceTransformerEmbedder.load(str(f))
    with pytest.raises(UserError, match=r"embedder.model .*cannot load a sentence-transformers model"):
        SentenceTransformerEmbedder.load(str(tmp_path))  # an empty folder


# ----------------------------------------------------------------------------- inference backends


def test_unknown_or_missing_backend_is_one_line_naming_the_install(monkeypatch):
    import sys

    from negsynth.embed.backends import check_backend
    from negsynth.errors import UserError

    check_backend("torch")
    with pytest.raises(UserError, match="use one of auto, torch, openvino, openvino-bf16"):
        check_backend("tensorrt")
    monkeypatch.setitem(sys.modules, "openvino", None)  # import fails as if not installed
    with pytest.raises(UserError, match=r"needs openvino and onnx; run: pip install 'negsynth\[openvino\]'") as e:
        check_backend("openvino")
    assert "\n" not in str(e.value)


def test_an_encoders_auto_dtype_is_float32_on_every_device():
    """An encoder's "auto" weights are float32 on a GPU too: score's false-negative rule compares
    cosines a few thousandths apart, and on an H200 bf16 weights moved 37 of 163 examples across it.
    A dtype set explicitly is kept (checked without a GPU: only "auto" is resolved here)."""
    torch = pytest.importorskip("torch")
    from negsynth.embed.st import encoder_dtype

    for device in ("cuda", "cuda:1", "mps", "cpu"):
        assert encoder_dtype("auto", device) is torch.float32
    assert encoder_dtype("bfloat16", "cuda") is torch.bfloat16
    assert encoder_dtype("float16", "cpu") is torch.float16


def test_auto_embeds_on_a_gpu_as_the_cpu_and_bf16_stays_close(minilm):
    """Where torch sees a CUDA GPU, "auto" embeds there in float32 (the CPU's vectors up to float
    rounding), and dtype bfloat16 gives vectors close to them (cosine above 0.99)."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    from negsynth.embed.st import SentenceTransformerEmbedder

    texts = ["a cat sat on the mat", "completely different: the stock market fell", "x", "Someone plays an instrument."]
    want = minilm.encode(texts)
    gpu = SentenceTransformerEmbedder.load("default", batch_size=4)
    assert gpu.device.startswith("cuda") and next(gpu.model.parameters()).dtype == torch.float32
    np.testing.assert_allclose(gpu.encode(texts), want, atol=1e-4)
    bf16 = SentenceTransformerEmbedder.load("default", batch_size=4, dtype="bfloat16")
    assert float(((bf16.encode(texts) * want).sum(axis=1)).min()) > 0.99


def test_exported_backend_embeds_as_torch(minilm, tmp_path, monkeypatch):
    """The ONNX backbone on OpenVINO under sentence-transformers' own tokenising, pooling and
    normalising gives torch's vectors up to float rounding (the export is cached under NEGSYNTH_CACHE_DIR)."""
    backend = "openvino"
    pytest.importorskip("onnx")
    pytest.importorskip("openvino")
    from negsynth.embed.st import SentenceTransformerEmbedder

    monkeypatch.setenv("NEGSYNTH_CACHE_DIR", str(tmp_path))
    texts = ["a cat sat on the mat", "completely different: the stock market fell", "x"]
    fast = SentenceTransformerEmbedder.load("default", device="cpu", batch_size=2, backend=backend)
    assert fast.backend == backend and fast.name == minilm.name
    got, want = fast.encode(texts), minilm.encode(texts)
    np.testing.assert_allclose(got, want, atol=1e-5)
    assert list(tmp_path.glob("onnx/*/model.onnx"))


def test_openvino_bf16_is_close_to_torch_or_refused_in_one_line(minilm, tmp_path, monkeypatch):
    """bfloat16 inference moves vectors a little (cosine to torch's > 0.9999 on these texts); a CPU
    without bf16 instructions is told so in one line."""
    pytest.importorskip("onnx")
    ov = pytest.importorskip("openvino")
    from negsynth.embed.st import SentenceTransformerEmbedder
    from negsynth.errors import UserError

    monkeypatch.setenv("NEGSYNTH_CACHE_DIR", str(tmp_path))
    texts = ["a cat sat on the mat", "completely different: the stock market fell", "x"]
    if "BF16" in ov.Core().get_property("CPU", "OPTIMIZATION_CAPABILITIES"):
        fast = SentenceTransformerEmbedder.load("default", device="cpu", batch_size=2, backend="openvino-bf16")
        cos = (fast.encode(texts) * minilm.encode(texts)).sum(axis=1)
        assert fast.backend == "openvino-bf16" and cos.min() > 0.9999 and not np.allclose(cos, 1.0, atol=1e-7)
    monkeypatch.setattr(ov.Core, "get_property", lambda self, device, name: ["FP32", "INT8"])
    with pytest.raises(UserError, match="no bfloat16 instructions") as e:
        SentenceTransformerEmbedder.load("default", device="cpu", backend="openvino-bf16")
    assert "\n" not in str(e.value)


def test_auto_backend_falls_back_to_torch(monkeypatch, tmp_path):
    import sys

    from negsynth.embed.backends import use_backend

    class Fake(list):
        device = "cpu"

    monkeypatch.setenv("NEGSYNTH_CACHE_DIR", str(tmp_path))
    monkeypatch.setitem(sys.modules, "openvino", None)
    assert use_backend(Fake([object()]), "auto") == "torch"  # no runtime: torch, no error
    monkeypatch.undo()
    pytest.importorskip("openvino")
    assert use_backend(Fake([object()]), "auto") == "torch"  # not a sentence-transformers Transformer first


def test_openvino_backend_refuses_negsynth_modules():
    from negsynth.embed.backends import _text_transformer
    from negsynth.errors import UserError
    from negsynth.schemas.train import TrainConfig
    from negsynth.train.trainer import build_model

    pytest.importorskip("datasets")
    m = build_model(TrainConfig(model="default", pooling="ata", max_length=16), device="cpu")
    with pytest.raises(UserError, match="need the torch backbone"):
        _text_transformer(m)
