from __future__ import annotations

from rknn_server.runtime.rknnrt.perf_text import parse_perf_detail

# Rows from the user guide's RK3588 mobilenet example (seeds-spec 1.5).
PIPE_TABLE = """Network Layer Information Table
ID | OpType | DataType | Target | InputShape | OutputShape | DDRCycles | NPUCycles | MaxCycles | Time(us) | MacUsage(%) | WorkLoad(0/1/2)--ImproveTherical | TaskNumber | RW(KB) | FullName
1 | InputOperator | UINT8 | CPU | \\ | (1,3,224,224) | 0 | 0 | 0 | 22 | \\ | 0.0%/0.0%/0.0%--Up:0.0% | 0/0 | 0 | InputOperator:data
2 | ConvRelu | UINT8 | NPU | (1,3,224,224),(32,3,3,3),(32) | (1,32,112,112) | 94150 | 112896 | 112896 | 428 | 0.00/0.00/0.00 | 300.0%/0.0%/0.0%--Up:-200.0% | 3/0 | 151 | Conv:conv1
59 | OutputOperator | FLOAT16 | CPU | (1,1000,1,1) | \\ | 0 | 0 | 0 | 67 | \\ | 300.0%/0.0%/0.0%--Up:-200.0% | 2/0 | 1 | OutputOperator:prob

Total Operator Elapsed Per Frame Time(us): 14374
Total Memory Read/Write Per Frame Size(KB): 12872.1

Operator Time Consuming Ranking Table
OpType | CallNumber | CPUTime(us) | GPUTime(us) | NPUTime(us) | TotalTime(us) | TimeRatio(%)
ConvRelu | 36 | 0 | 0 | 9319 | 9319 | 64.83%
"""

# The on-board runtime's blank-separated variant (RKNN_LOG_LEVEL=4, columns cut by the guide's author).
BLANK_TABLE = """ID OpType DataType Target Time(us) FullName
1 InputOperator UINT8 CPU 17 InputOperator:data
2 ConvClip UINT8 NPU 331 Conv:conv1
Total Operator Elapsed Time(us): 348
Total Memory RW Amount(MB): 2
"""


def test_pipe_table() -> None:
    table = parse_perf_detail(PIPE_TABLE)
    assert [layer.index for layer in table.layers] == [1, 2, 59]
    conv = table.layers[1]
    assert (conv.op_type, conv.data_type, conv.target, conv.name) == (
        "ConvRelu",
        "UINT8",
        "NPU",
        "Conv:conv1",
    )
    assert conv.input_shapes == ("(1,3,224,224)", "(32,3,3,3)", "(32)")
    assert conv.output_shape == "(1,32,112,112)" and conv.time_us == 428.0
    assert conv.extra["DDRCycles"] == "94150" and conv.extra["RW(KB)"] == "151"
    assert table.layers[0].input_shapes == () and table.layers[2].output_shape == ""
    assert table.extra_columns == (
        "DDRCycles",
        "NPUCycles",
        "MaxCycles",
        "MacUsage(%)",
        "WorkLoad(0/1/2)--ImproveTherical",
        "TaskNumber",
        "RW(KB)",
    )
    assert table.operator_time_us == 14374.0 and table.rw_kb == 12872.1


def test_blank_separated_table() -> None:
    table = parse_perf_detail(BLANK_TABLE)
    assert [(layer.op_type, layer.time_us, layer.name) for layer in table.layers] == [
        ("InputOperator", 17.0, "InputOperator:data"),
        ("ConvClip", 331.0, "Conv:conv1"),
    ]
    assert table.operator_time_us == 348.0 and table.rw_kb == 2048.0


def test_empty_text() -> None:
    table = parse_perf_detail("")
    assert table.layers == () and table.operator_time_us == 0.0
