from pathlib import Path

import pytest
from eval_fixtures import save_tiny_model
from hub_fixtures import fetched_suite


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> Path:
    return save_tiny_model(tmp_path_factory.mktemp("tiny_eurobert"))


@pytest.fixture(scope="session")
def paper_root(tmp_path_factory) -> Path:
    """Every paper repository in its hub layout (a few rows each), fetched by the real fetch: a --data-root."""
    return fetched_suite(tmp_path_factory.mktemp("paper"))
