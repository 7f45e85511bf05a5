"""Tests for negsynth.train: ATA maths, bidirectional masks, sampler order, loss, training, save/reload.

Fast tests use a tiny random Llama / BERT built from a config and the bundled MiniLM (no network).
The SmolLM2 + LoRA training test is marked slow.
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("sentence_transformers")
pytest.importorskip("datasets")

from transformers import BertConfig, BertModel, LlamaConfig, LlamaModel  # noqa: E402

from negsynth.schemas.train import TrainConfig  # noqa: E402
from negsynth.train.bidirectional import make_bidirectional, parse_mode  # noqa: E402
from negsynth.train.loss import make_loss  # noqa: E402
from negsynth.train.pooling import (  # noqa: E402
    _AttentionInputCapture,
    ata_weights,
    find_last_self_attention,
    last_token_index,
    recompute_attention_probs,
)


def tiny_llama(impl="sdpa", layers=3, seed=0):
    torch.manual_seed(seed)
    cfg = LlamaConfig(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        attn_implementation=impl,
    )
    return LlamaModel(cfg).eval()


def tiny_bert(impl="sdpa"):
    torch.manual_seed(0)
    cfg = BertConfig(
        vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, attn_implementation=impl
    )
    return BertModel(cfg).eval()


# ----------------------------------------------------------------------------- ATA maths


def test_ata_weights_hand_computed_two_heads_with_padding():
    rng = np.random.default_rng(0)
    n, H = 4, 2
    # example 0: 3 real tokens + 1 pad (right padding); example 1: left padding, 1 pad
    mask = np.array([[1, 1, 1, 0], [0, 1, 1, 1]])
    probs = np.zeros((2, H, n, n))
    for b in range(2):
        for h in range(H):
            for i in range(n):
                logits = rng.normal(size=n)
                logits[mask[b] == 0] = -np.inf  # pad keys get no attention
                p = np.exp(logits - logits[np.isfinite(logits)].max())
                probs[b, h, i] = p / p.sum()
    # by hand: column sums over REAL query rows, head mean, zero pads, normalise
    expected = np.zeros((2, n))
    for b in range(2):
        s = np.zeros(n)
        for j in range(n):
            s[j] = np.mean([sum(probs[b, h, i, j] for i in range(n) if mask[b, i]) for h in range(H)])
        s *= mask[b]
        expected[b] = s / s.sum()
    got = ata_weights(torch.tensor(probs), torch.tensor(mask)).numpy()
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-7)
    assert got[0, 3] == 0 and got[1, 0] == 0
    # pad query rows hold real distributions; including them would change the answer
    wrong = probs.sum(2).mean(1) * mask
    wrong /= wrong.sum(1, keepdims=True)
    assert not np.allclose(wrong, got)
    # a pooled subset renormalises over that subset only
    pool = torch.tensor([[0, 1, 1, 1], [1, 1, 1, 1]])
    sub = ata_weights(torch.tensor(probs), torch.tensor(mask), pool).numpy()
    assert sub[0, 0] == 0 and abs(sub[0].sum() - 1) < 1e-6
    np.testing.assert_allclose(sub[0, 1:3], expected[0, 1:3] / expected[0, 1:3].sum(), rtol=1e-5)


def test_last_token_index_left_and_right_padding():
    m = torch.tensor([[1, 1, 0, 0], [0, 0, 1, 1], [1, 1, 1, 1]])
    assert last_token_index(m).tolist() == [1, 3, 3]


@pytest.mark.parametrize("bidir", ["none", "all"])
def test_recomputed_llama_attention_matches_eager(bidir):
    m = tiny_llama("eager")
    h = make_bidirectional(m, bidir)
    cap = _AttentionInputCapture(find_last_self_attention(m))
    ids = torch.randint(0, 64, (2, 7))
    am = torch.ones(2, 7, dtype=torch.long)
    am[1, 5:] = 0
    ref = m(input_ids=ids, attention_mask=am, output_attentions=True).attentions[-1]
    hs, pe = cap.pop()
    got = recompute_attention_probs(cap.attn, hs, am, pe)
    real = am.bool()
    for b in range(2):  # compare real query rows (pad rows are excluded from ATA anyway)
        torch.testing.assert_close(got[b][:, real[b]], ref[b][:, real[b]].float(), atol=1e-5, rtol=1e-4)
    if h:
        h.remove()


def test_recomputed_bert_attention_matches_eager():
    m = tiny_bert("eager")
    cap = _AttentionInputCapture(find_last_self_attention(m))
    ids = torch.randint(0, 64, (2, 6))
    am = torch.tensor([[1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 0, 0]])
    ref = m(input_ids=ids, attention_mask=am, output_attentions=True).attentions[-1]
    hs, pe = cap.pop()
    got = recompute_attention_probs(cap.attn, hs, am, pe)
    torch.testing.assert_close(got[:, :, :4], ref[:, :, :4].float(), atol=1e-5, rtol=1e-4)


# ----------------------------------------------------------------------------- bidirectional


def _hidden(m, ids, am):
    with torch.no_grad():
        return m(input_ids=ids, attention_mask=am, output_hidden_states=True).hidden_states


@pytest.mark.parametrize("impl", ["sdpa", "eager"])
def test_bidirectional_all_and_last_k(impl):
    m = tiny_llama(impl, layers=4)
    ids = torch.randint(0, 64, (2, 8))
    am = torch.ones(2, 8, dtype=torch.long)
    am[1, 6:] = 0
    ids2 = ids.clone()
    ids2[:, 4] = (ids[:, 4] + 1) % 64  # change a LATER token

    def early_changes():  # per hidden_states entry (0 = embeddings, k = after layer k)
        a, b = _hidden(m, ids, am), _hidden(m, ids2, am)
        return [(x[:, :4] - y[:, :4]).abs().max().item() for x, y in zip(a, b)]

    assert max(early_changes()) == 0.0  # causal: earlier tokens never see token 4
    h = make_bidirectional(m, "last:2")
    d = early_changes()
    assert d[0] == d[1] == d[2] == 0.0 and d[3] > 1e-4 and d[4] > 1e-4  # only layers 3, 4 react
    h.remove()
    assert max(early_changes()) == 0.0  # remove() restores causal attention
    h = make_bidirectional(m, "all")
    d = early_changes()
    assert d[0] == 0.0 and all(x > 1e-4 for x in d[1:])
    # padding mask kept: changing pad tokens does not move real tokens
    ids3 = ids.clone()
    ids3[1, 6:] = (ids[1, 6:] + 7) % 64
    a, b = _hidden(m, ids, am), _hidden(m, ids3, am)
    assert (a[-1][1, :6] - b[-1][1, :6]).abs().max().item() == 0.0
    h.remove()


def test_parse_mode_errors_name_the_fix():
    assert parse_mode("last:1", 4) == [3]
    with pytest.raises(ValueError, match="last:K"):
        parse_mode("last", 4)
    with pytest.raises(ValueError, match="only 4 layers"):
        parse_mode("last:9", 4)


# ----------------------------------------------------------------------------- sampler and loss


def info_nce(q, d_pos, d_neg=None, temperature=0.02):
    """The spec's InfoNCE (SEED_SPEC §1.6) on embeddings ``[B, d]``: in-batch and hard negatives, no query-query terms."""
    docs = d_pos if d_neg is None else torch.cat([d_pos, d_neg], 0)
    scores = torch.nn.functional.normalize(q, dim=-1) @ torch.nn.functional.normalize(docs, dim=-1).T / temperature
    return torch.nn.functional.cross_entropy(scores, torch.arange(q.shape[0]))


