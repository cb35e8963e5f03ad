"""Checkpoints as downloaded (tiny, in the two repositories' layouts: tests/checkpoints.py): what our reader
takes from them (stops, context window), their tokenizers with and without remote code, and whole
generations against a straightforward loop of each model's own block generation."""

from __future__ import annotations

import builtins
import json
from pathlib import Path

import pytest
import torch
from checkpoints import Checkpoint, dream_checkpoint, llada_checkpoint  # tests/ (conftest.py's folder)
from executor_helpers import dense_attention
from torch import Tensor

from executor.control.messages import BlockWork
from executor.model.attention import TorchAttention
from executor.model.config import Family
from executor.model.forward import ModelRunner
from executor.model.hf_config import chat_turn_end, read_config
from executor.model.kv_cache import PagedKVCache
from executor.model.loading import load_checkpoint
from executor.model.transformer import Transformer
from executor.run.live import LivePlan, plan_run
from executor.run.live_options import LiveOptions
from executor.worker.engine import Engine
from runs.config import RunConfig
from sangam.batcher import Batcher
from sangam.budget import BatchConfig
from sangam.hardware import BLOCK
from sangam.kv import PagePool
from serve.tokenizer import Message, PretrainedTokenizer, load_tokenizer

FACTORIES = {Family.LLADA: llada_checkpoint, Family.DREAM: dream_checkpoint}


@pytest.fixture(scope="module")
def written(tmp_path_factory: pytest.TempPathFactory) -> dict[Family, Checkpoint]:
    root = tmp_path_factory.mktemp("checkpoints")
    return {family: make(root / family.value) for family, make in FACTORIES.items()}


# ---- the layouts -------------------------------------------------------------------------------------


def test_the_layouts_are_the_repositories(written: dict[Family, Checkpoint]) -> None:
    llada, dream = written[Family.LLADA].directory, written[Family.DREAM].directory
    assert {p.name for p in llada.iterdir()} == {
        "config.json", "configuration_llada.py", "generation_config.json", "modeling_llada.py",
        "model.safetensors.index.json", *(f"model-0000{i}-of-00006.safetensors" for i in range(1, 7)),
        "special_tokens_map.json", "tokenizer.json", "tokenizer_config.json",
    }  # fmt: skip
    assert {p.name for p in dream.iterdir()} == {
        "added_tokens.json", "config.json", "configuration_dream.py", "generation_config.json", "merges.txt",
        "model.safetensors.index.json", *(f"model-0000{i}-of-00004.safetensors" for i in range(1, 5)),
        "modeling_dream.py", "special_tokens_map.json", "tokenization_dream.py", "tokenizer_config.json",
        "vocab.json",
    }  # fmt: skip
    for directory in (llada, dream):
        assert "auto_map" in json.loads((directory / "config.json").read_text())
        index = json.loads((directory / "model.safetensors.index.json").read_text())
        assert set(index["weight_map"].values()) == {p.name for p in directory.glob("model-*.safetensors")}


@pytest.mark.parametrize("family", list(Family))
def test_a_checkpoint_loads_without_running_its_code(
    family: Family, written: dict[Family, Checkpoint]
) -> None:
    model = load_checkpoint(written[family].directory, dtype=torch.float32)  # modeling_*.py raises if run
    assert model.config.shape.vocab == written[family].config.shape.vocab
    assert model.config.mask_id == written[family].config.mask_id


# ---- stops and the context window --------------------------------------------------------------------


def test_stops_are_the_configs_eos_ids_and_the_chat_templates_turn_end(
    written: dict[Family, Checkpoint],
) -> None:
    # config.json and generation_config.json name only <|endoftext|>; the template ends turns otherwise
    assert read_config(written[Family.LLADA].directory).eos_ids == (126081, 126348)  # <|eot_id|>
    assert read_config(written[Family.DREAM].directory).eos_ids == (151643, 151645)  # <|im_end|>


def test_generation_config_and_template_stops_add_up(tmp_path: Path) -> None:
    directory = dream_checkpoint(tmp_path / "dream").directory
    generation = json.loads((directory / "generation_config.json").read_text())
    (directory / "generation_config.json").write_text(
        json.dumps(generation | {"eos_token_id": [151643, 151644]})
    )
    assert read_config(directory).eos_ids == (151643, 151644, 151645)


