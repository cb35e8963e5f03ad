"""Testbeds: the shipped files, what a run takes from one, flags that override it, the arrival clip."""

from __future__ import annotations

import csv
import dataclasses
import itertools
import json
import math
import random
import shutil
from pathlib import Path
from typing import Any

import pytest

from cli.main import main
from profiles import testbeds as tb
from profiles.store import DATA
from profiles.testbed import LinkEntry, ProfileEntry, Sourced, parse_testbed
from profiles.testbed import testbed_dict as as_dict
from profiles.testbeds import choose_testbed, known_testbeds, load_testbed, write_testbed
from runs.config import CONTROL_MS, RunConfig
from sangam.batcher import Microbatch
from sangam.cost import LoopCosts
from sangam.progress import DEFAULT_PROGRESS, counts_spec, parse_progress
from sangam.workload import TraceRow, with_arrivals
from sim.options import SimOptions, options_on_testbed
from sim.setup import Resolver
from tests.factories import make_request

SHIPPED = ("sangam-h100", "sangam-h200", "sangam-h200-fp8", "reference-h200", "reference-h100")


def test_every_shipped_testbed_parses_and_names_a_source_for_every_value() -> None:
    assert set(SHIPPED) <= set(known_testbeds())
    for name in known_testbeds():
        testbed = load_testbed(name)
        assert as_dict(parse_testbed(as_dict(testbed), name)) == as_dict(testbed)
        raw = json.loads((DATA / "testbeds" / f"{name}.json").read_text())
        sections = [raw["profile"], raw["kv_pages"], raw["link"], raw["control_ms"], raw["arrival"]]
        assert all(section["source"] for section in [*sections, *raw["progress"].values()])


def test_our_testbeds_hold_the_simulators_documented_defaults() -> None:
    defaults = SimOptions()
    for name in ("sangam-h100", "sangam-h200", "sangam-h200-fp8"):
        testbed = load_testbed(name)
        specs = {key: entry.spec for key, entry in testbed.progress.items()}
        assert specs == {key: f"betabinom:{m:g}:{s:g}" for key, (m, s) in DEFAULT_PROGRESS.items()}
        assert testbed.control_ms.value == CONTROL_MS and testbed.arrival.clip is None
        assert (testbed.link.gb_per_s, testbed.link.latency_ms) == (
            defaults.link_gbps,
            defaults.link_latency_ms,
        )
    assert choose_testbed(None, None).name == "sangam-h100" == f"sangam-{RunConfig().gpu}"
    assert choose_testbed(None, "h200").name == "sangam-h200"


def run_summary(tmp_path: Path, name: str, *args: str) -> dict[str, object]:
    out = tmp_path / name
    base = ["sim", "--mode", "2C", "--qps", "1.5", "-n", "60", "--out", str(out)]
    assert main([*base, *args]) == 0
    summary: dict[str, object] = json.loads((out / "summary.json").read_text())
    return summary


def test_the_default_run_is_the_sangam_h100_testbeds_and_flags_override_a_testbed(tmp_path: Path) -> None:
    plain = run_summary(tmp_path, "plain")
    named = run_summary(tmp_path, "named", "--testbed", "sangam-h100")
    assert plain["testbed"] == named["testbed"] == "sangam-h100"
    assert plain["mean_e2el_ms"] == named["mean_e2el_ms"] and plain["config"] == named["config"]
    h200 = run_summary(tmp_path, "h200", "--gpu", "h200")
    assert h200["testbed"] == "sangam-h200" and h200["config"]["kv_pages"] == 13167  # type: ignore[index]
    over = run_summary(tmp_path, "over", "--testbed", "sangam-h200", "--control-ms", "0", "--pages", "9000")
    assert over["control_ms"] == 0 and over["config"]["kv_pages"] == 9000  # type: ignore[index]
    assert over["mean_e2el_ms"] != h200["mean_e2el_ms"]


