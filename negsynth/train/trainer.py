"""Train an embedding model on the curriculum with the stock ``SentenceTransformerTrainer``
(docs/train.md). The curriculum's order survives because the batch sampler is passed as a class in
``SentenceTransformerTrainingArguments.batch_sampler`` (no trainer subclass); on resume the trainer
skips the consumed batches, which lands on the next curriculum batch.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

from negsynth.data.stock import text_columns
from negsynth.embed.base import quiet_loading
from negsynth.schemas.train import TrainConfig
from negsynth.train.callbacks import curriculum_log_callback, progress_callback
from negsynth.train.checkpoints import checkpoint_step, checkpoints, drop_checkpoint, last_checkpoint, seal_callback
from negsynth.train.distributed import is_main_process, per_device_batch_size
from negsynth.train.sampler import batch_segments, curriculum_batch_sampler, data_parallel_world, load_rows

log = logging.getLogger(__name__)

# ----------------------------------------------------------------------------- model building


@quiet_loading()
def build_model(config: TrainConfig, device: str | None = None):
    """A SentenceTransformer: ``Transformer`` [+ ``BidirectionalAttention``] + pooling [+ LoRA].

    Decoders get a pad token (EOS), right padding, and for ``last`` pooling an appended EOS token
    (``tokenizer.add_eos_token``), so the pooled token has seen the whole text — unless
    ``text_template`` puts a prompt after the text (BeLLM), whose last token is then pooled.
    """
    import torch
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import Transformer

    from negsynth.embed.models import resolve_model
    from negsynth.train.bidirectional import BidirectionalAttention

    ref = resolve_model(config.model, allow_hub=False, what="train.model")
    path, is_decoder = ref.path, ref.is_decoder
    if config.bidirectional != "none" and not is_decoder:
        raise ValueError(
            f"bidirectional={config.bidirectional!r} needs a decoder model; {config.model!r} is an encoder (set bidirectional='none')"
        )
    mkw = {"attn_implementation": config.attn_implementation, "dtype": torch.float32}
    tr = Transformer(path, model_kwargs=mkw, max_seq_length=config.max_length)
    if "message" in tr.modality_config:
        # sentence-transformers 6 renders plain text of chat models through the chat template
        # (SmolLM2's adds a ~20-token system prompt): every text would then share that preamble,
        # and truncation at max_length can leave nothing else. Pin the plain text modality.
        text_only = {k: v for k, v in tr.modality_config.items() if k != "message"}
        tr = Transformer(
            path, model_kwargs=mkw, max_seq_length=config.max_length, modality_config=text_only, module_output_name=tr.module_output_name
        )
    tok = tr.tokenizer
    if is_decoder:
        if tok.pad_token is None:
            tok.pad_token = tok.eos_token
        tok.padding_side = "right"
        if config.pooling == "last" and (config.text_template or "{text}").endswith("{text}"):
            _append_eos(tok)  # a prompt after the text (BeLLM's ` is:"`) is pooled at its own last token
    modules: list = [tr]
    if config.bidirectional != "none":
        modules.append(BidirectionalAttention(config.bidirectional))
    dim = tr.get_embedding_dimension()
    modules.append(_pooling_module(config, dim))
    if _base_normalizes(path):
        from sentence_transformers.sentence_transformer.modules import Normalize

        modules.append(Normalize())
    model = SentenceTransformer(modules=modules, device=device or train_device(config))
    # the training length is a training choice, not the model's: the saved model keeps the base's
    # own max_seq_length (MiniLM 256), or documents are cut shorter at evaluation than before training
    model.negsynth_saved_max_length = _base_max_length(path, tr)
    model.negsynth_text_format = text_format(config)
    if config.lora.enabled:
        from negsynth.train.lora import add_lora

        add_lora(model, config.lora, is_decoder=is_decoder)
    if config.gradient_checkpointing:
        tr.auto_model.gradient_checkpointing_enable()
    return model


def _pooling_module(config: TrainConfig, dim: int):
    """mean / cls / last -> sentence-transformers' own ``Pooling`` (portable: a plain
    ``SentenceTransformer(path)`` reloads it); ata -> negsynth's module."""
    if config.pooling in ("mean", "cls", "last"):
        from sentence_transformers.sentence_transformer.modules import Pooling

        return Pooling(dim, pooling_mode={"last": "lasttoken"}.get(config.pooling, config.pooling))
    from negsynth.train.pooling import EmbeddingPooling

    return EmbeddingPooling(dim, mode="ata")


