"""``mmgate bench``: a multimodal session benchmark for any OpenAI-compatible endpoint.

Modules, one job each: ``dataset`` (AIPerf single_turn / multi_turn JSONL), ``synth`` (sliding-window
generator), ``images`` + ``origin`` (images as data: URLs or from a loopback origin), ``planner``
(``--uuid-and-strip``, pure), ``payload`` (request bodies), ``client`` (HTTP + SSE), ``engine``
(load generation), ``records`` + ``stats`` (measurements), ``overhead`` (the client measuring itself),
``report`` / ``plots`` / ``compare`` / ``progress`` (output), ``runner`` (a whole run), ``cli``.
"""
