"""vLLM's disaggregated-serving fields (``kv_transfer_params``, ``ec_transfer_params``) make a replica
with a KV or encoder-cache connector connect to the host they name and pull cache blocks by id: from
clients they are refused (400 naming the field, nothing sent) on every endpoint that takes them,
unless the operator allows them (``--allow-transfer-params``: its clients are a P/D proxy). Through a
real gateway in front of an echo backend that keeps what it got (``tests.backends.echo_server``)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import orjson
import pytest

from mmgate.config import BackendSpec
from mmgate.serve import RunningGateway
from tests.backends.echo_server import EchoBackend, echo_backend
from tests.support.agents import call, is_anthropic_error, is_openai_error
from tests.support.gateway import gateway_settings, running_gateway

PARAMS = {"do_remote_prefill": True, "remote_host": "10.0.0.7", "remote_port": 5600,
          "remote_engine_id": "e", "remote_block_ids": [1, 2, 3]}
MESSAGES = [{"role": "user", "content": "hi"}]
BODIES = {
    "/v1/chat/completions": {"model": "m1", "messages": MESSAGES},
    "/v1/messages": {"model": "m1", "max_tokens": 4, "messages": MESSAGES},
    "/v1/responses": {"model": "m1", "input": "hi"},
    "/v1/completions": {"model": "m1", "prompt": "hi"},
    "/tokenize": {"model": "m1", "prompt": "hi"},
}


@asynccontextmanager
async def gateway(**settings: Any) -> AsyncIterator[tuple[RunningGateway, EchoBackend]]:
    async with echo_backend("e0", ("m1",)) as echo, running_gateway(
            gateway_settings(backends=(BackendSpec(kind="vllm", url=echo.url, name="e0"),), **settings)) as gw:
        yield gw, echo


def posted(echo: EchoBackend) -> list[Any]:
    return [orjson.loads(s.body) for s in echo.seen if s.method == "POST"]


@pytest.mark.parametrize("field", ["kv_transfer_params", "ec_transfer_params"])
async def test_refused_from_clients_on_every_endpoint(field: str) -> None:
    async with gateway() as (gw, echo):
        for path, body in BODIES.items():
            reply = await call(gw.url, path, {**body, field: PARAMS})
            assert reply.status == 400, (path, reply.raw)
            if path == "/v1/messages":
                assert is_anthropic_error(reply) and field in reply.json["error"]["message"], reply.raw
            else:
                assert is_openai_error(reply) and reply.json["error"]["param"] == field, (path, reply.raw)
        assert posted(echo) == []  # nothing reached the backend


async def test_an_escaped_or_repeated_key_is_refused_too() -> None:
    """JSON escapes spell the same key (vLLM decodes them), and a repeated key's last value is the
    one vLLM reads: both are seen as the parsed field."""
    async with gateway() as (gw, echo):
        escaped = b'{"model":"m1","prompt":"hi","\\u006bv_transfer_params":{"remote_host":"10.0.0.7"}}'
        repeated = b'{"model":"m1","prompt":"hi","kv_transfer_params":null,"kv_transfer_params":{"a":1}}'
        for raw in (escaped, repeated):
            for path in ("/v1/completions", "/v1/chat/completions"):
                if path.endswith("chat/completions"):
                    raw = raw.replace(b'"prompt":"hi"', b'"messages":[{"role":"user","content":"hi"}]')
                reply = await call(gw.url, path, raw=raw)
                assert reply.status == 400 and reply.json["error"]["param"] == "kv_transfer_params", reply.raw
        assert posted(echo) == []


async def test_forwarded_as_sent_when_the_operator_allows_them() -> None:
    async with gateway(allow_transfer_params=True) as (gw, echo):
        for path in ("/v1/chat/completions", "/v1/completions", "/v1/messages"):
            await call(gw.url, path, {**BODIES[path], "kv_transfer_params": PARAMS})
        sent = posted(echo)
        assert len(sent) == 3 and all(body["kv_transfer_params"] == PARAMS for body in sent), sent
