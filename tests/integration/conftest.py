"""Fixtures that run the real `darkserve serve` binary (see ds_server.py):
each server starts on a free loopback port, is waited for until /health
answers 200, and is always killed at the end of its fixture."""
import pytest

from ds_server import MODEL, TINY, Server


@pytest.fixture
def servers(tmp_path):
    """Factory: servers(model=..., args=[...], session_dir=..., name=...) ->
    Server; every server it made is killed at the end of the test."""
    made = []

    def start(**kw):
        kw.setdefault("name", f"srv{len(made)}")
        s = Server(tmp_path, **kw)
        made.append(s)
        return s

    yield start
    for s in made:
        s.kill()


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """A tiny-model server shared by a module's tests."""
    s = Server(tmp_path_factory.mktemp("tiny"), TINY, name="tiny")
    yield s
    s.kill()


@pytest.fixture(scope="module")
def real(tmp_path_factory):
    """A real-model server shared by a module's tests."""
    s = Server(tmp_path_factory.mktemp("real"), MODEL, name="real")
    yield s
    s.kill()