def _base_max_length(path: str, tr) -> int | None:
    """The base model's own max_seq_length (sentence_bert_config.json), else the tokenizer's limit."""
    cfg = Path(path) / "sentence_bert_config.json"
    try:
        if cfg.is_file():
            return int(json.loads(cfg.read_text()).get("max_seq_length") or 0) or None
    except (OSError, ValueError):
        pass
    lim = getattr(tr.tokenizer, "model_max_length", None)
    return int(lim) if isinstance(lim, int) and lim < 100_000 else None


@quiet_loading()
def save_model(model, out: str) -> None:
    """Save with the base model's own max_seq_length restored (see :func:`build_model`), and the
    text format the model was trained with (``negsynth_text.json``, :mod:`negsynth.embed.text`)."""
    keep = model.max_seq_length
    saved = getattr(model, "negsynth_saved_max_length", None)
    if saved:
        model.max_seq_length = saved
    try:
        model.save(out)
    finally:
        model.max_seq_length = keep
    fmt = getattr(model, "negsynth_text_format", None)
    if fmt is not None and not fmt.is_identity:
        fmt.save(out)


def text_format(config: TrainConfig):
    """The :class:`~negsynth.embed.text.TextFormat` of ``train.text_template`` / ``text_preprocess``."""
    from negsynth.embed.text import TextFormat

    return TextFormat(template=config.text_template or "{text}", preprocess=config.text_preprocess)


def _base_normalizes(path: str) -> bool:
    """True when the base model folder is a sentence-transformers model ending in ``Normalize``
    (all-MiniLM-L6-v2 does): the trained model keeps the same output contract."""
    mj = Path(path) / "modules.json"
    try:
        return mj.is_file() and any(m.get("type", "").endswith("Normalize") for m in json.loads(mj.read_text()))
    except (OSError, ValueError, AttributeError):
        return False


def is_decoder_model(model) -> bool:
    """Whether a built SentenceTransformer's backbone is a causal LM (decides the default τ)."""
    cfg = getattr(getattr(model[0], "auto_model", None), "config", None)
    return bool(
        cfg is not None
        and (getattr(cfg, "is_decoder", False) or any(a.endswith("ForCausalLM") for a in getattr(cfg, "architectures", None) or []))
    )


def resolve_temperature(config: TrainConfig, is_decoder: bool) -> float:
    """``train.temperature``, or the family default: 0.05 for encoders (sentence-transformers models were
    pretrained at MNRL scale 20), 0.02 for decoders (LLM2Vec / E5-Mistral)."""
    from negsynth.schemas.train import DECODER_TEMPERATURE, ENCODER_TEMPERATURE

    if config.temperature is not None:
        return config.temperature
    return DECODER_TEMPERATURE if is_decoder else ENCODER_TEMPERATURE


@quiet_loading()
def load_model(path: str, device: str | None = None):
    """Reload a model saved by :func:`train` (or ``model.save``) with its negsynth modules.

    sentence-transformers 6 refuses to import module classes outside its own namespace unless
    ``trust_remote_code=True`` (the classes here come from the installed ``negsynth`` package, not
    from files in the model folder), so this is ``SentenceTransformer(path, trust_remote_code=True)``.
    """
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(str(path), device=device, trust_remote_code=True)


def _append_eos(tok) -> None:
    """Make a fast tokenizer append EOS to every text (saved with the tokenizer)."""
    try:
        tok.add_eos_token = True
        if tok("a").input_ids[-1] == tok.eos_token_id:
            return
    except Exception:  # noqa: BLE001 - fall back to a post-processor
        pass
    from tokenizers.processors import TemplateProcessing

    eos = tok.eos_token
    tok._tokenizer.post_processor = TemplateProcessing(
        single=f"$A {eos}", pair=f"$A {eos} $B:1 {eos}:1", special_tokens=[(eos, tok.eos_token_id)]
    )


# ----------------------------------------------------------------------------- callbacks and train()


def train_device(config: TrainConfig) -> str:
    """``train.device`` resolved as :func:`~negsynth.embed.base.resolve_device` does ("auto": a CUDA
    GPU, else Apple's mps, else the CPU); a GPU torch does not see is refused."""
    from negsynth.embed.base import resolve_device

    if config.device in ("cuda", "mps") and resolve_device("auto") != config.device:
        raise ValueError(f"train.device = {config.device!r} but torch sees no such device; use 'auto' or 'cpu'")
    return resolve_device(config.device)


