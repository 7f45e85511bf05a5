"""The seed methods as the papers define them: echo templates (seed 003), EmbedFilter's PromptEOL
prompt, truncation and Mistral window (seed 004), and ATA's pooled set ``embed_mask`` (seed 002).

Tokenizers are the real bundled ones (SmolLM2-135M-Instruct, all-MiniLM-L6-v2); models are tiny
random ones built here, so every test runs in seconds.
"""

from __future__ import annotations

import copy
import json

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from helpers import tiny_decoder  # noqa: E402

from negsynth.embed.decoder import DecoderEmbedder  # noqa: E402
from negsynth.embed.decoder_templates import render, resolve_echo_templates  # noqa: E402
from negsynth.embed.embedfilter import filter_window  # noqa: E402
from negsynth.prompts.embedding import ECHO_TEMPLATES  # noqa: E402

ECHO_TEMPLATE = ECHO_TEMPLATES["rewrite"][0]

Q = "What is the capital of France?"
D = "Paris is the capital of France."
PROMPT = "Retrieve passages that answer the question"


@pytest.fixture(scope="module")
def smol_tok():
    from negsynth.embed.hf import resolve_decoder_path
    from negsynth.resources import MissingResource

    try:
        path = resolve_decoder_path("default")
    except MissingResource as exc:
        pytest.skip(str(exc))
    tok = transformers.AutoTokenizer.from_pretrained(path)
    tok.pad_token = tok.pad_token or tok.eos_token
    return tok


@pytest.fixture(scope="module")
def smol(smol_tok):
    return tiny_decoder(len(smol_tok)), smol_tok