def test_mnrl_equals_info_nce():
    from sentence_transformers.sentence_transformer.losses import MultipleNegativesRankingLoss

    torch.manual_seed(0)
    q, p, n = torch.randn(6, 8), torch.randn(6, 8), torch.randn(6, 8)

    class Fake(torch.nn.Module):  # MNRL only calls model(features) -> sentence_embedding
        def forward(self, f):
            return {"sentence_embedding": f["x"]}

    loss = make_loss(Fake(), temperature=0.05)
    assert isinstance(loss, MultipleNegativesRankingLoss) and loss.scale == pytest.approx(20.0)
    got = loss([{"x": q}, {"x": p}, {"x": n}], None)
    torch.testing.assert_close(got, info_nce(q, p, n, 0.05))


# ----------------------------------------------------------------------------- training and reload


def _dataset(n=16, seed=0):
    """Arbitrary code-word pairs: a pretrained model cannot already solve them, so loss must be learnt."""
    from datasets import Dataset

    rng = np.random.default_rng(seed)
    words = [
        "amber",
        "basalt",
        "cobalt",
        "dune",
        "ember",
        "fjord",
        "garnet",
        "heron",
        "iris",
        "jade",
        "kelp",
        "lichen",
        "marl",
        "nickel",
        "onyx",
        "pumice",
        "quartz",
        "rust",
        "slate",
        "topaz",
    ]
    rows = []
    for i in range(n):
        w = rng.choice(words, 3, replace=False)
        rows.append(
            {
                "anchor": f"Instruct: Retrieve the matching code\nQuery: code {i} {w[0]}",
                "positive": f"{w[1]} {w[2]} {i * 7}",
                "negative": f"{w[2]} {w[0]} {i * 3 + 1}",
                "level": 4 - (i * 4) // n,
                "phase": (i * 4) // n,
                "task_type": "short-short",
                "example_id": f"ex{i}",
            }
        )
    return Dataset.from_list(rows)


def _dataset_loss(model, ds, temperature):
    with torch.no_grad():
        e = [model.encode(ds[c], convert_to_tensor=True, batch_size=64) for c in ("anchor", "positive", "negative")]
    return info_nce(*e, temperature=temperature).item()


def test_minilm_training_reduces_loss_and_logs_phase(minilm, tmp_path):
    import json

    from sentence_transformers import SentenceTransformer

    from negsynth.train.trainer import train

    ds = _dataset(8)
    before = _dataset_loss(SentenceTransformer(minilm, device="cpu"), ds, 0.05)
    cfg = TrainConfig(
        model=minilm,
        pooling="mean",
        batch_size=2,
        grad_accum=1,
        lr=3e-4,
        epochs=2,
        max_length=32,
        save_steps=1000,
        output_dir=str(tmp_path / "run"),
        temperature=0.05,
    )
    out = train(ds, cfg)
    after = _dataset_loss(SentenceTransformer(out, device="cpu", trust_remote_code=True), ds, 0.05)
    assert after < 0.7 * before, (before, after)
    hist = [r for r in json.loads(open(f"{out}/train_log.json").read())["log_history"] if "loss" in r]
    assert len(hist) == 8
    # one batch = one phase, logged in curriculum order 0,1,2,3 in each epoch (the sampler keeps the order)
    assert [r["phase"] for r in hist] == [0, 1, 2, 3, 0, 1, 2, 3]
    assert [r["level"] for r in hist[:4]] == [4, 3, 2, 1]


