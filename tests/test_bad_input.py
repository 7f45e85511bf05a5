"""Bad input: one-line error naming the file/field and the fix, exit code != 0, no traceback,
and nothing already written is lost or corrupted (every file's hash is the same afterwards).

Cases already covered by tests/test_cli_pipeline.py (unknown llm key, max_concurrency=0, bad
base_url, missing key env var, unreachable server, unknown brainstorm type, --set without '=',
missing config file, unclosed TOML table, generate before brainstorm) are not repeated here.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
from fake_openai import FakeOpenAI, always_valid
from helpers import write_run_config
from typer.testing import CliRunner

from negsynth.cli import app

runner = CliRunner()


def write_config(tmp: Path, base_url: str) -> Path:
    return write_run_config(tmp, base_url)


@pytest.fixture(scope="module")
def server():
    with FakeOpenAI(always_valid) as srv:
        yield srv


@pytest.fixture(scope="module")
def finished(tmp_path_factory, server) -> Path:
    """A run dir with brainstorm and generate done: what must survive every bad command."""
    tmp = tmp_path_factory.mktemp("done")
    cfg = write_config(tmp, server.base_url)
    for stage in ("brainstorm", "generate"):
        r = runner.invoke(app, [stage, "-c", str(cfg), "-d", str(tmp / "run"), "-q"])
        assert r.exit_code == 0, r.output
    return tmp / "run"


def hashes(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(root.rglob("*")) if p.is_file()}


def check_one_line(r, *needles: str) -> None:
    assert r.exit_code not in (0, None), r.output
    err = r.stderr
    assert "Traceback" not in err and err.count("\n") == 1, err
    assert err.startswith("error: ")
    for n in needles:
        assert n in err, (n, err)


# Each case: (name, prepare(tmp, run_dir, cfg) -> args, needles). ``prepare`` may damage the run dir
# (before the hashes are taken) and returns the CLI arguments.
Case = tuple[str, Callable[[Path, Path, Path], list[str]], tuple[str, ...]]


def toml(tmp: Path, text: str) -> Path:
    p = tmp / "bad.toml"
    p.write_text(text)
    return p


def gen(cfg: Path, rd: Path, *extra: str) -> list[str]:
    return ["generate", "-c", str(cfg), "-d", str(rd), "-q", *extra]


def damage(rd: Path, rel: str, data: bytes | None) -> None:
    p = rd / rel
    if data is None:
        p.unlink()
    else:
        p.write_bytes(data)


def unfinish(rd: Path, s: int, prefix: bytes) -> None:
    """Turn finished shard ``s`` back into a .partial (as the runner writes it), with ``prefix`` first."""
    final = rd / "generate" / f"shard-{s:05d}.jsonl"
    rows = [json.loads(x) for x in final.read_text().splitlines()]
    start = s * 4
    lines = [json.dumps({"i": start + i, "k": "ok", "r": r}) for i, r in enumerate(rows)]
    final.with_name(final.name + ".partial").write_bytes(prefix + "\n".join(lines[:-1]).encode() + b"\n")
    final.unlink()


CASES: list[Case] = [
    # -- config files -----------------------------------------------------------------------
    (
        "wrong type in TOML",
        lambda t, rd, c: gen(toml(t, '[llm]\nmax_concurrency = "many"\n'), rd),
        ("bad.toml", "[llm] max_concurrency", "integer"),
    ),
    ("section is not a table", lambda t, rd, c: gen(toml(t, "llm = 5\n"), rd), ("bad.toml", "llm")),
    ("unknown section", lambda t, rd, c: gen(toml(t, "[lmm]\nmodel = 'x'\n"), rd), ("bad.toml", "unknown key 'lmm'", "allowed:")),
    (
        "unknown generate key",
        lambda t, rd, c: gen(toml(t, "[generate]\nexmaples = 3\n"), rd),
        ("[generate] unknown key 'exmaples'", "examples"),
    ),
    ("duplicate key", lambda t, rd, c: gen(toml(t, "[llm]\nmodel = 'a'\nmodel = 'b'\n"), rd), ("bad.toml", "invalid TOML")),
    ("config is a directory", lambda t, rd, c: gen(t, rd), ("cannot read config",)),
    (
        "config not UTF-8",
        lambda t, rd, c: (t / "bin.toml").write_bytes(b"\xff\xfe[llm]\x00") and gen(t / "bin.toml", rd),
        ("bin.toml", "cannot read config"),
    ),
    ("timeout must be > 0", lambda t, rd, c: gen(c, rd, "--set", "llm.timeout=0"), ("[llm] timeout", "greater than 0")),
    ("shard_size 0", lambda t, rd, c: gen(c, rd, "--set", "pipeline.shard_size=0"), ("[pipeline] shard_size",)),
    (
        "unknown task type in ratio",
        lambda t, rd, c: gen(c, rd, "--set", "generate.ratio={bitext=1.0}"),
        ("[generate] ratio", "unknown task type 'bitext'"),
    ),
    ("ratio all zero", lambda t, rd, c: gen(c, rd, "--set", "generate.ratio={sts=0.0}"), ("ratio", "at least one task type")),
    ("structured_output literal", lambda t, rd, c: gen(c, rd, "--set", "llm.structured_output=xml"), ("structured_output", "json_schema")),
    # -- --set syntax ------------------------------------------------------------------------
    ("--set into a value", lambda t, rd, c: gen(c, rd, "--set", "llm.model.name=x"), ("--set", "'model' is not a section")),
    ("--set empty key", lambda t, rd, c: gen(c, rd, "--set", "=3"), ("--set", "empty key")),
    ("--set wrong type", lambda t, rd, c: gen(c, rd, "--set", "generate.examples=lots"), ("[generate] examples", "'lots'")),
    # -- options -----------------------------------------------------------------------------
    ("negative --max-requests", lambda t, rd, c: gen(c, rd, "--max-requests", "-1"), ("--max-requests -1", ">= 0")),
    ("negative --max-cost", lambda t, rd, c: gen(c, rd, "--max-cost", "-0.5"), ("--max-cost -0.5", ">= 0")),
    ("negative --max-tokens", lambda t, rd, c: gen(c, rd, "--max-tokens", "-10"), ("--max-tokens -10",)),
    (
        "unknown stage in run",
        lambda t, rd, c: ["run", "-c", str(c), "-d", str(rd), "-q", "--stages", "brainstorm,bogus"],
        ("unknown stage 'bogus'",),
    ),
    # (a relaunch of the finished stage needs no key: --overwrite does, and must leave the run dir as it was)
    (
        "missing key file",
        lambda t, rd, c: gen(c, rd, "--overwrite", "--set", f"llm.api_key_file={t / 'nokey.txt'}"),
        ("llm.api_key_file", "nokey.txt"),
    ),
    # -- run dir -----------------------------------------------------------------------------
    ("run dir is a file", lambda t, rd, c: (t / "afile").write_text("x") and gen(c, t / "afile"), ("--run-dir", "not a directory")),
    (
        "run dir under a file",
        lambda t, rd, c: (t / "afile2").write_text("x") and gen(c, t / "afile2" / "sub"),
        ("--run-dir", "cannot create"),
    ),
    ("corrupt manifest", lambda t, rd, c: damage(rd, "manifest.json", b'{"stages": {') or gen(c, rd), ("manifest.json", "not valid JSON")),
    # -- input shards ------------------------------------------------------------------------
    (
        "truncated last line of brainstorm shard",
        lambda t, rd, c: (
            damage(rd, "brainstorm/shard-00000.jsonl", (rd / "brainstorm/shard-00000.jsonl").read_bytes()[:-30])
            or gen(c, rd, "--overwrite")
        ),
        ("brainstorm/shard-00000.jsonl", "truncated last line", "rerun"),
    ),
    (
        "garbage line in the middle of a brainstorm shard",
        lambda t, rd, c: (
            damage(rd, "brainstorm/shard-00000.jsonl", b'{"id": 1\n' + (rd / "brainstorm/shard-00000.jsonl").read_bytes())
            or gen(c, rd, "--overwrite")
        ),
        ("brainstorm/shard-00000.jsonl:1", "not valid JSON"),
    ),
    (
        "empty brainstorm shard",
        lambda t, rd, c: damage(rd, "brainstorm/shard-00000.jsonl", b"") or gen(c, rd, "--overwrite"),
        ("brainstorm", "no tasks"),
    ),
    (
        "brainstorm record of the wrong shape",
        lambda t, rd, c: damage(rd, "brainstorm/shard-00000.jsonl", b'{"id": "t1", "task": 5}\n') or gen(c, rd, "--overwrite"),
        ("brainstorm", "malformed", "rerun brainstorm"),
    ),
    (
        "brainstorm line is an array",
        lambda t, rd, c: damage(rd, "brainstorm/shard-00000.jsonl", b"[1, 2]\n") or gen(c, rd, "--overwrite"),
        ("shard-00000.jsonl:1", "expected a JSON object"),
    ),
    (
        "unknown task type in a brainstorm record",
        lambda t, rd, c: (
            damage(rd, "brainstorm/shard-00000.jsonl", b'{"id": "t1", "task_type": "bitext", "task": "Find translations."}\n')
            or gen(c, rd, "--overwrite")
        ),
        ("brainstorm", "task_type"),
    ),
    (
        "corrupted line inside a .partial",
        lambda t, rd, c: unfinish(rd, 1, b"{oops\n") or gen(c, rd),
        ("shard-00001.jsonl.partial:1", "not valid JSON"),
    ),
    # -- corpus inputs -------------------------------------------------------------------------
    (
        "a PDF passed to corpus as CSV",
        lambda t, rd, c: (
            (t / "docs.csv").write_bytes(b"%PDF-1.4\n%\xe2\xe3\n1 0 obj\n<< >>\nendobj\n") and corpus_cmd(c, rd, t / "docs.csv")
        ),
        ("docs.csv", "is a PDF file, not csv text", "name it .pdf"),
    ),
    (
        "a corpus folder of Word files",
        lambda t, rd, c: docx_folder(t) and corpus_cmd(c, rd, t / "word"),
        ("word: no corpus files here (.docx ×2)", "convert the documents"),
    ),
    (
        "an --id-col the corpus file lacks",
        lambda t, rd, c: (t / "d.csv").write_text("doc,text\na,one\n") and corpus_cmd(c, rd, t / "d.csv", "--id-col", "pid"),
        ("d.csv", "no column 'pid' for id (columns: doc, text)", "--id-col"),
    ),
    (
        "corpus ids that repeat",
        lambda t, rd, c: (t / "d.csv").write_text("id,text\n1,one\n1,two\n") and corpus_cmd(c, rd, t / "d.csv"),
        ("d.csv", "1 of 2 documents repeat an earlier id in column 'id'", "--ids first"),
    ),
]


def corpus_cmd(cfg: Path, rd: Path, path: Path, *extra: str) -> list[str]:
    return ["corpus", "-c", str(cfg), "-d", str(rd), "-i", str(path), "-q", *extra]


def docx_folder(t: Path) -> bool:
    (t / "word").mkdir()
    for n in ("a", "b"):
        (t / "word" / f"{n}.docx").write_bytes(b"PK\x03\x04")
    return True


@pytest.mark.parametrize("name, prepare, needles", CASES, ids=[c[0] for c in CASES])
def test_bad_input(tmp_path, finished, server, name, prepare, needles):
    rd = tmp_path / "run"
    shutil.copytree(finished, rd)
    cfg = write_config(tmp_path, server.base_url)
    n_req = len(server.requests)
    args = prepare(tmp_path, rd, cfg)
    before = hashes(rd)
    r = runner.invoke(app, args)
    check_one_line(r, *needles)
    assert hashes(rd) == before, "a bad command changed files in the run dir"
    assert len(server.requests) == n_req  # it failed before sending anything


def test_at_least_twenty_cases():
    assert len(CASES) >= 20


# -- export --out ---------------------------------------------------------------------------------


@pytest.fixture
def curriculum_run(tmp_path):
    """A run dir with a curriculum (export's dataset part needs nothing more)."""
    from test_export import scored

    from negsynth.data.curriculum import build_curriculum, save_curriculum
    from negsynth.data.shards import write_jsonl

    d = tmp_path / "run"
    exs = [scored(i) for i in range(17)]
    write_jsonl(d / "score" / "shard-00000.jsonl", exs)
    rows = build_curriculum(exs, batch_size=4, seed=0)
    save_curriculum(rows, d / "curriculum", stats=dict(rows.stats))
    return d


def test_export_out_that_is_a_file_names_out(tmp_path, curriculum_run):
    f = tmp_path / "afile"
    f.write_text("x")
    r = runner.invoke(app, ["export", "-d", str(curriculum_run), "--out", str(f), "--only", "dataset"])
    assert r.exit_code == 2, r.output
    line = _one_line(r)
    assert line.startswith("error: --out") and "not a folder" in line and "--run-dir" not in line
    f2 = tmp_path / "sub"
    f2.write_text("x")  # a file where a parent folder is expected
    r = runner.invoke(app, ["export", "-d", str(curriculum_run), "--out", str(f2 / "out"), "--only", "dataset"])
    assert r.exit_code == 2 and _one_line(r).startswith("error: --out") and "--run-dir" not in r.stderr


def test_export_unwritable_out_names_out(tmp_path, curriculum_run):
    if os.geteuid() == 0:  # root ignores permissions: /proc refuses even root a new folder
        outs = [Path("/proc/negsynth-export")] if Path("/proc/self").is_dir() else []
    else:
        outs = [tmp_path / "locked", tmp_path / "locked" / "new"]
    locked = tmp_path / "locked"
    locked.mkdir()
    os.chmod(locked, 0o555)
    try:
        for out in outs:
            r = runner.invoke(app, ["export", "-d", str(curriculum_run), "--out", str(out), "--only", "dataset"])
            assert r.exit_code == 2, r.output
            line = _one_line(r)
            assert line.startswith("error: --out") and ("writable" in line or "cannot create" in line) and "--run-dir" not in line
    finally:
        os.chmod(locked, 0o755)
    r = runner.invoke(app, ["export", "-d", str(curriculum_run), "--out", str(tmp_path / "ok"), "--only", "dataset"])
    assert r.exit_code == 0, r.output


def _one_line(r) -> str:
    assert r.stderr.count("\n") == 1 and "Traceback" not in r.stderr, r.stderr
    return r.stderr