def _precision(config: TrainConfig, device: str) -> dict[str, bool]:
    import torch

    on_gpu = device.startswith("cuda")
    p = config.precision
    if p == "auto":
        p = ("bf16" if torch.cuda.is_bf16_supported() else "fp16") if on_gpu else "fp32"
    if p in ("bf16", "fp16") and not on_gpu:
        raise ValueError(f"precision={config.precision!r} needs a GPU; use 'auto' or 'fp32' on {device}")
    return {"bf16": p == "bf16", "fp16": p == "fp16"}


AUTO_MINI_BATCH = 8  # rows per GradCache chunk under mini_batch_size = "auto" (docs/train.md)


def resolve_mini_batch_size(config: TrainConfig, per_device: int, device_type: str) -> int | None:
    """The GradCache chunk size to train with (None: plain MNRL). ``"auto"``: chunks of
    :data:`AUTO_MINI_BATCH` rows on CPU when the loss is InfoNCE alone and a device's batch holds
    more rows than one chunk — a sixth of the memory at ~1.07x the time (docs/benchmarks.md);
    plain MNRL on an accelerator (speed first there) and for the AnglE + InfoNCE loss, which
    GradCache does not cover."""
    if config.mini_batch_size != "auto":
        return config.mini_batch_size
    infonce_alone = config.loss == "mnrl" and config.angle_weight == 0 and config.infonce_weight == 1.0
    return AUTO_MINI_BATCH if infonce_alone and device_type == "cpu" and per_device > AUTO_MINI_BATCH else None


#: the setting that writes teacher scores, named where a distillation loss finds none
TEACHER_SETTING = 'corpus.teacher = "cross-encoder" (corpus.teacher_model = a CrossEncoder name or folder)'


def check_teacher_labels(ds, loss: str, negatives: int) -> None:
    """A ValueError in one line unless every row of ``ds`` has a teacher's scores for its positive
    and each of its ``negatives`` (the ``label`` column the curriculum writes)."""
    if "label" not in ds.column_names:
        raise ValueError(
            f"train.loss = {loss!r} learns from a teacher's scores, and the curriculum has none: "
            f"make the examples with {TEACHER_SETTING} and rebuild the curriculum, or use train.loss = 'mnrl'"
        )
    if negatives < 1:
        raise ValueError(f"train.loss = {loss!r} needs rows with negatives (anchor, positive, negative_1..K); the dataset has none")
    bad = next((i for i, lab in enumerate(ds["label"]) if lab is None or len(lab) != negatives + 1), None)
    if bad is not None:
        raise ValueError(
            f"train.loss = {loss!r}: row {bad}'s label holds {len(ds[bad]['label'] or [])} scores, not {negatives + 1} "
            "(the positive and each negative); rebuild the curriculum"
        )


def _training_dataset(ds, config: TrainConfig, text_cols: list[str], distill: bool):
    """The dataset as the loss consumes it: only the text columns (sentence-transformers embeds
    every column it is given: metadata such as level, phase and ids stays out of the inputs), plus
    the teacher's scores as the label column where the loss learns from them, every text in the
    format the model will see at evaluation (``negsynth_text.json``)."""
    train_ds = ds.select_columns(text_cols + (["label"] if distill else []))
    fmt = text_format(config)
    if not fmt.is_identity:
        train_ds = train_ds.map(lambda row: {c: fmt.apply(row[c]) for c in text_cols}, desc="text format")
    return train_ds, fmt


def _batch_sampler(config: TrainConfig, ds, train_ds, phases: list | None, per_device: int):
    """``(batch_sampler, batch_starts)``: what ``SentenceTransformerTrainingArguments.batch_sampler``
    gets, and the first row of each planned batch (None when the sampler shuffles; the log callback
    reads each step's phase there).

    ``shuffled``: sentence-transformers' ``NO_DUPLICATES`` (refused on a phased curriculum, which it
    would mix); ``ordered``: the curriculum sampler, its batches planned once now so that the rows
    it moves or skips are logged."""
    if config.batch_sampler == "shuffled":
        if phases is not None and len(set(phases)) > 1:
            raise ValueError(
                "train.batch_sampler = 'shuffled' reshuffles the rows, which would mix the curriculum's phases; "
                "use it with an unordered schedule (curriculum.schedule = 'tuple') or set batch_sampler = 'ordered'"
            )
        from sentence_transformers.base.sampler import BatchSamplers

        return BatchSamplers.NO_DUPLICATES, None
    if "batch" in ds.column_names and len(ds) and set(ds.unique("batch")) == {-1}:
        log.warning(
            "the rows were not built as batches (batch = -1: a 'stock' curriculum): the order-keeping sampler trains them "
            "in dataset order, unshuffled; set batch_sampler = 'shuffled' to train them as sentence-transformers' stock recipe does"
        )
    sampler = curriculum_batch_sampler(batch_segments(ds))
    planned = sampler(train_ds, batch_size=per_device, drop_last=False)
    if planned.counts["moved"] or planned.counts["skipped_self_duplicate"]:
        log.info(
            "batch sampler: %d row(s) moved to a later batch so that no text repeats in a batch, %d skipped (a row repeating its own text)",
            planned.counts["moved"],
            planned.counts["skipped_self_duplicate"],
        )
    return sampler, [b[0] for b in planned.global_batches if b]