@pytest.mark.parametrize("pooling", ["mean", "ata", "latent"])
def test_saved_model_reloads_with_its_pooling(minilm, tmp_path, pooling):
    from sentence_transformers import SentenceTransformer

    from negsynth.train.trainer import build_model

    cfg = TrainConfig(model=minilm, pooling=pooling, latent_num=16, max_length=32)
    m = build_model(cfg, device="cpu")
    if pooling == "latent":  # make the latent weights non-default so a failed load would show
        with torch.no_grad():
            m[1].latents.add_(0.5)
    texts = ["a cat sat on the mat", "rivers flow to the sea and further on", "x"]
    e1 = m.encode(texts, convert_to_numpy=True)
    m.save(str(tmp_path / "m"))
    m2 = SentenceTransformer(str(tmp_path / "m"), device="cpu", trust_remote_code=True)
    assert type(m2[1]).__name__ == type(m[1]).__name__
    e2 = m2.encode(texts, convert_to_numpy=True)
    np.testing.assert_allclose(e1, e2, atol=1e-5)
    if pooling == "ata":  # ATA differs from mean pooling on the same backbone
        mean = build_model(TrainConfig(model=minilm, pooling="mean", max_length=32), device="cpu").encode(texts, convert_to_numpy=True)
        assert np.abs(mean - e1).max() > 1e-3


def need_smollm2() -> None:
    try:
        from negsynth.embed.hf import resolve_decoder_path

        resolve_decoder_path("default")
    except Exception as e:  # noqa: BLE001
        pytest.skip(f"SmolLM2 not available: {e}")


def smollm2_config(tmp_path, **settings) -> TrainConfig:
    """A short SmolLM2 run on CPU (batches of 4, no accumulation, no checkpoints) into
    ``tmp_path/run``; skips where SmolLM2 is not installed."""
    need_smollm2()
    return TrainConfig(model="smollm2", batch_size=4, grad_accum=1, save_steps=1000, output_dir=str(tmp_path / "run"), **settings)


@pytest.mark.slow
def test_smollm2_lora_bidirectional_ata_training_reduces_loss(tmp_path):
    from sentence_transformers import SentenceTransformer

    from negsynth.train.trainer import build_model, resolve_temperature, train

    cfg = smollm2_config(tmp_path, pooling="ata", bidirectional="last:2", lora={"enabled": True}, lr=1e-3, epochs=2, max_length=24)
    ds = _dataset(8)
    tau = resolve_temperature(cfg, is_decoder=True)  # the decoder family's default, 0.02
    before = _dataset_loss(build_model(cfg, device="cpu"), ds, tau)
    out = train(ds, cfg)
    m2 = SentenceTransformer(out, device="cpu", trust_remote_code=True)
    assert type(m2[1]).__name__ == "BidirectionalAttention" and m2[2].mode == "ata"
    after = _dataset_loss(m2, ds, tau)
    assert after < before, (before, after)


def test_ata_leaves_the_instruction_out_and_keeps_it_so_after_a_reload(minilm, tmp_path):
    from sentence_transformers import SentenceTransformer

    from negsynth.train.trainer import build_model

    m = build_model(TrainConfig(model=minilm, pooling="ata", max_length=32), device="cpu")
    assert m[1].ata_pool == "embed_mask"
    m.save(str(tmp_path / "m"))
    assert SentenceTransformer(str(tmp_path / "m"), device="cpu", trust_remote_code=True)[1].ata_pool == "embed_mask"


def test_a_pooling_config_saved_before_ata_pool_existed_loads_as_all_and_drops_ata_detach(tmp_path):
    import json

    from negsynth.train.pooling import EmbeddingPooling

    (tmp_path / "config.json").write_text(json.dumps({"embedding_dimension": 8, "mode": "ata", "ata_detach": False}))
    assert EmbeddingPooling.load(str(tmp_path)).ata_pool == "all"
    # what the model was trained with wins over the loading model's defaults
    assert EmbeddingPooling.load(str(tmp_path), init_defaults={"ata_pool": "embed_mask"}).ata_pool == "all"


# ----------------------------------------------------------------------------- BeLLM recipe


def test_bellm_recipe_sets_what_the_seed_defines_and_explicit_fields_win():
    from negsynth.schemas.train import BELLM_RECIPE

    c = TrainConfig(model="smollm2", recipe="bellm")
    assert (c.bidirectional, c.pooling, c.temperature, c.infonce_weight, c.angle_weight, c.lr) == ("last:1", "last", 0.05, 20.0, 1.0, 2e-4)
    assert c.text_template == 'The representative word for sentence {text} is:"' and c.text_preprocess == "bellm"
    assert (c.lora.enabled, c.lora.r, c.lora.alpha, c.lora.dropout) == (True, 32, 32, 0.1)
    # the ablations of the paper: same recipe, other attention
    assert TrainConfig(model="smollm2", recipe="bellm", bidirectional="none").bidirectional == "none"
    assert TrainConfig(model="smollm2", recipe="bellm", lr=1e-3).lr == 1e-3
    assert TrainConfig().text_template is None and TrainConfig().angle_weight == 0.0 and set(BELLM_RECIPE) <= set(TrainConfig.model_fields)
    with pytest.raises(ValueError, match="exactly one"):
        TrainConfig(text_template="no slot")


