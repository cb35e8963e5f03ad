"""Testbeds: everything a simulation cannot observe in a run, named, versioned, each value with its source.

A testbed (docs/design.md section 7) fixes the GPU, the iteration-time profile of every model (the
directory of measured data under `profiles/data/`, derived to the testbed's GPU when measured on
another), the KV pages per worker, the forwards-per-block model per (model, trace), the KV link, the
control plane's delay and the arrival process, and optionally a scale of iteration time per kind of each
model's profile (`sangam.cost.TimeScales`, as `sangam fit --scales` fits them), what the executor's
worker loop costs beyond its profile (`sangam.cost.LoopCosts`) and the control plane's handoff before
each KV transfer. Files are loaded by `profiles.testbeds`; this module only checks their content.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from sangam.cost import IterationKind, LoopCosts, TimeScales
from sangam.hardware import lookup_gpu, lookup_model
from sangam.progress import parse_progress
from sangam.workload import MASK_LEN, check_arrival_clip

FORMAT = 1  # the file format's version (each testbed also has its own `version`)


@dataclass(frozen=True, slots=True)
class Sourced:
    """One number of a testbed and where it came from."""

    value: float
    source: str


@dataclass(frozen=True, slots=True)
class ProgressEntry:
    """Forwards per block of one (model, trace): a `sangam.progress.parse_progress` spec."""

    spec: str
    source: str


@dataclass(frozen=True, slots=True)
class ProfileEntry:
    """Where one model's iteration times come from, when not from the testbed's profile directory."""

    data: str
    source: str


@dataclass(frozen=True, slots=True)
class LinkEntry:
    """The KV link: a profile in profiles/data/links, or an assumed bandwidth and latency."""

    source: str
    profile: str | None = None
    gb_per_s: float | None = None
    latency_ms: float | None = None


@dataclass(frozen=True, slots=True)
class ArrivalEntry:
    """The arrival process of synthetic traces: Poisson, its gaps clipped at `clip` mean gaps if given."""

    source: str
    clip: float | None = None


@dataclass(frozen=True, slots=True)
class PagesEntry:
    """KV pages per worker by model; a model not listed: the profile's live worker, else GPU memory."""

    source: str
    values: Mapping[str, int]


@dataclass(frozen=True, slots=True)
class LoopEntry:
    """What the executor's worker loop costs per iteration beyond the GPU call its profile times
    (`LoopCosts`): its report (`report_ms` plus `report_token_ns` per token of every item's sequence) and
    the rest (`other_ms` plus `other_item_ms` per item, up to `other_items_cap` items where given)."""

    report_ms: Sourced
    report_token_ns: Sourced
    other_ms: Sourced
    other_item_ms: Sourced
    other_items_cap: Sourced | None = None

    def costs(self) -> LoopCosts:
        cap = self.other_items_cap
        return LoopCosts(
            (self.report_ms.value + self.other_ms.value) / 1e3,
            self.other_item_ms.value / 1e3,
            self.report_token_ns.value / 1e9,
            int(cap.value) if cap is not None else None,
        )


LOOP_TERMS = ("report_ms", "report_token_ns", "other_ms", "other_item_ms")
LOOP_CAP = "other_items_cap"  # optional


