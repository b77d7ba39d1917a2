"""Metrics, file names and the table text."""

from __future__ import annotations

import numpy as np
import pytest

from rknn_client.accuracy.capture import LayerInfo
from rknn_client.accuracy.compare import ErrorPair, align, compare, cosine, euclidean
from rknn_client.accuracy.report import (
    SIMULATOR_TABLE,
    TableRow,
    format_table,
    layer_file_name,
    safe_name,
)


def test_metrics_in_float64() -> None:
    a = np.array([1.0, 2.0, 3.0], np.float32)
    b = np.array([1.0, 2.0, 4.0], np.float32)
    assert cosine(a, b) == pytest.approx(17 / np.sqrt(14 * 21), abs=1e-15)
    assert euclidean(a, b) == 1.0
    assert cosine(np.zeros(3), np.zeros(3)) == 1.0
    assert cosine(np.zeros(3), a) == 0.0
    big = np.full(4, 1e30, np.float32)
    assert euclidean(big, -big) == pytest.approx(4e30)


def test_align_accepts_nhwc_and_refuses_mismatches() -> None:
    nchw = np.arange(2 * 3 * 4, dtype=np.float32).reshape(1, 2, 3, 4)
    np.testing.assert_array_equal(align(nchw, nchw.transpose(0, 2, 3, 1)), nchw)
    assert align(nchw, np.zeros((1, 5))) is None
    pair = compare(nchw, nchw.reshape(2, 3, 4))
    assert pair is not None and pair.cos == pytest.approx(1.0) and pair.euc == 0.0


def test_file_names_are_safe_and_bounded() -> None:
    info = LayerInfo(7, "Conv/../x", "n", "/features/0/Conv_output_0:0")
    name = layer_file_name(info, np.zeros((1, 2, 3), np.float32))
    assert name == "007_Conv_.._x__features_0_Conv_output_0_0_shape_1_2_3_float.npy"
    assert layer_file_name(LayerInfo(0, "In", "n", "t"), np.zeros(2, np.uint8)).endswith("_shape_2_uint8.npy")
    assert safe_name("..") == "_"
    long = safe_name("a" * 500)
    assert len(long) <= 96 and long != safe_name("a" * 499)


def test_table_layout() -> None:
    text = format_table(
        SIMULATOR_TABLE,
        [
            TableRow("[Conv] 464", ErrorPair(0.992021, 4.10791), ErrorPair(0.999981, 0.198104)),
            TableRow("[Reshape] output_int8", None, None),
            TableRow("[exDataConvert] output", ErrorPair(1.0, 0.0), None),
        ],
    )
    lines = text.splitlines()
    assert lines[0].startswith("# simulator_error:") and lines[2].startswith("# single:")
    assert lines[3].split() == ["layer_name", "simulator_error"]
    assert lines[4].split() == ["entire", "single"]
    assert lines[5].split() == ["cos", "euc", "cos", "euc"]
    assert set(lines[6]) == {"-"}
    assert lines[7].split() == ["[Conv]", "464", "0.99202", "|", "4.1079", "0.99998", "|", "0.1981"]
    assert lines[8] == "[Reshape] output_int8"
    assert lines[9].split() == ["[exDataConvert]", "output", "1.00000", "|", "0.0"]
    assert lines[7].index("0.99998") == lines[4].index("single") == lines[5].rindex("cos")
