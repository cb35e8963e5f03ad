"""Read a local Hugging Face `config.json` of LLaDA or Dream into a `ModelConfig`.

Both models ship remote code, so transformers' AutoConfig cannot read them offline; the JSON is parsed here
and checked against what our transformer implements. Nothing of the checkpoint's code is run.

- **Stops** (`eos_ids`): the union of config.json's and generation_config.json's EOS ids and the token that
  ends a turn in the chat template of tokenizer_config.json (LLaDA's `<|eot_id|>`, Dream's `<|im_end|>`,
  neither of which the configs name). Without a chat template, the family's own stops stand in, where the
  vocabulary has them.
- **Context window** (`context_len`): what the model documents (`FamilyTraits.context_len`: LLaDA 4,096,
  its training length; Dream 2,048, from its model card), never more than the config's position limit.
  Dream's `max_position_embeddings` (131,072) is Qwen2.5's, not what Dream was trained for.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from executor.model.config import TRAITS, Family, ModelConfig
from sangam.hardware import ModelSpec

ARCHITECTURES = {traits.architecture: family for family, traits in TRAITS.items()}


def read_config(directory: str | Path) -> ModelConfig:
    """The `ModelConfig` of the checkpoint in `directory`; ValueError for anything we do not implement."""
    path = Path(directory)
    raw = json.loads((path / "config.json").read_text())
    architecture = (raw.get("architectures") or [None])[0]
    if architecture not in ARCHITECTURES:
        raise ValueError(f"{path}: architecture {architecture!r} is not one of {sorted(ARCHITECTURES)}")
    family = ARCHITECTURES[architecture]
    shape = (_llada_shape if family is Family.LLADA else _dream_shape)(path.name, raw)
    if raw.get("rope_scaling"):
        raise ValueError(f"{path}: rope_scaling {raw['rope_scaling']} is not implemented")
    traits = TRAITS[family]
    return ModelConfig(
        family=family,
        shape=shape,
        rms_eps=float(raw.get("rms_norm_eps", traits.rms_eps)),
        rope_theta=float(raw.get("rope_theta", traits.rope_theta)),
        mask_id=int(raw.get("mask_token_id", traits.mask_id)),
        eos_ids=_stop_ids(path, raw, traits.eos_ids, shape.vocab),
        context_len=context_window(raw),
    )


def family_of(raw: dict[str, Any]) -> Family | None:
    """The family of a parsed config.json, by `architectures[0]`; None for another model."""
    return ARCHITECTURES.get((raw.get("architectures") or [None])[0])


def position_limit(raw: dict[str, Any]) -> int:
    """The most positions config.json allows (LLaDA's `max_sequence_length`, Dream's
    `max_position_embeddings`), else the family's."""
    limit = raw.get("max_sequence_length") or raw.get("max_position_embeddings")
    family = family_of(raw)
    return int(limit) if limit else TRAITS[family].positions if family is not None else 1 << 62


def context_window(raw: dict[str, Any]) -> int:
    """The context window the model documents, within what its config.json allows."""
    family = family_of(raw)
    documented = TRAITS[family].context_len if family is not None else 1 << 62
    return min(documented, position_limit(raw))


def _llada_shape(name: str, raw: dict[str, Any]) -> ModelSpec:
    _require(raw, "weight_tying", False)
    _require(raw, "include_bias", False)
    _require(raw, "include_qkv_bias", False)
    _require(raw, "block_type", "llama")
    heads = raw["n_heads"]
    return ModelSpec(
        name,
        layers=raw["n_layers"],
        hidden=raw["d_model"],
        heads=heads,
        kv_heads=raw.get("n_kv_heads") or heads,
        head_dim=raw["d_model"] // heads,
        intermediate=raw["mlp_hidden_size"],
        vocab=raw.get("embedding_size") or raw["vocab_size"],  # wte rows; LLaDA pads the vocab to this
        qkv_bias=False,
    )


def _dream_shape(name: str, raw: dict[str, Any]) -> ModelSpec:
    _require(raw, "tie_word_embeddings", False)
    heads = raw["num_attention_heads"]
    return ModelSpec(
        name,
        layers=raw["num_hidden_layers"],
        hidden=raw["hidden_size"],
        heads=heads,
        kv_heads=raw.get("num_key_value_heads") or heads,
        head_dim=raw.get("head_dim") or raw["hidden_size"] // heads,
        intermediate=raw["intermediate_size"],
        vocab=raw["vocab_size"],
        qkv_bias=True,
    )