def test_a_testbed_that_disagrees_with_gpu_or_is_missing_is_one_line_and_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["sim", "--testbed", "sangam-h200", "--gpu", "h100", "-n", "5"]) == 2
    assert "models the h200, not --gpu h100" in capsys.readouterr().err
    assert main(["sim", "--testbed", "nowhere", "-n", "5"]) == 2
    assert "no testbed 'nowhere' (known: " in capsys.readouterr().err
    bad = tmp_path / "bad.json"
    raw = json.loads((DATA / "testbeds" / "sangam-h100.json").read_text())
    del raw["link"]["source"]
    bad.write_text(json.dumps({**raw, "name": "bad"}))
    assert main(["sim", "--testbed", str(bad), "-n", "5"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "testbed bad.link: 'source' must be a non-empty string" in err


def reference_data(tmp_path: Path) -> Path:
    """A data root whose reference profile is a copy of ours (the fixture until the measured one lands)."""
    root = tmp_path / "data"
    shutil.copytree(DATA / "h200", root / "h200-reference")
    return root


def test_the_reference_testbeds_take_its_pages_its_clipped_arrivals_and_a_derived_h100(
    tmp_path: Path,
) -> None:
    data = reference_data(tmp_path)
    h100 = load_testbed("reference-h100")
    cost, name, profile = tb.unscaled_cost_model(h100, "llada-8b", data=data)
    loop = f", {h100.loop_costs().label()}"  # its worker loop, beyond the profile (calib/reference_loop.py)
    _, name = tb.looped_cost_model(h100, cost, name)
    assert (
        profile is not None
        and profile.derived_from == "h200"
        and name == "h200-reference profile, derived from h200" + loop
    )
    ours, _, _ = Resolver(load_testbed("sangam-h100")).priced("llada-8b")
    assert profile.coefficients == ours.coefficients  # type: ignore[attr-defined]  # same data, same derivation
    cfg = tb.testbed_config(h100, RunConfig(mode="1C"), profile, {})
    assert (cfg.gpu, cfg.pages, cfg.arrival_clip) == ("h100", 5632, 3.0)
    given = tb.testbed_config(h100, RunConfig(mode="1C"), profile, {"pages": 100, "arrival_cv": 2.0})
    assert (given.pages, given.arrival_clip) == (100, None)
    options = options_on_testbed(h100, {"link": "cpu-gloo", "control_ms": None})
    assert options.link == "cpu-gloo" and options.control_ms == h100.control_ms.value
    other = dataclasses.replace(
        h100, link=LinkEntry("a test", profile="cpu-gloo"), control_ms=Sourced(7.0, "a test")
    )
    assert (options_on_testbed(other, {}).link, options_on_testbed(other, {}).control_ms) == ("cpu-gloo", 7.0)
    given_link = options_on_testbed(other, {"link_gbps": 5.0})
    assert (given_link.link, given_link.link_gbps, given_link.link_latency_ms) == (None, 5.0, 1.0)
    with pytest.raises(ValueError, match="are missing"):
        tb.unscaled_cost_model(h100, "llada-8b", data=tmp_path / "empty")
    elsewhere = dataclasses.replace(h100, profile_data=str(tmp_path / "mine"))  # as fit --profile writes it
    with pytest.raises(ValueError, match=f"its profiles \\({tmp_path}/mine\\) are missing"):  # not data//abs
        tb.unscaled_cost_model(elsewhere, "llada-8b")


def test_a_written_testbed_reads_back(tmp_path: Path) -> None:
    testbed = dataclasses.replace(load_testbed("reference-h100"), name="copy", fit={"points": 3})
    path = tmp_path / "copy.json"
    write_testbed(testbed, path)
    assert load_testbed(str(path)) == testbed


def gaps_of(times: list[float | None]) -> list[float]:
    known = [0.0, *(t for t in times if t is not None)]
    return [b - a for a, b in itertools.pairwise(known)]


def test_clipped_exponential_gaps_are_the_reference_harnesss() -> None:
    rows = [TraceRow(10, 10)] * 20_000
    qps = 2.0
    clipped = with_arrivals(rows, qps, random.Random(4), clip=3.0)
    plain = with_arrivals(rows, qps, random.Random(4))
    gaps = gaps_of([r.arrival_time for r in clipped])
    raw = gaps_of([r.arrival_time for r in plain])
    assert all(g == pytest.approx(min(r, 3.0 / qps)) for g, r in zip(gaps, raw, strict=True))
    assert sum(gaps) / len(gaps) == pytest.approx((1 - math.exp(-3)) / qps, rel=0.02)
    with pytest.raises(ValueError, match="Poisson gaps only"):
        with_arrivals(rows, qps, random.Random(4), cv=2.0, clip=3.0)


def test_counts_spec_round_trips_observed_forwards() -> None:
    samples = [3, 3, 5, 32, 1]
    model = parse_progress(counts_spec(samples))
    assert counts_spec(samples) == "counts:1=1,3=2,5=1,32=1"
    assert model.mean == pytest.approx(sum(samples) / len(samples))
    with pytest.raises(ValueError, match="bad progress model"):
        parse_progress("counts:3")


def test_the_reference_testbeds_price_both_models_with_its_measured_profiles() -> None:
    h100, h200 = Resolver(load_testbed("reference-h100")), Resolver(load_testbed("reference-h200"))
    for model in ("llada-8b", "dream-7b"):
        _, name, profile = tb.unscaled_cost_model(h100.testbed, model)
        assert profile is not None and name == "h200-reference profile, derived from h200"
        assert profile.model == model and profile.meta["peer"] == "UT-InfraAI/sangam"
        _, measured_name, measured = tb.unscaled_cost_model(h200.testbed, model)
        assert measured is not None and measured_name == "h200-reference profile, measured"
        assert measured.meta["peer"] == "UT-InfraAI/sangam"
    # reference-h200 prices Dream with the reference's own times, not ours: one decode at context 1819
    # took the reference 8.58 ms and us 6.18 ms on the H200 (profiles/data/h200-reference/dream-7b.csv)
    decode = Microbatch((make_request(1, 1819),), (), 0, 0, 0, 0)
    ours, _, _ = Resolver(load_testbed("sangam-h200")).priced("dream-7b")
    theirs, _, _ = tb.unscaled_cost_model(h200.testbed, "dream-7b")  # its profile, without its loop
    assert theirs.seconds(decode) == pytest.approx(8.58e-3, rel=0.1)
    assert ours.seconds(decode) == pytest.approx(6.18e-3, rel=0.1)
    stand_in = dataclasses.replace(h100.testbed, profile_models={"dream-7b": ProfileEntry("h200", "a test")})
    _, dream_name, dream = tb.unscaled_cost_model(stand_in, "dream-7b")
    assert dream is not None and dream_name == "derived from h200" and dream.model == "dream-7b"
    assert load_testbed("reference-h100").profile_models == {}
    raw = as_dict(stand_in)
    assert raw["profile"]["models"] == {"dream-7b": {"data": "h200", "source": "a test"}}
    assert parse_testbed(raw, "reference-h100") == stand_in


def test_time_scale_multiplies_every_iteration(tmp_path: Path) -> None:
    def summary(name: str, *args: str) -> dict[str, object]:
        assert (
            main(["sim", "--mode", "1C", "--qps", "0.01", "-n", "3", "--out", str(tmp_path / name), *args])
            == 0
        )
        result: dict[str, object] = json.loads((tmp_path / name / "summary.json").read_text())
        return result

    plain, slow = summary("one"), summary("two", "--time-scale", "2")
    assert slow["cost_model"] == "derived from h200, times 2"
    for part in ("mean_decode_ms", "mean_prefill_ms"):  # requests alone on a worker: nothing else moves
        assert slow[part] == pytest.approx(2 * plain[part])  # type: ignore[operator]


def test_a_testbeds_time_scales_multiply_each_kind_of_iteration(tmp_path: Path) -> None:
    raw = as_dict(load_testbed("sangam-h100"))
    raw["name"] = "slow-decodes"
    raw["time_scales"] = {"llada-8b": {"decode": {"value": 3.0, "source": "a test"}}}
    path = tmp_path / "slow-decodes.json"
    path.write_text(json.dumps(raw))
    assert load_testbed(str(path)).scales("llada-8b").decode == 3.0

    def summary(name: str, *args: str) -> dict[str, float]:
        out = tmp_path / name
        assert main(["sim", "--mode", "1C", "--qps", "0.01", "-n", "3", "--out", str(out), *args]) == 0
        result: dict[str, float] = json.loads((out / "summary.json").read_text())
        return result

    plain, slow = summary("plain"), summary("slow", "--testbed", str(path))
    assert slow["cost_model"] == "derived from h200, times 1 prefill, 3 decode, 1 mixed"
    assert slow["mean_decode_ms"] == pytest.approx(3 * plain["mean_decode_ms"])  # requests alone: only
    assert slow["mean_prefill_ms"] == pytest.approx(plain["mean_prefill_ms"])  # their decodes slow down
    both = summary("both", "--testbed", str(path), "--time-scale", "2")
    assert both["cost_model"] == "derived from h200, times 2 prefill, 6 decode, 2 mixed"
    assert both["mean_decode_ms"] == pytest.approx(6 * plain["mean_decode_ms"])
    assert summary("analytic", "--testbed", str(path), "--cost", "analytic")["cost_model"] == "analytic"
    raw["time_scales"] = {"llada-8b": {"attention": {"value": 2.0, "source": "a test"}}}
    with pytest.raises(ValueError, match="'attention' is not an iteration kind"):
        parse_testbed(raw, "slow-decodes")
    raw["time_scales"] = {"llada-8b": {"decode": {"value": 0, "source": "a test"}}}
    with pytest.raises(ValueError, match="must be positive"):
        parse_testbed(raw, "slow-decodes")


def test_a_testbeds_loop_prices_every_iteration_and_its_handoff_every_transfer(tmp_path: Path) -> None:
    raw = as_dict(load_testbed("sangam-h100"))
    raw["name"] = "looped"
    raw["loop"] = {
        "report_ms": {"value": 2.0, "source": "a test"},
        "report_token_ns": {"value": 100.0, "source": "a test"},
        "other_ms": {"value": 30.0, "source": "a test"},
        "other_item_ms": {"value": 0.5, "source": "a test"},
    }
    raw["handoff_ms"] = {"value": 40.0, "source": "a test"}
    path = tmp_path / "looped.json"
    path.write_text(json.dumps(raw))
    looped = load_testbed(str(path))
    assert looped.loop_costs() == LoopCosts(0.032, item_s=0.0005, token_s=1e-7) and looped.handoff_s == 0.04
    for cap, error in (
        (3.0, None), (0.0, "whole number of items, at least 1"), (2.5, "whole number"),
        (math.inf, "a number of at most 1e"), (math.nan, "a number of at most 1e"),
    ):  # fmt: skip
        raw["loop"]["other_items_cap"] = {"value": cap, "source": "a test"}
        if error is None:
            assert parse_testbed(raw, "looped").loop_costs().items_cap == 3
            assert as_dict(parse_testbed(raw, "looped"))["loop"]["other_items_cap"]["value"] == 3.0
        else:
            with pytest.raises(ValueError, match=error):
                parse_testbed(raw, "looped")
    del raw["loop"]["other_items_cap"]
    for key, value, error in (
        (
            "control_ms",
            {"value": 1e308, "source": "a test"},
            "must be a number of at most 1e\\+09, got 1e\\+308",
        ),
        (
            "time_scale",
            {},
            "unknown key 'time_scale' \\(known: format, name,",
        ),  # a typo once dropped the scales
    ):  # 1e308 ms once overflowed as a time
        with pytest.raises(ValueError, match=error):
            parse_testbed({**raw, key: value}, "looped")
    assert load_testbed("sangam-h100").loop_costs().none and load_testbed("sangam-h100").handoff_s == 0.0

    def run(name: str, *args: str) -> tuple[dict[str, Any], dict[int, dict[str, float]]]:
        out = tmp_path / name
        assert main(["sim", "--mode", "1P1D", "--qps", "0.01", "-n", "3", "--out", str(out), *args]) == 0
        with (out / "requests.csv").open() as f:
            requests = {int(r["request_id"]): {k: float(v) for k, v in r.items()} for r in csv.DictReader(f)}
        return json.loads((out / "summary.json").read_text()), requests

    (plain, base), (summary, got) = run("plain"), run("looped", "--testbed", str(path))
    assert summary["cost_model"].endswith(
        "plus a loop of 32 ms + 0.5 ms per item + 100 ns per token per iteration"
    )
    assert summary["kv_link"]["handoff_s"] == 0.04 and plain["kv_link"]["handoff_s"] == 0.0
    for rid, req in got.items():  # alone on the cluster: every block pays exactly its terms
        blocks, seq = req["n_blocks"], req["seq_len"]  # a block done by its prefill moves no KV:
        assert req["transfer"] - base[rid]["transfer"] == pytest.approx(0.040 * req["kv_transfers"])
        # every iteration of one item: 32 ms, 0.5 ms for its one item, 100 ns per token of its sequence
        per_iteration = 0.032 + 0.0005 + 1e-7 * seq
        assert req["prefill"] - base[rid]["prefill"] == pytest.approx(blocks * per_iteration)
        decodes = req["forwards"] - blocks  # every forward but a block's prefill is a decode iteration
        assert req["decode"] - base[rid]["decode"] == pytest.approx(decodes * per_iteration)
    _, flagged = run("flagged", "--testbed", str(path), "--handoff-ms", "0")
    assert all(flagged[rid]["transfer"] == pytest.approx(base[rid]["transfer"]) for rid in base)
    raw["loop"] = {"report_ms": raw["loop"]["report_ms"]}
    with pytest.raises(ValueError, match="exactly report_ms, report_token_ns, other_ms, other_item_ms"):
        parse_testbed(raw, "looped")
    raw["loop"], raw["handoff_ms"] = None, {"value": -1.0, "source": "a test"}
    with pytest.raises(ValueError, match="handoff_ms: must not be negative"):
        parse_testbed(raw, "looped")


def test_every_path_to_a_testbeds_cost_model_adds_its_loop() -> None:
    from sim.setup import Resolver

    h100 = load_testbed("reference-h100")
    loop = h100.loop_costs()
    scales = h100.scales("llada-8b")
    assert not loop.none and loop.item_s > 0 and not scales.identity
    mb = Microbatch((make_request(1, 1819), make_request(2, 1500)), (make_request(3, 900),), 0, 0, 0, 0)
    profile, _, _ = tb.unscaled_cost_model(h100, "llada-8b")
    # the GPU call scaled as a mixed iteration; the loop, unscaled, per iteration, per item and per token
    loop_s = loop.iteration_s + 3 * loop.item_s + loop.token_s * (1819 + 1500 + 900)
    want = profile.seconds(mb) * scales.mixed + loop_s
    sweep, name, _ = Resolver(h100).priced("llada-8b")  # sweep, reproduce, validate, the explorer
    run = Resolver(h100).resolve(RunConfig(mode="1C", gpu="h100"))  # sangam sim, fit
    assert sweep.seconds(mb) == pytest.approx(want) and run.cost.seconds(mb) == pytest.approx(want)
    assert name == run.cost_name and name.endswith(loop.label())


def test_a_run_is_resolved_on_its_testbed_once_with_explicit_flags_winning(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from sim import setup as sim_setup

    loads: list[str] = []
    unscaled = sim_setup.unscaled_cost_model

    def counted(testbed: Any, model: str, cost: str = "profile") -> Any:
        loads.append(model)
        return unscaled(testbed, model, cost)

    monkeypatch.setattr(sim_setup, "unscaled_cost_model", counted)
    h100 = load_testbed("reference-h100")
    resolver = sim_setup.Resolver(h100, {"control_ms": 9.0})
    first = resolver.resolve(RunConfig(mode="1C"))
    assert (first.config.gpu, first.options.control_ms, first.options.testbed) == ("h100", 9.0, h100.name)
    assert first.config.pages == h100.pages("llada-8b") and first.progress == h100.progress_spec(
        "llada-8b", "sharegpt"
    )
    assert f", {h100.scales('llada-8b').label()}, " in first.cost_name  # its scales, then its loop
    given = resolver.resolve(RunConfig(mode="1C", pages=100), {"pages": 100}, progress="fixed:3")
    assert (given.config.pages, given.progress) == (100, "fixed:3")
    assert loads == ["llada-8b"]  # the profile is read once per model
