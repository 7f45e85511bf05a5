"""Zero-shot sentence embeddings from a decoder-only LLM (SEED_SPEC §3, §4, §6): ``mean``,
``last``, ``prompteol``, ``echo``, ``reba`` and ``embedfilter`` (inputs and pooled positions:
docs/zeroshot.md).

A template is tokenised in one go with character offsets; a token belongs to a ``{text}`` slot
when its span overlaps the slot, so the pooled positions are exact for any fast tokenizer. Each
copy of the text is cut to ``max_length`` tokens (``head``, or ``head_tail`` for EmbedFilter's
PromptEOL). Batches are padded on the tokenizer's ``padding_side`` with explicit ``position_ids``
and pooled in float64: left, right and no padding agree up to float rounding.
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
#: the ``[embedder]`` fields :class:`DecoderEmbedder` takes under the same names
CONFIG_FIELDS = (
    "method pooling repeat filter_ratio base max_length batch_size prompteol_template echo_template "
    "echo_doc_template truncation filter_start query_template instruct_queries"
).split()


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
    """Zero-shot embeddings from a decoder LLM (methods: docs/zeroshot.md).

    Build it from a config (:meth:`from_config`) or around any transformers decoder and its fast
    tokenizer::

        emb = DecoderEmbedder(model, tok, method="reba", pooling="mean", repeat=2)
        vecs = emb.encode(["a sentence", "another one"])  # [2, emb.dim] float32, L2-normalised

    The arguments are :class:`~negsynth.schemas.config.EmbedderConfig`'s fields of the same names;
    ``model_name`` names the model in :attr:`name` and the SVD cache. A non-default template shows
    in :attr:`name` as ``[name]`` or ``[custom]``.
    """

    def __init__(
        self,
        model,
        tokenizer,
        *,
        method: str = "mean",
        pooling: str = "mean",
        repeat: int = 2,
        filter_ratio: int = 2,
        base: str = "echo",
        max_length: int | None = None,
        batch_size: int = 32,
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
        self.method, self.pooling, self.repeat = method, pooling, repeat
        self.filter_ratio, self.base = filter_ratio, base
        self.max_length = max_length or DEFAULT_MAX_LENGTH
        self.batch_size = batch_size
        self.padding_side = "left" if getattr(tokenizer, "padding_side", None) == "left" else "right"
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
        """Load ``cfg.model`` (eager attention for ReBA, the LM head for EmbedFilter) and wrap it."""
        from negsynth.embed.hf import load_decoder

        model, tok = load_decoder(
            cfg.model,
            device=cfg.device,
            dtype=cfg.dtype,
            causal_lm=cfg.method == "embedfilter",
            attn_implementation="eager" if cfg.method == "reba" else None,
        )
        return cls(model, tok, model_name=cfg.model, **{k: getattr(cfg, k) for k in CONFIG_FIELDS})

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
            return f"reba{self.repeat}-{self.pooling}"
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

    def embed_batch(self, batch: dict):
        """Run the model on one collated batch -> ``[B, d]`` (``[B, k]`` for EmbedFilter), float64."""
        import torch

        kind, pooling = self._effective()
        dev = self.device
        mask = batch["attention_mask"].to(dev)
        with torch.inference_mode():
            out = self.backbone(
                input_ids=batch["input_ids"].to(dev),
                attention_mask=mask,
                position_ids=batch["position_ids"].to(dev),
                use_cache=False,
                **({"output_attentions": True} if kind == "reba" else {}),
            )
            # zero the pad positions (a fully masked pad row can come out as NaN with some kernels)
            hidden = out.last_hidden_state.to(self.pool_dtype).masked_fill(~mask.bool()[..., None], 0.0)
            if kind == "reba":
                fused = fuse_attentions(out.attentions, mask).to(self.pool_dtype)
                emb = pool(hidden, reba_weights(fused, batch["first"].to(dev), mask, pooling), "mean")
            else:
                emb = pool(hidden, batch["pool"].to(dev), pooling)
        return self.project(emb.cpu().numpy().astype(np.float64))

    def project(self, emb: np.ndarray) -> np.ndarray:
        """EmbedFilter's ``e -> e · V[l:r]ᵀ`` on pooled vectors ``[N, d] -> [N, d/τ]`` (identity for
        the other methods). Linear, so filtering the pooled vector equals pooling filtered tokens."""
        return emb @ self._basis if self._basis is not None else emb

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


def _short_name(model: str) -> str:
    from negsynth.schemas.train import DECODER_ALIASES

    if model == "default" or model in DECODER_ALIASES or "smollm2-135m" in model.lower():
        return "smollm2-135m"
    return Path(model.rstrip("/")).name.lower() or model.lower()
