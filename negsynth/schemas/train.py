"""Trainer configuration (pydantic, ``extra="forbid"``): no torch/transformers import here.

See ``docs/train.md`` for the field table. Example::

    TrainConfig(model="smollm2", pooling="ata", bidirectional="all", lora={"enabled": True})
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from negsynth.prompts.embedding import BELLM_TEMPLATE
from negsynth.schemas.section import REMOVED_FIELDS

ENCODER_TEMPERATURE = 0.05  # sentence-transformers models: MNRL scale 20
DECODER_TEMPERATURE = 0.02  # LLM2Vec loss_scale 50, E5-Mistral
#: the one table of model aliases: alias -> (kind, the Hugging Face hub id of the bundled model it
#: stands for). ``negsynth.embed.models`` resolves them; it lives here, below the embedders,
#: because the config and the decoder loader (``embed/hf.py``, which ``embed/models.py`` imports)
#: read it too. In a decoder setting (``embedder.kind = "decoder"``) ``default`` is SmolLM2.
MODEL_ALIASES: dict[str, tuple[Literal["encoder", "decoder"], str]] = {
    "default": ("encoder", "sentence-transformers/all-MiniLM-L6-v2"),
    "minilm": ("encoder", "sentence-transformers/all-MiniLM-L6-v2"),
    "smollm2": ("decoder", "HuggingFaceTB/SmolLM2-135M-Instruct"),
    "smollm2-135m": ("decoder", "HuggingFaceTB/SmolLM2-135M-Instruct"),
}
DECODER_ALIASES = tuple(a for a, (kind, _) in MODEL_ALIASES.items() if kind == "decoder")
ENCODER_ALIASES = tuple(a for a, (kind, _) in MODEL_ALIASES.items() if kind == "encoder")
LLAMA_LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
BERT_LORA_TARGETS = ["query", "key", "value", "dense"]


class LoraSettings(BaseModel):
    """LoRA adapter settings (SEED_SPEC §1.8: r 16, α 32, dropout 0.05, q,k,v,o,gate,up,down)."""

    model_config = ConfigDict(extra="forbid")
    enabled: bool = False
    r: int = Field(16, ge=1)
    alpha: int = Field(32, ge=1)
    dropout: float = Field(0.05, ge=0.0, lt=1.0)
    targets: list[str] | Literal["auto"] = "auto"  # auto: Llama q,k,v,o,gate,up,down; BERT query,key,value,dense


class TrainConfig(BaseModel):
    """Trainer settings. Defaults follow SEED_SPEC §1.8 where they are cheap enough for CPU."""

    model_config = ConfigDict(extra="forbid")

    model: str = "default"  # "default"/"minilm" = all-MiniLM-L6-v2; "smollm2" = SmolLM2-135M decoder; or a local path
    # "bellm": BeLLM's recipe for a decoder (seed 001, SEED_SPEC §5): last layer bidirectional, its
    # prompt around every text, last-prompt-token pooling, 20 x contrastive + 1 x AnglE, LoRA r 32 /
    # alpha 32 / dropout 0.1, lr 2e-4 — each only where the field is not set explicitly (BELLM_RECIPE)
    recipe: Literal["mgh", "bellm"] = "mgh"
    # every text (anchors and documents) becomes text_template.format(text=...) after text_preprocess,
    # at training and, through negsynth_text.json in the saved folder, when negsynth loads the model
    text_template: str | None = None
    text_preprocess: Literal["none", "bellm"] = "none"
    # mean / cls / last are saved as sentence-transformers' own Pooling (plain SentenceTransformer(path)
    # loads them); ata / latent are negsynth modules (load with trust_remote_code=True, see docs/train.md)
    pooling: Literal["mean", "cls", "last", "ata", "latent"] = "mean"
    latent_num: int = Field(512, ge=1)  # NV-Embed latent array size r
    latent_heads: int = Field(8, ge=1)
    # τ; scale = 1/τ. None = per model family: 0.05 for sentence-transformers encoders (pretrained
    # at MNRL's scale 20), 0.02 for decoders (LLM2Vec / E5-Mistral); 1.0 = the literal seed text
    temperature: float | None = Field(None, gt=0)
    batch_size: int = Field(64, ge=2)
    grad_accum: int = Field(8, ge=1)
    lr: float = Field(2e-5, gt=0)
    warmup_steps: int = Field(0, ge=0)
    warmup_ratio: float = Field(0.1, ge=0.0, lt=1.0)  # linear warmup over this share of the steps (ignored when warmup_steps > 0)
    max_grad_norm: float | None = Field(1.0, gt=0)  # gradient clipping; None = off
    # loss = infonce_weight x InfoNCE + angle_weight x AnglE (sentence-transformers' AnglELoss at
    # angle_scale on (anchor, positive) = 1 and (anchor, negative) = 0 pairs); AnglE's trainer, as BeLLM uses it
    infonce_weight: float = Field(1.0, gt=0.0)
    angle_weight: float = Field(0.0, ge=0.0)
    angle_scale: float = Field(20.0, gt=0.0)
    # what the model learns from: "mnrl" = InfoNCE (the examples as written: the document is the
    # positive, the rest negatives); "margin-mse" / "distill-kl" = a teacher's scores (the
    # curriculum's label column, from corpus.teacher = "hybrid") through sentence-transformers'
    # MarginMSELoss / DistillKLDivLoss; "mnrl+distill-kl" = InfoNCE + distill_weight x DistillKL
    loss: Literal["mnrl", "margin-mse", "distill-kl", "mnrl+distill-kl"] = "mnrl"
    distill_weight: float = Field(1.0, gt=0.0)
    # DistillKLDivLoss's temperature (None: sentence-transformers' default, 1.0): the student's
    # cosines are divided by it; distill_teacher_temperature (None: the same) divides the teacher's
    # scores. At 1.0 both softmaxes are nearly flat (cosines in [-1, 1], hybrid scores in [0, 2]) and
    # the loss barely moves; the student's InfoNCE temperature (0.05) and a teacher temperature
    # matched to the spread of its scores give the listwise signal distillation is for
    distill_temperature: float | None = Field(None, gt=0.0)
    distill_teacher_temperature: float | None = Field(None, gt=0.0)
    gather_across_devices: bool = True  # multi-GPU: every rank's in-batch negatives seen by all ranks
    max_steps: int = -1  # optimizer steps; -1 = run `epochs` passes over the data
    epochs: float = Field(1.0, gt=0)
    max_length: int = Field(512, ge=8)
    lora: LoraSettings = Field(default_factory=LoraSettings)
    bidirectional: str = "none"  # "none" | "all" (LLM2Vec) | "last:K" (BeLLM: last:1); decoders only
    precision: Literal["auto", "fp32", "bf16", "fp16"] = "auto"  # auto: bf16 (or fp16) on GPU, fp32 on CPU
    # where training runs: "auto" (a CUDA GPU when torch sees one, else Apple's mps, else CPU), "cpu"
    # (e.g. beside a busy GPU), "cuda" or "mps"; which GPU: CUDA_VISIBLE_DEVICES, and under torchrun /
    # accelerate each process takes its own
    device: Literal["auto", "cpu", "cuda", "mps"] = "auto"
    gradient_checkpointing: bool = False  # recompute activations in backward: less memory, ~30 % slower steps
    # GradCache (sentence-transformers' CachedMultipleNegativesRankingLoss): embed the batch in chunks of
    # this many rows without keeping activations, then backpropagate chunk by chunk. Same loss and
    # gradients as the full batch (float rounding aside) with the activation memory of one chunk;
    # None (or "off" in TOML) = plain MNRL (one forward pass over the batch, every activation kept); "auto" = chunks of
    # 8 rows on CPU when the loss is InfoNCE alone and a device's batch is over 8 rows, else None
    mini_batch_size: Annotated[int, Field(ge=1)] | Literal["auto"] | None = "auto"
    # the encoder's attention kernel: "sdpa" (torch's scaled_dot_product_attention) or "eager"
    attn_implementation: Literal["sdpa", "eager"] = "sdpa"
    seed: int = 42
    save_steps: int = Field(500, ge=1)
    save_total_limit: int | None = 2
    logging_steps: int = Field(1, ge=1)
    output_dir: str = "runs/train"
    # train(): True = the latest whole (sealed) checkpoint in output_dir; str = a checkpoint folder.
    # `negsynth train` resumes an interrupted run of the same config by default (--overwrite: afresh)
    resume: bool | str = False
    # "ordered": negsynth's sampler keeps the rows' (curriculum) order; "shuffled": sentence-transformers'
    # own NO_DUPLICATES sampler, the stock recipe's (rows reshuffled with the seed each pass, no text
    # twice in a batch, a short batch where rows collide), for rows with no order to keep (one phase)
    batch_sampler: Literal["ordered", "shuffled"] = "ordered"

    def __repr_args__(self):
        # the fields removed since run dirs were made, at their old defaults in their old places:
        # config hashes over the run config's repr stay what those run dirs recorded (section.py)
        removed = REMOVED_FIELDS["TrainConfig"]
        for name, value in super().__repr_args__():
            yield name, value
            yield from ((gone, old) for gone, (after, old) in removed.items() if after == name)

    @model_validator(mode="after")
    def _recipe(self):
        if self.recipe == "bellm":
            explicit = self.model_fields_set
            for k, v in BELLM_RECIPE.items():
                if k not in explicit:
                    object.__setattr__(self, k, LoraSettings(**v) if k == "lora" else v)
        if self.text_template is not None and self.text_template.count("{text}") != 1:
            raise ValueError(f"text_template={self.text_template!r}: needs exactly one {{text}} slot")
        return self

    @field_validator("mini_batch_size", mode="before")
    @classmethod
    def _mini_batch_off(cls, v):
        # TOML has no null: "off" is plain MNRL (one forward pass over the batch), as None is in Python
        return None if isinstance(v, str) and v.strip().lower() in ("off", "none") else v

    @field_validator("bidirectional")
    @classmethod
    def _check_bidir(cls, v: str) -> str:
        import re

        v = v.strip().lower()
        if v not in ("none", "all") and not re.fullmatch(r"last:[1-9]\d*", v):
            raise ValueError(f"bidirectional={v!r}: use 'none', 'all' or 'last:K' (K >= 1), e.g. 'last:1' for BeLLM")
        return v


#: what ``recipe = "bellm"`` sets (SEED_SPEC §5: paper LoRA r 32 / alpha 32 / dropout 0.1, lr 2e-4;
#: README stage 1 loss ibn_w 20 + angle_w 1 at scale 20; the prompt and its last token)
BELLM_RECIPE = {
    "bidirectional": "last:1",
    "pooling": "last",
    "text_template": BELLM_TEMPLATE,
    "text_preprocess": "bellm",
    "temperature": 0.05,
    "infonce_weight": 20.0,
    "angle_weight": 1.0,
    "angle_scale": 20.0,
    "lr": 2e-4,
    "lora": {"enabled": True, "r": 32, "alpha": 32, "dropout": 0.1},
}
