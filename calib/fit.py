"""`sangam fit`: a testbed's forwards per block (and, if asked, its time scales per iteration kind) fitted
to observed load-curve points, or forwards per block measured.

From targets (`calib.targets`): for each (model, trace) its beta-binomial's mean (and, if asked, its
spread) is chosen by `scipy.optimize` so that the simulated metrics of the targets come closest to the
observed ones, in the weighted mean of squared log ratios. With `--scales KIND...` each model's profile
also gets a free multiplier of its iteration times per kind (`sangam.cost.TimeScales`), shared by the
model's traces, so a model's pairs are then fitted together. Every evaluation simulates the same
requests (the same seed, hence the same lengths and arrival gaps) and draws each block's forwards from
the same uniforms by inverse CDF, so the objective moves smoothly with the parameters (common random
numbers). A leave-one-out check refits without each point and predicts it.

From live runs (`--blocks`): the forwards of every block in their blocks.csv, per (model, trace),
become an empirical model (`counts:D=N,...`).
"""

from __future__ import annotations

import csv
import dataclasses
import hashlib
import json
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from calib.points import PointKey, PointRunner, metric
from calib.targets import Target
from profiles.testbed import PagesEntry, ProgressEntry, Sourced, Testbed
from runs.live_summary import run_config, served_model
from runs.options import nonempty_path, option
from sangam.cost import IterationKind, TimeScales
from sangam.hardware import BLOCK
from sangam.progress import counts_spec
from sangam.workload import MASK_LEN

TRIALS = BLOCK - 1  # a block's forwards are 1 + BetaBinomial(31, a, b)
MEAN_BOUNDS = (1.5, 30.0)
DISPERSION_BOUNDS = (0.005, 0.9)  # rho = 1 / (a + b + 1): 0 is binomial, 1 all-or-nothing
SCALE_BOUNDS = (0.2, 5.0)  # a time scale's search range
FREE = ("mean", "mean+std", "none")
PER_PAIR = {"none": 0, "mean": 1, "mean+std": 2}  # free forwards-per-block parameters of a pair
KINDS = tuple(kind.value for kind in IterationKind)

Pair = tuple[str, str]  # (model, trace)


@dataclass(frozen=True, slots=True)
class FitOptions:
    """What `sangam fit` fits, to what, and where it writes the testbed."""

    targets: Path | None = option(
        None, "observed points, CSV: layout, policy, model, trace, budget, qps, metric, value, weight "
        "[, quote]", parse=nonempty_path, metavar="CSV",
    )  # fmt: skip
    blocks: tuple[Path, ...] = option(
        (), "instead: live run directories whose blocks.csv give forwards per block (empirical)",
        parse=lambda text: [nonempty_path(text)], many=True, metavar="DIR", default_text="none",
    )  # fmt: skip
    loop: tuple[Path, ...] = option(
        (), "instead: live run directories of our executor whose iterations.csv give its worker loop's "
        "time between steps (which a profile does not time), charged per iteration as "
        "a + b * min(items, cap)",
        parse=lambda text: [nonempty_path(text)], many=True, metavar="DIR", default_text="none",
    )  # fmt: skip
    profile: Path | None = option(
        None, "instead: a directory of `sangam profile` data (e.g. profiles/data/h200-fp8-kvfp8) whose "
        "iteration times and KV pages the new testbed takes", parse=nonempty_path, metavar="DIR",
    )  # fmt: skip
    free: str = option(
        "mean", "free forwards-per-block parameters per model and trace: the mean, mean and spread, or "
        "none (keep the base testbed's, e.g. measured by --blocks; then give --scales)", choices=FREE,
    )  # fmt: skip
    scales: tuple[str, ...] = option(
        (), "also fit a scale of each model's iteration times per kind: prefill (prefills only), decode "
        "(decodes only), mixed (prefills with decodes)", many=True, choices=KINDS, metavar="KIND",
        default_text="none",
    )  # fmt: skip
    name: str | None = option(
        None,
        "the new testbed's name (not a shipped testbed's)",
        default_text="the --out file's name, else the base testbed's name + '-fit'",
    )
    out: Path | None = option(
        None, "where to write the new testbed: a directory (for NAME.json) or a FILE.json named after it; "
        "never a shipped testbed or inside the installed package", parse=nonempty_path, metavar="PATH",
        default_text="the working directory",
    )  # fmt: skip

    @property
    def kinds(self) -> tuple[IterationKind, ...]:
        return tuple(IterationKind(k) for k in self.scales)


