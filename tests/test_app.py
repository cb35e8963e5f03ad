"""The explorer driven through Streamlit's AppTest: widgets set, comparisons run, charts drawn, and bad
input answered with a message in the page, never an exception."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from streamlit.testing.v1 import AppTest
from test_app_logic import sim_results_dir

ENTRY = Path(__file__).parents[1] / "app" / "streamlit_app.py"
LIVE_PAGE = """
if __name__ == "__main__":  # the simulator's spawned workers re-import this script
    from app.live_compare import main

    main()
"""
SMALL = {"layouts": "colocated, 3P5C", "qps_min": 6.0, "qps_max": 9.0, "qps_count": 2, "num_requests": 40}


def explorer() -> AppTest:
    at = AppTest.from_file(str(ENTRY), default_timeout=90)
    at.run()
    assert not at.exception
    return at


def submit(at: AppTest, **values: Any) -> AppTest:
    """Set sidebar widgets by key and press 'Run comparison'."""
    for key, value in values.items():
        kind = {str: "text_input"}.get(type(value), "number_input")
        if key in ("trace", "model", "gpu"):
            kind = "selectbox"
        getattr(at, kind)(key=key).set_value(value)
    at.button[0].click().run()
    return at


def charts(at: AppTest) -> int:
    return len(at.get("plotly_chart"))


def test_a_comparison_draws_every_chart_with_its_csv() -> None:
    at = submit(explorer(), **SMALL)
    assert not at.exception and not at.error
    assert charts(at) == 8  # latency, best layout, 3 CDFs, breakdown, queue and KV over time
    downloads = [b.proto.label for b in at.get("download_button")]
    assert len(downloads) == 9 and all(label.endswith(".csv") for label in downloads)
    assert [m.label for m in at.metric] == ["8C knee", "3P5C knee"]
    assert "40 requests per point" in at.markdown[0].value

    at.number_input(key="slo").set_value(0.01).run()  # nothing meets it: still drawn, knees say so
    assert not at.exception and not at.error and charts(at) == 8
    assert {m.value for m in at.metric} == {"none"}

    at.selectbox[-1].set_value("3P5C").run()  # the layout shown over time
    assert not at.exception and charts(at) == 8


def test_several_seeds_are_averaged() -> None:
    at = submit(explorer(), **{**SMALL, "qps_count": 1, "seeds": "0, 1"})
    assert not at.exception and not at.error
    table = at.dataframe[0].value
    assert list(table["seeds"]) == [2, 2]


def test_the_mask_buffer_field_shows_what_runs_use() -> None:
    at = explorer()
    assert at.number_input(key="mask_len_sharegpt").value == 1024
    at.selectbox(key="trace").set_value("arxiv").run()
    assert at.number_input(key="mask_len_arxiv").value == 512
    submit(at, **SMALL)
    assert not at.exception and not at.error and "mask buffer 512" in at.markdown[0].value
    submit(at, mask_len_arxiv=2048)  # the user's own value
    assert not at.exception and not at.error and "mask buffer 2048" in at.markdown[0].value
    at.selectbox(key="trace").set_value("upload").run()
    assert at.number_input(key="mask_len_upload").value == 1024  # a trace file's default


def test_each_gpu_profile_is_labelled_by_its_provenance() -> None:
    at = explorer()
    assert at.selectbox(key="gpu").options == ["h200 profile, measured", "h100 profile, derived from h200"]
    assert at.selectbox(key="cost").options[0] == "h100 profile, derived from h200"  # the default GPU
    at.selectbox(key="gpu").set_value("h200").run()
    assert at.selectbox(key="cost").options[0] == "h200 profile, measured"
    submit(at, gpu="h100", **SMALL)
    assert not at.exception and not at.error
    assert "iteration times derived from h200" in at.markdown[0].value


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"qps_min": 9.0, "qps_max": 4.0}, "the QPS range is empty: min 9 is above max 4"),
        ({"qps_count": 0}, "the QPS range needs at least one point"),
        ({"qps_min": 0.0}, "the lowest QPS must be positive"),
        ({"gpus": 0}, "the GPU count must be at least 1"),
        ({"gpus": 6}, "layout 5P3D uses 8 GPUs but the GPU count is 6"),
        ({"layouts": "colocated, 4P2D"}, "layout 4P2D uses 6 GPUs but the GPU count is 8"),
        ({"layouts": "colocated, 5X3"}, "bad mode '5X3'"),
        ({"layouts": ""}, "choose at least one layout"),
        ({"seeds": "zero"}, "seeds must be whole numbers"),
        ({"progress": "betabinom:40:1"}, "bad progress model"),
        ({"mask_len_sharegpt": 100}, "mask length must be a positive multiple of 32"),
        ({"trace": "upload"}, "upload a trace file"),
    ],
)
def test_bad_input_is_a_message_in_the_page(values: dict[str, Any], message: str) -> None:
    at = submit(explorer(), **values)
    assert not at.exception
    assert len(at.error) == 1 and message in at.error[0].value
    assert charts(at) == 0


def test_a_malformed_uploaded_trace_names_the_file_and_line() -> None:
    at = explorer()
    at.file_uploader(key="upload").upload("mine.csv", b"prompt_len,output_len\n100,50\n100,-3\n", "text/csv")
    submit(at, trace="upload")
    assert not at.exception and charts(at) == 0
    assert "mine.csv line 3: output_len must be a positive integer" in at.error[0].value


@pytest.mark.parametrize(("cv", "arrivals"), [(0.0, "Poisson arrivals"), (3.0, "gamma arrivals (CV 3)")])
def test_an_uploaded_trace_is_swept_over_the_qps_range(cv: float, arrivals: str) -> None:
    rows = "".join(f"{0.1 * i},{200 + i},{40 + i}\n" for i in range(30))
    at = explorer()
    at.file_uploader(key="upload").upload("timed.csv", f"arrival_time,prompt_len,output_len\n{rows}".encode())
    submit(at, trace="upload", arrival_cv=cv, **SMALL)
    assert not at.exception and not at.error and charts(at) == 8
    assert "timed.csv (30 rows), 30 requests per point" in at.markdown[0].value
    assert f"arrival times are replaced by {arrivals} at each QPS" in at.info[0].value


def live_page() -> AppTest:
    at = AppTest.from_string(LIVE_PAGE, default_timeout=90)
    at.run()
    assert not at.exception
    return at


def test_live_results_sit_next_to_the_simulated_run(tmp_path: Path) -> None:
    folder = sim_results_dir(tmp_path)  # `sangam sim --out` writes what `sangam live --out` writes
    at = live_page()
    uploader = at.file_uploader(key="live_files")
    for name in ("summary.json", "requests.csv", "blocks.csv"):
        uploader.upload(name, (folder / name).read_bytes())
    at.button[0].click().run()
    assert not at.exception and not at.error
    assert charts(at) == 2  # overlaid e2e CDFs, breakdown side by side
    assert [m.delta for m in at.metric] == ["+0.0%"] * 3  # the sim replays exactly the same run
    table = at.dataframe[0].value
    assert table["sim_vs_live_pct"].abs().max() == pytest.approx(0.0, abs=1e-9)


def test_a_live_results_directory_by_path(tmp_path: Path) -> None:
    folder = sim_results_dir(tmp_path)
    (folder / "blocks.csv").unlink()
    at = live_page()
    at.text_input(key="live_dir").set_value(str(folder))
    at.button[0].click().run()
    assert not at.exception and not at.error and charts(at) == 2
    assert "forwards per block drawn by the progress model" in at.markdown[0].value


def test_a_cpu_run_of_a_tiny_model_is_not_compared_with_a_gpus_simulation(tmp_path: Path) -> None:
    """The issue's case: a CPU tiny-model live run got a +62% against llada-8b on an H100."""
    from test_app_logic import as_live

    folder = as_live(sim_results_dir(tmp_path), devices=["cpu"], live_model="tiny-llada")
    at = live_page()
    at.text_input(key="live_dir").set_value(str(folder))
    at.button[0].click().run()
    assert not at.exception and len(at.error) == 1
    assert "served tiny-llada on 1 CPU worker" in at.error[0].value and "no twin" in at.error[0].value
    assert len(at.metric) == 0 and charts(at) == 0  # no percentage of an unlike comparison


