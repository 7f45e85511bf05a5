"""What a run will cost before a request is sent: ``negsynth estimate`` (docs/configuration.md).

Each LLM stage counts the requests its run would send (:meth:`Stage.estimate
<negsynth.pipeline.stage.Stage.estimate>`); this module turns them into tokens, wall time and USD,
expected and with every re-ask used. A finished stage costs nothing.
"""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import asdict
from pathlib import Path
from typing import Any

from negsynth.errors import UserError
from negsynth.pipeline.context import StageContext
from negsynth.pipeline.tally import StageEstimate, Tally, TokenCounter


def method():
    """The method's stages, in order (:data:`negsynth.stages.METHOD`, read when called)."""
    from negsynth.stages import METHOD

    return METHOD


def _stage_finished(run_dir: Path, stage: str) -> bool:
    """Whether the stage's stats say it is done (the pipeline's one rule); no readable stats: not done."""
    from negsynth.pipeline.stage import finished_stats

    p = run_dir / stage / "stats.json"
    try:
        stats = json.loads(p.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(stats, dict) and "complete" in stats and finished_stats(stats)


def _cached_answer_tokens(run_dir: Path) -> dict[str, int]:
    """Per stage, the mean completion tokens of its answers among the first 5,000 in the run's
    request cache (an answer that names no ``"stage"`` is not counted)."""
    import sqlite3

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
            stage = obj.get("stage")
            if isinstance(stage, str) and obj["usage"][1]:
                usage[stage].append(int(obj["usage"][1]))
        except (ValueError, KeyError, TypeError, IndexError, AttributeError):
            continue
    return {k: round(sum(v) / len(v)) for k, v in usage.items()}


# ---------------------------------------------------------------------------- the run
#: the figures of each stage that the total adds up, each expected and with every re-ask used
TOTAL_KEYS = tuple(
    k + sfx for k in ("requests", "prompt_tokens", "completion_tokens", "prefix_tokens", "wall_s", "cost_usd") for sfx in ("", "_max")
)


def estimate(
    ctx: StageContext,
    stages: list[str] | None = None,
    *,
    rps: float | None = None,
    latency_s: float | None = None,
    price_in: float | None = None,
    price_out: float | None = None,
) -> dict[str, Any]:
    """The estimate of ``stages`` (default: the LLM stages of ``pipeline.stages``), as a dict."""
    cfg = ctx.cfg
    names = _stages_to_estimate(cfg, stages)
    if (latency_s is not None and latency_s <= 0) or (rps is not None and rps <= 0):
        raise UserError("--latency and --rps must be > 0")
    # the embedded LLM is timed on this machine unless the caller says how fast it is
    measure = rps is None and latency_s is None and cfg.llm.base_url == "embedded"
    latency_s = 5.0 if latency_s is None else latency_s
    tc = TokenCounter(cfg.llm.model)
    cached = _cached_answer_tokens(ctx.run_dir)
    pin = cfg.llm.price.input_per_mtok if price_in is None else price_in
    pout = cfg.llm.price.output_per_mtok if price_out is None else price_out
    # requests per second: given, or llm.max_concurrency in flight, each taking --latency seconds
    rate = rps if rps is not None else cfg.llm.max_concurrency / latency_s
    if cfg.llm.rpm:
        rate = min(rate, cfg.llm.rpm / 60)
    ests = _count_stages(ctx, names, tc, cached)
    speed = None
    if measure and any(e.requests for e in ests):
        from negsynth.pipeline.embedded_speed import measure_embedded

        speed = measure_embedded(cfg, ctx.run_dir, ctx.reporter, tc.text)
    out: dict[str, Any] = {"stages": {}}
    for est in ests:
        _time_and_price(est, rate=rate, tpm=cfg.llm.tpm, speed=speed, pin=pin, pout=pout)
        out["stages"][est.stage] = asdict(est)
    tot = {k: sum(s[k] for s in out["stages"].values()) for k in TOTAL_KEYS}
    tot["cost_usd"], tot["cost_usd_max"] = round(tot["cost_usd"], 6), round(tot["cost_usd_max"], 6)
    out["total"] = tot
    out["assumptions"] = {
        "model": cfg.llm.model,
        "tokenizer": tc.name,
        "completion_tokens": "the size of each stage's worked-example answer, or the mean of its answers in the run's request cache when it has some (max: llm.max_tokens per request)",
        "requests_max": f"every item using all llm.max_attempts={cfg.llm.max_attempts} attempts",
        "rate_rps": round(rate, 4) if speed is None else None,
        "rate_basis": speed.basis
        if speed is not None
        else f"--rps {rps:g}"
        if rps is not None
        else f"llm.max_concurrency={cfg.llm.max_concurrency} requests every --latency {latency_s:g} s"
        + (f", capped by llm.rpm={cfg.llm.rpm}" if cfg.llm.rpm else "")
        + (f" and llm.tpm={cfg.llm.tpm}" if cfg.llm.tpm else ""),
        "price_per_mtok": {"input": pin, "output": pout},
        "price_basis": "--price-in/--price-out" if price_in is not None or price_out is not None else "llm.price",
    }
    return out


def _stages_to_estimate(cfg, stages: list[str] | None) -> list[str]:
    """``stages`` (``--stages``), else the stages of ``pipeline.stages`` that call the LLM."""
    llm_stages = [s.name for s in method() if s.uses_llm(cfg)]
    names = stages or [s for s in cfg.pipeline.stages if s in llm_stages]
    bad = [s for s in names if s not in llm_stages]
    if bad:
        raise UserError(f"--stages {','.join(bad)}: not a stage that calls the LLM with this config; choose from {', '.join(llm_stages)}")
    return names


def _count_stages(ctx: StageContext, names: list[str], tc: TokenCounter, cached: dict[str, int]) -> list[StageEstimate]:
    """Requests and tokens of each stage in ``names``, from its own estimator (``cached``: mean
    completion tokens per stage)."""
    from negsynth.prompts import reask_template

    cfg = ctx.cfg
    counts = {"attempts": cfg.llm.max_attempts, "max_tokens": cfg.llm.max_tokens, "reask_tokens": tc.text(reask_template())}
    fallback = min(cfg.llm.max_tokens, 256)
    by_name = {s.name: s for s in method()}
    ests: list[StageEstimate] = []
    for name in names:
        est = StageEstimate(stage=name)
        ests.append(est)
        if _stage_finished(ctx.run_dir, name):
            est.done = True
            est.basis.append("finished: a rerun reuses its outputs and sends nothing")
        else:
            by_name[name].estimate(ctx, Tally(est, tc, fallback=fallback, **counts))
        if name in cached and est.requests:
            est.completion_tokens = est.requests * min(cached[name], cfg.llm.max_tokens)
            est.basis.append(f"completion tokens: the mean of its answers in the run's request cache ({cached[name]} tokens)")
    return ests


def _time_and_price(est: StageEstimate, *, rate: float, tpm: int | None, speed, pin: float, pout: float) -> None:
    """Set ``est``'s wall time and USD, expected and max, at ``rate`` (capped by ``tpm``) or ``speed``."""
    for suffix, req, pt, ct, pre in (
        ("", est.requests, est.prompt_tokens, est.completion_tokens, est.prefix_tokens),
        ("_max", est.requests_max, est.prompt_tokens_max, est.completion_tokens_max, est.prefix_tokens_max),
    ):
        r = rate
        if tpm and req:
            r = min(r, tpm / 60 / ((pt + ct) / req))
        wall = speed.seconds(req, pt, ct, pre) if speed is not None else (req / r if req else 0.0)
        setattr(est, "wall_s" + suffix, round(wall, 1))
        setattr(est, "cost_usd" + suffix, round((pt * pin + ct * pout) / 1e6, 6))


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
    if a["rate_rps"] is None:
        console.print(f"wall time: the embedded LLM {a['rate_basis']}")
    else:
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
