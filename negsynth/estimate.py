"""What a run will cost before a request is sent: ``negsynth estimate``.

For every stage of the run that calls the LLM (brainstorm, generate, regenerate with LLM
negatives, corpus, score with ``score.judge_model = "llm"``) it plans the stage's work items the
way the stage does and renders their actual prompts, then reports:

* **requests**: one per item (brainstorm: one per list asked in the first round; corpus: one per
  sampled document, its ``queries_per_doc`` queries share the answer), and ``requests_max`` with
  every validation re-ask the configured ``llm.max_attempts`` allows;
* **prompt tokens** of those prompts, counted with ``tiktoken`` for OpenAI models when it is
  installed, else estimated as characters / 4 (the ``tokenizer`` field says which);
* **completion tokens**: expected = the size of the stage's worked-example answer (the shape the
  model is shown), or the mean answer already in the run's cache for that stage when there is
  one; max = ``llm.max_tokens`` per request;
* **wall time** at ``--rps`` requests per second, or ``llm.max_concurrency`` requests every
  ``--latency`` seconds, capped by ``llm.rpm`` / ``llm.tpm``;
* **USD** from ``--price-in`` / ``--price-out`` ($ per 1M tokens) or ``llm.price``.

Where a stage's inputs do not exist yet (generate before brainstorm, score before generate), it
plans with stand-ins (brainstorm's worked-example tasks, generate's planned items with its worked
example's texts) and says so in ``basis``. A stage whose ``stats.json`` says it is complete costs
nothing (a rerun reuses it); a stage interrupted mid-way is estimated whole (its answered requests
come from the cache: the estimate is an upper bound).
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from negsynth.errors import UserError
from negsynth.pipeline.context import StageContext


def llm_stage_names() -> tuple[str, ...]:
    """The stages that call the LLM (always, or with some settings), in the method's order."""
    from negsynth.stages import METHOD

    return tuple(s.name for s in METHOD if s.llm)


#: tokens a chat format adds per message (OpenAI's rule of thumb: role and separators)
PER_MESSAGE = 4


class TokenCounter:
    """tiktoken for a model it knows, when installed; else characters / 4, labelled as such."""

    def __init__(self, model: str):
        self.enc = None
        self.name = "approx: characters / 4"
        try:
            import tiktoken
        except ImportError:
            return
        try:
            self.enc = tiktoken.encoding_for_model(model)
        except KeyError:
            return
        self.name = f"tiktoken:{self.enc.name}"

    def text(self, s: str) -> int:
        if self.enc is not None:
            return len(self.enc.encode(s, disallowed_special=()))
        return math.ceil(len(s) / 4)

    def messages(self, msgs: list[dict[str, str]]) -> int:
        return sum(self.text(m.get("content") or "") + PER_MESSAGE for m in msgs) + 3


