"""The container image, built once for every docker test of tests/deploy (test_image.py,
test_memory_limit.py): from the files of a clean checkout, on the Debian base image, offline."""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Iterator

import pytest

from tests.deploy.image import (
    BASE_TAG,
    BUILD_TIMEOUT_S,
    build_base_image,
    clean_checkout,
    docker,
    fill_wheelhouse,
)

BASE_TIMEOUT_S = 900


@pytest.fixture(scope="session")
def image(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The image's tag; removed afterwards (the base image stays cached). Only tests marked with
    the modules' docker skip ask for it. TEST_IMAGE names an image built already (``make
    image-offline``) to run instead, kept."""
    if os.environ.get("TEST_IMAGE"):
        yield os.environ["TEST_IMAGE"]
        return
    build_base_image(BASE_TIMEOUT_S)
    context = clean_checkout(tmp_path_factory.mktemp("image") / "checkout")
    assert not any((context / "deploy" / "docker" / "wheelhouse").glob("*.whl"))
    assert fill_wheelhouse(context / "deploy" / "docker" / "wheelhouse", BUILD_TIMEOUT_S) > 0
    tag = f"mmgate:test-{uuid.uuid4().hex[:8]}"
    started = time.monotonic()
    build = docker("build", "--quiet", "--build-arg", f"BASE_IMAGE={BASE_TAG}", "--build-arg", "PIP_OFFLINE=1",
                   "--tag", tag, str(context), timeout=BUILD_TIMEOUT_S, check=False)
    assert build.returncode == 0, build.stderr[-3000:]
    print(f"image {tag} built in {time.monotonic() - started:.1f} s")
    try:
        yield tag
    finally:
        docker("image", "rm", "--force", tag, check=False)
        # The build stage's image (untagged once the build is done); the base image stays cached.
        docker("image", "prune", "--force", "--filter", "label=mmgate.stage=build", check=False)
