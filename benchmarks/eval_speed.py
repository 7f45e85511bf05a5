"""Evaluation speed: the encoder backends side by side (same scores?), and what the results cache saves.

**Backend arms** ``BACKEND[@DEVICE[:DTYPE]]`` (``torch``, ``openvino``, ``openvino-bf16``,
``torch@cuda``, ``torch@cuda:float32``; device cpu unless named): all-MiniLM-L6-v2 evaluated through
``negsynth.evaluate_model`` with ``evaluate.backend`` / ``dtype`` and ``embedder.device`` set, in this
process (``--threads`` torch threads). Reported per arm: the evaluation's own seconds (the report's,
the model's load and an ONNX export left out), the speed-up over the first arm, each task's main
score and its difference from the first arm's. A backend may replace torch as the default only
when its scores equal torch's to the 4th decimal.

**Cache arms** ``no-cache`` / ``cache``: what the results cache saves a user, ``negsynth evaluate``
of a newly trained model (MiniLM with every weight moved by seeded noise, ``--noise``) against its
base, as whole commands: ``--no-cache`` (both models scored), and with ``NEGSYNTH_EVAL_CACHE_DIR`` a
fresh copy of a folder where an earlier run stored the base's results (as after a new training).
Reported: the command's wall time and whether both arms' reports hold the same scores.

Every arm runs ``--repeats`` times, order rotated (a load spike hits them alike); medians::

    python benchmarks/eval_speed.py --arms torch,openvino,openvino-bf16               # SciFact, quick suite
    python benchmarks/eval_speed.py --arms torch,openvino --suite full --tasks SciFact,STSBenchmark,TRECClustering
    python benchmarks/eval_speed.py --arms torch,torch@cuda,torch@cuda:float32 --suite full   # on a GPU
    python benchmarks/eval_speed.py --arms no-cache,cache --tasks STSBenchmark,SICK-R,STS12,SciFact,MRPC,SICK-E,TREC,TRECClustering
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import harness

CACHE_ARMS = ("no-cache", "cache")


def backend_arm(arm: str, a) -> dict:
    """One evaluation of MiniLM with ``arm``'s backend, device and dtype."""
    import negsynth

    backend, _, where = arm.partition("@")
    device, dtype = where or "cpu", "auto"  # auto: float32 on a CPU, bf16 / fp16 on a GPU
    if ":" in device and not device.rsplit(":", 1)[1].isdigit():  # cuda:float32, cuda:1:float32
        device, dtype = device.rsplit(":", 1)
    sets = [f"evaluate.backend={backend}", f"evaluate.dtype={dtype}", f"embedder.device={device}", f"evaluate.batch_size={a.batch_size}"]
    rep = negsynth.evaluate_model("default", a.tasks, suite=a.suite, overrides=sets, data_dir=a.data_dir)
    if not rep["tasks"]:
        sys.exit("eval_speed: no evaluation data: " + "; ".join(rep["notes"]))
    return {"seconds": rep["seconds"], "cpu_seconds": rep["cpu_seconds"], "scores": {t: r["main_score"] for t, r in rep["tasks"].items()}}


def perturbed_model(dest: Path, noise: float) -> str:
    """MiniLM with every weight moved by seeded noise: a new model by content, as a training makes."""
    import torch

    m = harness.base_model("cpu")
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in m.parameters():
            p.add_(torch.randn(p.shape, generator=g) * noise)
    m.save(str(dest))
    return str(dest)


def cache_arm(arm: str, rep: int, a, tmp: Path) -> dict:
    """``negsynth evaluate --model TRAINED --baseline BASE`` as a whole command, with or without the stored base results."""
    env = dict(os.environ)
    run_dir, cmd = tmp / f"run-{arm}-{rep}", ["--no-cache"]
    if arm == "cache":
        shutil.copytree(tmp / "warm", tmp / f"cache-{rep}")
        env["NEGSYNTH_EVAL_CACHE_DIR"], cmd = str(tmp / f"cache-{rep}"), []
    t0 = time.perf_counter()
    evaluate(a, run_dir, a.trained, a.base, *cmd, env=env)
    wall = time.perf_counter() - t0
    reps = {n: json.loads((run_dir / "evaluate" / n).read_text()) for n in ("baseline.json", "report.json")}
    return {"seconds": wall, "scores": {f"{n[:-5]}:{t}": r["main_score"] for n, rep_ in reps.items() for t, r in rep_["tasks"].items()}}


