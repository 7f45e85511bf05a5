"""evaluate honours [embedder]: a decoder is built from the whole section (method, pooling, ...)."""

from __future__ import annotations

import json

import pytest
from helpers import STS_ROWS, write_sts12
from typer.testing import CliRunner

from negsynth.cli import app

pytest.importorskip("transformers")


@pytest.fixture(autouse=True)
def smollm2():
    from negsynth.resources import MissingResource, smollm2_gguf_path

    try:
        smollm2_gguf_path()
    except MissingResource as e:
        pytest.skip(f"SmolLM2 not installed: {e}")


def test_the_whole_section_reaches_the_decoder(tmp_path, monkeypatch):
    """Fast: the [embedder] section as the decoder embedder receives it (no model loaded)."""
    from negsynth.embed import embedder_for
    from negsynth.embed.decoder import DecoderEmbedder
    from negsynth.schemas.config import EmbedderConfig

    seen = []

    def capture(cfg):
        seen.append(cfg)
        raise ValueError("captured")

    monkeypatch.setattr(DecoderEmbedder, "from_config", staticmethod(capture))
    with pytest.raises(ValueError, match="captured"):
        embedder_for(
            "smollm2",
            batch_size=4,
            embedder=EmbedderConfig(kind="decoder", method="embedfilter", base="prompteol", filter_ratio=3, batch_size=99),
        )
    cfg = seen[-1]
    assert (cfg.kind, cfg.model, cfg.method, cfg.base, cfg.filter_ratio, cfg.batch_size) == (
        "decoder",
        "default",
        "embedfilter",
        "prompteol",
        3,
        4,
    )
    # the command: no trained model + embedder.kind=decoder -> the zero-shot embedder [embedder] describes
    decoder = "--set embedder.kind=decoder --set embedder.method=reba --set embedder.repeat=3".split()
    r = CliRunner().invoke(app, ["evaluate", "-d", str(tmp_path / "run"), "--baseline", "", "-q", *decoder])
    assert r.exit_code == 2 and "captured" in r.output
    assert (seen[-1].model, seen[-1].method, seen[-1].repeat) == ("default", "reba", 3)


@pytest.mark.slow
def test_evaluate_command_reports_the_method(tmp_path):
    """Real SmolLM2 on a 4-pair STS set (~10 s on idle cores, ~35 s when they are busy)."""
    write_sts12(tmp_path / "data", STS_ROWS[:4])
    rd = tmp_path / "run"
    decoder = "--set embedder.kind=decoder --set embedder.method=echo".split()
    data = ["--data-dir", str(tmp_path / "data"), "--tasks", "STS12"]
    r = CliRunner().invoke(app, ["evaluate", "-d", str(rd), *data, "--baseline", "", "-q", *decoder])
    assert r.exit_code == 0, r.output
    rep = json.loads((rd / "evaluate" / "report.json").read_text())
    assert rep["embedder"].startswith("decoder:") and "echo" in rep["embedder"], rep["embedder"]
    assert rep["model"] == "smollm2"
    # the same section reaches a decoder given with --model
    from negsynth.embed import embedder_for
    from negsynth.schemas.config import EmbedderConfig

    emb = embedder_for("smollm2", batch_size=4, embedder=EmbedderConfig(kind="decoder", method="prompteol", pooling="last"))
    assert emb.name.startswith("decoder:") and "prompteol" in emb.name, emb.name
