"""Random-weight checkpoints in the two repositories' layouts, written, loaded and served as a user serves a
download (`sangam serve --weights DIR --trust-remote-code`), with streamed chat (issue 28 item 7).

    python -m benchmarks.checkpoint_serve write --family llada [--size full] [--device cuda] --dir DIR
    python -m benchmarks.checkpoint_serve chat [--dir DIR] [--max-tokens 64 256 ...] [-- SERVE ARGS]
    python -m benchmarks.checkpoint_serve summary PART.json ... [--json FILE]

(`write` and `chat` take `--json FILE` for their part of the results.)

- write: `benchmarks.checkpoint_layouts` writes the family's checkpoint (`--size full`: LLaDA-8B or
  Dream-7B; `tiny`: the tests' shapes) with weights N(0, 0.02) drawn in bf16 on `--device`, shard by
  shard; then the worker's own loader (`load_checkpoint`, in the worker's dtype) reads it onto the device,
  timed. The files are still in the page cache then: a warm load, no disk read.
- chat: starts `sangam serve --weights DIR --trust-remote-code` (without `--dir`: random weights) with
  SERVE ARGS, times its start to the first 200 of /health, then the `openai` client holds one
  conversation, a streamed turn per
  `--max-tokens` (each answer goes into the next turn's messages): per turn the time to the first chunk
  (the first block), the gaps between chunks (one per 32-token block), the whole turn, the usage and the
  finish_reason; then SIGTERM, the exit status and the seconds the drain took. Exit status 1 if a turn
  failed or ended without a finish_reason, or the server did not exit 0.
- summary: the parts' tables (logits too: `benchmarks.checkpoint_logits --json`), all parts in one JSON.

The tokenizers are `checkpoint_layouts`' byte-level stand-ins of a few hundred tokens: with random weights
nearly every generated id lies beyond them and is left out of the text, so the streamed text is mostly
empty while the token counts are the model's.
"""

from __future__ import annotations

import argparse
import itertools
import json
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from benchmarks.checkpoint_layouts import dream_checkpoint, full_real, hf_tensors, llada_checkpoint, tiny_real
from benchmarks.serve_bench import wait_healthy
from executor.model.config import Family
from executor.model.hf_config import read_config
from executor.model.loading import load_checkpoint
from executor.run.ports import free_port

FACTORIES = {Family.LLADA: llada_checkpoint, Family.DREAM: dream_checkpoint}
STD = 0.02  # weights N(0, STD): LLaDA's init_std, the speed benchmarks' random weights
USER_TURNS = (
    "Hello! Who are you?",
    "Tell me a story about a lighthouse keeper and the sea.",
    "Now say it again in one sentence.",
    "Thank you. Goodbye!",
)
STOP_S = 60.0  # how long the server may take to drain and stop after SIGTERM


@dataclass(frozen=True, slots=True)
class Turn:
    max_tokens: int
    prompt_tokens: int | None  # the usage chunk's (None: the stream had none)
    completion_tokens: int | None
    chunks: int  # chunks with a choice: one per 32-token block
    arrivals_ms: list[float]  # request sent -> each of those chunks
    ttft_ms: float | None  # request sent -> first chunk (the first block)
    mean_gap_ms: float | None  # between consecutive chunks
    max_gap_ms: float | None
    total_s: float  # request sent -> stream closed
    finish_reason: str | None
    text_chars: int
    error: str = ""


def device_name(device: str) -> str:
    return torch.cuda.get_device_name(torch.device(device)) if device.startswith("cuda") else device


