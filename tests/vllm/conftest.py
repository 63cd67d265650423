"""A real ``mmgate serve`` process in front of the session's two real vLLM replicas."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.vllm import GatewayProcess, VllmReplica, running_gateway_process

GATEWAY_FLAGS = ("--health-interval", "1", "--readmit-after", "1", "--allowed-private", "127.0.0.1")


@pytest.fixture(scope="module")
def gateway(vllm_replicas: list[VllmReplica], tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    """``mmgate serve --backend vllm=<replica 0> --backend vllm=<replica 1>`` for the module."""
    log = tmp_path_factory.mktemp("gateway") / "mmgate.log"
    with running_gateway_process([r.url for r in vllm_replicas], log, *GATEWAY_FLAGS) as gw:
        yield gw
