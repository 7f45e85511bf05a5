"""Zero-shot sentence embeddings from a decoder-only LLM (issue 7; SEED_SPEC §3, §4, §6).

A causal LM only lets token *i* see tokens ``<= i``, so plain pooling of its hidden states is
weak. The methods here work around that without any training:

``mean`` / ``last``
    Classical pooling over the text tokens (mean of the final hidden states, or the last one).
``prompteol``
    PromptEOL: ``This sentence: "{text}" means in one word:"`` and take the hidden state of the
    final prompt token (the model is asked to squeeze the sentence into its next token).
    Templates by name in :data:`PROMPTEOL_TEMPLATES` (``prompteol_template``).
``echo``
    Echo embeddings: the text is written twice and only the *second* copy plus EOS is pooled
    (mean or last), because every token of the second copy has already "seen" the whole
    sentence. Default: the echo paper's templates (:data:`ECHO_TEMPLATES` ``"echo"``), query
    ``Instruct:{instruction},\nQuery:{text}\nQuery again:{text}`` (the instruction line is dropped
    without an instruction) and document ``Document:{text}\nDocument again:{text}``, + EOS;
    ``echo_template="rewrite"`` gives EmbedFilter's ``Rewrite the following paragraph: {text}. The
    rewritten paragraph: {text}``. :meth:`DecoderEmbedder.encode_queries` / ``encode_documents``
    pick the template; plain ``encode`` uses the query template (symmetric use).
``reba``
    ReBA: the text repeated ``k`` times, plus *backward attention*: all layers'/heads' attention
    matrices are fused by symmetrise-and-max (Algorithm 1, :func:`fuse_attentions`) and the last
    layer's token states are re-weighted by that fused matrix (see :func:`reba_weights`).
``embedfilter``
    EmbedFilter: an echo (mean) or PromptEOL (last) embedding projected onto the middle band of
    right singular vectors of the unembedding matrix ``W_U = U Σ Vᵀ`` (``k = d/τ`` centred
    rows of ``Vᵀ``; rows ``128 .. 128+k`` for Mistral, ``filter_start``), which also reduces the
    dimension ``d -> d/τ``. The SVD is cached on disk. Its PromptEOL base defaults to the seed's
    ``Summarize the sentence: "{text}" in one word:"`` and keeps the first and last 256 tokens of
    a text longer than 512 (``truncation="head_tail"``).

Tokenisation. Every method builds one string from a template (``{text}`` slots) and tokenises it
in one go with character offsets; a token belongs to a slot when its character span overlaps the
slot. So the pooled positions are exact for any fast tokenizer (BPE merges such as ``."`` at a
slot border count as part of the slot). Special tokens the tokenizer adds natively (a BOS for
Llama/Mistral; nothing for SmolLM2/GPT-2) are added in front; echo appends EOS and pools it.
Each copy of the text is truncated to ``max_length`` tokens (512 when not set): the first ones
(``head``), or the first and last halves (``head_tail``, EmbedFilter's PromptEOL default).

Batching. Sequences are sorted by length, padded on ``padding_side`` (left or right) with an
attention mask and explicit ``position_ids`` (so left padding gives the same RoPE positions as no
padding), and pooled in float64 (float32 on MPS). Left, right and no padding give the same
embeddings up to float rounding.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from negsynth.embed.base import Embedder
from negsynth.embed.decoder_pooling import fuse_attentions, pool, reba_weights
from negsynth.embed.decoder_templates import render, resolve_echo_templates, resolve_prompteol_template
from negsynth.embed.embedfilter import filter_basis
from negsynth.prompts.embedding import ECHO_TEMPLATES, PROMPTEOL_TEMPLATES

log = logging.getLogger(__name__)

METHODS = ("mean", "last", "prompteol", "echo", "reba", "embedfilter")

DEFAULT_MAX_LENGTH = 512


def _special_prefix(tokenizer) -> list[int]:
    """The special tokens ``tokenizer`` adds on its own in front of a text (BOS for Llama, none for
    GPT-2): what :meth:`DecoderEmbedder.tokenize` puts before a template it tokenises bare."""
    plain = tokenizer("a", add_special_tokens=False)["input_ids"]
    full = tokenizer("a", add_special_tokens=True)["input_ids"]
    at = next((i for i in range(len(full) - len(plain) + 1) if full[i : i + len(plain)] == plain), 0)
    return list(full[:at])


# --------------------------------------------------------------------------------------------
# tokenisation


@dataclass
class Tokenized:
    """One text turned into model input. ``pool`` marks the positions that are pooled; ``first``
    marks the first copy of the text (ReBA rows); both are 0/1 lists as long as ``ids``."""

    ids: list[int]
    pool: list[int]
    first: list[int] = field(default_factory=list)


class DecoderEmbedder(Embedder):
    """Zero-shot embeddings from a decoder LLM; see the module docstring for the methods.

    Construct from a config (``DecoderEmbedder.from_config(EmbedderConfig(kind="decoder",
    method="echo"))``, which loads the model with :func:`negsynth.embed.hf.load_decoder`) or pass
    any transformers decoder (bare ``AutoModel`` or ``AutoModelForCausalLM``) and its **fast**
    tokenizer directly (tests use a tiny random Llama)::

        emb = DecoderEmbedder(model, tok, method="reba", pooling="mean", repeat=2)
        vecs = emb.encode(["a sentence", "another one"])  # [2, emb.dim] float32, L2-normalised

    Arguments: ``method`` in ``mean, last, prompteol, echo, reba, embedfilter``; ``pooling``
    (``mean``/``last``) for mean/last/echo/reba and for embedfilter with ``base="echo"``
    (PromptEOL always pools the last token); ``repeat`` = ReBA's k; ``reba_variant`` = ``paper``
    or ``code`` (only changes ``last``; see :func:`reba_weights`); ``filter_ratio`` = EmbedFilter's
    τ; ``base`` = what EmbedFilter filters (``echo`` or ``prompteol``); ``max_length`` = token cap
    per copy of the text; ``padding_side`` (default: the tokenizer's); ``model_name`` for
    :attr:`name` and the SVD cache key. ``echo_template`` / ``echo_doc_template`` (a name in
    :data:`ECHO_TEMPLATES` or literal text with two ``{text}`` slots; default ``"echo"``, the paper's
    pair), ``prompteol_template`` (a name in :data:`PROMPTEOL_TEMPLATES` or literal text; ``"auto"``
    = ``prompteol`` for PromptEOL, ``summarize`` / ``mistral`` under EmbedFilter), ``truncation``
    (``auto`` = ``head_tail`` for EmbedFilter on PromptEOL, else ``head``) and ``filter_start``
    (``auto`` = 128 for ``model_type == "mistral"``, else centred; ``"centred"`` or an int). A
    non-default template shows in :attr:`name` as ``[name]`` or ``[custom]``.

    ReBA variant implemented: Algorithm 1 exactly (symmetrise, max over all layers and heads,
    pads zeroed first); mean = paper eq. 5 (= the code up to scale, so cosine-identical); last =
    the paper's e_n (row of the last token of the *first* copy, keys k >= n) by default, the
    code's final-token row with ``reba_variant="code"``. Copies are joined with one space (the
    code concatenates raw strings, which lets BPE merge across the copy border), and the last
    layer's states are used (as in the code's evaluation).
    """

    def __init__(
        self,
        model,
        tokenizer,
        *,
        method: str = "mean",
        pooling: str = "mean",
        repeat: int = 2,
        reba_variant: str = "paper",
        filter_ratio: int = 2,
        base: str = "echo",
        max_length: int | None = None,
        batch_size: int = 32,
        padding_side: str | None = None,
        model_name: str | None = None,
        prompteol_template: str = "auto",
        echo_template: str = "echo",
        echo_doc_template: str | None = None,
        truncation: str = "auto",
        filter_start: int | str | None = "auto",
        query_template: str | None = None,
        instruct_queries: bool = False,
    ):
        import torch

        if method not in METHODS:
            raise ValueError(f"unknown method {method!r}; choose from {METHODS}")
        if pooling not in ("mean", "last"):
            raise ValueError(f"unknown pooling {pooling!r} (mean, last)")
        if base not in ("echo", "prompteol"):
            raise ValueError(f"unknown EmbedFilter base {base!r} (echo, prompteol)")
        if repeat < 2 and method == "reba":
            raise ValueError("ReBA needs repeat >= 2")
        if not getattr(tokenizer, "is_fast", False):
            raise ValueError("DecoderEmbedder needs a fast tokenizer (character offsets locate the text spans)")
        if truncation not in ("auto", "head", "head_tail"):
            raise ValueError(f"unknown truncation {truncation!r} (auto, head, head_tail)")
        self.model = model
        self.tokenizer = tokenizer
        self.method, self.pooling, self.repeat, self.reba_variant = method, pooling, repeat, reba_variant
        self.filter_ratio, self.base = filter_ratio, base
        self.max_length = max_length or DEFAULT_MAX_LENGTH
        self.batch_size = batch_size
        self.padding_side = padding_side or getattr(tokenizer, "padding_side", "right") or "right"
        if self.padding_side not in ("left", "right"):
            raise ValueError(f"padding_side must be left or right, not {self.padding_side!r}")
        model_type = getattr(model.config, "model_type", None)
        self.prompteol_template = resolve_prompteol_template(prompteol_template, method, model_type)
        self.echo_template, self.echo_doc_template = resolve_echo_templates(echo_template, echo_doc_template)
        if truncation == "auto":  # EmbedFilter's PromptEOL runs keep the first and last 256 of 512 (SEED_SPEC §6)
            truncation = "head_tail" if method == "embedfilter" and base == "prompteol" else "head"
        self.truncation = truncation
        if query_template:
            self.query_template = query_template
        self.instruct_queries = instruct_queries
        # the bare transformer (final hidden states after the final norm)
        self.backbone = getattr(model, getattr(model, "base_model_prefix", ""), None) or model
        self.device = next(model.parameters()).device
        self.pool_dtype = torch.float32 if self.device.type == "mps" else torch.float64
        if method == "reba" and getattr(model.config, "_attn_implementation", "eager") != "eager":
            log.info("ReBA needs attention probabilities: switching %s to eager attention", type(model).__name__)
            model.set_attn_implementation("eager")
        pad = tokenizer.pad_token_id
        self.pad_id = pad if pad is not None else (tokenizer.eos_token_id or 0)
        self.eos_id = tokenizer.eos_token_id
        self.prefix_ids = _special_prefix(tokenizer)
        self._basis = None  # EmbedFilter's projection [d, k]; None = identity
        if method == "embedfilter":
            self._basis, self.window = filter_basis(model, self._model_key(model, model_name), filter_ratio, filter_start, model_type)
        short = _short_name(model_name or getattr(model.config, "_name_or_path", "") or type(model).__name__)
        self.name = f"decoder:{short}:{self.describe()}"

    @classmethod
    def from_config(cls, cfg) -> DecoderEmbedder:
        """Load ``cfg.model`` with :func:`negsynth.embed.hf.load_decoder` and wrap it.

        ``method="reba"`` loads with eager attention (the only method that needs attention
        probabilities); ``method="embedfilter"`` loads the LM head (unembedding matrix).
        """
        from negsynth.embed.hf import load_decoder

        model, tok = load_decoder(
            cfg.model,
            device=cfg.device,
            dtype=cfg.dtype,
            causal_lm=cfg.method == "embedfilter",
            attn_implementation="eager" if cfg.method == "reba" else None,
        )
        return cls(
            model,
            tok,
            method=cfg.method,
            pooling=cfg.pooling,
            repeat=cfg.repeat,
            reba_variant=getattr(cfg, "reba_variant", "paper"),
            filter_ratio=cfg.filter_ratio,
            base=cfg.base,
            max_length=cfg.max_length,
            batch_size=cfg.batch_size,
            padding_side=getattr(cfg, "padding_side", None),
            model_name=cfg.model,
            prompteol_template=getattr(cfg, "prompteol_template", "auto"),
            echo_template=getattr(cfg, "echo_template", "echo"),
            echo_doc_template=getattr(cfg, "echo_doc_template", None),
            truncation=getattr(cfg, "truncation", "auto"),
            filter_start=getattr(cfg, "filter_start", "auto"),
            query_template=cfg.query_template,
            instruct_queries=cfg.instruct_queries,
        )

    # ---------------------------------------------------------------- description

    def describe(self) -> str:
        """The method part of :attr:`name`, e.g. ``echo-mean``, ``reba2-last``, ``embedfilter-echo-mean-tau2``."""
        m = self.method
        if m in ("mean", "last"):
            return m
        tag = self._template_tag()
        if m == "prompteol":
            return f"prompteol{tag}-last"
        if m == "echo":
            return f"echo{tag}-{self.pooling}"
        if m == "reba":
            return f"reba{self.repeat}-{self.pooling}" + ("-code" if self.reba_variant == "code" and self.pooling == "last" else "")
        base = f"echo{tag}-{self.pooling}" if self.base == "echo" else f"prompteol{tag}-last"
        extra = "" if self.truncation == ("head_tail" if self.base == "prompteol" else "head") else f"-{self.truncation}"
        return f"embedfilter-{base}-tau{self.filter_ratio}{extra}"

    def _template_tag(self) -> str:
        """``""`` for the method's default template, else ``[name]`` (``[custom]`` for literal text)."""
        kind, _ = self._effective()
        if kind == "echo":
            names = [k for k, v in ECHO_TEMPLATES.items() if v == (self.echo_template, self.echo_doc_template)]
            return "" if names == ["echo"] else f"[{names[0] if names else 'custom'}]"
        default = "summarize" if self.method == "embedfilter" else "prompteol"
        names = [k for k, v in PROMPTEOL_TEMPLATES.items() if v == self.prompteol_template]
        return "" if names == [default] else f"[{names[0] if names else 'custom'}]"

    @property
    def dim(self) -> int:
        if self._basis is not None:
            return int(self._basis.shape[1])
        return int(self.model.config.hidden_size)

    @staticmethod
    def _model_key(model, model_name: str | None) -> str:
        """What the SVD cache is keyed by (with a hash of the weight): the folder the model was
        loaded from when known, else ``model_name``."""
        return getattr(model.config, "_name_or_path", "") or model_name or type(model).__name__

    # ---------------------------------------------------------------- tokenisation

    def _truncate(self, text: str) -> str:
        """Cut ``text`` to ``max_length`` tokens: ``head`` keeps the first ``max_length``;
        ``head_tail`` (EmbedFilter's PromptEOL runs, SEED_SPEC §6) keeps the first
        ``max_length // 2`` and the last ``max_length - max_length // 2`` (256 + 256 of 512),
        joined at the token borders of the original string."""
        enc = self.tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
        n, m = len(enc["input_ids"]), self.max_length
        if n <= m:
            return text
        offs = enc["offset_mapping"]
        if self.truncation == "head_tail":
            h = m // 2
            return text[: offs[h - 1][1]] + text[offs[n - (m - h)][0] :]
        return text[: offs[m - 1][1]]

    def _effective(self) -> tuple[str, str]:
        """(input kind, pooling) actually run: embedfilter delegates to its base."""
        if self.method == "embedfilter":
            return (self.base, self.pooling if self.base == "echo" else "last")
        if self.method == "prompteol":
            return ("prompteol", "last")
        if self.method in ("mean", "last"):
            return ("plain", self.method)
        return (self.method, self.pooling)

    def tokenize(self, text: str, role: str = "query", instruction: str | None = None) -> Tokenized:
        """Build the model input for one text and mark the pooled positions.

        ``plain``: ``[prefix] text`` (pool the text tokens). ``prompteol``: the template, pool the
        final token. ``echo``: the echo query template (``role="query"``, with ``instruction`` in
        its ``{instruction}`` slot; the instruction line is dropped without one) or document
        template (``role="document"``) + EOS, pool the second text copy and EOS.
        ``reba``: ``[prefix] text text ...`` (``repeat`` copies joined by a space); ``pool`` marks
        every real token, ``first`` the first copy.
        """
        kind, _ = self._effective()
        text = self._truncate(text)
        if kind == "plain":
            template = "{text}"
        elif kind == "prompteol":
            template = self.prompteol_template
        elif kind == "echo":
            template = self.echo_doc_template if role == "document" else self.echo_template
        else:  # reba
            template = " ".join(["{text}"] * self.repeat)
        s, spans = render(template, text, instruction if kind == "echo" else None)
        enc = self.tokenizer(s, add_special_tokens=False, return_offsets_mapping=True)
        ids, offs = list(enc["input_ids"]), list(enc["offset_mapping"])

        n_pre = len(self.prefix_ids)
        # token j belongs to slot (lo, hi) when its (non-empty) character span overlaps it
        masks = [[0] * n_pre + [int(b > a and a < hi and b > lo) for a, b in offs] for lo, hi in spans]
        ids = self.prefix_ids + ids
        first = masks[0]
        if kind == "plain":
            pool_mask = masks[0]
        elif kind == "prompteol":
            pool_mask = [0] * (len(ids) - 1) + [1]
        elif kind == "echo":
            pool_mask = masks[1]
            if self.eos_id is not None:
                ids = ids + [self.eos_id]
                pool_mask = pool_mask + [1]
                first = first + [0]
        else:
            pool_mask = [1] * len(ids)
        if not any(pool_mask):  # empty text: fall back to the final token
            pool_mask = [0] * (len(ids) - 1) + [1]
        if not ids:
            raise ValueError("nothing to embed: empty text and no special tokens")
        if kind == "reba" and not any(first):
            first = [0] * (len(ids) - 1) + [1]
        return Tokenized(ids, pool_mask, first)

    def collate(self, items: Sequence[Tokenized]) -> dict:
        """Pad a batch on :attr:`padding_side` -> tensors ``input_ids``, ``attention_mask``,
        ``position_ids`` (0.. on the real tokens, whatever the padding), ``pool``, ``first``."""
        import torch

        L = max(len(t.ids) for t in items)
        rows = {k: [] for k in ("input_ids", "attention_mask", "pool", "first")}
        for t in items:
            n = L - len(t.ids)
            first = t.first or [0] * len(t.ids)
            seqs = (t.ids, [1] * len(t.ids), t.pool, first)
            fills = (self.pad_id, 0, 0, 0)
            for k, seq, f in zip(rows, seqs, fills, strict=True):
                rows[k].append(([f] * n + seq) if self.padding_side == "left" else (seq + [f] * n))
        out = {k: torch.tensor(v, dtype=torch.long) for k, v in rows.items()}
        out["position_ids"] = (out["attention_mask"].cumsum(-1) - 1).clamp_min(0)
        return out

    # ---------------------------------------------------------------- encoding

    def embed_batch(self, batch: dict, poolings: Sequence[str] | None = None):
        """Run the model on one collated batch -> ``[B, d]`` (``[B, k]`` for EmbedFilter), float64.

        With ``poolings`` (e.g. ``("mean", "last")``) the one forward pass is pooled several ways
        and a dict ``pooling -> [B, d]`` is returned (for ReBA, ``"last:code"`` / ``"last:paper"``
        pick the variant). Used by ablations/benchmarks to share the expensive forward pass.
        """
        import torch

        kind, default_pooling = self._effective()
        need_attn = kind == "reba"
        dev = self.device
        out_d = {}
        with torch.inference_mode():
            kw = dict(
                input_ids=batch["input_ids"].to(dev),
                attention_mask=batch["attention_mask"].to(dev),
                position_ids=batch["position_ids"].to(dev),
                use_cache=False,
            )
            if need_attn:
                kw["output_attentions"] = True
            out = self.backbone(**kw)
            # zero the pad positions (a fully masked pad row can come out as NaN with some kernels)
            hidden = out.last_hidden_state.to(self.pool_dtype).masked_fill(~kw["attention_mask"].bool()[..., None], 0.0)
            fused = fuse_attentions(out.attentions, kw["attention_mask"]).to(self.pool_dtype) if need_attn else None
            del out
            for p in poolings or (default_pooling,):
                if need_attn:
                    pooling, _, variant = p.partition(":")
                    w = reba_weights(fused, batch["first"].to(dev), kw["attention_mask"], pooling, variant or self.reba_variant)
                    emb = torch.einsum("bl,bld->bd", w, hidden) / w.sum(dim=1, keepdim=True).clamp_min(1e-30)
                else:
                    emb = pool(hidden, batch["pool"].to(dev), p)
                out_d[p] = self.project(emb.cpu().numpy().astype(np.float64))
        return out_d if poolings else out_d[default_pooling]

    def project(self, emb: np.ndarray) -> np.ndarray:
        """EmbedFilter's ``e -> e · V[l:r]ᵀ`` on pooled vectors ``[N, d] -> [N, d/τ]`` (identity for
        the other methods). Linear, so filtering the pooled vector equals pooling filtered tokens."""
        return emb @ self._basis if self._basis is not None else emb

    def encode_raw(self, texts: Sequence[str], poolings: Sequence[str], *, batch_size: int | None = None) -> dict[str, np.ndarray]:
        """One forward pass per batch, pooled each way in ``poolings`` -> ``{pooling: [N, dim]}``
        float64, **not** L2-normalised (see :meth:`embed_batch`)."""
        bs = batch_size or self.batch_size
        items = [self.tokenize(t) for t in texts]
        order = sorted(range(len(items)), key=lambda i: -len(items[i].ids))
        res = {p: np.zeros((len(items), self.dim), dtype=np.float64) for p in poolings}
        for b0 in range(0, len(order), bs):
            idx = order[b0 : b0 + bs]
            for p, v in self.embed_batch(self.collate([items[i] for i in idx]), poolings).items():
                res[p][idx] = v
        return res

    def _roles_apply(self) -> bool:
        """True when queries and documents get different inputs (echo with a role template)."""
        return self._effective()[0] == "echo" and (self.echo_template != self.echo_doc_template or "{instruction}" in self.echo_template)

    def encode_queries(self, texts: Sequence[str], instruction: str | Sequence[str] | None = None, **kw) -> np.ndarray:
        """Echo: the query template, with the instruction in its ``{instruction}`` slot when
        ``instruct_queries`` is on (else that line is dropped); a query template without the slot
        gets the text from ``format_query``. Other methods: the base class."""
        if not self._roles_apply():
            return super().encode_queries(texts, instruction, **kw)
        if instruction is None or isinstance(instruction, str):
            instruction = [instruction] * len(texts)
        pairs = zip(texts, instruction, strict=True)
        if "{instruction}" in self.echo_template:
            items = [self.tokenize(t, "query", i if self.instruct_queries else None) for t, i in pairs]
        else:
            items = [self.tokenize(self.format_query(t, i), "query") for t, i in pairs]
        return self._encode_items(items, **kw)

    def encode_documents(self, texts: Sequence[str], **kw) -> np.ndarray:
        """Echo: the document template. Other methods: the base class's (plain :meth:`encode`)."""
        if not self._roles_apply():
            return super().encode_documents(texts, **kw)
        return self._encode_items([self.tokenize(t, "document") for t in texts], **kw)

    def _encode_items(self, items: list[Tokenized], *, batch_size: int | None = None, show_progress: bool = False) -> np.ndarray:
        """Like :meth:`encode` on already tokenised items: float32, rows L2-normalised."""
        if not items:
            return np.zeros((0, self.dim), dtype=np.float32)
        out = np.asarray(self._run(items, batch_size=batch_size, show_progress=show_progress), dtype=np.float32)
        return out / np.clip(np.linalg.norm(out, axis=1, keepdims=True), 1e-12, None)

    def _encode(self, texts: list[str], *, batch_size: int | None, show_progress: bool) -> np.ndarray:
        """Plain :meth:`encode` (no role): echo uses the *query* template without an instruction
        (the echo paper encodes both sides of a symmetric pair with the query template)."""
        return self._run([self.tokenize(t) for t in texts], batch_size=batch_size, show_progress=show_progress)

    def _run(self, items: list[Tokenized], *, batch_size: int | None, show_progress: bool) -> np.ndarray:
        bs = batch_size or self.batch_size
        order = sorted(range(len(items)), key=lambda i: -len(items[i].ids))
        out = np.zeros((len(items), self.dim), dtype=np.float64)
        for b0 in range(0, len(order), bs):
            idx = order[b0 : b0 + bs]
            out[idx] = self.embed_batch(self.collate([items[i] for i in idx]))
            if show_progress:
                log.info("%s: %d/%d texts", self.name, min(b0 + bs, len(order)), len(order))
        return out


