"""`sangam serve --weights DIR` on CPU: a tiny LLaDA checkpoint with a tokenizer beside it, read through
transformers' AutoTokenizer in the server, the `openai` client in front."""

from __future__ import annotations

import shutil
import signal
from pathlib import Path

import openai
import pytest
import torch
from executor_helpers import save_checkpoint
from serve_helpers import TOKENIZER, start_serve, wait_http  # tests/ (conftest.py's folder) is on sys.path

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