def spread(mean: float, rho: float) -> float:
    """The standard deviation of 1 + BetaBinomial(31) with this mean and dispersion rho."""
    p = (mean - 1) / TRIALS
    return math.sqrt(TRIALS * p * (1 - p) * (1 + (TRIALS - 1) * rho))


def dispersion(mean: float, std: float) -> float:
    """The inverse of `spread`."""
    p = (mean - 1) / TRIALS
    return (std * std / (TRIALS * p * (1 - p)) - 1) / (TRIALS - 1)


def betabinom(mean: float, rho: float) -> str:
    return f"betabinom:{mean:.4g}:{spread(mean, rho):.4g}"


def start_of(spec: str) -> tuple[float, float]:
    """(mean, rho) of a betabinom spec; another model starts from the default's mean and dispersion."""
    kind, _, rest = spec.partition(":")
    mean, std = (float(x) for x in rest.split(":")) if kind == "betabinom" else (10.0, 5.0)
    return mean, min(max(dispersion(mean, std), DISPERSION_BOUNDS[0]), DISPERSION_BOUNDS[1])


@dataclass(frozen=True, slots=True)
class Space:
    """The free parameters of one fit, as the vector the optimiser moves: `PER_PAIR[free]` of each pair's
    forwards per block (its mean, then its dispersion), then the model's time scale of each of `kinds`."""

    pairs: tuple[Pair, ...]
    free: str
    kinds: tuple[IterationKind, ...]
    starts: tuple[tuple[float, float], ...]  # each pair's (mean, rho) to start from
    kept: tuple[str, ...]  # each pair's spec where its forwards are not free
    base_scales: TimeScales  # the scales of the kinds not free

    @property
    def size(self) -> int:
        return PER_PAIR[self.free] * len(self.pairs) + len(self.kinds)

    def start(self) -> list[float]:
        n = PER_PAIR[self.free]
        return [v for start in self.starts for v in start[:n]] + [self.base_scales.of(k) for k in self.kinds]

    def bounds(self) -> list[tuple[float, float]]:
        return [MEAN_BOUNDS, DISPERSION_BOUNDS][: PER_PAIR[self.free]] * len(self.pairs) + [
            SCALE_BOUNDS
        ] * len(self.kinds)

    def forwards(self, x: Sequence[float]) -> list[tuple[float, float] | None]:
        """Each pair's fitted (mean, rho) at `x` (None where its forwards are kept)."""
        n = PER_PAIR[self.free]
        if n == 0:
            return [None] * len(self.pairs)
        return [(x[i * n], x[i * n + 1] if n == 2 else start[1]) for i, start in enumerate(self.starts)]

    def specs(self, x: Sequence[float]) -> dict[Pair, str]:
        return {
            pair: betabinom(*fitted) if fitted is not None else kept
            for pair, fitted, kept in zip(self.pairs, self.forwards(x), self.kept, strict=True)
        }

    def scales(self, x: Sequence[float]) -> TimeScales:
        free = x[PER_PAIR[self.free] * len(self.pairs) :]
        changed = {k.value: round(float(v), 4) for k, v in zip(self.kinds, free, strict=True)}  # as written
        return dataclasses.replace(self.base_scales, **changed)


@dataclass(frozen=True, slots=True)
class PointFit:
    target: Target
    simulated: float  # at the fitted parameters
    held_out: float | None  # predicted by a fit without this point (None: it is the fit's only point)


@dataclass(frozen=True, slots=True)
class PairFit:
    """Forwards per block of one (model, trace) after a fit: fitted (mean and rho), or kept."""

    model: str
    trace: str
    spec: str
    mean: float | None  # None: kept (`--free none`)
    rho: float | None


@dataclass(frozen=True, slots=True)
class Fit:
    """One fit: a (model, trace), or with time scales free, a model and all its traces."""

    pairs: tuple[PairFit, ...]
    kinds: tuple[IterationKind, ...]  # the time scales fitted
    scales: TimeScales  # the model's scales after the fit (the kinds not fitted: the base testbed's)
    objective: float
    evaluations: int
    points: tuple[PointFit, ...]

    @property
    def model(self) -> str:
        return self.pairs[0].model