@pytest.fixture()
def svd_tmp(tmp_path, monkeypatch):
    import negsynth.embed.embedfilter as ef

    monkeypatch.setenv("NEGSYNTH_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(ef, "_BASIS_MEMO", {})


def _pooled_text(e, item):
    return e.tokenizer.decode([i for i, m in zip(item.ids, item.pool, strict=True) if m])


# ------------------------------------------------------------------- echo (seed 003)


def test_echo_paper_templates_render_exactly():
    query, doc = resolve_echo_templates("echo")
    s, spans = render(query, Q, PROMPT)
    assert s == f"Instruct:{PROMPT},\nQuery:{Q}\nQuery again:{Q}"
    assert [s[a:b] for a, b in spans] == [Q, Q]
    assert render(doc, D)[0] == f"Document:{D}\nDocument again:{D}"
    # no instruction: the Instruct line is dropped
    assert render(query, Q)[0] == f"Query:{Q}\nQuery again:{Q}"
    # the old rewrite prompt by name, or by its text
    assert resolve_echo_templates("rewrite") == (ECHO_TEMPLATE, ECHO_TEMPLATE)
    assert resolve_echo_templates(ECHO_TEMPLATE) == (ECHO_TEMPLATE, ECHO_TEMPLATE)
    with pytest.raises(ValueError):
        resolve_echo_templates("only one {text}")


def test_echo_default_tokens_and_pooled_second_copy(smol):
    model, tok = smol
    e = DecoderEmbedder(model, tok, method="echo", instruct_queries=True)
    assert e.echo_template == "Instruct:{instruction},\nQuery:{text}\nQuery again:{text}"
    assert e.name.endswith(":echo-mean")
    it = e.tokenize(Q, "query", PROMPT)
    # SmolLM2 adds no BOS; EOS is appended and pooled with the second copy only
    assert tok.decode(it.ids) == f"Instruct:{PROMPT},\nQuery:{Q}\nQuery again:{Q}" + tok.eos_token
    assert _pooled_text(e, it) == Q + tok.eos_token
    it = e.tokenize(D, "document")
    assert tok.decode(it.ids) == f"Document:{D}\nDocument again:{D}" + tok.eos_token
    assert _pooled_text(e, it) == D + tok.eos_token
    # encode_queries / encode_documents use those inputs
    q = e.encode_queries([Q], PROMPT)
    np.testing.assert_allclose(q, e._encode_items([e.tokenize(Q, "query", PROMPT)]), atol=1e-6)
    d = e.encode_documents([D])
    np.testing.assert_allclose(d, e._encode_items([e.tokenize(D, "document")]), atol=1e-6)
    assert not np.allclose(d, e.encode([D]), atol=1e-4)  # plain encode = query template (symmetric use)
    # instruct_queries off: the instruction line is dropped
    e2 = DecoderEmbedder(model, tok, method="echo")
    np.testing.assert_allclose(e2.encode_queries([Q], PROMPT), e2.encode([Q]), atol=1e-6)


def test_echo_rewrite_selectable_from_config():
    from negsynth.schemas.config import EmbedderConfig

    cfg = EmbedderConfig(kind="decoder", method="echo")
    assert (cfg.echo_template, cfg.echo_doc_template) == ("echo", None)
    assert EmbedderConfig(kind="decoder", method="echo", echo_template="rewrite").echo_template == "rewrite"
    with pytest.raises(ValueError):
        EmbedderConfig(kind="decoder", method="echo", echo_template="no slot")


def test_echo_rewrite_tokens(smol):
    model, tok = smol
    e = DecoderEmbedder(model, tok, method="echo", echo_template="rewrite")
    assert e.name.endswith(":echo[rewrite]-mean")
    it = e.tokenize("A cat.", "document")
    assert tok.decode(it.ids) == "Rewrite the following paragraph: A cat.. The rewritten paragraph: A cat." + tok.eos_token


# ------------------------------------------------------------------- EmbedFilter (seed 004)


def test_embedfilter_prompteol_default_is_seed_prompt(smol, svd_tmp):
    model, tok = smol
    e = DecoderEmbedder(model, tok, method="embedfilter", base="prompteol")
    assert e.prompteol_template == 'Summarize the sentence: "{text}" in one word:"'
    it = e.tokenize("A cat.")
    assert tok.decode(it.ids) == 'Summarize the sentence: "A cat." in one word:"'
    assert it.pool == [0] * (len(it.ids) - 1) + [1]
    assert e.truncation == "head_tail" and e.name.endswith("embedfilter-prompteol-last-tau2")
    # plain PromptEOL keeps the original wording; the old wording stays selectable under EmbedFilter
    p = DecoderEmbedder(model, tok, method="prompteol")
    assert tok.decode(p.tokenize("A cat.").ids) == 'This sentence: "A cat." means in one word:"' and p.truncation == "head"
    old = DecoderEmbedder(model, tok, method="embedfilter", base="prompteol", prompteol_template="prompteol")
    assert old.prompteol_template == 'This sentence: "{text}" means in one word:"'
    assert old.name.endswith("embedfilter-prompteol[prompteol]-last-tau2")


def test_embedfilter_truncation_keeps_first_and_last_256(smol, svd_tmp):
    model, tok = smol
    text = " ".join(f"w{i}" for i in range(700))
    full = tok(text, add_special_tokens=False)["input_ids"]
    assert len(full) > 512
    e = DecoderEmbedder(model, tok, method="embedfilter", base="prompteol")
    it = e.tokenize(text)
    prefix = tok('Summarize the sentence: "', add_special_tokens=False)["input_ids"]
    suffix = tok('" in one word:"', add_special_tokens=False)["input_ids"]
    assert it.ids[: len(prefix)] == prefix and it.ids[-len(suffix) :] == suffix
    body = it.ids[len(prefix) : len(it.ids) - len(suffix)]
    assert body == full[:256] + full[-256:]
    # echo keeps the first max_length tokens of each copy
    ee = DecoderEmbedder(model, tok, method="embedfilter", base="echo", max_length=512)
    assert ee.truncation == "head"
    assert sum(ee.tokenize(text, "document").pool) == 512 + 1  # second copy + EOS
    assert _pooled_text(ee, ee.tokenize(text, "document")) == tok.decode(full[:512]) + tok.eos_token


def test_embedfilter_mistral_window_offset_128(smol_tok, svd_tmp):
    assert filter_window(4096, 2, 128) == (128, 2176)
    assert filter_window(4096, 2) == (1024, 3072)
    with pytest.raises(ValueError):
        filter_window(256, 1, 128)
    mistral = tiny_decoder(300, "mistral", hidden=256)
    e = DecoderEmbedder(mistral, smol_tok, method="embedfilter", base="prompteol")
    assert e.window == (128, 256) and e.dim == 128
    assert e.prompteol_template == 'This sentence: "{text}" means [MASK]'
    assert DecoderEmbedder(mistral, smol_tok, method="embedfilter", filter_start="centred").window == (64, 192)
    llama = tiny_decoder(300, hidden=256)
    assert DecoderEmbedder(llama, smol_tok, method="embedfilter").window == (64, 192)
    assert DecoderEmbedder(llama, smol_tok, method="embedfilter", filter_start=128).window == (128, 256)


# ------------------------------------------------------------------- ATA embed_mask (seed 002)


def _instr(text):
    return f"Instruct: {PROMPT}\nQuery: {text}"


@pytest.mark.parametrize("which", ["smollm2", "minilm"])
def test_instruction_markers_find_the_prefix(which, smol_tok):
    from negsynth.train.pooling import instruction_markers, instruction_pool_mask

    if which == "minilm":
        from negsynth.resources import MissingResource, minilm_path

        try:
            tok = transformers.AutoTokenizer.from_pretrained(str(minilm_path()))
        except MissingResource as exc:
            pytest.skip(str(exc))
    else:
        tok = smol_tok
    mk = instruction_markers(tok)
    for side in ("left", "right"):
        tok.padding_side = side
        b = tok([_instr(Q), D, _instr("")], padding=True, return_tensors="pt")
        pm = instruction_pool_mask(b["input_ids"], b["attention_mask"], mk)
        rows = [[i for i, m in zip(ids, row) if m] for ids, row in zip(b["input_ids"].tolist(), pm.tolist())]
        want = Q.lower() if which == "minilm" else Q
        assert tok.decode(rows[0], skip_special_tokens=True).strip() == want
        assert not set(rows[0]) & set(tok.all_special_ids) - {tok.sep_token_id}  # no BOS/CLS, no pads (SEP ends the text)
        # no instruction: all real tokens; an empty query text: P is never empty
        assert pm[1].tolist() == b["attention_mask"][1].tolist()
        assert pm[2].sum() >= 1
    if which == "smollm2":  # inside a chat wrapper the text and the closing tokens are pooled
        b = tok([f"<|im_start|>user\n{_instr(Q)}<|im_end|>"], return_tensors="pt")
        pm = instruction_pool_mask(b["input_ids"], b["attention_mask"], mk)
        assert tok.decode([i for i, m in zip(b["input_ids"][0].tolist(), pm[0].tolist()) if m]) == f" {Q}<|im_end|>"
    tok.padding_side = "right"


def _tiny_llama_dir(tmp_path, tok):
    from transformers import LlamaConfig, LlamaModel

    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2
    )
    d = tmp_path / "tiny"
    LlamaModel(cfg).eval().save_pretrained(d)
    tok = copy.deepcopy(tok)
    tok.chat_template = None  # plain text input, as the trainer pins it
    tok.save_pretrained(d)
    return str(d)