def evaluate(a, run_dir: Path, model: str, baseline: str, *extra: str, env: dict) -> None:
    """``negsynth evaluate`` of ``model`` against ``baseline`` into ``run_dir``, quietly."""
    args = [
        "evaluate",
        "-d",
        str(run_dir),
        "--model",
        model,
        "--baseline",
        baseline,
        "--suite",
        a.suite,
        "--tasks",
        ",".join(a.tasks),
        "--quiet",
    ]
    args += ["--data-dir", str(a.data_dir)] if a.data_dir else []
    subprocess.run(harness.negsynth_cli(*args, *extra), check=True, env=env, stdout=subprocess.DEVNULL)


def report(runs: dict[str, list[dict]], what: str) -> dict:
    names = list(runs)
    ref, t_ref = runs[names[0]][0]["scores"], harness.median(runs[names[0]], "seconds")
    rows, summary = [], {}
    for arm, rs in runs.items():
        med, scores = harness.median(rs, "seconds"), rs[0]["scores"]
        same = all(round(r["scores"][t], 4) == round(ref[t], 4) for r in rs for t in ref)
        summary[arm] = {"median_s": med, "speedup": t_ref / med, "scores": scores, "same_to_4_decimals": same}
        cells = " ".join(f"{t} {100 * s:.4f} ({100 * (s - ref[t]):+.4f})" for t, s in scores.items())
        rows.append(
            [arm, " / ".join(f"{r['seconds']:.1f}" for r in rs), f"{med:.1f}", f"{t_ref / med:.2f}x", "yes" if same else "NO", cells]
        )
    print(f"\n{what}\n")
    print(harness.table(["arm", "s (reps)", "median s", "speed-up", f"same scores as {names[0]}", f"scores (Δ vs {names[0]})"], rows))
    return summary


def main(argv: list[str] | None = None) -> None:
    ap = harness.parser(__doc__)
    ap.add_argument(
        "--arms", default="torch,openvino,openvino-bf16", help="BACKEND[@DEVICE[:DTYPE]] or no-cache / cache; the first the reference"
    )
    ap.add_argument("--suite", default="quick", choices=["quick", "full"])
    ap.add_argument("--tasks", type=lambda v: [t for t in v.split(",") if t], default="SciFact")
    ap.add_argument("--data-dir", default=None)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2, help="backend arms: torch / runtime threads")
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--noise", type=float, default=1e-3, help="cache arms: the std of the noise that makes the 'trained' model")
    ap.add_argument("--json", type=Path, default=None)
    a = ap.parse_args(argv)
    arms = [x.strip() for x in a.arms.split(",") if x.strip()]
    start, out = harness.machine(), {}
    if backends := [x for x in arms if x not in CACHE_ARMS]:
        import torch

        torch.set_num_threads(a.threads)
        runs = harness.interleaved(backends, a.repeats, lambda arm, rep: backend_arm(arm, a))
        out["backends"] = report(
            runs, f"{a.suite} {','.join(a.tasks)}; {a.repeats} reps interleaved; {torch.get_num_threads()} torch threads"
        )
    if cached := [x for x in arms if x in CACHE_ARMS]:
        import negsynth

        with tempfile.TemporaryDirectory() as td:
            tmp = Path(td)
            a.base, a.trained = negsynth.model_path("default"), perturbed_model(tmp / "trained", a.noise)
            evaluate(
                a, tmp / "run-warm", a.base, "", env={**os.environ, "NEGSYNTH_EVAL_CACHE_DIR": str(tmp / "warm")}
            )  # stores the base's results
            runs = harness.interleaved(cached, a.repeats, lambda arm, rep: cache_arm(arm, rep, a, tmp))
        out["cache"] = report(runs, f"negsynth evaluate of a new model against its base, {a.suite} {','.join(a.tasks)}; whole commands")
    print(f"\nload at start {start['load']}, at end {harness.machine()['load']}; {start['cpus']} CPUs")
    harness.write_record(a.json, a, start, **out)


if __name__ == "__main__":
    main()