class Objective:
    """The simulated metrics of a fit's targets at given forwards per block and time scales, each
    simulation once."""

    def __init__(self, sim: PointRunner, targets: Sequence[Target], num_requests: int, seed: int) -> None:
        self.sim, self.targets, self.num_requests, self.seed = sim, list(targets), num_requests, seed
        self._seen: dict[tuple[PointKey, str, TimeScales], dict[str, Any]] = {}  # summaries by input

    @property
    def evaluations(self) -> int:
        return len(self._seen)

    def simulated(self, index: int, specs: Mapping[Pair, str], scales: TimeScales) -> float:
        target = self.targets[index]
        key = (target.key, specs[target.pair], scales)
        if key not in self._seen:
            cfg = target.key.config(self.num_requests, self.seed)
            self._seen[key] = self.sim.run(cfg, key[1], scales).summary
        return metric(self._seen[key], target.metric)

    def loss(self, specs: Mapping[Pair, str], scales: TimeScales, indices: Sequence[int]) -> float:
        """Weighted mean squared log ratio of simulated to observed over `indices`."""
        total = sum(self.targets[i].weight for i in indices)
        return (
            sum(
                self.targets[i].weight
                * math.log(self.simulated(i, specs, scales) / self.targets[i].value) ** 2
                for i in indices
            )
            / total
        )


def minimise(
    loss: Callable[[Sequence[float]], float], start: Sequence[float], bounds: Sequence[tuple[float, float]]
) -> list[float]:
    """The `x` of least `loss`: bounded Brent for one parameter, else Nelder-Mead."""
    from scipy.optimize import minimize, minimize_scalar

    if len(start) == 1:
        xatol = 0.02 if bounds[0] == MEAN_BOUNDS else 0.002  # a mean in forwards, a scale in ratio
        found = minimize_scalar(lambda v: loss([v]), bounds=bounds[0], method="bounded",
                                options={"xatol": xatol})  # fmt: skip
        return [float(found.x)]
    found = minimize(
        lambda x: loss(list(x)), start, method="Nelder-Mead", bounds=bounds,
        options={"xatol": 0.01, "fatol": 1e-5, "maxfev": 60 * len(start)},
    )  # fmt: skip
    return [float(v) for v in found.x]


def fit_space(objective: Objective, space: Space) -> Fit:
    """One fit of its targets, then each left out in turn."""
    every = list(range(len(objective.targets)))

    def fitted(indices: Sequence[int]) -> list[float]:
        return minimise(
            lambda x: objective.loss(space.specs(x), space.scales(x), indices), space.start(), space.bounds()
        )

    x = fitted(every)
    specs, scales = space.specs(x), space.scales(x)
    points = []
    for i in every:
        held_out = None
        if len(every) > 1:
            others = fitted([j for j in every if j != i])
            held_out = objective.simulated(i, space.specs(others), space.scales(others))
        points.append(PointFit(objective.targets[i], objective.simulated(i, specs, scales), held_out))
    pairs = tuple(
        PairFit(model, trace, specs[(model, trace)], *(fitted if fitted else (None, None)))
        for (model, trace), fitted in zip(space.pairs, space.forwards(x), strict=True)
    )
    return Fit(
        pairs, space.kinds, scales, objective.loss(specs, scales, every), objective.evaluations, tuple(points)
    )


def fit_targets(
    testbed: Testbed,
    targets: Sequence[Target],
    free: str,
    num_requests: int,
    seed: int,
    kinds: Sequence[IterationKind] = (),
) -> list[Fit]:
    """Fit every (model, trace) the targets name, in the order they first appear; with time scales of
    `kinds` free, every model (all its traces together)."""
    if PER_PAIR[free] == 0 and not kinds:
        raise ValueError("--free none leaves nothing to fit: give --scales KIND... as well")
    sim = PointRunner(testbed)
    pairs = list(dict.fromkeys(t.pair for t in targets))
    groups = (
        [[p for p in pairs if p[0] == m] for m in dict.fromkeys(m for m, _ in pairs)]
        if kinds
        else [[p] for p in pairs]
    )
    fits = []
    for group in groups:
        mine = [t for t in targets if t.pair in group]
        kept = tuple(testbed.progress_spec(*pair) for pair in group)
        model = group[0][0]
        starts = tuple(start_of(spec) for spec in kept)
        space = Space(tuple(group), free, tuple(kinds), starts, kept, testbed.scales(model))
        fits.append(fit_space(Objective(sim, mine, num_requests, seed), space))
    return fits