def test_the_turn_end_is_read_from_the_chat_template(tmp_path: Path) -> None:
    directory = llada_checkpoint(tmp_path / "llada").directory
    assert chat_turn_end(directory) == 126348
    config = json.loads((directory / "tokenizer_config.json").read_text())
    template = config["chat_template"].replace("<|eot_id|>", "<|end_header_id|>")  # another turn end
    (directory / "tokenizer_config.json").write_text(json.dumps(config | {"chat_template": template}))
    assert chat_turn_end(directory) == 126347
    assert read_config(directory).eos_ids == (126081, 126347)


def test_without_a_tokenizer_the_familys_turn_end_still_stops(tmp_path: Path) -> None:
    directory = llada_checkpoint(tmp_path / "llada").directory
    (directory / "tokenizer_config.json").unlink()
    assert read_config(directory).eos_ids == (126081, 126348)


def test_the_context_window_is_what_the_model_documents(written: dict[Family, Checkpoint]) -> None:
    assert read_config(written[Family.LLADA].directory).context_len == 4096  # max_sequence_length
    assert read_config(written[Family.DREAM].directory).context_len == 2048  # not max_position_embeddings


# ---- tokenizers ----------------------------------------------------------------------------------------


PROMPTS: list[str] = []  # what transformers asked on the terminal (it swallows an error `input` raises)


def no_prompt(question: object = "") -> str:
    PROMPTS.append(str(question))
    raise EOFError


