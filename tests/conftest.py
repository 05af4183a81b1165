from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="session")
def shared_data():
    """The shared data folder beside the repository (../shared/data); skipped where absent."""
    path = REPO.parent / "shared" / "data"
    if not path.is_dir():
        pytest.skip("../shared/data is not beside this checkout")
    return path
