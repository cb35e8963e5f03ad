"""The executor benchmark's bounds and its --table re-print (CPU: no forward runs)."""

from __future__ import annotations

import json
from dataclasses import asdict, replace
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from benchmarks.executor_speed import (
    FP8_SPEEDUP,
    Row,
    bound,
    category,
    count,
    count_parts,
    main,
    met,
    parts_bound,
    serial_bound_ms,
)
from executor.model.config import Family, full_size
from sangam.hardware import BLOCK


def decode_row(model: Family, items: int, ms: float = 10.0) -> Row:
    rows = BLOCK + (1 if model is Family.DREAM else 0)
    flops, nbytes = count(full_size(model).shape, items, rows, 1819, decode=True)
    bound_ms, by = bound(flops, nbytes)
    return Row(model.value, "decode", items, 1819, "on", True, ms, flops, nbytes, bound_ms, by, "<=1.5x")


@given(st.sampled_from(list(Family)), st.integers(1, 64))
def test_the_serial_bound_is_never_below_the_roofline_bound(model: Family, items: int) -> None:
    row = decode_row(model, items)
    assert serial_bound_ms(row) >= row.bound_ms * (1 - 1e-12)


def test_the_serial_bound_adds_attention_where_it_is_bound_by_another_resource() -> None:
    one, eight = decode_row(Family.LLADA, 1), decode_row(Family.LLADA, 8)
    # one item: weights and KV both stream from memory, so one after the other is the roofline bound
    assert serial_bound_ms(one) == pytest.approx(one.bound_ms) == 1e3 * one.bytes / 4.3e12
    # eight items: the linear layers are compute-bound while attention still streams its KV
    assert serial_bound_ms(eight) > 1.2 * eight.bound_ms


def test_table_prints_each_row_of_a_json_file(tmp_path, capsys) -> None:
    rows = [decode_row(Family.LLADA, 8, ms=9.15), replace(decode_row(Family.DREAM, 4, ms=5.98), error=0.0)]
    path = tmp_path / "speed.json"
    path.write_text(json.dumps([asdict(row) | {"met": ""} for row in rows]))
    main(["--table", str(path)])
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 3 and lines[0].split()[-2:] == ["serial", "g-err"]
    for line, row in zip(lines[1:], rows, strict=True):
        fields = line.split()
        assert fields[:4] == [row.model, row.quant, "decode", str(row.size)]
        assert float(fields[7]) == row.ms
        serial = fields[-1] if row.error is None else fields[-2]
        assert serial == f"{row.ms / serial_bound_ms(row):.2f}"
    assert lines[1].split()[-2:] == ["NO", "1.38"]  # the shipped LLaDA B=8 figure: 1.74x bound, 1.38x serial


def shipped_row(**change: object) -> str:
    """The first shipped row, with some fields changed, as a one-row JSON file's text."""
    rows = json.loads(
        (Path(__file__).parent.parent / "benchmarks/results/executor_speed-h200.json").read_text()
    )
    return json.dumps([{**rows[0], **change}])


@pytest.mark.parametrize(
    "text",
    [
        "not json", '[{"model": "llada"}]', '{"rows": 1}', "[]",
        shipped_row(ms=None), shipped_row(ms=0), shipped_row(model="gpt"),
    ],
)  # fmt: skip
def test_table_of_a_file_without_rows_exits_with_one_line(tmp_path, text: str) -> None:
    path = tmp_path / "bad.json"
    path.write_text(text)
    with pytest.raises(SystemExit) as exit_:
        main(["--table", str(path)])
    message = str(exit_.value.code)
    assert message.startswith(f"executor_speed: {path} holds no benchmark rows") and "\n" not in message


def test_old_files_without_a_quantization_read_as_bf16(tmp_path, capsys) -> None:
    path = tmp_path / "old.json"
    old = {k: v for k, v in asdict(decode_row(Family.LLADA, 8, ms=9.15)).items() if k != "quant"}
    path.write_text(json.dumps([old]))
    main(["--table", str(path)])
    assert capsys.readouterr().out.splitlines()[1].split()[:2] == ["llada", "bf16"]


def test_fp8_halves_body_weight_bytes_and_doubles_their_rate() -> None:
    spec = full_size(Family.LLADA).shape
    (body16, head16), attention16 = count_parts(spec, 8, BLOCK, 1819, True)
    (body8, head8), attention8 = count_parts(spec, 8, BLOCK, 1819, True, "fp8")
    assert body8[0] == body16[0] and body8[1] == body16[1] / 2 and body8[2] == FP8_SPEEDUP * body16[2]
    assert head8 == head16 and attention8 == attention16  # the LM head and attention stay bf16
    # bf16's bound through the parts is the old one
    assert parts_bound((body16, head16, attention16)) == bound(*count(spec, 8, BLOCK, 1819, True))
    assert parts_bound((body8, head8, attention8))[0] < parts_bound((body16, head16, attention16))[0]


def test_fp8_rows_are_held_to_issue_30s_times() -> None:
    row = replace(decode_row(Family.LLADA, 8, ms=5.4), quant="fp8", target="<=5.5ms")
    assert met(row) == "yes" and met(replace(row, ms=5.6)) == "NO"
    assert serial_bound_ms(row) < serial_bound_ms(replace(row, quant="bf16"))


def test_an_fp8_kv_cache_halves_the_kv_bytes_only_and_labels_its_rows(tmp_path, capsys) -> None:
    spec = full_size(Family.LLADA).shape
    (body, head), attention = count_parts(spec, 8, BLOCK, 1819, True, "fp8")
    (body8, head8), attention8 = count_parts(spec, 8, BLOCK, 1819, True, "fp8", "fp8")
    assert (body8, head8) == (body, head) and attention8 == (attention[0], attention[1] / 2, attention[2])
    path = tmp_path / "kv.json"
    row = replace(decode_row(Family.LLADA, 8, ms=7.0), quant="fp8", kv="fp8")
    path.write_text(json.dumps([asdict(row) | {"met": ""}]))
    main(["--table", str(path)])
    assert capsys.readouterr().out.splitlines()[1].split()[:2] == ["llada", "fp8+kv8"]


def test_kernel_sums_count_our_page_kernels_as_attention() -> None:
    """Fp8PageAttention's Triton kernels (`_attend`, `_merge`) were summed as elementwise in the fifth
    round's breakdowns."""
    fa2 = "BatchPrefillWithPagedKVCacheKernel"
    assert category("_attend") == category("_merge") == category(fa2) == "attention"
    assert category("_quantize_rows") == category("_add_rmsnorm_quantize_rows") == "fp8 quantize"