def test_dream_without_trust_remote_code_ends_with_one_line(
    written: dict[Family, Checkpoint], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(builtins, "input", no_prompt)
    PROMPTS.clear()
    with pytest.raises(ValueError) as caught:
        load_tokenizer(None, str(written[Family.DREAM].directory))
    assert PROMPTS == []
    message = str(caught.value)
    assert "\n" not in message
    assert "--trust-remote-code" in message and "tokenization_dream.py" in message


def test_dream_with_trust_remote_code_loads_its_tokenizer_and_chat_template(
    written: dict[Family, Checkpoint], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(builtins, "input", no_prompt)
    PROMPTS.clear()
    tokenizer = load_tokenizer(None, str(written[Family.DREAM].directory), trust_remote_code=True)
    assert PROMPTS == []
    assert isinstance(tokenizer, PretrainedTokenizer)
    prompt = tokenizer.chat_prompt([Message("user", "hello the world")])
    tail = [151644, *tokenizer.encode("assistant\n")]  # <|im_start|>assistant
    assert prompt[0] == 151644 and prompt[-len(tail) :] == tail
    assert 151645 in prompt  # each turn ends with <|im_end|>
    assert tokenizer.decode(tokenizer.encode("hello, world")) == "hello, world"


def test_llada_loads_without_remote_code_and_never_prompts(
    written: dict[Family, Checkpoint], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(builtins, "input", no_prompt)  # its config.json's auto_map made transformers ask
    PROMPTS.clear()
    tokenizer = load_tokenizer(None, str(written[Family.LLADA].directory))
    assert PROMPTS == []
    prompt = tokenizer.chat_prompt([Message("user", "hi")])
    assert (
        prompt[:2] == [126080, 126346] and 126348 in prompt
    )  # <|startoftext|><|start_header_id|>, <|eot_id|>


@pytest.mark.parametrize("family", list(Family))
def test_special_tokens_never_appear_in_text(
    family: Family, written: dict[Family, Checkpoint], monkeypatch: pytest.MonkeyPatch
) -> None:
    tokenizer = load_tokenizer(None, str(written[family].directory), trust_remote_code=True)
    config = read_config(written[family].directory)
    answer = tokenizer.encode("the answer")
    ids = [*answer, *config.eos_ids, config.mask_id, *answer]
    assert tokenizer.decode(ids) == "the answerthe answer"


def test_special_tokens_never_appear_even_where_the_tokenizer_would_keep_them(tmp_path: Path) -> None:
    # a slow tokenizer skips only the special tokens its special_tokens_map names: without
    # `additional_special_tokens`, <|im_start|> and <|im_end|> (marked special where added) would show
    directory = dream_checkpoint(tmp_path / "dream").directory
    for name in ("tokenizer_config.json", "special_tokens_map.json"):
        config = json.loads((directory / name).read_text())
        del config["additional_special_tokens"]
        (directory / name).write_text(json.dumps(config))
    tokenizer = load_tokenizer(None, str(directory), trust_remote_code=True)
    answer = tokenizer.encode("the answer")
    assert tokenizer.decode([*answer, 151645, 151644, *answer]) == "the answerthe answer"


def test_ids_the_tokenizer_does_not_know_are_left_out(written: dict[Family, Checkpoint]) -> None:
    # Dream's model has 152,064 rows and its tokenizer fewer tokens; its slow tokenizer fails on the rest
    tokenizer = load_tokenizer(None, str(written[Family.DREAM].directory), trust_remote_code=True)
    answer = tokenizer.encode("the answer")
    assert tokenizer.decode([*answer, 55593, 152063, *answer]) == "the answerthe answer"


# ---- whole generations against the models' own block generation -------------------------------------


def reference_generate(model: Transformer, prompt: Tensor, blocks: int, threshold: float = 0.9) -> Tensor:
    """Fast-dLLM's dual-cache block generation, written out plainly, as each model's own code does it.

    Per block: a full forward over prompt and every mask (the refresh) caches every position's K and V;
    then the block's tokens alone are forwarded against that cache with the block's own K and V fresh,
    until no mask is left. A step commits every masked position whose top probability reaches the
    threshold, and the most confident one always. Dream's head predicts the next token, so its logits
    move one position right, and its refresh commits the block's first position alone. (The mask id is
    never proposed.)
    """
    config = model.config
    dream = config.family is Family.DREAM
    x = torch.cat([prompt, torch.full((blocks * BLOCK,), config.mask_id)])
    for block in range(blocks):
        start = len(prompt) + block * BLOCK
        logits, cache = refresh(model, x)
        if dream:
            logits = torch.cat([logits[:1], logits[:-1]])
        probs = to_probs(logits[start : start + BLOCK], config.mask_id)
        if dream:
            x[start] = probs[0].argmax()
        else:
            commit(x, start, probs, threshold, config.mask_id)
        while (x[start : start + BLOCK] == config.mask_id).any():
            logits = block_forward(model, x, start, cache)
            if dream:
                logits = torch.cat([logits[:1], logits[:-1]])
            commit(x, start, to_probs(logits, config.mask_id), threshold, config.mask_id)
    return x[len(prompt) :]


Cache = dict[int, tuple[Tensor, Tensor]]


@torch.inference_mode()
def refresh(model: Transformer, x: Tensor) -> tuple[Tensor, Cache]:
    """Logits at every position of `x`, and every layer's K and V."""
    cache: Cache = {}

    def keep(layer: int, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        cache[layer] = (k, v)
        return dense_attention(layer, q, k, v)

    everywhere = torch.arange(len(x))
    return model(x, everywhere, keep, everywhere), cache


@torch.inference_mode()
def block_forward(model: Transformer, x: Tensor, start: int, cache: Cache) -> Tensor:
    """Logits of the block's positions, from its tokens against the cache with the block's K and V fresh."""

    def fresh_block(layer: int, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        keys, values = cache[layer][0].clone(), cache[layer][1].clone()
        keys[start : start + BLOCK], values[start : start + BLOCK] = k, v
        return dense_attention(layer, q, keys, values)

    positions = torch.arange(start, start + BLOCK)
    return model(x[start : start + BLOCK], positions, fresh_block, torch.arange(BLOCK))


def to_probs(logits: Tensor, mask_id: int) -> Tensor:
    probs = torch.softmax(logits.double(), dim=-1)
    probs[:, mask_id] = 0.0
    return probs


def commit(x: Tensor, start: int, probs: Tensor, threshold: float, mask_id: int) -> None:
    confidence, token = probs.max(dim=-1)
    masked = x[start : start + BLOCK] == mask_id
    confidence = torch.where(masked, confidence, -1.0)
    chosen = (confidence >= threshold) & masked
    chosen[int(confidence.argmax())] = True
    x[start : start + BLOCK] = torch.where(chosen, token, x[start : start + BLOCK])


def engine_generate(model: Transformer, prompt: Tensor, blocks: int) -> Tensor:
    """Blocks through the worker's engine (paged KV, the sampler in threshold mode), one after another."""
    pool = PagePool(64)
    cache = PagedKVCache.for_model(pool, model.config, dtype=torch.float32, device="cpu")
    engine = Engine(0, model, Batcher(0, BatchConfig(), pool), ModelRunner(model, cache, TorchAttention()))
    tokens = prompt.tolist()
    for block in range(blocks):
        engine.admit(BlockWork(1, 0.0, block, len(prompt), blocks * BLOCK, tuple(tokens)))
        done = []
        while not done:
            report = engine.step()
            assert report is not None
            done = list(report.finished)
        tokens += list(done[0].tokens)
    return torch.tensor(tokens[len(prompt) :])


@pytest.mark.parametrize("family", list(Family))
def test_whole_generations_match_the_models_own_block_generation(
    family: Family, written: dict[Family, Checkpoint]
) -> None:
    model = load_checkpoint(written[family].directory, dtype=torch.float32)
    prompt = torch.randint(0, 256, (11,), generator=torch.Generator().manual_seed(5))
    ours, theirs = engine_generate(model, prompt, 2), reference_generate(model, prompt, 2)
    assert torch.equal(ours, theirs)


def test_dreams_refresh_commits_the_blocks_first_position_alone(written: dict[Family, Checkpoint]) -> None:
    model = load_checkpoint(written[Family.DREAM].directory, dtype=torch.float32)
    prompt = torch.randint(0, 256, (11,), generator=torch.Generator().manual_seed(6))
    pool = PagePool(64)
    cache = PagedKVCache.for_model(pool, model.config, dtype=torch.float32, device="cpu")
    engine = Engine(0, model, Batcher(0, BatchConfig(), pool), ModelRunner(model, cache, TorchAttention()))
    engine.admit(BlockWork(1, 0.0, 0, len(prompt), BLOCK, tuple(prompt.tolist())))
    assert engine.step() is not None  # the prefill
    (job,) = engine.jobs.values()
    block = job.tokens[len(prompt) : len(prompt) + BLOCK]
    committed = (block != model.config.mask_id).nonzero().flatten().tolist()
    assert committed == [0]
    everywhere = torch.arange(len(job.tokens))
    with torch.inference_mode():  # the token left of the block predicts it
        logits = model(torch.cat([prompt, torch.full((BLOCK,), model.config.mask_id)]), everywhere,
                       dense_attention, everywhere)  # fmt: skip
    assert int(block[0]) == int(
        to_probs(logits[len(prompt) - 1 : len(prompt)], model.config.mask_id).argmax()
    )


# ---- --max-model-len -------------------------------------------------------------------------------


def plan(weights: Path | str, mask_len: int = 64, **options: object) -> LivePlan:
    live = LiveOptions(workers=1, weights=str(weights), **options)  # type: ignore[arg-type]
    return plan_run(RunConfig(mask_len=mask_len, pages=512), live)


def test_max_model_len_reaches_the_workers_within_the_models_positions(
    written: dict[Family, Checkpoint],
) -> None:
    dream = written[Family.DREAM].directory
    assert plan(dream).cluster.max_model_len is None  # the workers register the documented 2048
    assert plan(dream, max_model_len=8192).cluster.max_model_len == 8192
    with pytest.raises(ValueError, match="allows 131072 positions"):
        plan(dream, max_model_len=131073)
    with pytest.raises(ValueError, match="allows 4096 positions"):
        plan(written[Family.LLADA].directory, max_model_len=8192)


def test_a_window_with_no_room_for_a_prompt_is_refused(written: dict[Family, Checkpoint]) -> None:
    with pytest.raises(ValueError, match="no room for a prompt in the context window of 2048 tokens"):
        plan(written[Family.DREAM].directory, mask_len=2048)
    assert plan(written[Family.DREAM].directory, mask_len=2048, max_model_len=4096).cluster.mask_len == 2048
    with pytest.raises(ValueError, match="window of 64 tokens"):
        plan("random", max_model_len=64)