def test_bellm_text_format_and_clean_up():
    from negsynth.embed.text import TextFormat, bellm_clean

    assert (
        bellm_clean(" Is it raining? ") == "Is it raining." and bellm_clean("a dog runs") == "a dog runs." and bellm_clean("ok.") == "ok."
    )
    f = TextFormat('The representative word for sentence {text} is:"', "bellm")
    assert f.apply("A man plays {guitar}") == 'The representative word for sentence A man plays {guitar}. is:"'
    assert TextFormat().is_identity and not f.is_identity


def test_angle_infonce_loss_is_the_weighted_sum_of_the_library_losses():
    from sentence_transformers.sentence_transformer.losses import AnglELoss

    from negsynth.train.loss import make_angle_infonce_loss

    torch.manual_seed(0)
    q, p, n1, n2 = (torch.randn(5, 8) for _ in range(4))

    class Fake(torch.nn.Module):
        def forward(self, f):
            return {"sentence_embedding": f["x"]}

    fake = Fake()
    feats = [{"x": t} for t in (q, p, n1, n2)]
    only_nce = make_angle_infonce_loss(fake, 0.05, infonce_weight=1.0, angle_weight=0.0)(feats, None)
    torch.testing.assert_close(only_nce, make_loss(fake, 0.05)(feats, None))
    both = make_angle_infonce_loss(fake, 0.05, infonce_weight=20.0, angle_weight=1.0, angle_scale=20.0)(feats, None)
    angle = AnglELoss(fake, scale=20.0).compute_loss_from_embeddings(
        [torch.cat([q, q, q]), torch.cat([p, n1, n2])], torch.tensor([1.0] * 5 + [0.0] * 10)
    )
    torch.testing.assert_close(both, 20.0 * only_nce + angle)
    # the AnglE term prefers positives above negatives: it is lower when they are apart
    apart = make_angle_infonce_loss(fake, 0.05, angle_weight=1.0)([{"x": q}, {"x": q + 0.01}, {"x": -q}], None)
    close = make_angle_infonce_loss(fake, 0.05, angle_weight=1.0)([{"x": q}, {"x": -q}, {"x": q + 0.01}], None)
    assert apart < close


@pytest.mark.slow
def test_bellm_recipe_trains_smollm2_and_negsynth_loads_it_with_its_prompt(tmp_path):
    import json

    from sentence_transformers import SentenceTransformer

    from negsynth.embed.st import SentenceTransformerEmbedder
    from negsynth.embed.text import load_text_format
    from negsynth.train.trainer import train

    cfg = smollm2_config(tmp_path, recipe="bellm", epochs=1, max_length=32)
    ds = _dataset(8)
    out = train(ds, cfg)
    fmt = load_text_format(out)
    assert fmt is not None and fmt.template == cfg.text_template and fmt.preprocess == "bellm"
    assert json.loads(open(f"{out}/train_log.json").read())["config"]["recipe"] == "bellm"
    plain = SentenceTransformer(out, device="cpu", trust_remote_code=True)
    assert type(plain[1]).__name__ == "BidirectionalAttention" and plain[1].mode == "last:1"
    # the pooled token is the prompt's last one: no EOS appended
    ids = plain.tokenizer(fmt.apply("a dog runs"))["input_ids"]
    assert ids[-1] != plain.tokenizer.eos_token_id
    texts = ["a dog runs", "Is it raining?"]
    ours = SentenceTransformerEmbedder.load(out, device="cpu").encode(texts)
    theirs = plain.encode([fmt.apply(t) for t in texts], normalize_embeddings=True)
    np.testing.assert_allclose(ours, theirs, atol=1e-5)


def test_installed_transformers_accepts_the_installed_peft():
    """LoRA goes through transformers' peft integration, which refuses a peft older than it wants."""
    pytest.importorskip("peft")
    from transformers.integrations import peft as tf_peft
    from transformers.utils.peft_utils import check_peft_version

    check_peft_version(tf_peft.MIN_PEFT_VERSION)  # raises ValueError on a pair that cannot add or load an adapter