class SharedPass:
    """One forward pass of ``embedder`` per distinct text, pooled every way in ``poolings`` and
    served as one :class:`Embedder` per pooling (:meth:`view`), so comparing poolings (or
    EmbedFilter on top of its base) costs one pass instead of one per row::

        shared = SharedPass(DecoderEmbedder(model, tok, method="echo"), ("mean", "last"), cache="echo.npz")
        report = evaluate(shared.view("mean"), suite="full", tasks="STS")

    A view embeds exactly as ``embedder.encode`` / ``encode_queries`` without an instruction would
    with that pooling (the symmetric, query-side input: what STS uses). Vectors are kept per text
    (raw, not normalised); with ``cache`` they are also written to that ``.npz`` file (atomically,
    after every pass over new texts) and read back at start, so a killed run resumes without
    embedding a text twice. The file records the embedder's name, ``max_length`` and the
    poolings; a file written for anything else is refused rather than mixed in.
    """

    def __init__(self, embedder: DecoderEmbedder, poolings: Sequence[str], cache: str | Path | None = None):
        self.embedder = embedder
        self.poolings = tuple(poolings)
        self.cache = Path(cache) if cache is not None else None
        self.key = f"{embedder.name}|max_length={embedder.max_length}|poolings={','.join(self.poolings)}"
        self.index: dict[str, int] = {}
        self._vecs: dict[str, np.ndarray] = {}
        #: texts embedded by this process and the seconds their forward passes took
        self.encoded, self.seconds = 0, 0.0
        if self.cache is not None and self.cache.exists():
            with np.load(self.cache, allow_pickle=False) as z:
                if str(z["key"]) != self.key:
                    raise ValueError(f"{self.cache}: written for {z['key']}, not {self.key}; remove it or pass another cache path")
                blob, ends = z["texts_utf8"].tobytes(), z["text_ends"].tolist()
                self.index = {blob[a:b].decode("utf-8"): i for i, (a, b) in enumerate(zip([0, *ends[:-1]], ends))}
                for p in self.poolings:
                    self._vecs[p] = z[f"pool:{p}"]

    def vectors(self, texts: Sequence[str], pooling: str) -> np.ndarray:
        """Raw pooled vectors ``[len(texts), d]`` (float64), embedding only texts not seen before."""
        import time

        new = [t for t in dict.fromkeys(texts) if t not in self.index]
        if new:
            t0 = time.perf_counter()
            raw = self.embedder.encode_raw(new, self.poolings)
            self.seconds += time.perf_counter() - t0
            self.encoded += len(new)
            for t in new:
                self.index[t] = len(self.index)
            for p in self.poolings:
                self._vecs[p] = np.concatenate([self._vecs[p], raw[p]]) if p in self._vecs else raw[p]
            self._save()
        rows = [self.index[t] for t in texts]
        return self._vecs[pooling][rows]

    def _save(self) -> None:
        if self.cache is None:
            return
        import os

        self.cache.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.cache.with_name(self.cache.name + ".tmp.npz")
        encoded = [
            t.encode("utf-8") for t in self.index
        ]  # one byte blob + offsets: a fixed-width str array would pad every text to the longest
        blob = np.frombuffer(b"".join(encoded), dtype=np.uint8)
        ends = np.cumsum([len(b) for b in encoded], dtype=np.int64)
        np.savez(tmp, key=np.array(self.key), texts_utf8=blob, text_ends=ends, **{f"pool:{p}": v for p, v in self._vecs.items()})
        os.replace(tmp, self.cache)

    def view(self, pooling: str, projector: DecoderEmbedder | None = None, name: str | None = None) -> Embedder:
        """An :class:`Embedder` serving ``pooling`` from this pass; with ``projector`` (an
        EmbedFilter embedder on this pass's base) its :meth:`DecoderEmbedder.project` is applied
        to the pooled vectors, as that embedder would itself."""
        if pooling not in self.poolings:
            raise ValueError(f"pooling {pooling!r} is not computed by this pass ({', '.join(self.poolings)})")
        return _PassView(self, pooling, projector, name or f"{self.embedder.name}|{pooling}")


class _PassView(Embedder):
    def __init__(self, shared: SharedPass, pooling: str, projector, name: str):
        self.shared, self.pooling, self.projector, self.name = shared, pooling, projector, name
        self.batch_size = shared.embedder.batch_size

    @property
    def dim(self) -> int:
        return (self.projector or self.shared.embedder).dim

    def _encode(self, texts: list[str], *, batch_size: int | None, show_progress: bool) -> np.ndarray:
        v = self.shared.vectors(texts, self.pooling)
        return self.projector.project(v) if self.projector is not None else v

    def encode_documents(self, texts: Sequence[str], **kw) -> np.ndarray:
        if self.shared.embedder._roles_apply():
            raise NotImplementedError(
                "a shared pass serves the query-side (symmetric) input; documents of this method use another template"
            )
        return super().encode_documents(texts, **kw)


def _short_name(model: str) -> str:
    from negsynth.schemas.train import DECODER_ALIASES

    if model == "default" or model in DECODER_ALIASES or "smollm2-135m" in model.lower():
        return "smollm2-135m"
    return Path(model.rstrip("/")).name.lower() or model.lower()
