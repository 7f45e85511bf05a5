"""Progress of `negsynth train` (steps, loss, ETA) and `negsynth evaluate` (task i/n, name,
elapsed): a bar on stderr in the normal mode, nothing with --quiet, and with --json stdout holds
the JSON alone. A 1-layer BERT (tests/test_train_resume.py's fixture), 4 training steps, and a
4-pair STS set, so each command takes a few seconds."""

from __future__ import annotations

import io
import json

import pytest

pytest.importorskip("sentence_transformers")
pytest.importorskip("datasets")

from helpers import STS_ROWS, write_sts12  # noqa: E402
from test_train_resume import SETS, make_curriculum, runner, tiny_bert  # noqa: E402, F401 (tiny_bert: a fixture)

from negsynth.cli import app  # noqa: E402
from negsynth.pipeline.progress import Reporter  # noqa: E402

MODES = {"normal": [], "quiet": ["--quiet"], "json": ["--json"]}


def _no_bar(stderr: str, bar: str) -> None:
    assert bar not in stderr and "ETA" not in stderr, stderr


@pytest.mark.parametrize("mode", MODES)
def test_train_shows_steps_loss_and_eta_on_stderr_unless_quiet_or_json(tmp_path, tiny_bert, mode):  # noqa: F811
    rd = tmp_path / "run"
    make_curriculum(rd)
    r = runner.invoke(app, ["train", "-d", str(rd), *SETS, "--set", f"train.model='{tiny_bert}'", *MODES[mode]])
    assert r.exit_code == 0, r.output
    if mode == "normal":
        bar = next(line for line in r.stderr.splitlines() if line.startswith("train ") and "4/4" in line)
        assert "loss " in bar and "ETA" in bar, r.stderr
        assert r.stderr.index(bar) < r.stderr.index("loss first -> last")  # the summary table after the bar, as before
        assert "{'loss'" not in r.stderr and r.stdout == ""  # no trainer log dicts, nothing on stdout
    else:
        _no_bar(r.stderr, "4/4")
        assert "loss first -> last" not in r.stderr
    if mode == "json":
        assert json.loads(r.stdout)["steps"] == 4  # stdout is the JSON and nothing else
    elif mode == "quiet":
        assert r.stdout == ""


@pytest.mark.parametrize("mode", MODES)
def test_evaluate_shows_task_progress_on_stderr_unless_quiet_or_json(tmp_path, tiny_bert, mode):  # noqa: F811
    data = write_sts12(tmp_path / "data", STS_ROWS[:4])
    args = ["evaluate", "-d", str(tmp_path / "run"), "--model", tiny_bert, "--baseline", "", "--data-dir", str(data)]
    r = runner.invoke(app, [*args, "--tasks", "STS12,SICK-R", *MODES[mode]])
    assert r.exit_code == 0, r.output
    if mode == "normal":
        lines = r.stderr.splitlines()
        assert any(line.startswith("[1/2] STS12 (STS) spearman=") for line in lines), r.stderr  # the task's line
        assert any(line.startswith("[2/2] SICK-R: skipped") for line in lines), r.stderr
        bar = next(line for line in lines if line.startswith("evaluate ") and "2/2" in line)
        assert "tiny-bert" in bar and "0:00:" in bar, bar  # the model, tasks done / all, elapsed
        assert r.stdout == ""
    else:
        _no_bar(r.stderr, "2/2")
        assert "[1/2]" not in r.stderr
    if mode == "json":
        assert json.loads(r.stdout)["model"] == tiny_bert


def test_bar_prints_a_plain_line_on_a_console_that_is_no_terminal():
    """A log file gets a line every line_every_s seconds (here: every update) besides the final bar;
    ``completed`` counts work done before (a resumed run), ``status`` replaces valid/rejected."""
    rep = Reporter()
    rep.line_every_s = 0
    rep.console.file = out = io.StringIO()
    with rep.progress("train", 10, status="", completed=4) as bar:
        bar.update(advance=1, status="loss 0.5000")
        bar.print("[1/2] a plain line, no markup")
    text = out.getvalue()
    assert "train: 5/10 loss 0.5000" in text and "elapsed 0:00" in text, text
    assert "[1/2] a plain line, no markup" in text
    assert "valid" not in text


def test_quiet_reporter_gives_a_bar_that_does_nothing():
    rep = Reporter(quiet=True)
    rep.console.file = out = io.StringIO()
    with rep.progress("evaluate x", 3, status="") as bar:
        bar.update(advance=1, status="STS12")
        bar.print("[1/3] line")
    assert out.getvalue() == ""


def test_evaluate_library_keeps_its_lines_with_progress_true(tmp_path, capsys):
    """`evaluate(..., progress=True)` (the library default) prints its one line per task, no bar."""
    from test_evaluate import HashBOW

    from negsynth.evaluate import evaluate

    evaluate(HashBOW(), suite="full", data_dir=write_sts12(tmp_path, STS_ROWS[:4]), tasks=["STS12"])
    err = capsys.readouterr().err
    assert err.startswith("[1/1] STS12 (STS) spearman=") and "ETA" not in err


def test_in_jupyter_the_bar_leaves_stderr_alone_and_ends_with_one_plain_line(capsys):
    """Under ipykernel rich's live bar swapped sys.stderr for a proxy printing through a console that
    writes to sys.stderr: the trainer's own save bar then recursed without end. In Jupyter the bar
    is plain lines and sys.stderr stays the kernel's."""
    import sys

    from rich.console import Console

    rep = Reporter()
    rep.console = Console(stderr=True, force_jupyter=True, highlight=False)
    before = sys.stderr
    with rep.console.capture() as shown, rep.progress("train", 3, status="") as bar:  # (what IPython would display)
        assert sys.stderr is before
        print("a library's own line on stderr", file=sys.stderr)
        bar.update(advance=3, status="loss 0.2500")
    assert sys.stderr is before
    assert "a library's own line on stderr" in capsys.readouterr().err
    assert "train: 3/3 loss 0.2500" in shown.get()


def test_a_line_with_brackets_reaches_the_user_as_written(capsys):
    """Messages carry paths, config keys and install commands: rich markup must not eat them."""
    rep = Reporter()
    rep.warn("evaluate: no data; pip install 'negsynth[eval]'")
    rep.info("reading runs/[demo]/corpus")
    rep.waiting("the server at [::1] went away", True)
    err = capsys.readouterr().err
    assert "pip install 'negsynth[eval]'" in err
    assert "runs/[demo]/corpus" in err
    assert "[::1]" in err
