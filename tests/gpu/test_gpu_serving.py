"""Serving on the device under load: ``python -m rayseq.serve --device DEVICE`` answers 128 requests
sent 32 at a time; greedy replies are the CPU model's, and a seeded sampled reply is the one the same server gives
that request alone (batching on the device changes no reply)."""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path

import httpx
import pytest

from rayseq.serving.model import ChatModel, GenRequest
from tests.serving_helpers import serve_cli, train_counting_checkpoint

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.ray


async def _burst(url: str, bodies: list[dict], concurrency: int) -> list[httpx.Response]:
    gate = asyncio.Semaphore(concurrency)
    async with httpx.AsyncClient(timeout=120, limits=httpx.Limits(max_connections=concurrency)) as client:
        async def one(body):
            async with gate:
                return await client.post(f"{url}/v1/chat", json=body)

        return await asyncio.gather(*(one(b) for b in bodies))


def test_serving_on_the_device_under_load(device, tmp_path):
    run_dir = train_counting_checkpoint(tmp_path / "run")
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "RAYSEQ_API_KEY")}
    with serve_cli(run_dir, tmp_path / "serve.log", "--device", device, env=env, timeout_s=120) as (url, proc):
        info = httpx.get(f"{url}/v1/models", timeout=30).json()["data"][0]["details"]
        assert info["device"].startswith(device)
        messages = [" ".join(str((7 * i + j) % 10) for j in range(1 + i % 10)) for i in range(64)]
        greedy = [{"message": m, "max_tokens": 12} for m in messages]
        sampled = [{"message": m, "max_tokens": 12, "temperature": 1.0, "seed": i} for i, m in enumerate(messages)]
        answers = asyncio.run(_burst(url, greedy + sampled, concurrency=32))
        assert [r.status_code for r in answers] == [200] * 128, [r.text for r in answers if r.status_code != 200]
        cpu = ChatModel(str(run_dir))
        expected = [r.replies[0] for r in cpu.generate([GenRequest(text=m, max_tokens=12) for m in messages])]
        assert [r.json()["reply"] for r in answers[:64]] == expected
        for i in (0, 17, 63):  # the same seeded request alone
            alone = httpx.post(f"{url}/v1/chat", json=sampled[i], timeout=60)
            assert alone.json()["reply"] == answers[64 + i].json()["reply"]
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=60) == 0, (tmp_path / "serve.log").read_text()[-3000:]
