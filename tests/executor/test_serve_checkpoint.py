"""`sangam serve --weights DIR` on CPU: a tiny LLaDA checkpoint with a tokenizer beside it, read through
transformers' AutoTokenizer in the server, the `openai` client in front."""

from __future__ import annotations

import shutil
import signal
import subprocess
import sys
from pathlib import Path

import openai
import pytest
import torch
from executor_helpers import save_checkpoint
from live_helpers import subprocess_env
from serve_helpers import TOKENIZER, start_serve, wait_http  # tests/ (conftest.py's folder) is on sys.path

from benchmarks.checkpoint_layouts import dream_checkpoint
from executor.model.config import Family, tiny
from executor.model.loading import random_model
from executor.run.ports import free_port
from serve.tokenizer import BUILTIN, Message

pytestmark = pytest.mark.timeout(180)


def test_a_checkpoint_serves_with_its_own_tokenizer_and_chat_template(tmp_path: Path) -> None:
    checkpoint = tmp_path / "tiny-llada"
    save_checkpoint(random_model(tiny(Family.LLADA), dtype=torch.float32, seed=3), checkpoint)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(BUILTIN / name, checkpoint / name)
    port = free_port()
    log = tmp_path / "serve.log"
    process = start_serve(["--weights", str(checkpoint), "--workers", "1", "--pages", "512",
                           "--mask-len", "32", "--port", str(port)], log)  # fmt: skip
    try:
        wait_http(f"http://127.0.0.1:{port}/health", process, timeout=150)
        assert f"tokenizer: {checkpoint}" in log.read_text()  # AutoTokenizer, not the built-in reader
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused")
        assert [m.id for m in client.models.list()] == [str(checkpoint)]
        messages = [{"role": "user", "content": "Hello there"}]
        reply = client.chat.completions.create(model=str(checkpoint), messages=messages, max_tokens=32)
        assert reply.usage is not None
        assert reply.usage.prompt_tokens == len(TOKENIZER.chat_prompt([Message("user", "Hello there")]))
        assert reply.choices[0].finish_reason in ("stop", "length")
    finally:
        process.send_signal(signal.SIGTERM)
        assert process.wait(60) == 0


def test_dream_as_downloaded_needs_trust_remote_code_and_serves_with_it(tmp_path: Path) -> None:
    checkpoint = dream_checkpoint(tmp_path / "dream").directory  # the real layout: a remote-code tokenizer
    args = ["--weights", str(checkpoint), "--workers", "1", "--pages", "512", "--mask-len", "64"]
    refused = subprocess.run(
        [sys.executable, "-m", "cli.main", "serve", *args, "--port", "0"], capture_output=True, text=True,
        env=subprocess_env(), stdin=subprocess.DEVNULL, timeout=120,
    )  # fmt: skip
    assert refused.returncode == 2
    assert refused.stderr.strip().count("\n") == 0 and "--trust-remote-code" in refused.stderr
    assert "Traceback" not in refused.stderr

    port = free_port()
    log = tmp_path / "serve.log"
    process = start_serve([*args, "--trust-remote-code", "--max-model-len", "256", "--port", str(port)], log)
    try:
        wait_http(f"http://127.0.0.1:{port}/health", process, timeout=150)
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused")
        assert client.models.list().data[0].max_model_len == 256  # type: ignore[attr-defined]
        messages = [{"role": "user", "content": "hello the world"}]
        reply = client.chat.completions.create(model=str(checkpoint), messages=messages, max_tokens=64)
        assert reply.usage is not None and reply.usage.prompt_tokens > 20  # the ChatML template's
        text = reply.choices[0].message.content or ""
        assert "<|im_end|>" not in text and "<|endoftext|>" not in text and "<|mask|>" not in text
        with pytest.raises(openai.BadRequestError, match="context window of 256 tokens"):
            client.completions.create(model=str(checkpoint), prompt=[5] * (256 - 64 + 1), max_tokens=64)
        client.completions.create(model=str(checkpoint), prompt=[5] * (256 - 64), max_tokens=64)
    finally:
        process.send_signal(signal.SIGTERM)
        assert process.wait(60) == 0
