"""sentence-transformers' stock recipe, one definition for the recipe benchmarks: the library's own
trainer with ``MultipleNegativesRankingLoss`` (scale 20), its ``NO_DUPLICATES`` sampler, linear
warmup over 10 % of the steps; the model saved with the base model's length, as negsynth saves its own."""

from __future__ import annotations

from pathlib import Path


def train_stock_recipe(model, ds, dest: Path, *, batch_size: int, lr: float, seed: int, max_length: int, steps: int | None = None):
    """Train ``model`` on ``ds`` (anchor, positive[, negative_1..n]) for ``steps`` (None: one pass),
    save it to ``dest`` and return the trainer (``trainer.batch_rows``: the rows of each batch trained)."""
    from sentence_transformers import SentenceTransformerTrainer, SentenceTransformerTrainingArguments
    from sentence_transformers.base.sampler import BatchSamplers
    from sentence_transformers.sentence_transformer.losses import MultipleNegativesRankingLoss
    from transformers import set_seed

    set_seed(seed)
    base_len = model.max_seq_length
    model.max_seq_length = max_length
    targs = SentenceTransformerTrainingArguments(
        output_dir=str(dest / "_ckpt"),
        per_device_train_batch_size=batch_size,
        learning_rate=lr,
        **({"num_train_epochs": 1} if steps is None else {"max_steps": steps}),
        warmup_ratio=0.1,
        batch_sampler=BatchSamplers.NO_DUPLICATES,
        seed=seed,
        data_seed=seed,
        save_strategy="no",
        report_to="none",
        logging_steps=1,
        disable_tqdm=True,
    )
    loss = MultipleNegativesRankingLoss(model)
    trainer = SentenceTransformerTrainer(model=model, args=targs, train_dataset=ds, loss=loss)
    # the rows of each batch as trained: NO_DUPLICATES leaves a batch short when rows share a text
    trainer.batch_rows = []
    hook = loss.register_forward_pre_hook(lambda _m, a: trainer.batch_rows.append(int(a[0][0]["input_ids"].shape[0])))
    trainer.train()
    hook.remove()
    model.max_seq_length = base_len  # evaluated like the base model (documents up to 256 tokens)
    model.save(str(dest))
    return trainer


def paired_against_stock(results: list[dict], arm: str, stock_arm: str, task: str, n_resamples: int = 10000) -> dict | None:
    """Per-query paired test of ``arm`` against ``stock_arm`` on ``task`` (each query averaged over
    the arm's seeds; ``results`` already narrowed to one dataset), or None when either has no
    per-query scores there."""
    from negsynth.evaluate.stats import align, paired_test

    def maps(a: str) -> list[dict]:
        return [r["per_query"][task] for r in sorted(results, key=lambda r: r["seed"]) if r["arm"] == a and task in r.get("per_query", {})]

    mine, stock = maps(arm), maps(stock_arm)
    if not mine or not stock or arm == stock_arm:
        return None
    qids, b = align(stock)
    _, a = align(mine, qids)
    return paired_test(a, b, n_resamples=n_resamples, seed=0)
