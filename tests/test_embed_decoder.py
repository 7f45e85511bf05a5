"""DecoderEmbedder on a tiny random Llama (2 layers, hidden 16) with a word-level tokenizer.

Everything here is built in the test (no network, no files except a tmp SVD cache). Expected
values are computed independently: pooled positions are written out by hand for a known
tokenisation, and embeddings are recomputed from a direct, unpadded model call with numpy.
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("tokenizers")

from helpers import tiny_decoder  # noqa: E402

from negsynth.embed.decoder import DecoderEmbedder  # noqa: E402
from negsynth.embed.decoder_pooling import fuse_attentions  # noqa: E402
from negsynth.embed.embedfilter import filter_window, svd_basis  # noqa: E402

TEXTS = ["the cat sat", "a dog ran far away .", "cat", "the dog sat on the cat"]
ECHO_T = "rewrite : {text} . again : {text}"
EOL_T = 'this sentence : " {text} " means in one word : "'


def _tokenizer():
    from tokenizers import Tokenizer, models, pre_tokenizers, processors

    words = ["<pad>", "<unk>", "<s>", "</s>"]
    corpus = " ".join(TEXTS + [ECHO_T, EOL_T]).replace("{text}", " ")
    for w in corpus.split():
        if w not in words:
            words.append(w)
    tk = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    tk.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tk.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 2)])
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast(tokenizer_object=tk, bos_token="<s>", eos_token="</s>", pad_token="<pad>", unk_token="<unk>")


@pytest.fixture(scope="module")
def tiny():
    tok = _tokenizer()
    return tiny_decoder(len(tok), max_positions=128), tok


def make(tiny, method, **kw):
    model, tok = tiny
    kw.setdefault("echo_template", ECHO_T)
    kw.setdefault("prompteol_template", EOL_T)
    return DecoderEmbedder(model, tok, method=method, model_name="tiny-llama", **kw)


def direct(model, ids, attentions=False):
    """Unpadded single-sequence forward: final hidden states [L, d] (and attention list)."""
    model.set_attn_implementation("eager")
    with torch.no_grad():
        out = model.model(input_ids=torch.tensor([ids]), output_attentions=attentions)
    h = out.last_hidden_state[0].double().numpy()
    if attentions:
        return h, [a[0].double().numpy() for a in out.attentions]
    return h


def toks(emb, item, mask):
    return [t for t, m in zip(emb.tokenizer.convert_ids_to_tokens(item.ids), mask, strict=True) if m]


# ------------------------------------------------------------------- spans and masks


def test_pooled_positions_by_method(tiny):
    text = "the cat sat"
    it = make(tiny, "mean").tokenize(text)
    assert it.pool == [0, 1, 1, 1]  # <s> the cat sat: BOS is not pooled
    e = make(tiny, "prompteol")
    it = e.tokenize(text)
    assert e.tokenizer.convert_ids_to_tokens(it.ids)[-2:] == [":", '"']
    assert it.pool == [0] * (len(it.ids) - 1) + [1]
    e = make(tiny, "echo")
    it = e.tokenize(text)
    # <s> rewrite : the cat sat . again : the cat sat </s>
    assert e.tokenizer.convert_ids_to_tokens(it.ids) == [
        "<s>",
        "rewrite",
        ":",
        "the",
        "cat",
        "sat",
        ".",
        "again",
        ":",
        "the",
        "cat",
        "sat",
        "</s>",
    ]
    assert [i for i, m in enumerate(it.pool) if m] == [9, 10, 11, 12]
    e = make(tiny, "reba", repeat=3)
    it = e.tokenize(text)
    assert toks(e, it, [1] * len(it.ids)) == ["<s>"] + ["the", "cat", "sat"] * 3
    assert [i for i, m in enumerate(it.first) if m] == [1, 2, 3]


def test_truncation_is_per_copy(tiny):
    e = make(tiny, "echo", max_length=2)
    it = e.tokenize("the dog sat on the cat")
    assert toks(e, it, it.pool) == ["the", "dog", "</s>"]
    # <s> rewrite : the dog . again : the dog </s>
    assert len(it.ids) == 1 + 2 + 2 + 1 + 2 + 2 + 1


def test_collate_masks_and_positions(tiny):
    for side in ("left", "right"):
        e = make(tiny, "echo")
        e.padding_side = side
        items = [e.tokenize(t) for t in ("cat", "the cat sat")]
        b = e.collate(items)
        n0, n1 = len(items[0].ids), len(items[1].ids)
        assert b["input_ids"].shape == (2, n1)
        am = b["attention_mask"][0].tolist()
        pad = [0] * (n1 - n0)
        assert am == (pad + [1] * n0 if side == "left" else [1] * n0 + pad)
        real = b["position_ids"][0][b["attention_mask"][0].bool()].tolist()
        assert real == list(range(n0))
        pooled = b["pool"][0].tolist()
        assert pooled == (pad + items[0].pool if side == "left" else items[0].pool + pad)


# ------------------------------------------------------------------- values vs direct computation


@pytest.mark.parametrize("method,pooling", [("mean", "mean"), ("last", "mean"), ("echo", "mean"), ("echo", "last"), ("prompteol", "mean")])
def test_pooling_matches_direct(tiny, method, pooling):
    model, _ = tiny
    e = make(tiny, method, pooling=pooling)
    for text in TEXTS[:2]:
        it = e.tokenize(text)
        h = direct(model, it.ids)
        pos = [i for i, m in enumerate(it.pool) if m]
        want = h[pos[-1]] if (method in ("last", "prompteol") or pooling == "last") else h[pos].mean(0)
        got = e.embed_batch(e.collate([it]))[0]
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def _algorithm1(atts):
    """Literal Algorithm 1 on one sequence: atts = list over layers of [H, L, L]."""
    L = atts[0].shape[-1]
    a_new = np.zeros((L, L))
    for a in atts:
        for q in range(a.shape[0]):
            s = (a[q] + a[q].T) / 2
            a_new = (a_new + s) / 2 + np.abs(a_new - s) / 2
    return a_new


def test_fuse_attentions_vs_numpy_with_padding():
    rng = np.random.default_rng(0)
    B, H, L, n_layers = 3, 2, 6, 3
    lengths = [6, 4, 2]
    atts = []
    for _ in range(n_layers):
        x = rng.normal(size=(B, H, L, L))
        x = np.where(np.tril(np.ones((L, L))) > 0, x, -np.inf)
        atts.append(np.exp(x) / np.exp(x).sum(-1, keepdims=True))
    mask = np.zeros((B, L))
    for b, n in enumerate(lengths):
        mask[b, L - n :] = 1  # left padding; pad rows hold garbage probabilities on purpose
    fused = fuse_attentions([torch.tensor(a) for a in atts], torch.tensor(mask)).numpy()
    for b, n in enumerate(lengths):
        real = slice(L - n, L)
        want = _algorithm1([a[b][:, real, real] for a in atts])
        np.testing.assert_allclose(fused[b, real, real], want, rtol=1e-6, atol=1e-7)
        assert np.all(fused[b][mask[b] == 0] == 0) and np.all(fused[b][:, mask[b] == 0] == 0)
        np.testing.assert_allclose(fused[b], fused[b].T)


@pytest.mark.parametrize("pooling,variant", [("mean", "paper"), ("last", "paper"), ("last", "code")])
def test_reba_matches_manual(tiny, pooling, variant):
    model, _ = tiny
    e = make(tiny, "reba", pooling=pooling, reba_variant=variant, repeat=2)
    text = "a dog ran far away ."
    it = e.tokenize(text)
    h, atts = direct(model, it.ids, attentions=True)
    A = _algorithm1(atts)
    L = len(it.ids)
    first = [i for i, m in enumerate(it.first) if m]
    assert first == list(range(1, 7))
    if pooling == "mean":  # eq. 5: (1/n) sum_i sum_{k>=i} A[i,k] v_k, up to scale
        want = sum(A[i, k] * h[k] for i in first for k in range(i, L))
    elif variant == "paper":  # e_n, n = last token of the first copy
        n = first[-1]
        want = sum(A[n, k] * h[k] for k in range(n, L))
    else:  # code: final token's row over every position
        want = sum(A[L - 1, k] * h[k] for k in range(L))
    got = e.embed_batch(e.collate([it]))[0]
    cos = got @ want / np.linalg.norm(got) / np.linalg.norm(want)
    assert cos > 1 - 1e-9


def test_reba_requests_attentions_only_for_reba(tiny, monkeypatch):
    model, _ = tiny
    seen = []
    orig = model.model.forward

    def spy(*a, **kw):
        seen.append(kw.get("output_attentions", False))
        return orig(*a, **kw)

    monkeypatch.setattr(model.model, "forward", spy)
    for m in ("mean", "echo", "prompteol"):
        e = make(tiny, m)
        e.encode(TEXTS[:2])
    assert seen and not any(seen)
    model.set_attn_implementation("sdpa")
    e = make(tiny, "reba")
    assert model.config._attn_implementation == "eager"  # switched on because ReBA needs probabilities
    seen.clear()
    e.encode(TEXTS[:2])
    assert seen and all(seen)


# ------------------------------------------------------------------- batching / padding invariance


@pytest.mark.parametrize(
    "method,pooling",
    [("mean", "mean"), ("last", "mean"), ("prompteol", "last"), ("echo", "mean"), ("echo", "last"), ("reba", "mean"), ("reba", "last")],
)
def test_left_right_batch_single_agree(tiny, method, pooling):
    model, _ = tiny
    model.set_attn_implementation("sdpa" if method != "reba" else "eager")
    outs = []
    for side in ("left", "right"):
        e = make(tiny, method, pooling=pooling)
        e.padding_side = side
        outs.append(e.encode(TEXTS, batch_size=4))
    single = np.stack([e.encode([t])[0] for t in TEXTS])
    assert outs[0].shape == (len(TEXTS), 16)
    assert len({len(e.tokenize(t).ids) for t in TEXTS}) > 1  # padding really happens
    np.testing.assert_allclose(outs[0], outs[1], atol=2e-5)
    np.testing.assert_allclose(outs[0], single, atol=2e-5)
    np.testing.assert_allclose(np.linalg.norm(single, axis=1), 1, atol=1e-5)


# ------------------------------------------------------------------- EmbedFilter


def test_filter_window():
    assert filter_window(16, 1) == (0, 16)
    assert filter_window(16, 2) == (4, 12)
    assert filter_window(16, 4) == (6, 10)
    assert filter_window(16, 8) == (7, 9)
    assert filter_window(576, 4) == (216, 360)
    assert filter_window(10, 4) == (4, 6)  # k = 2, centred in 10
    with pytest.raises(ValueError):
        filter_window(4, 8)


def test_svd_basis_cached_on_disk(tmp_path, monkeypatch):
    import negsynth.embed.embedfilter as ef

    rng = np.random.default_rng(1)
    w = torch.tensor(rng.normal(size=(40, 8)), dtype=torch.float32)
    monkeypatch.setattr(ef, "_BASIS_MEMO", {})
    vh, s = svd_basis(w, "some/model", cache=tmp_path)
    _, s_np, vh_np = np.linalg.svd(w.numpy().astype(np.float64), full_matrices=False)
    np.testing.assert_allclose(s, s_np, rtol=1e-4)
    # same subspaces (sign-free): projectors onto the middle window agree
    lo, hi = filter_window(8, 2)
    np.testing.assert_allclose(vh[lo:hi].T @ vh[lo:hi], vh_np[lo:hi].T @ vh_np[lo:hi], atol=1e-4)
    files = list(tmp_path.glob("*.npz"))
    assert len(files) == 1 and "some_model" in files[0].name
    # a second call in a fresh process state reads the file instead of recomputing
    monkeypatch.setattr(ef, "_BASIS_MEMO", {})
    monkeypatch.setattr(torch.linalg, "svd", lambda *a, **k: (_ for _ in ()).throw(AssertionError("recomputed")))
    vh2, _ = svd_basis(w, "some/model", cache=tmp_path)
    np.testing.assert_array_equal(vh, vh2)
    # a different weight is a different cache entry
    monkeypatch.undo()
    monkeypatch.setattr(ef, "_BASIS_MEMO", {})
    svd_basis(w * 2, "some/model", cache=tmp_path)
    assert len(list(tmp_path.glob("*.npz"))) == 2


@pytest.mark.parametrize("base,tau", [("echo", 2), ("echo", 4), ("prompteol", 2), ("echo", 1)])
def test_embedfilter_projects_base(tiny, tmp_path, monkeypatch, base, tau):
    import negsynth.embed.embedfilter as ef

    monkeypatch.setenv("NEGSYNTH_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(ef, "_BASIS_MEMO", {})
    model, _ = tiny
    e = make(tiny, "embedfilter", base=base, filter_ratio=tau)
    assert e.dim == 16 // tau
    # the tests' own templates are literal text: "[custom]" in the name
    assert e.name == f"decoder:tiny-llama:embedfilter-{'echo[custom]-mean' if base == 'echo' else 'prompteol[custom]-last'}-tau{tau}"
    assert list((tmp_path / "embedfilter").glob("*.npz"))
    w = model.lm_head.weight.detach().double().numpy()
    _, _, vh = np.linalg.svd(w, full_matrices=False)
    lo, hi = filter_window(16, tau)
    base_emb = make(tiny, base, pooling="mean" if base == "echo" else "last")
    raw = np.stack([base_emb.embed_batch(base_emb.collate([base_emb.tokenize(t)]))[0] for t in TEXTS])
    want = raw @ vh[lo:hi].T
    got = e.encode(TEXTS)
    # compare cosine matrices (coordinates are defined only up to signs of singular vectors)
    wn = want / np.linalg.norm(want, axis=1, keepdims=True)
    np.testing.assert_allclose(got @ got.T, wn @ wn.T, atol=1e-5)
    if tau == 1:  # no filter: the same cosines as the base method
        b = base_emb.encode(TEXTS)
        np.testing.assert_allclose(got @ got.T, b @ b.T, atol=1e-5)


def test_names_and_dims(tiny):
    assert make(tiny, "echo", pooling="last").name == "decoder:tiny-llama:echo[custom]-last"
    assert make(tiny, "reba", repeat=3).name == "decoder:tiny-llama:reba3-mean"
    assert make(tiny, "prompteol").name == "decoder:tiny-llama:prompteol[custom]-last"
    assert make(tiny, "mean").dim == 16
    with pytest.raises(ValueError):
        make(tiny, "cls")


def test_from_config_loads_real_smollm2():
    """The bundled SmolLM2-135M (about 8 s): paraphrases must be closer than unrelated text."""
    from negsynth.embed import load_embedder
    from negsynth.resources import MissingResource, smollm2_gguf_path

    try:
        smollm2_gguf_path()
    except MissingResource as exc:
        pytest.skip(str(exc))
    from negsynth.schemas.config import EmbedderConfig

    e = load_embedder(EmbedderConfig(kind="decoder", method="echo", batch_size=4))
    assert e.name == "decoder:smollm2-135m:echo-mean" and e.dim == 576
    v = e.encode(["A man is playing a guitar.", "A man plays the guitar.", "The stock market fell sharply today."])
    assert v.shape == (3, 576)
    assert v[0] @ v[1] > v[0] @ v[2] + 0.05
