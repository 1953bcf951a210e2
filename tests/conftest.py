import pytest

from deploy.tiny_model import make_tiny_model


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    """The tiny model, made once per test session."""
    return make_tiny_model(tmp_path_factory.mktemp("models") / "tiny", seed=0)