def test_an_fp8_run_is_simulated_on_the_fp8_testbed_and_one_no_testbed_prices_says_so(tmp_path: Path) -> None:
    from test_app_logic import as_live

    folder = as_live(sim_results_dir(tmp_path), devices=["cuda:0"] * 8, live_model="llada-8b", gpu="h200",
                     quantization="fp8", kv_cache_dtype="fp8")  # fmt: skip
    at = live_page()
    at.text_input(key="live_dir").set_value(str(folder))
    at.button[0].click().run()
    assert not at.exception and not at.error and charts(at) == 2
    shown = at.markdown[0].value
    assert "simulated on testbed sangam-h200-fp8, iteration times h200-fp8-kvfp8 profile" in shown
    as_live(folder, quantization=None)  # bf16 weights over FP8 KV: no testbed is priced for it
    at.button[0].click().run()
    assert not at.exception and len(at.error) == 1 and charts(at) == 0
    assert "--quantization none and --kv-cache-dtype fp8, and no shipped testbed" in at.error[0].value


@pytest.mark.parametrize(
    ("files", "message"),
    [
        ({"summary.json": b"{oops", "requests.csv": b"request_id\n0\n"}, "summary.json is not valid JSON"),
        ({"summary.json": b'{"config": {}}'}, "missing requests.csv"),
        ({}, "give a results directory or upload its files"),
    ],
)
def test_bad_live_input_is_a_message_in_the_page(files: dict[str, bytes], message: str) -> None:
    at = live_page()
    for name, data in files.items():
        at.file_uploader(key="live_files").upload(name, data)
    at.button[0].click().run()
    assert not at.exception
    assert len(at.error) == 1 and message in at.error[0].value
    assert charts(at) == 0