def test_add_lora_turns_transformers_peft_refusal_into_one_line():
    from negsynth.errors import UserError
    from negsynth.schemas.train import LoraSettings
    from negsynth.train.lora import add_lora

    class Backbone(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.q_proj = torch.nn.Linear(2, 2)

    class First:
        auto_model = Backbone()

    class Model(list):
        def add_adapter(self, cfg):
            raise ValueError("The version of PEFT you are using is not compatible, please use a version >= 9.0.0")

    with pytest.raises(UserError, match=r"pip install 'transformers<5.24'"):
        add_lora(Model([First()]), LoraSettings(enabled=True, targets=["q_proj"]), is_decoder=True)


# ----------------------------------------------------------------------------- memory settings


def test_mini_batch_size_picks_cached_mnrl_at_the_same_scale():
    """mini_batch_size -> GradCache (CachedMNRL) at the same scale; None keeps plain MNRL."""
    from sentence_transformers.sentence_transformer.losses import CachedMultipleNegativesRankingLoss, MultipleNegativesRankingLoss

    class Fake(torch.nn.Sequential):  # CachedMNRL reads model[0]
        pass

    plain = make_loss(Fake(torch.nn.Identity()), temperature=0.05)
    cached = make_loss(Fake(torch.nn.Identity()), temperature=0.05, mini_batch_size=2)
    assert type(plain) is MultipleNegativesRankingLoss
    assert isinstance(cached, CachedMultipleNegativesRankingLoss) and cached.mini_batch_size == 2 and cached.scale == pytest.approx(20.0)


def test_memory_options_reach_the_trainer(minilm, tmp_path):
    """train.mini_batch_size -> CachedMNRL; attn_implementation and gradient_checkpointing -> the backbone."""
    from sentence_transformers.sentence_transformer.losses import CachedMultipleNegativesRankingLoss

    from negsynth.train.trainer import make_trainer

    ds = _dataset(4)
    cfg = TrainConfig(
        model=minilm,
        batch_size=2,
        max_steps=1,
        max_length=16,
        output_dir=str(tmp_path / "run"),
        mini_batch_size=1,
        attn_implementation="eager",
        gradient_checkpointing=True,
    )
    trainer, model = make_trainer(ds, cfg)
    assert isinstance(trainer.loss, CachedMultipleNegativesRankingLoss) and trainer.loss.mini_batch_size == 1
    backbone = model[0].auto_model
    assert backbone.config._attn_implementation == "eager"
    assert backbone.is_gradient_checkpointing
    with pytest.raises(ValueError, match="mini_batch_size"):
        make_trainer(ds, cfg.model_copy(update={"angle_weight": 1.0}))


@pytest.mark.parametrize(
    ("setting", "per_device", "device", "extra", "want"),
    [
        ("auto", 32, "cpu", {}, 8),  # the recipe's batch on CPU: GradCache in 8-row chunks
        ("auto", 8, "cpu", {}, None),  # one chunk would be the whole batch: plain MNRL
        ("auto", 32, "cuda", {}, None),  # an accelerator: speed first
        ("auto", 32, "cpu", {"angle_weight": 1.0}, None),  # AnglE + InfoNCE: GradCache does not cover it
        ("auto", 32, "cpu", {"infonce_weight": 0.5}, None),
        (None, 32, "cpu", {}, None),
        (4, 32, "cuda", {}, 4),  # an explicit size is kept as given
    ],
)
def test_mini_batch_size_auto_is_gradcache_on_cpu_for_infonce_alone(setting, per_device, device, extra, want):
    from negsynth.train.trainer import resolve_mini_batch_size

    cfg = TrainConfig(mini_batch_size=setting, **extra)
    assert resolve_mini_batch_size(cfg, per_device, device) == want


def test_mini_batch_size_default_is_auto_and_rejects_nonsense():
    assert TrainConfig().mini_batch_size == "auto"
    for bad in (0, "eight", -1):
        with pytest.raises(ValueError):
            TrainConfig(mini_batch_size=bad)


def test_auto_mini_batch_reaches_the_trainer_and_keeps_angle_configs_working(minilm, tmp_path):
    """The default ("auto") trains a CPU batch of 12 rows with CachedMNRL in 8-row chunks; the
    AnglE + InfoNCE loss under the default still builds (plain, no error)."""
    from sentence_transformers.sentence_transformer.losses import CachedMultipleNegativesRankingLoss, MultipleNegativesRankingLoss

    from negsynth.train.trainer import make_trainer

    ds = _dataset(12)
    # on CPU (device "cpu": "auto" picks a GPU where there is one, and there auto means plain MNRL)
    cfg = TrainConfig(model=minilm, batch_size=12, max_steps=1, max_length=16, output_dir=str(tmp_path / "run"), device="cpu")
    trainer, _ = make_trainer(ds, cfg)
    assert isinstance(trainer.loss, CachedMultipleNegativesRankingLoss) and trainer.loss.mini_batch_size == 8
    trainer, _ = make_trainer(ds, cfg.model_copy(update={"batch_size": 8}))
    assert type(trainer.loss) is MultipleNegativesRankingLoss
    trainer, _ = make_trainer(ds, cfg.model_copy(update={"angle_weight": 1.0}))
    assert not isinstance(trainer.loss, CachedMultipleNegativesRankingLoss)


@pytest.mark.parametrize("pooling", ["mean", "ata", "latent"])
def test_auto_gradcache_trains_the_other_poolings(minilm, tmp_path, pooling):
    """GradCache re-embeds each chunk with gradients: ATA's attention hook and the latent pooler
    must train under it as under plain MNRL (one step, finite loss, weights moved)."""
    from sentence_transformers.sentence_transformer.losses import CachedMultipleNegativesRankingLoss

    from negsynth.train.trainer import make_trainer

    cfg = TrainConfig(
        model=minilm,
        pooling=pooling,
        latent_num=16,
        batch_size=12,
        max_steps=1,
        max_length=16,
        warmup_ratio=0.0,
        lr=1e-3,
        output_dir=str(tmp_path / "run"),
        device="cpu",
    )
    trainer, model = make_trainer(_dataset(12), cfg)
    assert isinstance(trainer.loss, CachedMultipleNegativesRankingLoss)
    before = [p.detach().clone() for p in model.parameters() if p.requires_grad]
    trainer.train()
    losses = [e["loss"] for e in trainer.state.log_history if "loss" in e]
    assert losses and all(np.isfinite(losses))
    after = [p.detach() for p in model.parameters() if p.requires_grad]
    assert any(not torch.equal(a, b) for a, b in zip(before, after, strict=True))


def test_train_log_and_stage_summary_say_when_gradcache_trained(minilm, tmp_path):
    import json

    from negsynth.stages.train import report
    from negsynth.train.trainer import train

    cfg = TrainConfig(model=minilm, batch_size=12, max_steps=1, max_length=16, output_dir=str(tmp_path / "run"), device="cpu")
    out = train(_dataset(12), cfg)
    saved = json.loads((tmp_path / "run" / "final" / "train_log.json").read_text())
    assert out.endswith("final") and saved["loss"] == {"class": "CachedMultipleNegativesRankingLoss", "mini_batch_size": 8}
    stats = {"model": out, "steps": 1, "loss_first": 1.0, "loss_last": 0.5, "wall_time_s": 1.0, "peak_rss_mib": 1461}
    rows = dict(report(stats | {"gradcache_rows": 8})[0].rows)
    assert rows["peak memory"] == "1461 MiB (GradCache, 8-row chunks)"
    assert dict(report(stats | {"gradcache_rows": None})[0].rows)["peak memory"] == "1461 MiB"


def test_train_device_places_the_model_and_the_trainer_and_refuses_a_missing_gpu(minilm, tmp_path, monkeypatch):
    """``train.device = "cpu"`` keeps the model and the HF trainer on the CPU even where a GPU is
    visible; "auto" takes the GPU when torch sees one; a GPU asked for where there is none is a
    one-line refusal, and so is bf16 on the CPU."""
    from negsynth.train.trainer import make_trainer, train_device

    cfg = TrainConfig(model=minilm, batch_size=8, max_steps=1, max_length=16, output_dir=str(tmp_path / "run"), device="cpu")
    trainer, model = make_trainer(_dataset(8), cfg)
    assert model.device.type == "cpu" and trainer.args.use_cpu and trainer.args.device.type == "cpu"
    assert not trainer.args.bf16 and not trainer.args.fp16
    with pytest.raises(ValueError, match="needs a GPU; use 'auto' or 'fp32' on cpu"):
        make_trainer(_dataset(8), cfg.model_copy(update={"precision": "bf16"}))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: False)
    assert train_device(cfg.model_copy(update={"device": "auto"})) == "cpu"
    with pytest.raises(ValueError, match="train.device = 'cuda' but torch sees no such device"):
        train_device(cfg.model_copy(update={"device": "cuda"}))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert train_device(cfg.model_copy(update={"device": "auto"})) == "cuda"
    with pytest.raises(ValueError):
        TrainConfig(device="gpu")


