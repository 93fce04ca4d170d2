import pytest

import train_scenarios as sc


@pytest.fixture(scope="session")
def data(tmp_path_factory):
    """The packed demo corpus every training test reads (prepared once per session)."""
    return sc.make_data(tmp_path_factory.mktemp("data"))