def synchronize(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize(torch.device(device))


def write(args: argparse.Namespace) -> int:
    family = Family(args.family)
    config = full_real(family) if args.size == "full" else tiny_real(family)
    if args.dir.exists():
        shutil.rmtree(args.dir)
    torch.zeros(1, device=args.device)  # the device's start-up is no part of the write
    started = time.perf_counter()
    FACTORIES[family](args.dir, config, seed=args.seed, std=STD, device=args.device)
    written = time.perf_counter() - started
    size = sum(f.stat().st_size for f in args.dir.glob("*.safetensors"))
    dtype = torch.float32 if args.device == "cpu" else torch.bfloat16  # the worker's (build_model)
    started = time.perf_counter()
    model = load_checkpoint(args.dir, dtype=dtype, device=args.device)
    synchronize(args.device)
    loaded = time.perf_counter() - started
    del model
    part = {
        "family": family.value, "size": args.size, "device": device_name(args.device), "dir": str(args.dir),
        "params": sum(t.shape.numel() for t in hf_tensors(config)),
        "layers": config.shape.layers, "hidden": config.shape.hidden, "vocab": config.shape.vocab,
        "files": sorted(p.name for p in args.dir.iterdir()),
        "safetensors_bytes": size, "write_s": written, "write_gb_per_s": size / written / 1e9,
        "load_dtype": str(dtype).removeprefix("torch."), "load_s": loaded,
        "load_gb_per_s": size / loaded / 1e9,
    }  # fmt: skip
    print(
        f"{family.value}: {part['params'] / 1e9:.2f}B parameters, {size / 1e9:.2f} GB in "
        f"{sum(n.endswith('.safetensors') for n in part['files'])} shards written in {written:.1f} s "
        f"({part['write_gb_per_s']:.2f} GB/s) on {part['device']}; loaded ({part['load_dtype']}) in "
        f"{loaded:.1f} s ({part['load_gb_per_s']:.2f} GB/s)"
    )
    save(args.json, part)
    return 0


def chat(args: argparse.Namespace) -> int:
    import openai  # the benchmark's client only: `write` and `summary` run without it

    family = read_config(args.dir).family.value if args.dir is not None else "random weights"
    weights = ["--weights", str(args.dir), "--trust-remote-code"] if args.dir is not None else []
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log_dir = args.log.with_suffix(".d")
    command = [
        sys.executable, "-m", "cli.main", "serve", *weights, "--port", str(port), "--log-dir", str(log_dir),
        *args.serve_args,
    ]  # fmt: skip
    part: dict[str, Any] = {"family": family, "weights": str(args.dir or "random"), "command": command[2:]}
    turns: list[Turn] = []
    with args.log.open("w") as log:
        started = time.perf_counter()
        server = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        try:
            wait_healthy(server, url, args.ready_timeout, "checkpoint_serve")
            part["ready_s"] = time.perf_counter() - started
            client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=300)
            (model,) = client.models.list().data
            part["model"], part["max_model_len"] = model.id, getattr(model, "max_model_len", None)
            turns = converse(client, model.id, args.max_tokens)
        except SystemExit as err:  # wait_healthy's: the server exited or did not get ready
            part["error"] = str(err)
        finally:
            part["exit_status"], part["stop_s"] = stop(server)
    part["turns"] = [asdict(t) for t in turns]
    ok = "error" not in part and part["exit_status"] == 0 and conversation_ok(turns, len(args.max_tokens))
    part["ok"] = ok
    print_chat(part)
    show_logs(args.log, log_dir, everything=not ok)
    save(args.json, part)
    return 0 if ok else 1


def converse(client: Any, model: str, max_tokens: Sequence[int]) -> list[Turn]:
    """One conversation, a streamed turn per entry of `max_tokens`; it ends at the first failed turn."""
    messages: list[dict[str, str]] = []
    turns: list[Turn] = []
    for index, limit in enumerate(max_tokens):
        messages.append({"role": "user", "content": USER_TURNS[index % len(USER_TURNS)]})
        turn, text = streamed_turn(client, model, messages, limit)
        turns.append(turn)
        if turn.error:
            break
        messages.append({"role": "assistant", "content": text})
    return turns


def conversation_ok(turns: Sequence[Turn], wanted: int) -> bool:
    """Whether all `wanted` turns ran, each stream ending with a finish_reason and no error."""
    return len(turns) == wanted and all(t.finish_reason and not t.error for t in turns)


def streamed_turn(client: Any, model: str, messages: list[dict[str, str]], limit: int) -> tuple[Turn, str]:
    import openai

    arrivals: list[float] = []
    pieces: list[str] = []
    finish, usage, error = None, None, ""
    started = time.perf_counter()
    try:
        stream = client.chat.completions.create(
            model=model, messages=messages, max_tokens=limit, stream=True,
            stream_options={"include_usage": True},
        )  # fmt: skip
        for chunk in stream:
            now = time.perf_counter() - started
            if chunk.choices:
                arrivals.append(now)
                pieces.append(chunk.choices[0].delta.content or "")
                finish = chunk.choices[0].finish_reason or finish
            if chunk.usage is not None:
                usage = chunk.usage
    except openai.APIError as err:
        error = f"{type(err).__name__}: {err}"
    total = time.perf_counter() - started
    gaps = [b - a for a, b in itertools.pairwise(arrivals)]
    text = "".join(pieces)
    turn = Turn(
        max_tokens=limit,
        prompt_tokens=usage.prompt_tokens if usage else None,
        completion_tokens=usage.completion_tokens if usage else None,
        chunks=len(arrivals),
        arrivals_ms=[a * 1e3 for a in arrivals],
        ttft_ms=arrivals[0] * 1e3 if arrivals else None,
        mean_gap_ms=sum(gaps) / len(gaps) * 1e3 if gaps else None,
        max_gap_ms=max(gaps) * 1e3 if gaps else None,
        total_s=total,
        finish_reason=finish,
        text_chars=len(text),
        error=error,
    )
    return turn, text


def stop(server: subprocess.Popen[bytes]) -> tuple[int | None, float]:
    """SIGTERM (the server drains and stops its processes): its exit status (None: killed after
    `STOP_S`) and the seconds it took."""
    started = time.perf_counter()
    if server.poll() is None:
        server.send_signal(signal.SIGTERM)
    try:
        status: int | None = server.wait(STOP_S)
    except subprocess.TimeoutExpired:
        server.kill()
        server.wait()
        status = None
    return status, time.perf_counter() - started


