/* The subset of rknn_api.h (SDK 2.3.2) the stand-in runtime implements, written from the documented
 * field order and widths so the compiled stub has the same ABI as the real librknnrt. */
#ifndef RKNN_STUB_API_H
#define RKNN_STUB_API_H

#include <stdint.h>

#define RKNN_MAX_DIMS 16
#define RKNN_MAX_NAME_LEN 256
#define RKNN_MAX_DYNAMIC_SHAPE_NUM 512

#if defined(__arm__)
typedef uint32_t rknn_context;
#else
typedef uint64_t rknn_context;
#endif

enum {
    RKNN_SUCC = 0,
    RKNN_ERR_FAIL = -1,
    RKNN_ERR_MALLOC_FAIL = -4,
    RKNN_ERR_PARAM_INVALID = -5,
    RKNN_ERR_MODEL_INVALID = -6,
    RKNN_ERR_CTX_INVALID = -7,
    RKNN_ERR_INPUT_INVALID = -8,
    RKNN_ERR_OUTPUT_INVALID = -9,
};

#define RKNN_FLAG_COLLECT_PERF_MASK 0x8
#define RKNN_FLAG_EXECUTE_FALLBACK_PRIOR_DEVICE_GPU 0x400

typedef enum {
    RKNN_QUERY_IN_OUT_NUM = 0,
    RKNN_QUERY_INPUT_ATTR = 1,
    RKNN_QUERY_OUTPUT_ATTR = 2,
    RKNN_QUERY_PERF_DETAIL = 3,
    RKNN_QUERY_PERF_RUN = 4,
    RKNN_QUERY_SDK_VERSION = 5,
    RKNN_QUERY_MEM_SIZE = 6,
    RKNN_QUERY_CUSTOM_STRING = 7,
    RKNN_QUERY_NATIVE_INPUT_ATTR = 8,
    RKNN_QUERY_NATIVE_OUTPUT_ATTR = 9,
    RKNN_QUERY_INPUT_DYNAMIC_RANGE = 13,
    RKNN_QUERY_CURRENT_INPUT_ATTR = 14,
    RKNN_QUERY_CURRENT_OUTPUT_ATTR = 15,
} rknn_query_cmd;

typedef enum {
    RKNN_TENSOR_FLOAT32 = 0,
    RKNN_TENSOR_FLOAT16 = 1,
    RKNN_TENSOR_INT8 = 2,
    RKNN_TENSOR_UINT8 = 3,
    RKNN_TENSOR_INT16 = 4,
} rknn_tensor_type;

typedef enum { RKNN_TENSOR_QNT_NONE = 0, RKNN_TENSOR_QNT_DFP = 1, RKNN_TENSOR_QNT_AFFINE_ASYMMETRIC = 2 } rknn_tensor_qnt_type;

typedef enum { RKNN_TENSOR_NCHW = 0, RKNN_TENSOR_NHWC = 1, RKNN_TENSOR_NC1HWC2 = 2, RKNN_TENSOR_UNDEFINED = 3 } rknn_tensor_format;

typedef enum { RKNN_NPU_CORE_AUTO = 0, RKNN_NPU_CORE_ALL = 0xffff } rknn_core_mask;

typedef struct { uint32_t n_input; uint32_t n_output; } rknn_input_output_num;

typedef struct {
    uint32_t index;
    uint32_t n_dims;
    uint32_t dims[RKNN_MAX_DIMS];
    char name[RKNN_MAX_NAME_LEN];
    uint32_t n_elems;
    uint32_t size;
    rknn_tensor_format fmt;
    rknn_tensor_type type;
    rknn_tensor_qnt_type qnt_type;
    int8_t fl;
    int32_t zp;
    float scale;
    uint32_t w_stride;
    uint32_t size_with_stride;
    uint8_t pass_through;
    uint32_t h_stride;
} rknn_tensor_attr;

typedef struct {
    uint32_t index;
    uint32_t shape_number;
    rknn_tensor_format fmt;
    char name[RKNN_MAX_NAME_LEN];
    uint32_t dyn_range[RKNN_MAX_DYNAMIC_SHAPE_NUM][RKNN_MAX_DIMS];
    uint32_t n_dims;
} rknn_input_range;

typedef struct { char* perf_data; uint64_t data_len; } rknn_perf_detail;
typedef struct { int64_t run_duration; } rknn_perf_run;
typedef struct { char api_version[256]; char drv_version[256]; } rknn_sdk_version;

typedef struct {
    uint32_t total_weight_size;
    uint32_t total_internal_size;
    uint64_t total_dma_allocated_size;
    uint32_t total_sram_size;
    uint32_t free_sram_size;
    uint32_t reserved[10];
} rknn_mem_size;

typedef struct { char string[1024]; } rknn_custom_string;

typedef struct {
    void* virt_addr;
    uint64_t phys_addr;
    int32_t fd;
    int32_t offset;
    uint32_t size;
    uint32_t flags;
    void* priv_data;
} rknn_tensor_mem;

typedef struct {
    uint32_t index;
    void* buf;
    uint32_t size;
    uint8_t pass_through;
    rknn_tensor_type type;
    rknn_tensor_format fmt;
} rknn_input;

typedef struct {
    uint8_t want_float;
    uint8_t is_prealloc;
    uint32_t index;
    void* buf;
    uint32_t size;
} rknn_output;

typedef struct {
    rknn_context ctx;
    int32_t real_model_offset;
    uint32_t real_model_size;
    int32_t model_buffer_fd;
    uint32_t model_buffer_flags;
    uint8_t reserved[112];
} rknn_init_extend;

typedef struct { uint64_t frame_id; int32_t non_block; int32_t timeout_ms; int32_t fence_fd; } rknn_run_extend;
typedef struct { uint64_t frame_id; } rknn_output_extend;

/* Only the head of rknn_custom_op matters to the stub: it records which op types were registered. */
typedef struct {
    uint32_t version;
    int32_t target;
    char op_type[64];
} rknn_custom_op;

#endif
