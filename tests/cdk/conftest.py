"""Fixtures for tests/cdk: each environment synthesized once (cdk_testkit caches per session)."""

import pytest

import cdk_testkit


@pytest.fixture(scope="module")
def dev():
    return cdk_testkit.synthesized("dev", pinned=True)


@pytest.fixture(scope="module")
def prod():
    return cdk_testkit.synthesized("prod", pinned=True)


@pytest.fixture(scope="module", params=cdk_testkit.ENVIRONMENTS)
def pinned(request):
    return cdk_testkit.synthesized(request.param, pinned=True)


@pytest.fixture(scope="module", params=cdk_testkit.BUILDERS)
def builder(request):
    """An environment that builds its own artifacts (has a build stack), pinned."""
    return cdk_testkit.synthesized(request.param, pinned=True)


@pytest.fixture(scope="module", params=cdk_testkit.ENVIRONMENTS)
def fresh_clone(request):
    """An environment as cdk.json ships it: nothing pinned yet."""
    return cdk_testkit.synthesized(request.param, pinned=False)


@pytest.fixture(scope="session", autouse=True)
def _remove_cloud_assemblies():
    yield
    cdk_testkit.remove_outdirs()
