"""The bad-input differential: every case of the part corpus (every content-part shape vLLM's chat
parser reads) and of the API corpus (Responses items and tool outputs, Messages image sources,
``/tokenize``, completions) sent to real vLLM directly and through a real gateway. The gateway's
answer is in vLLM's status class (2xx, 4xx, 5xx) for every case except the deliberate policy
refusals, each named with its reason in ``POLICY_REFUSALS`` and listed in docs/SECURITY.md, where it
is a 4xx whatever vLLM does."""

from __future__ import annotations

import re
from pathlib import Path

from tests.support.api_corpus import API_CASES
from tests.support.api_corpus import POLICY_REFUSALS as API_POLICY_REFUSALS
from tests.support.part_corpus import CASES, POLICY_REFUSALS, Outcome, corpus_run
from tests.support.vllm import ROOT, VllmReplica


def _differing(outcomes: list[Outcome], policy: dict[str, str]) -> list[str]:
    differing = []
    for o in outcomes:
        assert o.direct_status, o  # vLLM answered (no connection failure)
        if o.name in policy:
            if not 400 <= o.gateway_status < 500:
                differing.append(f"{o.name}: a policy refusal answered {o.gateway_status}")
        elif o.gateway_status // 100 != o.direct_status // 100:
            differing.append(f"{o.name}: gateway {o.gateway_status} ({o.gateway_error}), "
                             f"vLLM {o.direct_status} ({o.direct_error})")
    return differing


async def test_every_bad_input_gets_vllms_status_class(vllm_replicas: list[VllmReplica], tmp_path: Path) -> None:
    replica = vllm_replicas[0]
    async with corpus_run(tmp_path, backend=(replica.url, replica.model), direct=True) as run:
        assert len(run.outcomes) == len(CASES) and len(run.api_outcomes) == len(API_CASES)
        assert _differing(run.outcomes, POLICY_REFUSALS) + _differing(run.api_outcomes, API_POLICY_REFUSALS) == []
        # The policy refusals are real: vLLM itself serves some of each reason's cases.
        served = {POLICY_REFUSALS.get(o.name) or API_POLICY_REFUSALS.get(o.name)
                  for o in run.outcomes + run.api_outcomes if o.direct_status == 200}
        assert {"url-policy", "tenant-uuids", "one-medium-per-part", "media-keys-on-text"} <= served


def test_every_policy_refusal_is_listed_in_security_md() -> None:
    text = (ROOT / "docs" / "SECURITY.md").read_text()
    listed = set(re.findall(r"`refusal:([a-z-]+)`", text))
    names = {n for n, _ in CASES} | {n for n, _, _ in API_CASES}
    assert set(POLICY_REFUSALS) <= names and set(API_POLICY_REFUSALS) <= names
    assert set(POLICY_REFUSALS.values()) | set(API_POLICY_REFUSALS.values()) <= listed