def test_ata_embed_mask_weights_and_reload(tmp_path, smol_tok):
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import Transformer

    from negsynth.train.pooling import EmbeddingPooling

    path = _tiny_llama_dir(tmp_path, smol_tok)
    tr = Transformer(path, max_seq_length=64)
    pool = EmbeddingPooling(tr.get_embedding_dimension(), mode="ata")
    assert pool.ata_pool == "embed_mask"
    model = SentenceTransformer(modules=[tr, pool], device="cpu")
    texts = [_instr(Q), D]
    feats = model.tokenize(texts)
    with torch.no_grad():
        out = model(dict(feats))
    w, ids = out["ata_weights"], feats["input_ids"]
    mask = feats["attention_mask"]
    n_q = len(smol_tok(Q, add_special_tokens=False)["input_ids"])
    real0 = [j for j, m in enumerate(mask[0].tolist()) if m]
    # query row: zero weight on every instruction token, positive on the text, sums to one
    assert (w[0, real0[:-n_q]] == 0).all() and (w[0, real0[-n_q:]] > 0).all()
    assert smol_tok.decode(ids[0, real0[-n_q:]]).strip() == Q
    # document row: every real token pooled
    assert (w[1][mask[1].bool()] > 0).all()
    torch.testing.assert_close(w.sum(-1), torch.ones(2))
    e1 = model.encode(texts, convert_to_numpy=True)
    # pooling every token (as models saved before embed_mask do) differs on the query, not on the document
    e_all = SentenceTransformer(
        modules=[Transformer(path, max_seq_length=64), EmbeddingPooling(tr.get_embedding_dimension(), mode="ata", ata_pool="all")],
        device="cpu",
    ).encode(texts, convert_to_numpy=True)
    assert np.abs(e_all[0] - e1[0]).max() > 1e-4
    np.testing.assert_allclose(e_all[1], e1[1], atol=1e-5)

    model.save(str(tmp_path / "m"))
    cfg_path = tmp_path / "m" / "1_EmbeddingPooling" / "config.json"
    if not cfg_path.exists():
        cfg_path = next(p for p in (tmp_path / "m").glob("*/config.json") if "ata_pool" in p.read_text())
    assert json.loads(cfg_path.read_text())["ata_pool"] == "embed_mask"
    m2 = SentenceTransformer(str(tmp_path / "m"), device="cpu", trust_remote_code=True)
    assert m2[1].ata_pool == "embed_mask"
    np.testing.assert_allclose(m2.encode(texts, convert_to_numpy=True), e1, atol=1e-5)
    # a model saved before ata_pool existed loads as "all" (what it was trained with)
    cfg = json.loads(cfg_path.read_text())
    del cfg["ata_pool"]
    cfg_path.write_text(json.dumps(cfg))
    m3 = SentenceTransformer(str(tmp_path / "m"), device="cpu", trust_remote_code=True)
    assert m3[1].ata_pool == "all"
    np.testing.assert_allclose(m3.encode(texts, convert_to_numpy=True), e_all, atol=1e-5)
