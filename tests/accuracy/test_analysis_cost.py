"""What an analysis costs and says: one ONNX Runtime session for all single-layer runs (not one per
layer), progress for each step, the files and bytes written reported exactly, and tensor text with the
toolkit's six decimals, trailing zeros left off, written without a Python call per value."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import onnx
import pytest

from rknn_client.accuracy import session as sessions
from rknn_client.accuracy import single, text_dump
from rknn_client.accuracy.analysis import analyse
from rknn_client.accuracy.capture import load_model
from rknn_client.accuracy.layers import ModelLayer, model_layers
from rknn_client.accuracy.steps import Steps


def test_single_layer_runs_share_one_session_and_match_the_per_layer_runs(
    tmp_path: Path, float_model: Path, quant_model: Path, test_image: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A session per layer (dozens for MobileNetV2) cost more than the layers did: the analysis now
    opens the two whole models and one combined single-layer model. The combined run gives the values
    that each cut run alone gives."""
    opened: list[int] = []
    real_open = sessions.open_session

    def counting(model: object) -> object:
        opened.append(1)
        return real_open(model)  # type: ignore[arg-type]

    monkeypatch.setattr(single, "open_session", counting)
    result = analyse(float_model, quant_model, [test_image], tmp_path / "snap")
    singles = [row for row in result.rows if row.single is not None]
    assert len(singles) >= 8 and len(opened) == 1

    runner = single.SingleLayerRunner(*_quant_layers(quant_model))
    golden = {row.name: np.load(tmp_path / "snap" / "golden" / "npy" / f"{row.name}.npy") for row in singles}
    together = runner.run(golden).values
    computed = [name for name in together if runner._cuts[name].nodes]  # type: ignore[union-attr]
    assert len(computed) >= 8
    for name in computed:
        alone = runner._run([name], golden)[0]
        np.testing.assert_array_equal(together[name], alone, err_msg=name)


def _quant_layers(quant_model: Path) -> tuple[onnx.ModelProto, list[ModelLayer]]:
    model = load_model(quant_model)
    return model, model_layers(model)


def test_every_step_shows_progress_and_the_written_total_is_what_is_on_disk(
    tmp_path: Path, float_model: Path, quant_model: Path, test_image: Path
) -> None:
    shown = io.StringIO()
    out = tmp_path / "snap"
    result = analyse(float_model, quant_model, [test_image], out, steps=Steps(shown, delay_s=0, enabled=True))
    text = shown.getvalue()
    for step in ("golden: the float model", "simulator: the quantized model", "single-layer runs"):
        assert f"{step}: 100%" in text, step
    assert "comparing layers: 100%|" in text and f"{len(result.rows)}/{len(result.rows)}" in text
    assert "writing golden/: 100%" in text and "writing simulator/: 100%" in text
    files = [path for path in out.rglob("*") if path.is_file()]
    assert result.written.files == len(files)
    assert result.written.bytes == sum(path.stat().st_size for path in files)
    assert (
        result.written.text(out)
        == f"wrote {len(files)} files ({result.written.bytes / 1e6:.1f} MB) under {out}"
    )


def test_no_progress_is_drawn_off_a_terminal_or_for_short_steps() -> None:
    """A log file gets no carriage-return bars; on a terminal, a step shorter than the delay stays silent."""
    shown = io.StringIO()
    with Steps(shown).step("quiet", 3) as advance:  # a StringIO is no terminal
        advance(3)
    with Steps(shown, delay_s=60, enabled=True).step("short", 3) as advance:
        advance(3)
    assert shown.getvalue() == ""


@pytest.mark.parametrize(
    "values",
    [
        np.array([0.0, -0.0, 5e-7, 1.5e-6, 2.5e-6, -2.5e-6, 0.9999995, 123.0000005, -1e-9], np.float32),
        np.random.default_rng(3).standard_normal(5000).astype(np.float32) * np.float32(1e4),
        np.array([3.4e38, -1e15, 1e12], np.float32),  # past 64-bit fixed point: the general path
        np.array([np.inf, -np.inf, np.nan, 1.0], np.float32),
        np.array([-(2**63), 2**63 - 1, 0, -7], np.int64),
        np.array([255, 0, 7], np.uint8),
    ],
)
def test_tensor_text_is_printf_of_each_value_byte_for_byte(values: np.ndarray) -> None:
    """The toolkit's %.6f digits (ties to even as printf rounds them, -0.0 keeps its sign, huge and
    non-finite values written), without the zeros that end a fraction: `0`, `0.5`, `-0`."""
    out = io.BytesIO()
    text_dump.write_lines(out, values)
    fmt = "%.6f" if values.dtype.kind == "f" else "%d"
    printf = [fmt % value for value in values.tolist()]
    lines = out.getvalue().decode().splitlines()
    assert lines == [text.rstrip("0").rstrip(".") if "." in text else text for text in printf]
    read = np.array([float(text) for text in lines])
    np.testing.assert_array_equal(read, np.array([float(text) for text in printf]))  # the toolkit's numbers


def test_tensor_text_is_the_same_across_chunk_boundaries(monkeypatch: pytest.MonkeyPatch) -> None:
    values = np.random.default_rng(4).standard_normal((3, 7, 5)).astype(np.float32)
    whole = io.BytesIO()
    text_dump.write_lines(whole, values)
    monkeypatch.setattr(text_dump, "CHUNK", 4)
    chunked = io.BytesIO()
    text_dump.write_lines(chunked, values)
    assert chunked.getvalue() == whole.getvalue() and whole.getvalue().count(b"\n") == values.size
