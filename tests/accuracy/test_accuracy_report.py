"""Metrics, file names and the table text."""

from __future__ import annotations

import numpy as np
import pytest

from rknn_client.accuracy.compare import ErrorPair, align, compare, cosine, euclidean
from rknn_client.accuracy.report import TableRow, format_euc, format_table, safe_name, tensor_file_names


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


def test_file_names_follow_the_toolkit_and_stay_safe_and_unique() -> None:
    files = tensor_file_names(
        ["p2o.pd_op.batch_norm_.0.0", "/features/0/Conv_output_0", "a.b", "a_b", "../x"]
    )
    assert files["p2o.pd_op.batch_norm_.0.0"] == "p2o_pd_op_batch_norm__0_0.txt"
    assert files["/features/0/Conv_output_0"] == "_features_0_Conv_output_0.txt"
    assert files["a.b"] == "a_b.txt" and files["a_b"] == "a_b_2.txt"
    assert "/" not in files["../x"] and not files["../x"].startswith(".")
    assert safe_name("..") == "_"
    long = safe_name("a" * 500)
    assert len(long) <= 96 and long != safe_name("a" * 499)


def test_euc_has_five_significant_digits_and_at_most_four_decimals() -> None:
    # Values as they appear in the toolkit's printed tables.
    assert [format_euc(v) for v in (2.05991, 22.6393, 0.00101, 13.2349, 0.0)] == [
        "2.0599",
        "22.639",
        "0.0010",
        "13.235",
        "0.0",
    ]


ROWS = [
    TableRow("[Conv] 464", ErrorPair(0.992021, 4.10791), ErrorPair(0.999981, 0.198104)),
    TableRow("[Reshape] output_int8", None, None),
    TableRow(
        "[exDataConvert] output", ErrorPair(1.0, 0.0), None, ErrorPair(0.9921, 4.27184), ErrorPair(1.0, 0.0)
    ),
]


def test_table_layout_without_runtime() -> None:
    lines = format_table(ROWS, with_runtime=False).splitlines()
    assert lines[0].startswith("# simulator_error:") and lines[2].startswith("#              single:")
    assert lines[3] == ""
    assert lines[4].split() == ["layer_name", "simulator_error"]
    assert lines[5].split() == ["entire", "single"]
    assert lines[6].split() == ["cos", "euc", "cos", "euc"]
    assert set(lines[7]) == {"-"}
    assert lines[8].split() == ["[Conv]", "464", "0.99202", "|", "4.1079", "0.99998", "|", "0.1981"]
    assert lines[9] == "[Reshape] output_int8"
    assert lines[10].split() == ["[exDataConvert]", "output", "1.00000", "|", "0.0"]
    assert lines[8].index("0.99202") == lines[4].index("simulator_error") == lines[5].index("entire")
    assert lines[8].index("0.99998") == lines[5].index("single") == lines[6].rindex("cos")


def test_runtime_columns_sit_beside_the_simulators() -> None:
    lines = format_table(ROWS, with_runtime=True).splitlines()
    assert [line.split(":")[0] for line in lines[:6]] == [
        "# simulator_error",
        "#              entire",
        "#              single",
        "# runtime_error",
        "#              entire",
        "#              single_sim",
    ]
    assert lines[7].split() == ["layer_name", "simulator_error", "runtime_error"]
    assert lines[8].split() == ["entire", "single", "entire", "single_sim"]
    assert lines[9].split() == ["cos", "euc"] * 4
    row = lines[13]
    assert row.split() == [
        "[exDataConvert]",
        "output",
        "1.00000",
        "|",
        "0.0",
        "0.99210",
        "|",
        "4.2718",
        "1.00000",
        "|",
        "0.0",
    ]
    assert row.index("0.99210") == lines[7].index("runtime_error") == lines[8].rindex("entire")
    assert row.rindex("1.00000") == lines[8].index("single_sim")