def _require(raw: dict[str, Any], key: str, expected: object) -> None:
    if key in raw and raw[key] != expected:
        raise ValueError(f"config.json has {key}={raw[key]!r}; only {expected!r} is implemented")


def _stop_ids(path: Path, raw: dict[str, Any], family: tuple[int, ...], vocab: int) -> tuple[int, ...]:
    """config.json's and generation_config.json's EOS ids and the chat template's end of turn, together;
    the family's stops (those inside the vocabulary) stand in for a template that cannot be read."""
    ids = set(_as_ids(raw.get("eos_token_id")))
    generation = path / "generation_config.json"
    if generation.exists():
        ids.update(_as_ids(json.loads(generation.read_text()).get("eos_token_id")))
    turn_end = chat_turn_end(path)
    if turn_end is not None and turn_end < vocab:
        ids.add(turn_end)
    else:
        ids.update(token for token in family if token < vocab)
    return tuple(sorted(ids)) or family


def chat_turn_end(directory: Path) -> int | None:
    """The id of the added token that the checkpoint's chat template writes right after a message's content
    (the end of a turn), or None: no tokenizer_config.json, no template, or none follows the content.

    The template is rendered here (sandboxed Jinja, as transformers renders it) over a two-message chat,
    without the tokenizer or any code of the checkpoint.
    """
    config_path = directory / "tokenizer_config.json"
    if not config_path.exists():
        return None
    config = json.loads(config_path.read_text())
    template = _chat_template(directory, config)
    added = {
        str(entry["content"]): int(token)
        for token, entry in (config.get("added_tokens_decoder") or {}).items()
        if isinstance(entry, dict) and "content" in entry
    }
    fast = directory / "tokenizer.json"  # a fast tokenizer's own list (LLaDA's)
    if fast.exists():
        added |= {
            str(t["content"]): int(t["id"]) for t in json.loads(fast.read_text()).get("added_tokens", [])
        }
    added_file = directory / "added_tokens.json"  # a slow tokenizer's (Qwen2's, Dream's)
    if added_file.exists():
        added |= {str(text): int(token) for text, token in json.loads(added_file.read_text()).items()}
    if template is None or not added:
        return None
    reply = "\u2063sangam reply\u2063"  # content no template alters or meets elsewhere
    text = _render(
        template, config, [{"role": "user", "content": "hi"}, {"role": "assistant", "content": reply}]
    )
    if text is None or reply not in text:
        return None
    rest = text[text.index(reply) + len(reply) :]
    matches = [token for token in added if rest.startswith(token)]
    return added[max(matches, key=len)] if matches else None


def _chat_template(directory: Path, config: dict[str, Any]) -> str | None:
    """tokenizer_config.json's `chat_template` (the default one of a list), or chat_template.jinja's."""
    template = config.get("chat_template")
    if isinstance(template, list):
        template = next((t.get("template") for t in template if t.get("name") == "default"), None)
    if not template and (directory / "chat_template.jinja").exists():
        template = (directory / "chat_template.jinja").read_text()
    return template if isinstance(template, str) and template else None


def _render(template: str, config: dict[str, Any], messages: list[dict[str, str]]) -> str | None:
    from jinja2 import TemplateError
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message: str) -> None:
        raise TemplateError(message)

    def token_text(name: str) -> str:
        value = config.get(name)
        return str(value.get("content", "")) if isinstance(value, dict) else str(value or "")

    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"]
    )
    env.globals["raise_exception"] = raise_exception
    env.filters["tojson"] = lambda value, **kwargs: json.dumps(value, ensure_ascii=False)
    try:
        return env.from_string(template).render(
            messages=messages, add_generation_prompt=False, bos_token=token_text("bos_token"),
            eos_token=token_text("eos_token"),
        )  # fmt: skip
    except Exception:  # a template beyond this plain rendering: the family's stops stand in
        return None


def _as_ids(value: int | list[int] | None) -> list[int]:
    if value is None:
        return []
    return [value] if isinstance(value, int) else list(value)