#: the settings of ``[train]`` each loss factory takes under its own name
_DISTILL_KEYS = ("distill_weight", "distill_temperature", "distill_teacher_temperature")
_ANGLE_KEYS = ("infonce_weight", "angle_weight", "angle_scale")


def _training_loss(config: TrainConfig, model, per_device: int, distill: bool):
    """The loss ``config`` names, at the model family's temperature, gathering in-batch negatives
    across devices under data parallelism: a distillation loss on the teacher's scores; AnglE +
    InfoNCE when either weight is off its default; else InfoNCE (cached MNRL when GradCache is on,
    :func:`resolve_mini_batch_size`). Refuses the settings a loss does not take, in one line."""
    from negsynth.train.loss import make_loss

    temperature = resolve_temperature(config, is_decoder_model(model))
    gather = config.gather_across_devices and data_parallel_world()[0] > 1
    mini_batch = resolve_mini_batch_size(config, per_device, model.device.type)
    angle = config.angle_weight > 0 or config.infonce_weight != 1.0
    if mini_batch and (distill or angle):
        raise ValueError(
            "mini_batch_size (GradCache) works with the InfoNCE loss alone (train.loss = 'mnrl', angle_weight = 0, "
            "infonce_weight = 1); set mini_batch_size = 'auto' or 'off'"
        )
    if distill:
        from negsynth.train.loss import make_distill_loss

        if angle:
            raise ValueError(
                f"train.loss = {config.loss!r} does not take the AnglE + InfoNCE weights; set angle_weight = 0 and infonce_weight = 1"
            )
        return make_distill_loss(
            model, config.loss, temperature=temperature, gather_across_devices=gather, **config.model_dump(include=set(_DISTILL_KEYS))
        )
    if angle:
        from negsynth.train.loss import make_angle_infonce_loss

        return make_angle_infonce_loss(model, temperature, gather_across_devices=gather, **config.model_dump(include=set(_ANGLE_KEYS)))
    return make_loss(model, temperature, gather_across_devices=gather, mini_batch_size=mini_batch)


def _training_arguments(config: TrainConfig, model, per_device: int, sampler):
    """``SentenceTransformerTrainingArguments`` from ``config``, for the device the model is on."""
    from sentence_transformers import SentenceTransformerTrainingArguments

    return SentenceTransformerTrainingArguments(
        output_dir=config.output_dir,
        per_device_train_batch_size=per_device,
        gradient_accumulation_steps=config.grad_accum,
        learning_rate=config.lr,
        # transformers 5 reads a float warmup_steps < 1 as a ratio (warmup_ratio is deprecated)
        warmup_steps=config.warmup_steps if config.warmup_steps or not config.warmup_ratio else config.warmup_ratio,
        max_grad_norm=config.max_grad_norm if config.max_grad_norm is not None else 0.0,
        lr_scheduler_type="linear",
        weight_decay=0.0,  # AdamW with no decay = the Adam of SEED_SPEC Table 5
        max_steps=config.max_steps,
        num_train_epochs=config.epochs,
        batch_sampler=sampler,
        seed=config.seed,
        data_seed=config.seed,
        save_strategy="steps",
        save_steps=config.save_steps,
        save_total_limit=None,  # rotation in seal_callback, after the new checkpoint is sealed
        logging_steps=config.logging_steps,
        report_to="none",
        dataloader_drop_last=False,
        dataloader_pin_memory=model.device.type == "cuda",  # on CPU torch warns that pinning does nothing
        disable_tqdm=True,
        use_cpu=model.device.type == "cpu",  # else the HF trainer moves a CPU-placed model to the GPU
        **_precision(config, model.device.type),
    )


