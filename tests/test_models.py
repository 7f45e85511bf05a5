"""One place turns a model name into a model: aliases, folders by kind, hub names, one-line errors."""

from __future__ import annotations

import json

import pytest

from negsynth.embed.models import resolve_model
from negsynth.errors import UserError
from negsynth.resources import minilm_path


def test_aliases_resolve_to_the_bundled_models():
    ref = resolve_model("default")
    assert ref.path == str(minilm_path()) and ref.kind == "sentence-transformers" and ref.local
    assert resolve_model("minilm").path == ref.path


def test_folders_are_told_apart_by_what_they_hold(tmp_path):
    st = tmp_path / "st"
    st.mkdir()
    (st / "modules.json").write_text("[]")
    dec = tmp_path / "dec"
    dec.mkdir()
    (dec / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"]}))
    enc = tmp_path / "enc"
    enc.mkdir()
    (enc / "config.json").write_text(json.dumps({"architectures": ["BertModel"]}))
    assert resolve_model(str(st)).kind == "sentence-transformers"
    assert resolve_model(str(dec)).is_decoder
    assert resolve_model(str(enc)).kind == "encoder"


def test_hub_names_pass_through_unless_refused(tmp_path):
    ref = resolve_model("BAAI/bge-small-en-v1.5")
    assert ref.path == "BAAI/bge-small-en-v1.5" and not ref.local
    with pytest.raises(UserError, match="train.model 'BAAI/bge-small-en-v1.5': not 'default'"):
        resolve_model("BAAI/bge-small-en-v1.5", allow_hub=False, what="train.model")


def test_a_missing_folder_or_a_file_is_one_line_naming_the_setting(tmp_path):
    with pytest.raises(UserError, match=r"evaluate --model '.*nope': no such folder"):
        resolve_model(str(tmp_path / "nope"), what="evaluate --model")
    f = tmp_path / "model.bin"
    f.write_bytes(b"x")
    with pytest.raises(UserError, match="is a file"):
        resolve_model(str(f))


def test_every_stage_resolves_through_it():
    """score's embedder, regenerate's miner, the trainer and evaluate share the resolver."""
    import inspect

    from negsynth.embed import mining, st
    from negsynth.pipeline import StageContext
    from negsynth.stages import evaluate
    from negsynth.train import trainer

    assert "resolve_model" in inspect.getsource(st.SentenceTransformerEmbedder.load)
    # the miner (regenerate's, corpus's and the Ray workers'): one loader
    assert "load_mining_model" in inspect.getsource(StageContext.load_mining_model)
    assert "load_sentence_transformer" in inspect.getsource(mining.load_mining_model)
    assert "resolve_model" in inspect.getsource(trainer.build_model)
    assert evaluate.embedder_for.__module__ == "negsynth.embed" and "resolve_model" in inspect.getsource(evaluate.embedder_for)