@dataclass(frozen=True, slots=True)
class Testbed:
    """A named, versioned bundle of simulator inputs (see the module docstring)."""

    name: str
    version: int
    description: str
    gpu: str
    profile_data: str  # a directory under profiles/data holding <model>.csv/.meta.json
    profile_source: str
    progress: Mapping[tuple[str, str], ProgressEntry]  # (model, trace) -> forwards per block
    link: LinkEntry
    control_ms: Sourced
    arrival: ArrivalEntry
    kv_pages: PagesEntry
    fit: Mapping[str, Any] | None = None  # what `sangam fit` recorded, for fitted testbeds
    profile_models: Mapping[str, ProfileEntry] = field(default_factory=dict)  # a model's other data
    # model -> iteration kind -> the scale of its profile's time of that kind (a kind not listed: 1)
    time_scales: Mapping[str, Mapping[IterationKind, Sourced]] = field(default_factory=dict)
    loop: LoopEntry | None = None  # None: the profile prices the whole iteration
    handoff_ms: Sourced | None = None  # added to every KV transfer (None: none)

    def profile_dir(self, model: str) -> str:
        """The directory under profiles/data of `model`'s measured iteration times."""
        entry = self.profile_models.get(model)
        return entry.data if entry is not None else self.profile_data

    def progress_spec(self, model: str, trace: str) -> str:
        """The forwards-per-block spec for `model` on `trace` (trace files: ShareGPT's)."""
        key = (model, trace if trace in MASK_LEN else "sharegpt")
        if key not in self.progress:
            raise ValueError(f"testbed {self.name} has no forwards-per-block model for {key[0]} on {key[1]}")
        return self.progress[key].spec

    def pages(self, model: str) -> int | None:
        return self.kv_pages.values.get(model)

    def scales(self, model: str) -> TimeScales:
        """The scales of `model`'s iteration times per kind on this testbed (1 where none is given)."""
        given = self.time_scales.get(model, {})
        return TimeScales(**{kind.value: entry.value for kind, entry in given.items()})

    def loop_costs(self) -> LoopCosts:
        return self.loop.costs() if self.loop is not None else LoopCosts()

    @property
    def handoff_s(self) -> float:
        return self.handoff_ms.value / 1e3 if self.handoff_ms is not None else 0.0


KEYS = (  # of a testbed's file, as `testbed_dict` writes them
    "format", "name", "version", "description", "gpu", "profile", "kv_pages", "progress", "link",
    "control_ms", "arrival", "time_scales", "loop", "handoff_ms", "fit",
)  # fmt: skip
MAX_NUMBER = 1e9  # milliseconds, scales, GB/s: past this one is a typo (and 1e308 overflowed as a time)
MIN_GB_PER_S = 1e-3  # a slower link's transfer time overflowed


def _text(data: Mapping[str, Any], key: str, where: str) -> str:
    value = data.get(key)
    if not isinstance(value, str) or not value:
        raise ValueError(f"{where}: '{key}' must be a non-empty string")
    return value


def _number(data: Mapping[str, Any], key: str, where: str) -> float:
    value = data.get(key)
    if isinstance(value, bool) or not isinstance(value, int | float) or not abs(value) <= MAX_NUMBER:
        raise ValueError(f"{where}: '{key}' must be a number of at most {MAX_NUMBER:g}, got {value!r}")
    return float(value)


def _sourced(data: Any, where: str) -> Sourced:
    if not isinstance(data, Mapping):
        raise ValueError(f"{where}: must be an object with 'value' and 'source'")
    return Sourced(_number(data, "value", where), _text(data, "source", where))


def _link(data: Any, where: str) -> LinkEntry:
    if not isinstance(data, Mapping):
        raise ValueError(f"{where}: must be an object")
    source = _text(data, "source", where)
    if "profile" in data:
        return LinkEntry(source, profile=_text(data, "profile", where))
    gbps, latency = _number(data, "gb_per_s", where), _number(data, "latency_ms", where)
    if not gbps >= MIN_GB_PER_S or latency < 0:
        raise ValueError(f"{where}: needs gb_per_s >= {MIN_GB_PER_S:g} and latency_ms >= 0")
    return LinkEntry(source, gb_per_s=gbps, latency_ms=latency)


def _progress(data: Any, where: str) -> dict[tuple[str, str], ProgressEntry]:
    if not isinstance(data, Mapping) or not data:
        raise ValueError(f"{where}: must map 'model/trace' to forwards-per-block models")
    out = {}
    for key, entry in data.items():
        model, _, trace = str(key).partition("/")
        lookup_model(model)
        if trace not in MASK_LEN:
            raise ValueError(f"{where}: {key!r} must be MODEL/TRACE with a trace of {', '.join(MASK_LEN)}")
        if not isinstance(entry, Mapping):
            raise ValueError(f"{where}.{key}: must be an object with 'spec' and 'source'")
        spec = _text(entry, "spec", f"{where}.{key}")
        parse_progress(spec)
        out[(model, trace)] = ProgressEntry(spec, _text(entry, "source", f"{where}.{key}"))
    return out