def fitted_testbed(
    base: Testbed,
    name: str,
    fits: Sequence[Fit],
    targets_file: Path,
    free: str,
    num_requests: int,
    seed: int,
) -> Testbed:
    """`base` with the fitted forwards per block and time scales, recording the fit."""
    digest = hashlib.sha256(targets_file.read_bytes()).hexdigest()
    progress = dict(base.progress)
    time_scales = {model: dict(scales) for model, scales in base.time_scales.items()}
    kinds = list(dict.fromkeys(k.value for fit in fits for k in fit.kinds))
    record: dict[str, Any] = {
        "targets": targets_file.name,
        "targets_sha256": digest,
        "base": f"{base.name} v{base.version}",
        "free": free,
        "num_requests": num_requests,
        "seed": seed,
        "pairs": {},
    }
    if kinds:
        record["time_scales"] = {}
    for fit in fits:
        what = f"{free} free"
        if fit.kinds:
            what += f", time scales of {', '.join(k.value for k in fit.kinds)}"
        source = (
            f"fitted by sangam fit ({what}) to {len(fit.points)} points of {targets_file.name} "
            f"(sha256 {digest[:12]}) on {base.name} v{base.version}, {num_requests} requests per point, "
            f"seed {seed}"
        )
        for pair in fit.pairs:
            entry: dict[str, Any] = {"spec": pair.spec}
            if pair.mean is not None and pair.rho is not None:
                progress[(pair.model, pair.trace)] = ProgressEntry(pair.spec, source)
                entry.update(mean=round(pair.mean, 4), std=round(spread(pair.mean, pair.rho), 4))
            entry.update(
                objective=fit.objective,
                points=[
                    {
                        "point": p.target.label(),
                        "observed": p.target.value,
                        "simulated": p.simulated,
                        "held_out": p.held_out,
                    }
                    for p in fit.points
                    if p.target.pair == (pair.model, pair.trace)
                ],
            )
            record["pairs"][f"{pair.model}/{pair.trace}"] = entry
        if fit.kinds:
            mine = time_scales.setdefault(fit.model, {})
            for kind in fit.kinds:
                mine[kind] = Sourced(round(fit.scales.of(kind), 4), source)
            record["time_scales"][fit.model] = {k.value: round(fit.scales.of(k), 4) for k in fit.kinds}
    fitted = "Forwards per block" if PER_PAIR[free] else ""
    if kinds:
        fitted += (" and t" if fitted else "T") + f"ime scales ({', '.join(kinds)})"
    return dataclasses.replace(
        base, name=name, version=1, progress=progress, time_scales=time_scales, fit=record,
        description=f"{base.description} {fitted} fitted by sangam fit.",
    )  # fmt: skip


def read_blocks(dirs: Sequence[Path]) -> dict[tuple[str, str], list[int]]:
    """Forwards of every block in the runs' blocks.csv, per (model, trace) of their summary.json; a run
    that forced the progress model's schedule (`--unmask schedule`) measured nothing and is refused."""
    found: dict[tuple[str, str], list[int]] = {}
    for directory in dirs:
        summary, blocks = directory / "summary.json", directory / "blocks.csv"
        if not summary.is_file() or not blocks.is_file():
            raise ValueError(f"{directory}: not a run directory (needs summary.json and blocks.csv)")
        config = run_config(directory)  # what served it is named in the testbed (`served_by`)
        model, trace = config.get("model"), config.get("trace")
        if config.get("unmask") != "threshold":
            raise ValueError(
                f"{directory}: its forwards were not measured (unmask {config.get('unmask')!r}): use live "
                "runs with --unmask threshold"
            )
        if trace not in MASK_LEN:
            trace = "sharegpt"  # a trace file's requests are modelled as ShareGPT's (profiles.testbed)
        forwards = []
        try:
            text = blocks.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            raise ValueError(f"{blocks}: not UTF-8 text") from None
        for line, row in enumerate(csv.DictReader(text.splitlines()), start=2):
            if row.get("forwards"):  # a block that never ran has none
                count = row["forwards"]
                if not (count.isascii() and count.isdigit() and 1 <= int(count) <= BLOCK):
                    raise ValueError(
                        f"{blocks}, line {line}: forwards must be in [1, {BLOCK}], got {count!r}"
                    )
                forwards.append(int(count))
        if not forwards:
            raise ValueError(f"{blocks}: no block with a forwards count")
        found.setdefault((str(model), str(trace)), []).extend(forwards)
    return found


