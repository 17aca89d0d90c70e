"""The suite's own disk use: its runs write about 20 GiB of checkpoints in all, so a passing test's tmp_path goes
when the test ends (pytest.ini) and a fixture's runs when the fixture is torn down (``conftest.fixture_folder``);
a failure keeps them for its logs."""

import os
from types import SimpleNamespace

import pytest
from conftest import fixture_folder


class _Request:
    """What ``fixture_folder`` uses of pytest's FixtureRequest."""

    def __init__(self):
        self.session, self.finalizers = SimpleNamespace(testsfailed=0), []

    def addfinalizer(self, finalizer) -> None:
        self.finalizers.append(finalizer)


@pytest.mark.parametrize("failures, kept", [(0, False), (1, True)])
def test_a_fixture_folder_goes_at_teardown_unless_a_test_failed_meanwhile(tmp_path_factory, failures, kept):
    request = _Request()
    folder = fixture_folder(request, tmp_path_factory, "runs")
    with open(os.path.join(folder, "model.safetensors"), "wb") as f:
        f.write(b"\0" * 1024)
    request.session.testsfailed += failures
    for finalizer in request.finalizers:
        finalizer()
    assert os.path.isdir(folder) == kept


def test_a_passing_tests_tmp_path_goes_when_it_ends(pytestconfig):
    assert pytestconfig.getini("tmp_path_retention_policy") == "failed"
