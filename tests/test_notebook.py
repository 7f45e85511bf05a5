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
from test_corpus import answer, write_big_corpus

from negsynth.pipeline.config_io import load_config
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


def test_the_example_notebook_runs(tmp_path, minilm):
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    pytest.importorskip("ipykernel")
    nb = nbformat.read(ROOT / "examples" / "corpus_quickstart.ipynb", as_version=4)
    folder = write_big_corpus(tmp_path)
    with FakeOpenAI(lambda req, n: answer(req, n)) as srv:
        # the settings cell, pointed at the fake server and a tiny corpus
        nb.cells[1].source = (
            f"CORPUS = {str(folder)!r}\nLLM = {srv.base_url!r}\nMODEL = 'fake'\nKEY_ENV = None\n"
            f"RUN_DIR = {str(tmp_path / 'run')!r}\nMAX_DOCS = 12"
        )
        nbclient.NotebookClient(nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(ROOT)}}).execute()
        assert len(srv.requests) == 12
    outs = [c.outputs for c in nb.cells if c.cell_type == "code"]
    assert "(12, {})" in json.dumps(outs[2][-1]["data"]["text/plain"])  # 12 valid queries, no rejects
    assert (tmp_path / "run" / "train" / "final").is_dir()
    assert "(1, 384)" in outs[4][-1]["data"]["text/plain"]


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