def measured_testbed(base: Testbed, name: str, dirs: Sequence[Path]) -> Testbed:
    """`base` with the empirical forwards per block of live runs' blocks."""
    progress = dict(base.progress)
    runs = ", ".join(d.name for d in dirs)
    served = sorted({served_by(d) for d in dirs})
    counts: dict[str, int] = {}
    for (model, trace), forwards in read_blocks(dirs).items():
        source = f"measured: {len(forwards)} blocks of live runs ({runs}; {'; '.join(served)})"
        progress[(model, trace)] = ProgressEntry(counts_spec(forwards), source)
        counts[f"{model}/{trace}"] = len(forwards)
    record = {"blocks": counts, "runs": [d.name for d in dirs], "base": f"{base.name} v{base.version}"}
    return dataclasses.replace(
        base, name=name, version=1, description=f"{base.description} Forwards per block measured live.",
        progress=progress, fit=record,
    )  # fmt: skip


def profiled_testbed(base: Testbed, name: str, directory: Path, data: Path) -> Testbed:
    """`base` (version 1 of `name`) priced by the `sangam profile` data in `directory` (named relative to
    `data`, the shipped profile root, when inside it; else by its absolute path), unscaled, with its KV
    pages: every model measured there, its pages and their dtype as its worker registered them
    (`<model>.meta.json`); ValueError (one line) without data or for another GPU."""
    metas = {m.name.removesuffix(".meta.json"): _profile_meta(m) for m in directory.glob("*.meta.json")}
    measured = {
        model: meta for model, meta in sorted(metas.items()) if (directory / f"{model}.csv").is_file()
    }
    if not measured:
        raise ValueError(f"--profile {directory}: no <model>.csv with its .meta.json (run sangam profile)")
    if base.loop is not None or base.handoff_ms is not None:
        raise ValueError(
            f"--profile: {base.name} carries another executor's worker loop or handoff; "
            f"base a profile of ours on a sangam-* testbed"
        )
    gpus = {str(meta.get("gpu")) for meta in measured.values()}
    if gpus != {base.gpu}:
        raise ValueError(
            f"--profile {directory}: measured on {', '.join(sorted(gpus))}, not {base.name}'s {base.gpu}"
        )
    resolved = directory.resolve()
    where = (
        str(resolved.relative_to(data.resolve()))
        if resolved.is_relative_to(data.resolve())
        else str(resolved)
    )

    def what(meta: Mapping[str, Any]) -> str:
        weights = f"{meta.get('quantization')} weights" if meta.get("quantization") else "bf16 weights"
        return f"{weights}, {meta.get('kv_cache_dtype', 'auto')} KV"

    measured_as = "; ".join(
        f"{model}: {what(meta)}, {meta.get('grid', {}).get('points')} shapes on "
        f"{meta.get('device_name')} {meta.get('date')}"
        for model, meta in measured.items()
    )
    pages = "; ".join(
        f"{model} {meta.get('kv_pages')} pages of {meta.get('kv_cache_dtype', 'auto')} KV"
        for model, meta in measured.items()
    )
    return dataclasses.replace(
        base, name=name, version=1,
        description=f"{base.description} Iteration times and KV pages from the profile in {where}.",
        profile_data=where, profile_models={},
        profile_source=f"sangam profile, measured: {where}/<model>.meta.json ({measured_as})",
        kv_pages=PagesEntry(
            f"the live worker's pages recorded with the profile ({where}/<model>.meta.json kv_pages and "
            f"kv_cache_dtype: {pages})", {},
        ),
        time_scales={}, fit=None,
    )  # fmt: skip


def _profile_meta(path: Path) -> dict[str, Any]:
    """A profile's metadata, with the KV pages its worker held; ValueError (one line, naming it) else."""
    try:
        meta = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, ValueError) as err:
        raise ValueError(f"{path}: not a profile's metadata ({err})") from None
    pages = meta.get("kv_pages") if isinstance(meta, dict) else None
    if isinstance(pages, bool) or not isinstance(pages, int) or pages < 1:
        raise ValueError(f"{path}: kv_pages must be a positive whole number, got {pages!r}")
    return meta


def served_by(directory: Path) -> str:
    """What served a live run: model, weights and threshold, from its summary.json."""
    config = run_config(directory)
    weights, threshold = config.get("weights", "?"), config.get("threshold", "?")
    return f"{served_model(config)}, {weights} weights, threshold {threshold}"