def make_trainer(dataset, config: TrainConfig, model=None, progress=None):
    """Build (trainer, model) without training — used by :func:`train` and the benchmark.

    ``progress``: see :func:`train`."""
    from sentence_transformers import SentenceTransformerTrainer
    from transformers import set_seed

    from negsynth.train.loss import DISTILL_LOSSES

    set_seed(config.seed)
    ds = load_rows(dataset)
    phases = ds["phase"] if "phase" in ds.column_names else None
    levels = ds["level"] if "level" in ds.column_names else None
    text_cols = text_columns(ds.column_names)
    distill = config.loss in DISTILL_LOSSES
    if distill:
        check_teacher_labels(ds, config.loss, len(text_cols) - 2)
    train_ds, fmt = _training_dataset(ds, config, text_cols, distill)
    per_device = per_device_batch_size(config.batch_size)  # batch_size is global under torchrun (docs/scale.md)
    sampler, batch_starts = _batch_sampler(config, ds, train_ds, phases, per_device)
    model = model if model is not None else build_model(config)
    model.negsynth_text_format = fmt
    loss = _training_loss(config, model, per_device, distill)
    trainer = SentenceTransformerTrainer(
        model=model,
        args=_training_arguments(config, model, per_device, sampler),
        train_dataset=train_ds,
        loss=loss,
        callbacks=[
            curriculum_log_callback(phases, levels, config.grad_accum, batch_starts),
            seal_callback(config.save_total_limit),
        ],
    )
    if progress is not None:
        # the bar replaces the log dicts the trainer prints on stdout (train_log.json keeps them)
        from transformers import PrinterCallback

        trainer.remove_callback(PrinterCallback)
        trainer.add_callback(progress_callback(progress))
    return trainer, model


def train(dataset, config: TrainConfig | dict | None = None, *, progress=None) -> str:
    """Train on the ordered curriculum and return the folder of the final SentenceTransformer.

    ``dataset``: anything :func:`~negsynth.train.sampler.load_rows` reads; ``config``: a
    :class:`TrainConfig` or a dict of its fields. Writes ``<output_dir>/final`` (with LoRA: the
    adapter), sealed ``<output_dir>/checkpoint-<step>`` folders (``resume=True`` continues from the
    latest) and ``final/train_log.json`` (loss, lr, phase, level per step). ``progress``: a bar
    factory as :func:`~negsynth.train.callbacks.progress_callback` takes, instead of the trainer's
    log dicts on stdout.
    """
    config = config if isinstance(config, TrainConfig) else TrainConfig(**(config or {}))
    trainer, model = make_trainer(dataset, config, progress=progress)
    resume: str | bool | None = None
    if config.resume is True:
        last = last_checkpoint(config.output_dir)
        resume = str(last) if last is not None else None
        if resume is None:
            log.warning("resume=True but no whole checkpoint in %s; starting from scratch", config.output_dir)
    elif isinstance(config.resume, str):
        if not os.path.isdir(config.resume):
            raise ValueError(f"resume={config.resume!r}: no such checkpoint folder (use True for the latest in output_dir)")
        resume = config.resume
    if config.resume is not False and is_main_process():
        # a checkpoint a kill left half-written, after the one resumed from: the trainer would save into it
        start = checkpoint_step(Path(resume)) if resume else None
        for step, p, ok in checkpoints(config.output_dir):
            if not ok and (start is None or step > start):
                log.warning("%s is not whole (killed while it was saved): removed", p)
                drop_checkpoint(p)
    try:
        with quiet_loading():  # the checkpoints' save bars (transformers, the hub): the stage shows one bar
            trainer.train(resume_from_checkpoint=resume)
    finally:
        for cb in trainer.callback_handler.callbacks:
            if getattr(cb, "is_negsynth_progress", False):
                cb.close()  # a bar an error left open
    out = os.path.join(config.output_dir, "final")
    if is_main_process():  # one writer under torchrun
        save_model(model, out)
        with open(os.path.join(out, "train_log.json"), "w") as f:
            # the loss as trained: mini_batch_size "auto" resolves per device (GradCache chunk rows or None)
            loss = {"class": type(trainer.loss).__name__, "mini_batch_size": getattr(trainer.loss, "mini_batch_size", None)}
            json.dump({"config": config.model_dump(), "loss": loss, "log_history": trainer.state.log_history}, f, indent=1)
    trainer.accelerator.wait_for_everyone()
    log.info("saved the trained model to %s", out)
    return out