def _time_scales(data: Any, where: str) -> dict[str, dict[IterationKind, Sourced]]:
    if not isinstance(data, Mapping):
        raise ValueError(f"{where}: must map models to {{kind: {{'value', 'source'}}}}")
    kinds = ", ".join(IterationKind)
    out: dict[str, dict[IterationKind, Sourced]] = {}
    for model, scales in data.items():
        lookup_model(model)
        if not isinstance(scales, Mapping):
            raise ValueError(f"{where}.{model}: must map iteration kinds ({kinds}) to scales")
        out[model] = {}
        for kind, entry in scales.items():
            if kind not in {k.value for k in IterationKind}:
                raise ValueError(f"{where}.{model}: {kind!r} is not an iteration kind ({kinds})")
            scale = _sourced(entry, f"{where}.{model}.{kind}")
            if not scale.value > 0:
                raise ValueError(f"{where}.{model}.{kind}: a time scale must be positive")
            out[model][IterationKind(kind)] = scale
    return out


def _non_negative(data: Any, where: str) -> Sourced:
    value = _sourced(data, where)
    if value.value < 0:
        raise ValueError(f"{where}: must not be negative")
    return value


def _loop(data: Any, where: str) -> LoopEntry | None:
    if data is None:
        return None
    if not isinstance(data, Mapping) or not set(LOOP_TERMS) <= set(data) <= {*LOOP_TERMS, LOOP_CAP}:
        raise ValueError(
            f"{where}: must hold exactly {', '.join(LOOP_TERMS)} (and {LOOP_CAP} if capped), each with "
            "'value' and 'source'"
        )
    cap = _non_negative(data[LOOP_CAP], f"{where}.{LOOP_CAP}") if LOOP_CAP in data else None
    if cap is not None and not (math.isfinite(cap.value) and cap.value >= 1 and cap.value.is_integer()):
        raise ValueError(f"{where}.{LOOP_CAP}: must be a whole number of items, at least 1")
    report_ms, report_token_ns, other_ms, other_item_ms = (
        _non_negative(data[term], f"{where}.{term}") for term in LOOP_TERMS
    )
    return LoopEntry(report_ms, report_token_ns, other_ms, other_item_ms, cap)


