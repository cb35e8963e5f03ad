"""Measured profiles: shapes, the fitted model, derived GPUs, the on-disk store."""

from __future__ import annotations

import csv
import dataclasses
import json
import random
from pathlib import Path

import pytest
from factories import rounded

from profiles.fit import Sample, fit, fit_graphs
from profiles.measured import Coefficients, Features, GraphTimes, predict, shape_seconds
from profiles.shapes import Shape
from profiles.store import load_profile, paths
from sangam.batcher import Microbatch

BUCKETS = (1, 2, 4, 8, 16, 32, 64)
TRUE = Coefficients(
    overhead=2e-3,
    graph=-1e-3,
    per_item=4e-5,
    per_graph_item=-1e-5,
    per_mixed_decode=6e-4,
    per_mixed=2e-3,
    per_token=2e-5,
    per_square=1e-9,
    per_context=1.7e-7,
    knee=256.0,
)

LINES = GraphTimes(buckets=(1, 4, 8), fixed=(5e-3, 6e-3, 7e-3), per_longest=(2e-7, 5e-7, 1.6e-6))


def grid(rng: random.Random) -> list[Shape]:
    shapes = [Shape((s,), ()) for s in (256, 512, 1024, 2048, 4096, 8192)]
    shapes += [Shape((s, s // 3), ()) for s in (512, 1536, 3000)]
    shapes += [Shape((), (c,) * b) for b in (1, 2, 3, 4, 8, 16, 24, 32, 64) for c in (256, 1024, 1819, 4096)]
    shapes += [Shape((), tuple(rng.choice([300, 5000]) for _ in range(b))) for b in (4, 16, 48)]
    shapes += [Shape((s,), (1819,) * b) for s in (1024, 4096) for b in (1, 8, 32)]
    return shapes


def samples(noise: float, seed: int = 0, true: Coefficients = TRUE) -> list[Sample]:
    rng = random.Random(seed)
    out = []
    for shape in grid(rng):
        f = Features.of(shape, buckets=BUCKETS)
        out.append(Sample(f, predict(true, f) * rng.gauss(1.0, noise)))
    return out


def test_shape_items_round_trip() -> None:
    shape = Shape((1819, 900), (1819, 2000))
    assert Shape.parse(shape.format()) == shape
    assert shape.format() == "p:1819:1819;p:900:900;d:32:1819;d:32:2000"
    assert Shape((), (5,) * 3).graph_bucket(BUCKETS) == 4 and Shape((1,), (5,)).graph_bucket(BUCKETS) == 0
    assert Shape((), (5,) * 5).graph_bucket((1, 2, 4)) == 0
    with pytest.raises(ValueError, match="bad iteration item"):
        Shape.parse("x:1:1")


def test_features_count_graph_padding() -> None:
    f = Features.of(Shape((), (1000,) * 3), buckets=BUCKETS)
    assert f.tokens == 4 * 32 and f.graph == 1.0 and f.context == 3000 and f.mixed_decodes == 0
    mixed = Features.of(Shape((512,), (1000,) * 3), buckets=BUCKETS)
    assert (
        mixed.mixed_decodes == 3 and mixed.graph == 0.0 and mixed.tokens == 512 + 3 * 32 and mixed.mixed == 1
    )
    assert Features.of(Shape((512,), ()), buckets=BUCKETS).mixed == 0 and f.mixed == 0
    assert Features.of(Shape((), (1000,) * 3), buckets=()).tokens == 3 * 32


def test_fit_recovers_the_generating_model() -> None:
    report = fit(samples(noise=0.0))
    assert report.heldout_mape < 0.5 and report.coefficients.knee == pytest.approx(TRUE.knee, rel=0.2)
    noisy = fit(samples(noise=0.02))
    assert noisy.heldout_mape < 4.0


@pytest.mark.parametrize("seed", range(6))
def test_per_mixed_joins_the_model_only_where_it_beats_its_base_by_a_standard_error(seed: int) -> None:
    exact = fit(samples(noise=0.0, seed=seed))
    assert exact.coefficients.per_mixed == pytest.approx(TRUE.per_mixed, rel=0.01)
    assert fit(samples(noise=0.005, seed=seed)).candidate.endswith("-mixed")
    without = fit(samples(noise=0.005, seed=seed, true=dataclasses.replace(TRUE, per_mixed=0.0)))
    assert not without.candidate.endswith("-mixed")


def test_fit_needs_enough_points() -> None:
    with pytest.raises(ValueError, match="at least"):
        fit(samples(0.0)[:40])


def test_derived_profile_scales_only_bandwidth_terms() -> None:
    slower = TRUE.derived(4.8 / 3.35)
    assert slower.per_token == TRUE.per_token and slower.per_square == TRUE.per_square
    assert slower.per_context == pytest.approx(TRUE.per_context * 4.8 / 3.35)
    decode = Features.of(Shape((), (1819,)), buckets=BUCKETS)
    prefill = Features.of(Shape((8192,), ()), buckets=BUCKETS)
    assert predict(slower, decode) > 1.2 * predict(TRUE, decode)
    assert predict(slower, prefill) == pytest.approx(predict(TRUE, prefill), rel=0.01)


def write_profile(root: Path, model: str, gpu: str) -> None:
    data, meta, _ = paths(model, gpu, root)
    data.parent.mkdir(parents=True)
    with data.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["items", "seconds"])
        for s in samples(noise=0.01):
            writer.writerow([shape_of(s).format(), s.seconds])
    meta.write_text(json.dumps({"gpu": gpu, "model": model, "graph_buckets": BUCKETS, "kv_pages": 1234}))


def shape_of(sample: Sample) -> Shape:
    for shape in grid(random.Random(0)):
        if Features.of(shape, buckets=BUCKETS) == sample.features:
            return shape
    raise AssertionError("sample not on the grid")


def test_store_fits_once_and_derives_h100(tmp_path: Path) -> None:
    write_profile(tmp_path, "llada-8b", "h200")
    measured = load_profile("llada-8b", "h200", tmp_path)
    assert measured is not None and measured.kv_pages == 1234 and measured.derived_from is None
    cache = paths("llada-8b", "h200", tmp_path)[2]
    assert json.loads(cache.read_text())["heldout_mape"] < 5
    assert load_profile("llada-8b", "h200", tmp_path) == measured  # from the cache
    derived = load_profile("llada-8b", "h100", tmp_path)
    assert derived is not None and derived.derived_from == "h200" and derived.meta["derived"]
    assert derived.kv_pages is None
    # the buckets' lines are the measuring GPU's own: a derived profile prices with the shared model
    assert measured.graphs is not None and derived.graphs is None
    assert load_profile("dream-7b", "h100", tmp_path) is None


def test_the_fit_cache_is_stale_when_the_buckets_or_the_terms_change(tmp_path: Path) -> None:
    write_profile(tmp_path, "llada-8b", "h200")
    _, meta, cache = paths("llada-8b", "h200", tmp_path)
    load_profile("llada-8b", "h200", tmp_path)
    assert json.loads(cache.read_text())["graph_buckets"] == list(BUCKETS)
    meta.write_text(json.dumps({**json.loads(meta.read_text()), "graph_buckets": [1, 2]}))
    load_profile("llada-8b", "h200", tmp_path)
    assert json.loads(cache.read_text())["graph_buckets"] == [1, 2]  # refitted with the new buckets
    old = json.loads(cache.read_text())
    del old["coefficients"]["per_mixed_decode"]  # a cache from before a term was added
    cache.write_text(json.dumps(old))
    assert load_profile("llada-8b", "h200", tmp_path) is not None
    assert "per_mixed_decode" in json.loads(cache.read_text())["coefficients"]
    old = json.loads(cache.read_text())
    del old["graph_times"]  # a cache from before the buckets' lines
    cache.write_text(json.dumps(old))
    assert load_profile("llada-8b", "h200", tmp_path).graphs is not None  # type: ignore[union-attr]
    assert json.loads(cache.read_text())["graph_times"]["buckets"] == [1, 2]  # the buckets set above
    cache.write_text("{not json")
    assert load_profile("llada-8b", "h200", tmp_path) is not None


def microbatch(prefills: tuple[int, ...], decodes: tuple[int, ...]) -> Microbatch:
    from factories import make_request

    reqs = [make_request(i, s) for i, s in enumerate((*prefills, *decodes))]
    return Microbatch(tuple(reqs[len(prefills) :]), tuple(reqs[: len(prefills)]), 0, 0, 0, 0)


@pytest.mark.parametrize("graphs", [None, LINES])
@pytest.mark.parametrize("buckets", [BUCKETS, (1, 2, 4), ()])
def test_cost_model_equals_the_fitted_formula(buckets: tuple[int, ...], graphs: GraphTimes | None) -> None:
    from profiles.measured import MeasuredCostModel

    model = MeasuredCostModel(TRUE, buckets, graphs)
    shapes = [
        ((), (900,) * 3),
        ((2000,), (1819,) * 5),
        ((512, 4096), ()),
        ((), (100,) * 70),
        ((), (300, 4000)),
    ]
    shapes += [((), (4000, 300, 1000, 2000, 300)), ((), (700,)), ((), (50,) * 16)]
    for prefills, decodes in shapes:
        expected = shape_seconds(TRUE, graphs, Shape(prefills, decodes), buckets)
        assert model.seconds(microbatch(prefills, decodes)) == pytest.approx(expected, rel=1e-12)
        if graphs is None:
            assert expected == predict(TRUE, Features.of(Shape(prefills, decodes), buckets))


def test_a_replay_costs_its_buckets_line_at_its_longest_context() -> None:
    """5 decodes replay the 8-item graph: as dear as 8 decodes of their longest context, whatever the
    others; a bucket without a line (2, 16 here) and eager microbatches take the shared model."""
    from profiles.measured import MeasuredCostModel

    model = MeasuredCostModel(TRUE, BUCKETS, LINES)
    unequal = model.seconds(microbatch((), (4000, 300, 1000, 2000, 300)))
    assert unequal == model.seconds(microbatch((), (4000,) * 8)) == pytest.approx(7e-3 + 1.6e-6 * 4000)
    for prefills, decodes in [((), (900, 1000)), ((), (900,) * 12), ((512,), (900,) * 3)]:
        expected = predict(TRUE, Features.of(Shape(prefills, decodes), BUCKETS))
        assert model.seconds(microbatch(prefills, decodes)) == pytest.approx(expected, rel=1e-12)


def replays(rng: random.Random, noise: float) -> list[tuple[Shape, float]]:
    """Replays of LINES' buckets (1-8 items, equal and unequal contexts), priced by LINES with noise, and
    of bucket 2 with too few points for a line, and some eager iterations."""
    out = []
    for items in (1, 3, 4, 5, 6, 8):
        for longest in (256, 1024, 1819, 4096):
            decodes = (longest, *(rng.randint(100, longest) for _ in range(items - 1)))
            out.append((Shape((), decodes), shape_seconds(TRUE, LINES, Shape((), decodes), BUCKETS)))
    out += [(Shape((), (500, 500)), 9e-3), (Shape((), (900, 100)), 9e-3), (Shape((1024,), (900,)), 2e-2)]
    return [(shape, seconds * rng.gauss(1.0, noise)) for shape, seconds in out]


def test_fit_graphs_recovers_each_buckets_line() -> None:
    report = fit_graphs(replays(random.Random(0), noise=0.0), BUCKETS)
    assert report is not None and report.graphs.buckets == LINES.buckets  # bucket 2: two points, no line
    assert report.graphs.fixed == pytest.approx(LINES.fixed, rel=1e-9)
    assert report.graphs.per_longest == pytest.approx(LINES.per_longest, rel=1e-9)
    assert report.points == 24 and report.heldout_mape < 1e-6
    two_contexts = [(Shape((), (c,)), t) for c, t in [(100, 1e-2), (200, 1.5e-2), (200, 2e-2)]]
    assert fit_graphs(two_contexts, BUCKETS) is None  # leaving out the point at 100 would leave no line
    assert fit_graphs([(Shape((1024,), ()), 1e-2)] * 10, BUCKETS) is None  # no replays at all


def test_fit_graphs_heldout_error_is_each_replay_left_out() -> None:
    from profiles.fit import _line

    points = [
        (max(s.decodes), t) for s, t in replays(random.Random(1), noise=0.05) if s.graph_bucket(BUCKETS) == 8
    ]
    _, _, heldout = _line(points)
    for i, (longest, seconds) in enumerate(points):
        fixed, slope, _ = _line(points[:i] + points[i + 1 :])
        assert heldout[i] == pytest.approx(100 * abs(fixed + slope * longest - seconds) / seconds, rel=1e-6)
    falling = [(256, 9e-3), (1024, 8e-3), (4096, 7e-3)]  # never cheaper with a longer context: a constant
    fixed, slope, _ = _line(falling)
    assert slope == 0.0 and 7e-3 < fixed < 9e-3


def test_the_shipped_profiles_load_from_their_caches_without_numpy() -> None:
    """`sangam sim` runs on the core dependencies alone: every shipped fit cache is fresh, so no load
    refits (the fit needs numpy) or writes into the installed package."""
    import subprocess
    import sys

    code = (
        "import sys; sys.modules['numpy'] = None\n"  # any import of numpy now fails
        "from profiles.store import DATA, load_profile_dir\n"
        "for meta in sorted(DATA.glob('*/*.meta.json')):\n"
        "    model, directory = meta.name.split('.')[0], meta.parent.name\n"
        "    gpu = __import__('json').loads(meta.read_text()).get('gpu', directory)\n"
        "    assert load_profile_dir(model, directory, gpu) is not None, meta\n"
        "    print(directory, model)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert len(out.stdout.split("\n")) > 4  # several profiles were loaded


def test_every_shipped_fit_holds_the_lines_its_data_gives() -> None:
    """The cached lines are what `fit_graphs` makes of the shipped data now (a cache is refitted only when
    its data, buckets or terms change, so a changed line fit would otherwise go unnoticed)."""
    from profiles.store import DATA, read_samples

    caches = sorted(DATA.glob("*/*.fit.json"))
    assert len(caches) >= 6
    for cache in caches:
        report = json.loads(cache.read_text())
        data = cache.with_name(cache.name.replace(".fit.json", ".csv"))
        lines = fit_graphs(read_samples(data), report["graph_buckets"])
        # to 9 digits: a cache fitted on the GPU machine differs from this machine's fit in its last bits
        assert rounded(lines.as_dict() if lines else None, 9) == rounded(report["graph_times"], 9), cache
