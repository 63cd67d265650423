"""Stored responses belong to the tenant that created them: through a real gateway with two API
keys, in front of a sim engine that stores responses as vLLM does (``--responses-store-mb``),
tenant B cannot read, cancel, continue or overwrite tenant A's response, nor choose an id; every
such try is answered as an unknown id. Ownership is read from the
id, so it holds on a restarted gateway with the same tenant secret. Response ids stay out of the
access log."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from mmgate._settings import MiB
from mmgate.config import BackendSpec
from mmgate.observe.access import ACCESS_LOGGER
from mmgate.response_ids import is_tenants_response, mint_response_id, redact_response_path
from tests.support.agents import Reply, call
from tests.support.gateway import FAST_SIM, gateway_settings, running_gateway, running_sims

MODEL = "mmgate-sim-vl"
A = {"Authorization": "Bearer key-a"}
B = {"Authorization": "Bearer key-b"}
SECRET = "tenant-secret-0123456789abcdef"
STORING = FAST_SIM.model_copy(update={"responses_store_bytes": MiB})
# A background answer that runs for seconds: still running while tenant B tries to reach it.
SLOW = STORING.model_copy(update={"speedup": 1.0, "decode_ms_per_token": 200.0})


class _Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


@pytest.fixture
def access_lines() -> Iterator[list[str]]:
    logger = logging.getLogger(ACCESS_LOGGER)
    handler, level = _Lines(), logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        yield handler.lines
    finally:
        logger.setLevel(level)
        logger.removeHandler(handler)


def settings_for(engine_url: str, keys: Path, **values: Any) -> Any:
    keys.write_text("key-a tenant-a\nkey-b tenant-b\n")
    return gateway_settings(backends=(BackendSpec(kind="vllm", url=engine_url, name="r0"),),
                            api_keys_file=str(keys), tenant_secret=SECRET, **values)


def unknown_shape(reply: Reply, response_id: str) -> tuple[int, Any]:
    """The answer with the id it names blanked: what must be the same for every unreachable id."""
    return reply.status, {"error": {k: (v.replace(response_id, "ID") if isinstance(v, str) else v)
                                    for k, v in reply.json["error"].items()}}


def test_minted_ids_name_their_tenant_and_paths_hide_them() -> None:
    ida = mint_response_id("ta")
    assert ida.startswith("resp_") and len(ida) == 69 and ida != mint_response_id("ta")
    assert is_tenants_response(ida, "ta") and not is_tenants_response(ida, "tb")
    assert not is_tenants_response("resp_" + "0" * 64, "ta") and not is_tenants_response("resp_abc", "ta")
    assert redact_response_path("/v1/responses/resp_abc/cancel") == "/v1/responses/{id}/cancel"
    assert redact_response_path("/v1/responses/resp_abc") == "/v1/responses/{id}"
    assert redact_response_path("/v1/responses") == "/v1/responses"
    assert redact_response_path("/v1/chat/completions") == "/v1/chat/completions"


async def test_another_tenants_response_is_an_unknown_id(tmp_path: Path, access_lines: list[str]) -> None:
    async with running_sims(1, SLOW) as (sim,), \
            running_gateway(settings_for(sim.url, tmp_path / "keys.txt", access_log="logfmt")) as gw:
        created = await call(gw.url, "/v1/responses", {"model": MODEL, "input": "hello", "background": True,
                                                       "metadata": {"note": "a-secret"}, "max_output_tokens": 30},
                             headers=A)
        assert created.status == 200 and created.json["status"] == "queued", created.json
        ida = created.json["id"]
        assert sim.engine.stored is not None and sim.engine.stored.get(ida) is not None
        assert is_tenants_response(ida, gw.gateway.keys.tenant_tag("tenant-a"))
        assert (await call(gw.url, f"/v1/responses/{ida}", method="GET", headers=A)).json == created.json

        unknown = "resp_" + "ab" * 32
        for method, suffix in (("GET", ""), ("POST", "/cancel")):
            never = await call(gw.url, f"/v1/responses/{unknown}{suffix}", method=method, headers=B)
            theirs = await call(gw.url, f"/v1/responses/{ida}{suffix}", method=method, headers=B)
            assert theirs.status == 404 and "a-secret" not in theirs.raw.decode()
            assert unknown_shape(theirs, ida) == unknown_shape(never, unknown)
        # Continuing A's conversation: the same 404 as an unknown previous_response_id.
        never = await call(gw.url, "/v1/responses", {"model": MODEL, "input": "x", "previous_response_id": unknown},
                           headers=B)
        theirs = await call(gw.url, "/v1/responses", {"model": MODEL, "input": "x", "previous_response_id": ida},
                            headers=B)
        assert theirs.status == 404 and theirs.json["error"]["param"] == "previous_response_id"
        assert unknown_shape(theirs, ida) == unknown_shape(never, unknown)
        # Overwriting A's stored response by naming it, or choosing any id: refused, naming the field.
        for chosen in (ida, "resp_mine"):
            refused = await call(gw.url, "/v1/responses", {"model": MODEL, "input": "b-text", "request_id": chosen},
                                 headers=B)
            assert refused.status == 400 and refused.json["error"]["param"] == "request_id"
        assert (await call(gw.url, f"/v1/responses/{ida}", method="GET", headers=A)).json == created.json

        # A's own: continued (the sim's answer is seeded by the prompt: A's conversation, then
        # "more") and cancelled; B's own responses are B's.
        follow = await call(gw.url, "/v1/responses", {"model": MODEL, "input": "more", "previous_response_id": ida,
                                                      "max_output_tokens": 3, "store": False}, headers=A)
        whole = await call(gw.url, "/v1/responses", {"model": MODEL, "max_output_tokens": 3, "store": False, "input": [
            {"role": "user", "content": "hello"}, {"role": "user", "content": "more"}]}, headers=A)
        assert follow.status == 200 and follow.json["output"][0]["content"] == whole.json["output"][0]["content"]
        assert follow.json["usage"]["input_tokens"] == whole.json["usage"]["input_tokens"]
        assert (await call(gw.url, f"/v1/responses/{ida}/cancel", headers=A)).json["status"] == "cancelled"
        idb = (await call(gw.url, "/v1/responses", {"model": MODEL, "input": "b-own"}, headers=B)).json["id"]
        assert (await call(gw.url, f"/v1/responses/{idb}", method="GET", headers=B)).status == 200
        assert (await call(gw.url, f"/v1/responses/{idb}", method="GET", headers=A)).status == 404
    assert not [line for line in access_lines if ida in line or idb in line]
    assert any("path=/v1/responses/{id}/cancel" in line for line in access_lines)


async def test_ownership_survives_a_restart_with_the_same_secret(tmp_path: Path) -> None:
    async with running_sims(1, STORING) as (sim,):
        settings = settings_for(sim.url, tmp_path / "keys.txt")
        async with running_gateway(settings) as gw:
            made = (await call(gw.url, "/v1/responses", {"model": MODEL, "input": "kept"}, headers=A)).json
        async with running_gateway(settings) as gw:  # a new process's map is empty: found by asking
            mine = await call(gw.url, f"/v1/responses/{made['id']}", method="GET", headers=A)
            assert mine.status == 200 and mine.json == made
            assert (await call(gw.url, f"/v1/responses/{made['id']}", method="GET", headers=B)).status == 404


async def test_without_api_keys_a_client_still_names_its_response(tmp_path: Path) -> None:
    """One trust domain: vLLM's ``request_id`` passes as it always did."""
    async with running_sims(1, STORING) as (sim,), running_gateway(
            gateway_settings(backends=(BackendSpec(kind="vllm", url=sim.url, name="r0"),))) as gw:
        named = await call(gw.url, "/v1/responses", {"model": MODEL, "input": "hi", "request_id": "resp_mine"})
        assert named.status == 200 and named.json["id"] == "resp_mine"
        assert sim.engine.stored is not None and sim.engine.stored.get("resp_mine") is not None
        assert (await call(gw.url, "/v1/responses/resp_mine", method="GET")).status == 200
