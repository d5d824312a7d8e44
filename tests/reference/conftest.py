"""Shared pytest fixtures for the reference tests: where the build and the
default model are. Keep this small; a missing binary or model must make a
test fail, never skip."""
import os
from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def build_dir() -> Path:
    return Path(os.environ.get("DARKSERVE_BUILD", "/work/main/build"))


@pytest.fixture(scope="session")
def model_path() -> Path:
    p = Path(os.environ.get("DARKSERVE_MODEL",
                            "/work/main/models/SmolLM2-135M-Instruct.Q4_1.gguf"))
    assert p.is_file(), f"model {p} is missing (run `make model`)"
    return p
