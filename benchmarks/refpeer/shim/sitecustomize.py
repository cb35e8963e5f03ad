"""Run-time fixes that let the reference implementation (written for transformers 4.57) run on the device
image's transformers 5, without editing its tree. On PYTHONPATH, Python imports this in every process it
starts, the reference launcher's scheduler and workers included (they are forked, so they inherit it
either way).

1. transformers 5 turns every config subclass into a dataclass; the reference's `LLaDAConfig` declares
   `keys_to_ignore_at_inference: list[str] = []`, a mutable default dataclasses refuse. Such annotated
   mutable class attributes of the reference's configs are re-annotated as ClassVar, what they are.
2. `AutoConfig.register` / `AutoModel.register` of a name transformers already knows is retried with
   exist_ok (the registrations are not what loads the model: the registry picks the class itself).
3. `use_return_dict`, gone from transformers 5 configs, is read by the reference's forward: a property
   that gives `return_dict`.
4. transformers 5's `from_pretrained` reads `all_tied_weights_keys`, which its `post_init` sets; the
   reference's `LLaDAModelLM.__init__` does not call `post_init`, so models get an empty (read-only)
   mapping as a class default: LLaDA-8B ties no weights (`weight_tying: false`).
5. transformers 5 calls `tie_weights(missing_keys=..., recompute_mapping=...)`; the reference's
   `LLaDAModelLM.tie_weights(self)` takes no arguments, so a model class of sangam.* whose tie_weights
   takes none is given one that accepts and ignores them.
6. transformers 5 dropped the "default" entry of `ROPE_INIT_FUNCTIONS`, which the reference's Dream
   rotary embedding looks up for plain RoPE: it is given back, the textbook inverse frequencies
   base^(-2i/d) over the head dimension, attention factor 1.

Each applied fix is listed in `APPLIED` and, when SANGAM_REF_SHIM_LOG is set, printed to stderr once.
"""

from __future__ import annotations

import dataclasses
import os
import sys
import types
import typing

APPLIED: list[str] = []


def _config_base() -> type:
    from transformers import configuration_utils

    return getattr(configuration_utils, "PreTrainedConfig", None) or configuration_utils.PretrainedConfig


def _mutable_defaults_as_classvar(base: type) -> None:
    hook = base.__dict__.get("__init_subclass__")
    if not dataclasses.is_dataclass(base) or not isinstance(hook, classmethod):
        return
    original = hook.__func__

    def init_subclass(cls: type, *args: typing.Any, **kwargs: typing.Any) -> typing.Any:
        if cls.__module__.startswith("sangam."):
            notes = cls.__dict__.get("__annotations__")  # noqa: RUF063 - edited in place, not a copy
            for name, kind in list((notes or {}).items()):
                if (
                    isinstance(cls.__dict__.get(name), list | dict | set)
                    and typing.get_origin(kind) is not typing.ClassVar
                ):
                    notes[name] = typing.ClassVar[kind]
        return original(cls, *args, **kwargs)

    base.__init_subclass__ = classmethod(init_subclass)  # type: ignore[assignment]
    APPLIED.append("config subclasses: mutable annotated class defaults of sangam.* made ClassVar")


def _tolerant_register() -> None:
    from transformers import AutoConfig, AutoModel

    config_register = AutoConfig.register
    model_register = AutoModel.register

    def register_config(model_type: typing.Any, config: typing.Any, exist_ok: bool = False) -> None:
        try:
            config_register(model_type, config, exist_ok=exist_ok)
        except ValueError:
            config_register(model_type, config, exist_ok=True)

    def register_model(config: typing.Any, model: typing.Any, exist_ok: bool = False) -> None:
        try:
            model_register(config, model, exist_ok=exist_ok)
        except ValueError:
            model_register(config, model, exist_ok=True)

    AutoConfig.register = staticmethod(register_config)  # type: ignore[method-assign,assignment]
    AutoModel.register = staticmethod(register_model)  # type: ignore[method-assign,assignment]
    APPLIED.append("AutoConfig/AutoModel.register: retried with exist_ok")


def _use_return_dict(base: type) -> None:
    if any("use_return_dict" in k.__dict__ for k in base.__mro__):
        return
    base.use_return_dict = property(lambda self: bool(getattr(self, "return_dict", True)))  # type: ignore[attr-defined]
    APPLIED.append("config.use_return_dict: a property giving return_dict")


def _no_tied_weights_default() -> None:
    from transformers import PreTrainedModel

    if "all_tied_weights_keys" in vars(PreTrainedModel):
        return
    PreTrainedModel.all_tied_weights_keys = types.MappingProxyType({})  # type: ignore[attr-defined]
    APPLIED.append("PreTrainedModel.all_tied_weights_keys: an empty default (no post_init in the reference)")


def _tie_weights_keywords() -> None:
    import inspect

    from transformers import PreTrainedModel

    hook = PreTrainedModel.__dict__.get("__init_subclass__")
    original = hook.__func__ if isinstance(hook, classmethod) else None

    def init_subclass(cls: type, **kwargs: typing.Any) -> None:
        if original is not None:
            original(cls, **kwargs)
        else:
            super(PreTrainedModel, cls).__init_subclass__(**kwargs)
        tie = cls.__dict__.get("tie_weights")
        takes_none = tie is not None and len(inspect.signature(tie).parameters) == 1
        if cls.__module__.startswith("sangam.") and takes_none:

            def tie_weights(self: typing.Any, *_: typing.Any, **__: typing.Any) -> None:
                tie(self)

            cls.tie_weights = tie_weights  # type: ignore[attr-defined]

    PreTrainedModel.__init_subclass__ = classmethod(init_subclass)  # type: ignore[assignment]
    APPLIED.append("sangam.* models: tie_weights(self) accepts transformers 5's keywords")


def _default_rope() -> None:
    from transformers import modeling_rope_utils

    table = modeling_rope_utils.ROPE_INIT_FUNCTIONS
    if "default" in table:
        return

    def plain_rope(
        config: typing.Any, device: typing.Any = None, **_: typing.Any
    ) -> tuple[typing.Any, float]:
        import torch

        dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        dim = int(dim * getattr(config, "partial_rotary_factor", 1.0))
        exponents = torch.arange(0, dim, 2, dtype=torch.int64).to(device=device, dtype=torch.float) / dim
        return 1.0 / (config.rope_theta**exponents), 1.0

    table["default"] = plain_rope
    APPLIED.append('ROPE_INIT_FUNCTIONS["default"]: plain RoPE (gone from transformers 5)')


def apply() -> None:
    try:
        base = _config_base()
    except ImportError:  # no transformers: nothing of the reference's model code will run here
        return
    _mutable_defaults_as_classvar(base)
    _tolerant_register()
    _use_return_dict(base)
    _no_tied_weights_default()
    _tie_weights_keywords()
    _default_rope()
    if os.environ.get("SANGAM_REF_SHIM_LOG"):
        print(f"refpeer shims (pid {os.getpid()}): {'; '.join(APPLIED) or 'none needed'}", file=sys.stderr)


apply()

if os.environ.get("SANGAM_REF_TIMING_DIR") or os.environ.get("SANGAM_REF_KV_GLOO"):
    import ref_timing

    ref_timing.install()