def test_auto_trains_on_a_gpu_in_mixed_precision(minilm, tmp_path):
    """Where torch sees a CUDA GPU, the default device and precision train there in bf16 (fp16 on
    GPUs without it) with plain MNRL (GradCache's "auto" is for the CPU): one step, finite loss."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    from negsynth.train.trainer import make_trainer

    cfg = TrainConfig(model=minilm, batch_size=12, max_steps=1, max_length=16, output_dir=str(tmp_path / "run"))
    trainer, model = make_trainer(_dataset(12), cfg)
    assert model.device.type == "cuda" and not trainer.args.use_cpu and (trainer.args.bf16 or trainer.args.fp16)
    assert type(trainer.loss).__name__ == "MultipleNegativesRankingLoss"
    trainer.train()
    losses = [e["loss"] for e in trainer.state.log_history if "loss" in e]
    assert losses and all(np.isfinite(losses))


def test_peak_rss_sees_an_allocation():
    from negsynth.train.memory import PeakRSS, current_rss

    assert current_rss() > 0
    with PeakRSS(interval=0.01) as m:
        block = np.ones(64 * 2**20 // 8)  # 64 MiB, touched
        block[::512] = 2.0
        import time

        time.sleep(0.05)
    assert m.peak_mib >= 64
    del block


def test_cached_mnrl_gives_mnrl_loss_and_gradients_without_dropout(minilm):
    """GradCache changes memory, not maths: with dropout off, CachedMNRL (chunks of 2 rows) gives
    MNRL's loss and gradients on the same batch. (In training the two draw dropout masks in a
    different order, so their loss curves agree only within that noise.)"""
    from negsynth.train.trainer import build_model

    ds = _dataset(4)
    torch.manual_seed(0)
    model = build_model(TrainConfig(model=minilm, max_length=16), device="cpu")
    model.eval()  # no dropout: both losses see the same embeddings
    feats = [model.preprocess(ds[c]) for c in ("anchor", "positive", "negative")]
    results = []
    for mb in (None, 2):
        model.zero_grad(set_to_none=True)
        value = make_loss(model, 0.05, mini_batch_size=mb)(
            [{k: v.clone() if torch.is_tensor(v) else v for k, v in f.items()} for f in feats], None
        )
        value.backward()
        grad = model[0].auto_model.encoder.layer[0].attention.self.query.weight.grad.clone()
        results.append((value.detach(), grad))
    torch.testing.assert_close(results[0][0], results[1][0], atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(results[0][1], results[1][1], atol=1e-5, rtol=1e-3)


def test_where_training_runs_is_not_part_of_what_the_model_is_made_from(tmp_path):
    """``train.device`` leaves the train stage's fingerprint alone (a run dir made before the setting
    existed keeps its model), while a setting that shapes the model changes it."""
    from negsynth.pipeline.context import StageContext
    from negsynth.schemas.config import RunConfig
    from negsynth.stages.train import STAGE

    def fp(**train) -> str:
        cfg = RunConfig()
        cfg.train = cfg.train.model_copy(update=train)
        return STAGE.made_from(StageContext(cfg=cfg, run_dir=tmp_path))

    assert fp() == fp(device="cpu") == fp(device="cuda")
    assert fp(lr=1e-4) != fp()


def test_the_shuffled_sampler_is_the_stock_recipes_and_refuses_a_curriculum(minilm, tmp_path):
    """batch_sampler = "shuffled" hands one-phase rows to sentence-transformers' NO_DUPLICATES
    sampler (seeded: the same batches twice, another order than the rows'); rows of several
    curriculum phases are refused in one line, since a shuffle would mix them."""
    from sentence_transformers.base.sampler import NoDuplicatesBatchSampler

    from negsynth.train.trainer import make_trainer

    ds = _dataset(12).map(lambda r: {"phase": 1})
    cfg = TrainConfig(model=minilm, batch_size=4, max_steps=1, max_length=16, output_dir=str(tmp_path / "run"), batch_sampler="shuffled")

    def batches():
        trainer, _ = make_trainer(ds, cfg)
        sampler = trainer.get_train_dataloader().batch_sampler
        assert isinstance(getattr(sampler, "batch_sampler", sampler), NoDuplicatesBatchSampler)
        return [list(b) for b in sampler]

    first = batches()
    assert first == batches() and sorted(i for b in first for i in b) == list(range(12))
    assert [i for b in first for i in b] != list(range(12))
    with pytest.raises(ValueError, match="batch_sampler = 'shuffled'"):
        make_trainer(_dataset(12), cfg)
    # the default keeps the rows' order
    trainer, _ = make_trainer(ds, cfg.model_copy(update={"batch_sampler": "ordered"}))
    assert [i for b in trainer.get_train_dataloader().batch_sampler for i in b] == list(range(12))


# ----------------------------------------------------------------------------- distillation losses


def _teacher_dataset(n: int = 8):
    """n-tuple rows (anchor, positive, negative_1, negative_2) with a teacher's scores as the
    curriculum writes them: ``label`` = [positive, negative_1, negative_2]."""
    from datasets import Dataset

    rows = [
        {
            "anchor": f"which metal is number {i}?",
            "positive": f"metal {i} conducts heat",
            "negative_1": f"rock {i} is grey",
            "negative_2": f"river {i} flows north",
            "label": [1.8, 1.2 - i / 100, 0.4],
            "level": 0,
            "phase": 1,
        }
        for i in range(n)
    ]
    return Dataset.from_list(rows)


def _fake_loss_model():
    class Fake(torch.nn.Module):
        def forward(self, f):
            return {"sentence_embedding": f["x"]}

    return Fake()


def test_distillation_losses_are_the_librarys_and_the_mix_is_their_weighted_sum():
    from sentence_transformers.sentence_transformer.losses import DistillKLDivLoss, MarginMSELoss
    from sentence_transformers.util import pairwise_cos_sim

    from negsynth.train.loss import WeightedSumLoss, make_distill_loss

    torch.manual_seed(0)
    fake = _fake_loss_model()
    q, p, n1, n2 = (torch.randn(5, 8) for _ in range(4))
    feats = [{"x": t} for t in (q, p, n1, n2)]
    labels = torch.tensor([[1.8, 1.1, 0.3]] * 5)
    mse = make_distill_loss(fake, "margin-mse", temperature=0.05)
    assert isinstance(mse, MarginMSELoss)
    torch.testing.assert_close(mse(feats, labels), MarginMSELoss(fake, similarity_fct=pairwise_cos_sim)(feats, labels))
    kl = make_distill_loss(fake, "distill-kl", temperature=0.05)
    assert isinstance(kl, DistillKLDivLoss) and kl.temperature == 1.0  # the library's default temperature
    assert make_distill_loss(fake, "distill-kl", temperature=0.05, distill_temperature=0.5).temperature == 0.5
    # the student's and the teacher's temperatures apart: at 1.0 the softmax over cosines in
    # [-1, 1] is nearly flat, at the student's own 0.05 it is not
    split = make_distill_loss(fake, "distill-kl", temperature=0.05, distill_temperature=0.05, distill_teacher_temperature=0.2)
    assert (split.student_temperature, split.teacher_temperature) == (0.05, 0.2)
    s = torch.stack([pairwise_cos_sim(q, x) for x in (p, n1, n2)], dim=1)
    t = labels / 0.2
    want = torch.nn.functional.kl_div(torch.log_softmax(s / 0.05, 1), torch.softmax(t, 1), reduction="batchmean") * 0.05**2
    torch.testing.assert_close(split(feats, labels), want)
    mix = make_distill_loss(fake, "mnrl+distill-kl", temperature=0.05, distill_weight=3.0)
    assert isinstance(mix, WeightedSumLoss)
    torch.testing.assert_close(mix(feats, labels), make_loss(fake, 0.05)(feats, labels) + 3.0 * kl(feats, labels))
    # the KL term follows the teacher: lower when the student orders the candidates as it does
    agree = kl([{"x": q}, {"x": q + 0.01}, {"x": q + 0.5 * torch.randn(5, 8)}, {"x": -q}], labels)
    disagree = kl([{"x": q}, {"x": -q}, {"x": q + 0.5 * torch.randn(5, 8)}, {"x": q + 0.01}], labels)
    assert agree < disagree
    with pytest.raises(ValueError, match="distillation loss"):
        make_distill_loss(fake, "mnrl", temperature=0.05)


@pytest.mark.parametrize("loss", ["margin-mse", "distill-kl", "mnrl+distill-kl"])
def test_each_distillation_loss_trains_minilm(minilm, tmp_path, loss):
    """The curriculum's label column reaches the loss: a finite loss every step, and the weights move."""
    import json
    import math

    from negsynth.train.trainer import make_trainer

    cfg = TrainConfig(
        model=minilm, loss=loss, batch_size=4, grad_accum=1, lr=1e-4, max_steps=2, max_length=16, save_steps=1000, output_dir=str(tmp_path)
    )
    trainer, model = make_trainer(_teacher_dataset(8), cfg)
    assert "label" in trainer.train_dataset.column_names
    assert type(trainer.loss).__name__ == {"margin-mse": "MarginMSELoss", "distill-kl": "DistillKLDivLoss"}.get(loss, "WeightedSumLoss")
    # GradCache ("auto" on CPU) is InfoNCE's alone: a distillation loss trains without it
    assert getattr(trainer.loss, "mini_batch_size", None) is None
    before = model[0].auto_model.encoder.layer[0].attention.self.query.weight.detach().clone()
    trainer.train()
    losses = [r["loss"] for r in trainer.state.log_history if "loss" in r]
    assert len(losses) == 2 and all(math.isfinite(x) for x in losses), losses
    after = model[0].auto_model.encoder.layer[0].attention.self.query.weight.detach()
    assert not torch.equal(before, after)
    json.dumps(trainer.loss.get_config_dict() if hasattr(trainer.loss, "get_config_dict") else {})


def test_a_distillation_loss_without_teacher_scores_is_refused_in_one_line(minilm, tmp_path):
    from negsynth.train.trainer import make_trainer

    cfg = TrainConfig(model=minilm, loss="distill-kl", batch_size=4, max_steps=1, max_length=16, output_dir=str(tmp_path))
    with pytest.raises(ValueError, match='corpus.teacher = "cross-encoder"') as e:
        make_trainer(_teacher_dataset(8).remove_columns("label"), cfg)
    assert "\n" not in str(e.value)
    short = _teacher_dataset(8).map(lambda r: {"label": r["label"][:2]})
    with pytest.raises(ValueError, match="holds 2 scores, not 3"):
        make_trainer(short, cfg)
    with pytest.raises(ValueError, match="GradCache"):
        make_trainer(_teacher_dataset(8), cfg.model_copy(update={"mini_batch_size": 2}))
    # InfoNCE (the default) trains on the same rows, the label left out of its inputs
    trainer, _ = make_trainer(_teacher_dataset(8), cfg.model_copy(update={"loss": "mnrl"}))
    assert trainer.train_dataset.column_names == ["anchor", "positive", "negative_1", "negative_2"]


def test_the_train_stage_names_the_teacher_setting_when_the_curriculum_has_no_scores(minilm, tmp_path):
    from negsynth.data.curriculum import build_curriculum, save_curriculum
    from negsynth.errors import UserError
    from negsynth.pipeline.context import StageContext
    from negsynth.schemas.config import RunConfig
    from negsynth.stages.train import run

    exs = [
        {
            "id": f"e{i}",
            "task": "",
            "task_type": "short-long",
            "query": f"q {i}",
            "positive": f"p {i}",
            "negatives": [f"n{k} {i}" for k in range(4)],
        }
        for i in range(8)
    ]
    rows = build_curriculum(exs, schedule="tuple", batch_size=2)
    save_curriculum(rows, tmp_path / "curriculum", stats=rows.stats)
    cfg = RunConfig()
    cfg.train = cfg.train.model_copy(update={"model": minilm, "loss": "margin-mse", "batch_size": 2})
    with pytest.raises(UserError, match='corpus.teacher = "cross-encoder"') as e:
        run(StageContext(cfg=cfg, run_dir=tmp_path))
    assert "\n" not in str(e.value)


def test_the_loss_settings_at_their_defaults_leave_older_hashes_alone(tmp_path):
    """``train.loss`` and its weights are settings added later: at their defaults neither the train
    stage's fingerprint nor the run config's hash sees them; set, both change."""
    from negsynth.pipeline.context import StageContext
    from negsynth.schemas.config import ADDED_FIELDS, RunConfig
    from negsynth.schemas.config_io import config_hash
    from negsynth.schemas.section import REMOVED_FIELDS
    from negsynth.stages.train import STAGE

    added = ADDED_FIELDS["TrainConfig"]
    assert set(added) == {"loss", "distill_weight", "distill_temperature", "distill_teacher_temperature"}

    def fp(**train) -> str:
        cfg = RunConfig()
        cfg.train = cfg.train.model_copy(update=train)
        return STAGE.made_from(StageContext(cfg=cfg, run_dir=tmp_path))

    # what the fingerprint was before the settings existed
    old = TrainConfig().model_dump(exclude={"resume", "output_dir", "device", "batch_sampler", *added})
    old.update({gone: value for gone, (_, value) in REMOVED_FIELDS["TrainConfig"].items()})  # removed since, at their old defaults
    assert fp() == config_hash({"train": old, "data": None})
    assert fp(loss="mnrl", distill_weight=1.0) == fp()
    assert len({fp(), fp(loss="distill-kl"), fp(loss="mnrl+distill-kl"), fp(loss="mnrl+distill-kl", distill_weight=0.5)}) == 4
    cfg = RunConfig()
    assert not set(added) & set(cfg.hash_dump()["train"])
    before = config_hash(cfg)
    cfg.train = cfg.train.model_copy(update={"loss": "margin-mse"})
    assert cfg.hash_dump()["train"]["loss"] == "margin-mse" and config_hash(cfg) != before