MARKED_PAGE = """
import streamlit as st

from app.ui import marked_running, stopped_notice

ending = st.radio("ending", ["stopped", "failed", "finished"], key="ending")
pressed = st.button("Go")
stopped_notice("p", "Go", pressed)
if pressed:
    try:
        with marked_running("p"):
            if ending == "stopped":
                st.stop()  # what a widget changed mid-run does: a BaseException that is no Exception
            if ending == "failed":
                raise ValueError("bad input")
    except ValueError:
        st.error("failed")
"""


@pytest.mark.parametrize(("ending", "notices"), [("stopped", 1), ("failed", 0), ("finished", 0)])
def test_a_run_that_a_change_stopped_is_noticed_once(ending: str, notices: int) -> None:
    from streamlit.runtime.scriptrunner_utils.exceptions import RerunException

    assert not issubclass(RerunException, Exception)  # so a rerun mid-run leaves the mark
    at = AppTest.from_string(MARKED_PAGE, default_timeout=30)
    at.run()
    at.radio(key="ending").set_value(ending)
    at.button[0].click().run()
    assert not at.exception and not at.warning
    at.run()
    assert len(at.warning) == notices
    assert notices == 0 or "press **Go** again" in at.warning[0].value
    at.run()
    assert not at.warning  # once


def test_a_run_stopped_by_pressing_its_button_again_is_not_noticed() -> None:
    """A second press stops the run under way and starts anew: nothing to warn of."""
    at = AppTest.from_string(MARKED_PAGE, default_timeout=30)
    at.run()
    at.radio(key="ending").set_value("stopped")
    at.button[0].click().run()
    at.radio(key="ending").set_value("finished")
    at.button[0].click().run()
    assert not at.exception and not at.warning