def show_logs(log: Path, log_dir: Path, *, everything: bool) -> None:
    """The server's own output; after a failure, also the ends of its processes' logs."""
    for line in log.read_text(errors="replace").splitlines()[-40:]:
        print(f"  serve| {line}")
    if everything and log_dir.is_dir():
        for path in sorted(log_dir.iterdir()):
            if path.is_file():
                for line in path.read_text(errors="replace").splitlines()[-15:]:
                    print(f"  {path.name}| {line}")


def ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def print_chat(part: dict[str, Any]) -> None:
    ready = part.get("ready_s")
    print(
        f"{part['family']}: ready in {'-' if ready is None else f'{ready:.1f}'} s, served as "
        f"{part.get('model', '-')} (max_model_len {part.get('max_model_len', '-')}); stopped with status "
        f"{part['exit_status']} in {part['stop_s']:.1f} s{'' if part['ok'] else '  FAILED'}"
        + (f"\n  error: {part['error']}" if "error" in part else "")
    )
    print(
        f"  {'turn':>4} {'max_tokens':>10} {'prompt':>6} {'tokens':>6} {'chunks':>6} {'TTFT ms':>8} "
        f"{'gap ms':>7} {'max gap':>7} {'total s':>7}  finish"
    )
    for i, t in enumerate(part["turns"]):
        tokens = f"{t['prompt_tokens'] or '-':>6} {t['completion_tokens'] or '-':>6}"
        print(
            f"  {i + 1:>4} {t['max_tokens']:>10} {tokens} {t['chunks']:>6} {ms(t['ttft_ms']):>8} "
            f"{ms(t['mean_gap_ms']):>7} {ms(t['max_gap_ms']):>7} "
            f"{t['total_s']:>7.2f}  {t['finish_reason'] or '-'}{'  ' + t['error'] if t['error'] else ''}"
        )


def summary(args: argparse.Namespace) -> int:
    parts = {path.stem: json.loads(path.read_text()) for path in args.parts if path.exists()}
    writes = [p for name, p in parts.items() if name.startswith("write-")]
    if writes:
        print(
            f"{'family':<7}{'size':<6}{'params':>8}{'GB':>7}{'write s':>9}{'GB/s':>7}{'load s':>8}{'GB/s':>7}"
        )
        for w in writes:
            sizes = f"{w['params'] / 1e9:>7.2f}B{w['safetensors_bytes'] / 1e9:>7.2f}"
            print(
                f"{w['family']:<7}{w['size']:<6}{sizes}"
                f"{w['write_s']:>9.1f}{w['write_gb_per_s']:>7.2f}{w['load_s']:>8.1f}{w['load_gb_per_s']:>7.2f}"
                f"  on {w['device']}"
            )
    for name, part in parts.items():
        if name.startswith("chat-"):
            print_chat(part)
    if "logits" in parts:
        from benchmarks.checkpoint_logits import LogitsRow, print_rows

        print_rows([LogitsRow(**row) for row in parts["logits"]["rows"]], parts["logits"]["device"])
    missing = [str(p) for p in args.parts if not p.exists()]
    if missing:
        print(f"missing parts (their steps did not finish): {', '.join(missing)}")
    save(args.json, parts)
    return 0


def save(path: Path | None, value: object) -> None:
    if path is not None:
        path.write_text(json.dumps(value, indent=1) + "\n")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    commands = parser.add_subparsers(dest="command", required=True)
    writer = commands.add_parser("write", help="write a checkpoint, then time its load")
    writer.add_argument("--family", choices=[f.value for f in Family], required=True)
    writer.add_argument("--size", choices=("full", "tiny"), default="full")
    writer.add_argument("--device", default="cuda", help="where the weights are drawn and loaded")
    writer.add_argument("--dir", type=Path, required=True, help="the checkpoint's directory (replaced)")
    writer.add_argument("--seed", type=int, default=0)
    writer.add_argument("--json", type=Path, metavar="FILE")
    chatter = commands.add_parser("chat", help="serve a checkpoint and stream chat turns")
    chatter.add_argument(
        "--dir", type=Path, help="the checkpoint's directory (default: random weights, --model in SERVE ARGS)"
    )
    chatter.add_argument("--max-tokens", type=int, nargs="+", default=[64, 256, 64, 256])
    chatter.add_argument("--ready-timeout", type=float, default=600.0, help="seconds to a 200 from /health")
    chatter.add_argument("--log", type=Path, default=Path("/tmp/checkpoint-serve.log"),
                         help="the server's output (its processes' logs go to LOG's stem + .d)")  # fmt: skip
    chatter.add_argument("--json", type=Path, metavar="FILE")
    chatter.add_argument("serve_args", nargs="*", help="after --: more arguments for sangam serve")
    summarizer = commands.add_parser("summary", help="the parts' tables, and one JSON of them all")
    summarizer.add_argument("parts", type=Path, nargs="+", help="write-*.json, chat-*.json, logits.json")
    summarizer.add_argument("--json", type=Path, metavar="FILE")
    args = parser.parse_args(argv)
    if args.command == "write" and args.device.startswith("cuda") and not torch.cuda.is_available():
        parser.error("--device cuda needs a CUDA GPU")
    return {"write": write, "chat": chat, "summary": summary}[args.command](args)


if __name__ == "__main__":
    sys.exit(main())
