"""LoRA adapters for the embedding backbone via peft (SEED_SPEC §1.8: r 16, α 32, dropout 0.05).

sentence-transformers' ``model.add_adapter`` injects the LoRA layers in place, so the ATA and
bidirectional hooks stay valid; only the adapter (and trainable pooling) get gradients, and
``SentenceTransformer(path)`` reloads base model + adapter.
"""

from __future__ import annotations

import logging

log = logging.getLogger(__name__)


def resolve_targets(backbone, targets, is_decoder: bool) -> list[str]:
    """``auto`` -> Llama q,k,v,o,gate,up,down or BERT query,key,value,dense; keep names present in the model."""
    from negsynth.schemas.train import BERT_LORA_TARGETS, LLAMA_LORA_TARGETS

    wanted = (LLAMA_LORA_TARGETS if is_decoder else BERT_LORA_TARGETS) if targets == "auto" else list(targets)
    names = {n.rsplit(".", 1)[-1] for n, _ in backbone.named_modules()}
    found = [t for t in wanted if t in names]
    if not found:
        raise ValueError(
            f"lora.targets={wanted}: none of these module names exist in {type(backbone).__name__}; pick from e.g. {sorted(names)[:20]}"
        )
    if len(found) < len(wanted):
        log.warning("LoRA targets not in the model and skipped: %s", sorted(set(wanted) - set(found)))
    return found


def add_lora(model, settings, is_decoder: bool) -> None:
    """Attach a fresh LoRA adapter to the SentenceTransformer's backbone (in place)."""
    from peft import LoraConfig

    backbone = model[0].auto_model
    targets = resolve_targets(backbone, settings.targets, is_decoder)
    cfg = LoraConfig(
        r=settings.r, lora_alpha=settings.alpha, lora_dropout=settings.dropout, target_modules=targets, task_type="FEATURE_EXTRACTION"
    )
    try:
        model.add_adapter(cfg)
    except ValueError as e:
        if "PEFT" not in str(e):
            raise
        # transformers checks peft's version itself; its message names no way out for this project
        import peft
        import transformers

        from negsynth.errors import UserError

        raise UserError(
            f"LoRA: transformers {transformers.__version__} rejects peft {peft.__version__} ({e}); "
            f"pip install 'transformers<5.24' (negsynth's [train] extra pins it) or a peft it accepts"
        ) from None
    n_train = sum(p.numel() for p in model.parameters() if p.requires_grad)
    n_all = sum(p.numel() for p in model.parameters())
    log.info("LoRA r=%d alpha=%d on %s: %d / %d parameters trainable", settings.r, settings.alpha, targets, n_train, n_all)