@dataclass
class StageEstimate:
    stage: str
    items: int = 0
    requests: int = 0
    requests_max: int = 0
    prompt_tokens: int = 0
    prompt_tokens_max: int = 0
    completion_tokens: int = 0
    completion_tokens_max: int = 0
    basis: list[str] = field(default_factory=list)
    done: bool = False
    wall_s: float = 0.0
    wall_s_max: float = 0.0
    cost_usd: float = 0.0
    cost_usd_max: float = 0.0

    def add(
        self,
        msgs: list[dict[str, str]],
        answer_tokens: int,
        tc: TokenCounter,
        attempts: int,
        max_tokens: int,
        reask_tokens: int,
        n: int = 1,
    ) -> None:
        """``n`` requests of ``msgs``: first attempts, and the worst case of ``attempts`` tries
        (each re-ask resends the conversation with the rejected answer and the re-ask turn)."""
        p = tc.messages(msgs)
        answer = min(answer_tokens, max_tokens)
        self.requests += n
        self.requests_max += n * attempts
        self.prompt_tokens += n * p
        extra = answer + reask_tokens + 2 * PER_MESSAGE
        self.prompt_tokens_max += n * (attempts * p + extra * attempts * (attempts - 1) // 2)
        self.completion_tokens += n * answer
        self.completion_tokens_max += n * attempts * max_tokens


def _answer_tokens(msgs: list[dict[str, str]], tc: TokenCounter, fallback: int) -> int:
    """The worked example's answer (the last assistant turn), the shape the model is asked for."""
    for m in reversed(msgs):
        if m["role"] == "assistant":
            return tc.text(m["content"])
    return fallback


def _stage_finished(run_dir: Path, stage: str) -> bool:
    """Whether the stage's stats say it is done (the pipeline's one rule); no readable stats: not done."""
    from negsynth.pipeline.stage import finished_stats

    p = run_dir / stage / "stats.json"
    try:
        stats = json.loads(p.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(stats, dict) and "complete" in stats and finished_stats(stats)


def _stage_of_answer(text: str) -> str | None:
    """Which stage asked for a cached answer, from the keys of its JSON (the cache keeps no stage)."""
    try:
        obj = json.loads(text)
    except (TypeError, ValueError):
        return None
    if not isinstance(obj, dict):
        return None
    keys = set(obj)
    if "tasks" in keys:
        return "brainstorm"
    if "queries" in keys:
        return "corpus"
    if "answers_query" in keys:
        return "score"
    if keys == {"hard_negative_documents"}:
        return "regenerate"
    if keys & {"user_query", "input_text", "S1", "input"}:
        return "generate"
    return None


def _cached_answer_tokens(run_dir: Path) -> dict[str, int]:
    """Per stage, the mean completion tokens of its answers in the run's request cache (the first
    5,000 answers), for the stages that have some."""
    import sqlite3
    from collections import defaultdict

    path = run_dir / "cache" / "llm.sqlite"
    if not path.is_file():
        return {}
    try:
        con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        try:
            rows = con.execute("SELECT value FROM responses LIMIT 5000").fetchall()
        finally:
            con.close()
    except sqlite3.Error:
        return {}
    usage: dict[str, list[int]] = defaultdict(list)
    for (v,) in rows:
        try:
            obj = json.loads(v)
            stage = _stage_of_answer(obj.get("text"))
            if stage is not None and obj["usage"][1]:
                usage[stage].append(int(obj["usage"][1]))
        except (ValueError, KeyError, TypeError, IndexError, AttributeError):
            continue
    return {k: round(sum(v) / len(v)) for k, v in usage.items()}


# ---------------------------------------------------------------------------- per stage
def _brainstorm(ctx: StageContext, est: StageEstimate, tc: TokenCounter, common: dict) -> None:
    from negsynth.stages.brainstorm import build_messages

    bc = ctx.cfg.brainstorm
    for tt in bc.task_types:
        n = min(max(1, math.ceil(bc.tasks_per_type / bc.tasks_per_request)), bc.max_requests_per_type)
        msgs = build_messages(tt, bc.tasks_per_request)
        ans = _answer_tokens(msgs, tc, common["fallback"])
        est.items += 1
        est.add(msgs, ans, tc, n=n, **common["add"])
    est.basis.append("one list request per tasks_per_request tasks wanted (the first round; more only if lists come back short)")


def _generate(ctx: StageContext, est: StageEstimate, tc: TokenCounter, common: dict) -> list[dict]:
    """Also returns the planned items' payloads (score's stand-ins when generate has not run)."""
    from negsynth.prompts import load_example
    from negsynth.schemas.records import Task
    from negsynth.stages.generate import build_messages, load_tasks, plan_items

    cfg = ctx.cfg.generate
    if list((ctx.run_dir / "brainstorm").glob("shard-*.jsonl")):
        tasks = load_tasks(ctx)
        est.basis.append("tasks from RUN_DIR/brainstorm")
    else:
        tasks = {
            tt: [
                Task(id=f"example-{tt}-{i}", task_type=tt, task=t, model="example")
                for i, t in enumerate(load_example(f"brainstorm_{tt}")["output"]["tasks"])
            ]
            for tt in cfg.ratio
            if tt != "sts"
        }
        from negsynth.schemas.records import STS_TASK

        tasks["sts"] = [Task(id="task-sts-fixed", task_type="sts", task=STS_TASK, model="fixed")]
        est.basis.append("brainstorm has not run: its worked-example tasks stand in for the tasks")
    items = plan_items(ctx, tasks)
    for it in items:
        p = it.payload
        msgs = build_messages(p["task_type"], p["task"], p["attributes"], few_shot=cfg.few_shot, shot=p.get("shot", 0))
        est.items += 1
        est.add(msgs, _answer_tokens(msgs, tc, common["fallback"]), tc, **common["add"])
    return [it.payload for it in items]


def no_inputs(stage: str) -> str:
    """estimate's line for a stage with no inputs: the ways estimate itself takes them (it has no --input)."""
    return (
        f'estimate: {stage} has no inputs; add [[{stage}.inputs]] path = "..." to the run file (-c FILE), '
        f"or pass --set '{stage}.inputs=[{{path=\"docs.jsonl\"}}]'"
    )


def _regenerate(ctx: StageContext, est: StageEstimate, tc: TokenCounter, common: dict) -> None:
    from negsynth.stages.regenerate import build_messages, load_inputs, plan_items

    cfg = ctx.cfg.regenerate
    if cfg.negatives == "mined":
        est.basis.append("regenerate.negatives = 'mined': no LLM request")
        return
    if not cfg.inputs:
        raise UserError(no_inputs("regenerate"))
    items, _ = plan_items(ctx, load_inputs(ctx))
    for it in items:
        msgs = build_messages(it.payload, cfg)
        est.items += 1
        est.add(msgs, _answer_tokens(msgs, tc, common["fallback"]), tc, **common["add"])
    est.basis.append("one request per input pair left after dedup and checks")


def _corpus(ctx: StageContext, est: StageEstimate, tc: TokenCounter, common: dict) -> None:
    from negsynth.stages.corpus import build_messages, cut_tokens, load_corpora, plan_items

    cfg = ctx.cfg.corpus
    if not cfg.inputs:
        raise UserError(no_inputs("corpus"))
    items = plan_items(ctx, load_corpora(ctx))
    est.items = len(items)
    for it in items:
        p = it.payload
        if p["query_index"]:
            continue  # a document's queries share one answer: one request per sampled document
        # the stage cuts the document to corpus.doc_tokens tokens of the embedder's tokenizer;
        # words stand in for them here (no model is loaded)
        msgs = build_messages(p, cfg, cut_tokens(p["document"], None, cfg.doc_tokens))
        est.add(msgs, _answer_tokens(msgs, tc, common["fallback"]), tc, **common["add"])
    est.basis.append("one request per sampled document (corpus.max_docs), the document cut to corpus.doc_tokens words")


def _score(ctx: StageContext, est: StageEstimate, tc: TokenCounter, common: dict, generated: list[dict] | None) -> None:
    from negsynth.stages.score.llm_judge import judge_messages

    if ctx.cfg.score.judge_model != "llm":
        est.basis.append("score.judge_model is not 'llm': no LLM request")
        return
    examples: list[dict] = []
    for stage in ("generate", "regenerate", "corpus"):
        for p in sorted((ctx.run_dir / stage).glob("shard-*.jsonl")):
            with open(p, encoding="utf-8") as f:
                examples += [json.loads(x) for x in f if x.strip()]
    if examples:
        est.basis.append("one judgement per example in the finished shards")
    else:
        from negsynth.prompts import load_examples

        stand_ins = []
        for g in generated or []:
            # every worked example is {query field, positive field, [negatives]}, in that order
            query, positive, negatives = list(load_examples(f"generate_{g['task_type']}")[0]["output"].values())[:3]
            stand_ins.append({"query": str(query), "positive": str(positive), "negatives": [str(x) for x in negatives]})
        examples = stand_ins
        est.basis.append("no examples yet: one judgement per planned generate item, generate's worked examples standing in for the texts")
    for ex in examples:
        msgs = judge_messages(ex.get("query", ""), ex.get("positive", ""), ex.get("negatives") or [])
        est.items += 1
        est.add(msgs, min(common["fallback"], 8 + 6 * len(ex.get("negatives") or [])), tc, **common["add"])


# ---------------------------------------------------------------------------- the run
def estimate(
    ctx: StageContext,
    stages: list[str] | None = None,
    *,
    rps: float | None = None,
    latency_s: float = 5.0,
    price_in: float | None = None,
    price_out: float | None = None,
) -> dict[str, Any]:
    """The estimate of ``stages`` (default: the LLM stages of ``pipeline.stages``), as a dict."""
    from negsynth.prompts import reask_template

    cfg = ctx.cfg
    llm_stages = llm_stage_names()
    names = stages or [s for s in cfg.pipeline.stages if s in llm_stages]
    bad = [s for s in names if s not in llm_stages]
    if bad:
        raise UserError(f"--stages {','.join(bad)}: not a stage that calls the LLM; choose from {', '.join(llm_stages)}")
    if latency_s <= 0 or (rps is not None and rps <= 0):
        raise UserError("--latency and --rps must be > 0")
    tc = TokenCounter(cfg.llm.model)
    cached = _cached_answer_tokens(ctx.run_dir)
    fallback = min(cfg.llm.max_tokens, 256)
    common = {
        "fallback": fallback,
        "add": {"attempts": cfg.llm.max_attempts, "max_tokens": cfg.llm.max_tokens, "reask_tokens": tc.text(reask_template())},
    }
    pin = cfg.llm.price.input_per_mtok if price_in is None else price_in
    pout = cfg.llm.price.output_per_mtok if price_out is None else price_out
    # requests per second: given, or llm.max_concurrency in flight, each taking --latency seconds
    rate = rps if rps is not None else cfg.llm.max_concurrency / latency_s
    if cfg.llm.rpm:
        rate = min(rate, cfg.llm.rpm / 60)
    out: dict[str, Any] = {"stages": {}}
    generated: list[dict] | None = None
    for name in names:
        est = StageEstimate(stage=name)
        if _stage_finished(ctx.run_dir, name):
            est.done = True
            est.basis.append("finished: a rerun reuses its outputs and sends nothing")
        elif name == "brainstorm":
            _brainstorm(ctx, est, tc, common)
        elif name == "generate":
            generated = _generate(ctx, est, tc, common)
        elif name == "regenerate":
            _regenerate(ctx, est, tc, common)
        elif name == "corpus":
            _corpus(ctx, est, tc, common)
        elif name == "score":
            if generated is None and "generate" in cfg.pipeline.stages and not list((ctx.run_dir / "generate").glob("shard-*.jsonl")):
                generated = _generate(ctx, StageEstimate(stage="generate"), tc, common)
            _score(ctx, est, tc, common, generated)
        if name in cached and est.requests:
            est.completion_tokens = est.requests * min(cached[name], cfg.llm.max_tokens)
            est.basis.append(f"completion tokens: the mean of its answers in the run's request cache ({cached[name]} tokens)")
        for suffix, req, pt, ct in (
            ("", est.requests, est.prompt_tokens, est.completion_tokens),
            ("_max", est.requests_max, est.prompt_tokens_max, est.completion_tokens_max),
        ):
            r = rate
            if cfg.llm.tpm and req:
                r = min(r, cfg.llm.tpm / 60 / ((pt + ct) / req))
            setattr(est, "wall_s" + suffix, round(req / r, 1) if req else 0.0)
            setattr(est, "cost_usd" + suffix, round((pt * pin + ct * pout) / 1e6, 6))
        out["stages"][name] = asdict(est)
    tot = {
        k: sum(s[k] for s in out["stages"].values())
        for k in (
            "requests",
            "requests_max",
            "prompt_tokens",
            "prompt_tokens_max",
            "completion_tokens",
            "completion_tokens_max",
            "wall_s",
            "wall_s_max",
            "cost_usd",
            "cost_usd_max",
        )
    }
    tot["cost_usd"], tot["cost_usd_max"] = round(tot["cost_usd"], 6), round(tot["cost_usd_max"], 6)
    out["total"] = tot
    out["assumptions"] = {
        "model": cfg.llm.model,
        "tokenizer": tc.name,
        "completion_tokens": "the size of each stage's worked-example answer, or the mean of its answers in the run's request cache when it has some (max: llm.max_tokens per request)",
        "requests_max": f"every item using all llm.max_attempts={cfg.llm.max_attempts} attempts",
        "rate_rps": round(rate, 4),
        "rate_basis": f"--rps {rps:g}"
        if rps is not None
        else f"llm.max_concurrency={cfg.llm.max_concurrency} requests every --latency {latency_s:g} s"
        + (f", capped by llm.rpm={cfg.llm.rpm}" if cfg.llm.rpm else "")
        + (f" and llm.tpm={cfg.llm.tpm}" if cfg.llm.tpm else ""),
        "price_per_mtok": {"input": pin, "output": pout},
        "price_basis": "--price-in/--price-out" if price_in is not None or price_out is not None else "llm.price",
    }
    return out


def render(est: dict[str, Any]) -> None:
    """The estimate as two tables on stdout (expected, and every re-ask used) and its assumptions."""
    from rich.table import Table

    from negsynth.pipeline.progress import report_console

    console = report_console()
    rows = list(est["stages"].items()) + [("total", est["total"])]
    for title, sfx in (("estimate before any request is sent", ""), ("worst case: every item uses all llm.max_attempts", "_max")):
        t = Table(title=title, title_justify="left")
        for h in ("stage", "requests", "prompt tokens", "completion tokens", "wall time", "USD"):
            t.add_column(h, justify="left" if h == "stage" else "right")
        for name, s in rows:
            if s.get("done"):
                t.add_row(name, "done", "", "", "", "")
            elif name != "total" and not s["requests"]:
                t.add_row(name, "no LLM", "", "", "", "")
            else:
                t.add_row(
                    name,
                    f"{s['requests' + sfx]:,}",
                    f"{s['prompt_tokens' + sfx]:,}",
                    f"{s['completion_tokens' + sfx]:,}",
                    _dur(s["wall_s" + sfx]),
                    f"${s['cost_usd' + sfx]:,.2f}",
                )
        console.print(t)
    a = est["assumptions"]
    console.print(f"tokens: {a['tokenizer']}; completion tokens: {a['completion_tokens']}")
    console.print(f"wall time at {a['rate_rps']:g} requests/s ({a['rate_basis']})")
    console.print(
        f"USD at ${a['price_per_mtok']['input']:g} / ${a['price_per_mtok']['output']:g} per 1M tokens in / out ({a['price_basis']})"
    )
    for name, s in est["stages"].items():
        for b in s["basis"]:
            console.print(f"  {name}: {b}")


def _dur(s: float) -> str:
    if s < 90:
        return f"{s:.0f} s"
    if s < 5400:
        return f"{s / 60:.0f} min"
    return f"{s / 3600:.1f} h"
