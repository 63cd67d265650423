"""The sim (``--profile tiny-qwen2vl-cpu``) answers the fidelity corpus exactly as real vLLM does:
status, error body, processor-cache counters, usage with image tokens, ``n`` — case by case."""

from __future__ import annotations

from pathlib import Path

from tests.support.fidelity import CASES, run_corpus
from tests.support.vllm import SimProcess, VllmReplica


async def test_sim_matches_real_vllm_case_by_case(vllm_replicas: list[VllmReplica], tmp_path: Path) -> None:
    sim = SimProcess(tmp_path / "sim.log")
    sim.start(["--profile", "tiny-qwen2vl-cpu", "--speedup", "1000"])
    try:
        real = await run_corpus(vllm_replicas[1])
        fake = await run_corpus(sim)
    finally:
        sim.stop()
    assert len(real) == len(CASES)
    differing = [(r.comparable(), f.comparable()) for r, f in zip(real, fake, strict=True)
                 if r.comparable() != f.comparable()]
    assert differing == []
    # The corpus exercises what it claims to: hits, misses, errors, n=2, image tokens.
    statuses = {r.status for r in real}
    assert statuses == {200, 400, 404}
    assert sum(r.hits for r in real) >= 5 and any(r.choices == 2 for r in real)
