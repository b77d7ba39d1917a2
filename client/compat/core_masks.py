"""The toolkit's NPU core-mask constants, shared by RKNN and RKNNLite (values of rknn_core_mask)."""


class NpuCoreMasks:
    NPU_CORE_AUTO = 0x0
    NPU_CORE_0 = 0x1
    NPU_CORE_1 = 0x2
    NPU_CORE_2 = 0x4
    NPU_CORE_0_1 = 0x3
    NPU_CORE_0_1_2 = 0x7
    NPU_CORE_ALL = 0xFFFF