def parse_testbed(data: Any, name: str) -> Testbed:
    """A testbed from the JSON object of its file named `name`; ValueError (one line) if it is not one."""
    if not isinstance(data, Mapping):
        raise ValueError(f"testbed {name}: not a JSON object")
    where = f"testbed {name}"
    unknown = sorted(set(data) - set(KEYS))
    if unknown:  # a misspelt key would drop what it holds without a word
        raise ValueError(f"{where}: unknown key {unknown[0]!r} (known: {', '.join(KEYS)})")
    if data.get("format") != FORMAT:
        raise ValueError(f"{where}: 'format' must be {FORMAT}")
    if data.get("name") != name:
        raise ValueError(f"{where}: its 'name' is {data.get('name')!r}, not its file's name")
    version = data.get("version")
    if not isinstance(version, int) or version < 1:
        raise ValueError(f"{where}: 'version' must be a positive integer")
    gpu = _text(data, "gpu", where)
    lookup_gpu(gpu)
    profile = data.get("profile")
    if not isinstance(profile, Mapping):
        raise ValueError(f"{where}: 'profile' must be an object with 'data' and 'source'")
    control = _sourced(data.get("control_ms"), f"{where}.control_ms")
    if control.value < 0:
        raise ValueError(f"{where}.control_ms: must not be negative")
    arrival = data.get("arrival")
    if not isinstance(arrival, Mapping):
        raise ValueError(f"{where}: 'arrival' must be an object with 'source' (and 'clip')")
    clip = arrival.get("clip")
    if clip is not None:
        clip = _number(arrival, "clip", f"{where}.arrival")
        check_arrival_clip(clip)
    pages = data.get("kv_pages")
    if not isinstance(pages, Mapping) or not isinstance(pages.get("values", {}), Mapping):
        raise ValueError(f"{where}: 'kv_pages' must be an object with 'source' and 'values' (model: pages)")
    values = dict(pages.get("values", {}))
    for model, count in values.items():
        lookup_model(model)
        if isinstance(count, bool) or not isinstance(count, int) or count < 1:
            raise ValueError(f"{where}.kv_pages.{model}: must be a positive whole number")
    fit = data.get("fit")
    models = profile.get("models", {})
    if not isinstance(models, Mapping):
        raise ValueError(f"{where}.profile: 'models' must map models to their own 'data' and 'source'")
    overrides = {}
    for model, entry in models.items():
        lookup_model(model)
        at = f"{where}.profile.models.{model}"
        if not isinstance(entry, Mapping):
            raise ValueError(f"{at}: must be an object with 'data' and 'source'")
        overrides[model] = ProfileEntry(_text(entry, "data", at), _text(entry, "source", at))
    handoff = data.get("handoff_ms")
    return Testbed(
        name=name,
        version=version,
        description=_text(data, "description", where),
        gpu=gpu,
        profile_data=_text(profile, "data", f"{where}.profile"),
        profile_source=_text(profile, "source", f"{where}.profile"),
        progress=_progress(data.get("progress"), f"{where}.progress"),
        link=_link(data.get("link"), f"{where}.link"),
        control_ms=control,
        arrival=ArrivalEntry(_text(arrival, "source", f"{where}.arrival"), clip),
        kv_pages=PagesEntry(_text(pages, "source", f"{where}.kv_pages"), values),
        fit=fit if isinstance(fit, Mapping) else None,
        profile_models=overrides,
        time_scales=_time_scales(data.get("time_scales", {}), f"{where}.time_scales"),
        loop=_loop(data.get("loop"), f"{where}.loop"),
        handoff_ms=None if handoff is None else _non_negative(handoff, f"{where}.handoff_ms"),
    )


def testbed_dict(testbed: Testbed) -> dict[str, Any]:
    """The JSON object of a testbed's file (what `parse_testbed` reads back)."""
    link: dict[str, Any] = {"source": testbed.link.source}
    if testbed.link.profile is not None:
        link["profile"] = testbed.link.profile
    else:
        link.update(gb_per_s=testbed.link.gb_per_s, latency_ms=testbed.link.latency_ms)
    out: dict[str, Any] = {
        "format": FORMAT,
        "name": testbed.name,
        "version": testbed.version,
        "description": testbed.description,
        "gpu": testbed.gpu,
        "profile": {"data": testbed.profile_data, "source": testbed.profile_source},
        "kv_pages": {"source": testbed.kv_pages.source, "values": dict(testbed.kv_pages.values)},
        "progress": {
            f"{m}/{t}": {"spec": e.spec, "source": e.source} for (m, t), e in testbed.progress.items()
        },
        "link": link,
        "control_ms": {"value": testbed.control_ms.value, "source": testbed.control_ms.source},
        "arrival": {"clip": testbed.arrival.clip, "source": testbed.arrival.source},
    }
    if testbed.profile_models:
        out["profile"]["models"] = {
            m: {"data": e.data, "source": e.source} for m, e in testbed.profile_models.items()
        }
    if testbed.time_scales:
        out["time_scales"] = {
            model: {kind.value: {"value": e.value, "source": e.source} for kind, e in scales.items()}
            for model, scales in testbed.time_scales.items()
        }
    if testbed.loop is not None:
        out["loop"] = {term: _sourced_dict(getattr(testbed.loop, term)) for term in LOOP_TERMS}
        if testbed.loop.other_items_cap is not None:
            out["loop"][LOOP_CAP] = _sourced_dict(testbed.loop.other_items_cap)
    if testbed.handoff_ms is not None:
        out["handoff_ms"] = _sourced_dict(testbed.handoff_ms)
    if testbed.fit is not None:
        out["fit"] = dict(testbed.fit)
    return out


def _sourced_dict(entry: Sourced) -> dict[str, Any]:
    return {"value": entry.value, "source": entry.source}
