/* A stand-in librknnrt.so (or, with -DSTUB_MRT, librknnmrt.so) for tests without a board.
 *
 * It exports the runtime's symbols with the header's struct layouts and runs a tiny text model format:
 *
 *   rknnstub 1
 *   input NAME TYPE FMT D0,D1,...[ zp=Z scale=S]      TYPE: FP32|INT8|UINT8, FMT: NHWC|UNDEFINED
 *   dynamic D0,D1,.. D0,D1,..                          optional: the input shapes rknn_set_input_shapes accepts
 *   output NAME TYPE A B[ zp=Z scale=S]                y = A * x + B per element; TYPE: FP32|INT8 (affine)
 *   custom_string TEXT                                 optional
 *   require_op OPTYPE                                  optional: rknn_run fails until a plugin registers it
 *
 * With RKNN_LOG_LEVEL >= 5 each run writes the input, every output before quantization and the outputs
 * as .npy files into RKNN_DUMP_DIR (default /userdata/dumps, as the real runtime on Linux).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "rknn_api.h"

#define MAX_OUT 8
#define MAX_SHAPES 8
#define MAX_OPS 8

#ifdef STUB_MRT
__attribute__((used)) static const char LIB_VERSION[] = "librknnmrt version: 2.3.2 (stubmrt@2025-04-09T09:08:16)";
#else
__attribute__((used)) static const char LIB_VERSION[] = "librknnrt version: 2.3.2 (stub@2025-04-09T09:08:16)";
#endif

typedef struct {
    char name[RKNN_MAX_NAME_LEN];
    rknn_tensor_type type;
    float a, b;
    int32_t zp;
    float scale;
    float* values; /* y before quantization, NHWC order, n_elems */
    void* raw;     /* y in the output type */
    rknn_tensor_mem* mem;
} stub_output;

typedef struct {
    char input_name[RKNN_MAX_NAME_LEN];
    rknn_tensor_type input_type;
    rknn_tensor_format input_fmt;
    int32_t input_zp;
    float input_scale;
    uint32_t n_dims;
    uint32_t dims[RKNN_MAX_DIMS];
    uint32_t n_shapes;
    uint32_t shapes[MAX_SHAPES][RKNN_MAX_DIMS];
    uint32_t n_out;
    stub_output out[MAX_OUT];
    char custom_string[1024];
    char required_op[64];
    char registered_ops[MAX_OPS][64];
    uint32_t n_registered;
    uint32_t flags;
    int core_mask;
    float* x;
    int have_input;
    rknn_tensor_mem* in_mem;
    rknn_tensor_attr in_attr;
    int64_t last_run_us;
    char perf_text[4096];
} stub_model;

static stub_model* model_of(rknn_context ctx) { return (stub_model*)(uintptr_t)ctx; }

static uint32_t n_elems(const stub_model* m) {
    uint32_t n = 1;
    for (uint32_t i = 0; i < m->n_dims; i++) n *= m->dims[i];
    return n;
}

static size_t type_size(rknn_tensor_type t) {
    switch (t) {
        case RKNN_TENSOR_FLOAT32: case RKNN_TENSOR_INT32: case RKNN_TENSOR_UINT32: return 4;
        case RKNN_TENSOR_FLOAT16: case RKNN_TENSOR_INT16: case RKNN_TENSOR_UINT16: return 2;
        case RKNN_TENSOR_INT64: return 8;
        default: return 1;
    }
}

static int parse_type(const char* s, rknn_tensor_type* t) {
    if (!strcmp(s, "FP32")) *t = RKNN_TENSOR_FLOAT32;
    else if (!strcmp(s, "INT8")) *t = RKNN_TENSOR_INT8;
    else if (!strcmp(s, "UINT8")) *t = RKNN_TENSOR_UINT8;
    else return -1;
    return 0;
}

static uint32_t parse_dims(const char* s, uint32_t* dims) {
    uint32_t n = 0;
    char* end;
    while (*s && n < RKNN_MAX_DIMS) {
        dims[n++] = (uint32_t)strtoul(s, &end, 10);
        if (*end != ',') break;
        s = end + 1;
    }
    return n;
}

static void parse_quant(const char* rest, int32_t* zp, float* scale) {
    const char* p = strstr(rest, "zp=");
    if (p) *zp = atoi(p + 3);
    p = strstr(rest, "scale=");
    if (p) *scale = strtof(p + 6, NULL);
}

static int load_model(FILE* f, stub_model* m) {
    char line[1200], a[300], b[300], c[300], d[300];
    if (!fgets(line, sizeof line, f) || strncmp(line, "rknnstub 1", 10)) return -1;
    while (fgets(line, sizeof line, f)) {
        line[strcspn(line, "\n")] = 0;
        if (sscanf(line, "input %255s %15s %15s %255s", a, b, c, d) == 4) {
            strcpy(m->input_name, a);
            if (parse_type(b, &m->input_type)) return -1;
            m->input_fmt = strcmp(c, "NHWC") ? RKNN_TENSOR_UNDEFINED : RKNN_TENSOR_NHWC;
            m->n_dims = parse_dims(d, m->dims);
            m->input_scale = 1.0f;
            parse_quant(line, &m->input_zp, &m->input_scale);
        } else if (!strncmp(line, "dynamic ", 8)) {
            char* tok = strtok(line + 8, " ");
            while (tok && m->n_shapes < MAX_SHAPES) parse_dims(tok, m->shapes[m->n_shapes++]), tok = strtok(NULL, " ");
        } else if (sscanf(line, "output %255s %15s %255s %255s", a, b, c, d) == 4 && m->n_out < MAX_OUT) {
            stub_output* o = &m->out[m->n_out++];
            strcpy(o->name, a);
            if (parse_type(b, &o->type)) return -1;
            o->a = strtof(c, NULL);
            o->b = strtof(d, NULL);
            o->scale = 1.0f;
            parse_quant(line, &o->zp, &o->scale);
        } else if (!strncmp(line, "custom_string ", 14)) {
            snprintf(m->custom_string, sizeof m->custom_string, "%.1000s", line + 14);
        } else if (sscanf(line, "require_op %63s", a) == 1) {
            strcpy(m->required_op, a);
        }
    }
    return (m->n_dims && m->n_out) ? 0 : -1;
}

int rknn_init(rknn_context* ctx, void* model, uint32_t size, uint32_t flag, rknn_init_extend* extend) {
    (void)extend;
    if (size != 0) return RKNN_ERR_PARAM_INVALID; /* the stand-in only loads by path */
    FILE* f = fopen((const char*)model, "r");
    if (!f) return RKNN_ERR_FAIL;
    stub_model* m = calloc(1, sizeof *m);
    int ret = load_model(f, m);
    fclose(f);
    if (ret) {
        free(m);
        return RKNN_ERR_MODEL_INVALID;
    }
    if (m->n_shapes) memcpy(m->dims, m->shapes[0], sizeof m->dims);
    m->flags = flag;
    *ctx = (rknn_context)(uintptr_t)m;
    return RKNN_SUCC;
}

static void free_buffers(stub_model* m) {
    free(m->x);
    m->x = NULL;
    for (uint32_t i = 0; i < m->n_out; i++) {
        free(m->out[i].values);
        free(m->out[i].raw);
        m->out[i].values = NULL;
        m->out[i].raw = NULL;
    }
}

int rknn_destroy(rknn_context ctx) {
    stub_model* m = model_of(ctx);
    if (!m) return RKNN_ERR_CTX_INVALID;
    free_buffers(m);
    free(m);
    return RKNN_SUCC;
}

static void fill_input_attr(const stub_model* m, rknn_tensor_attr* attr) {
    attr->n_dims = m->n_dims;
    memcpy(attr->dims, m->dims, sizeof attr->dims);
    snprintf(attr->name, sizeof attr->name, "%s", m->input_name);
    attr->n_elems = n_elems(m);
    attr->size = attr->n_elems * (uint32_t)type_size(m->input_type);
    attr->fmt = m->input_fmt;
    attr->type = m->input_type;
    attr->qnt_type = m->input_type == RKNN_TENSOR_FLOAT32 ? RKNN_TENSOR_QNT_NONE : RKNN_TENSOR_QNT_AFFINE_ASYMMETRIC;
    attr->zp = m->input_zp;
    attr->scale = m->input_scale;
    attr->w_stride = m->n_dims == 4 ? m->dims[2] : 0;
#ifdef STUB_MRT
    if (m->n_dims == 4) attr->w_stride = (m->dims[2] + 3u) & ~3u; /* rows padded to 4 elements */
#endif
    attr->size_with_stride = m->n_dims == 4 ? attr->size / m->dims[2] * attr->w_stride : attr->size;
    attr->h_stride = m->n_dims == 4 ? m->dims[1] : 0;
}

static void fill_output_attr(const stub_model* m, uint32_t i, rknn_tensor_attr* attr) {
    const stub_output* o = &m->out[i];
    attr->n_dims = m->n_dims;
    memcpy(attr->dims, m->dims, sizeof attr->dims);
    snprintf(attr->name, sizeof attr->name, "%s", o->name);
    attr->n_elems = n_elems(m);
    attr->size = attr->n_elems * (uint32_t)type_size(o->type);
    attr->size_with_stride = attr->size;
    attr->fmt = m->input_fmt;
    attr->type = o->type;
    attr->qnt_type = o->type == RKNN_TENSOR_INT8 ? RKNN_TENSOR_QNT_AFFINE_ASYMMETRIC : RKNN_TENSOR_QNT_NONE;
    attr->zp = o->zp;
    attr->scale = o->scale;
}

static void format_perf(stub_model* m) {
    int cores = m->core_mask == 0 || m->core_mask == RKNN_NPU_CORE_ALL ? 1 : __builtin_popcount((unsigned)m->core_mask);
    char load[64];
    snprintf(load, sizeof load, "%.1f%%/%.1f%%/%.1f%%", 100.0 / cores, cores > 1 ? 100.0 / cores : 0.0,
             cores > 2 ? 100.0 / cores : 0.0);
    char shape[128] = "(";
    for (uint32_t i = 0; i < m->n_dims; i++) {
        char d[16];
        snprintf(d, sizeof d, i ? ",%u" : "%u", m->dims[i]);
        strcat(shape, d);
    }
    strcat(shape, ")");
    size_t n = 0, cap = sizeof m->perf_text;
    n += snprintf(m->perf_text + n, cap - n,
                  "ID | OpType | DataType | Target | InputShape | OutputShape | Time(us) | WorkLoad(0/1/2) | RW(KB) | FullName\n");
    n += snprintf(m->perf_text + n, cap - n, "1 | InputOperator | FLOAT32 | CPU | \\ | %s | 10 | %s | 0 | InputOperator:%s\n",
                  shape, load, m->input_name);
    int total = 10;
    for (uint32_t i = 0; i < m->n_out; i++, total += 100 + (int)i) {
        n += snprintf(m->perf_text + n, cap - n, "%u | Mul | INT8 | NPU | %s,(1) | %s | %u | %s | %.1f | Mul:%s_mul\n",
                      i + 2, shape, shape, 100 + i, load, 1.5 * (i + 1), m->out[i].name);
    }
    n += snprintf(m->perf_text + n, cap - n, "%u | OutputOperator | INT8 | CPU | %s | \\ | 5 | %s | 0 | OutputOperator:%s\n",
                  m->n_out + 2, shape, load, m->out[0].name);
    total += 5;
    snprintf(m->perf_text + n, cap - n,
             "\nTotal Operator Elapsed Per Frame Time(us): %d\nTotal Memory Read/Write Per Frame Size(KB): %.1f\n"
             "\nOperator Time Consuming Ranking Table\nOpType | CallNumber | TotalTime(us)\nMul | %u | %d\n",
             total, 1.5 * m->n_out * (m->n_out + 1) / 2, m->n_out, total - 15);
}

int rknn_query(rknn_context ctx, rknn_query_cmd cmd, void* info, uint32_t size) {
    stub_model* m = model_of(ctx);
    if (!m) return RKNN_ERR_CTX_INVALID;
    switch (cmd) {
        case RKNN_QUERY_IN_OUT_NUM: {
            if (size != sizeof(rknn_input_output_num)) return RKNN_ERR_PARAM_INVALID;
            rknn_input_output_num* io = info;
            io->n_input = 1;
            io->n_output = m->n_out;
            return RKNN_SUCC;
        }
        case RKNN_QUERY_INPUT_ATTR: case RKNN_QUERY_NATIVE_INPUT_ATTR: case RKNN_QUERY_CURRENT_INPUT_ATTR: {
            rknn_tensor_attr* attr = info;
            if (size != sizeof(rknn_tensor_attr) || attr->index != 0) return RKNN_ERR_PARAM_INVALID;
            if (cmd == RKNN_QUERY_INPUT_ATTR && m->n_shapes) {
                stub_model largest = *m;
                memcpy(largest.dims, m->shapes[m->n_shapes - 1], sizeof largest.dims);
                fill_input_attr(&largest, attr);
            } else {
                fill_input_attr(m, attr);
            }
            return RKNN_SUCC;
        }
        case RKNN_QUERY_OUTPUT_ATTR: case RKNN_QUERY_NATIVE_OUTPUT_ATTR: case RKNN_QUERY_CURRENT_OUTPUT_ATTR: {
            rknn_tensor_attr* attr = info;
            if (size != sizeof(rknn_tensor_attr) || attr->index >= m->n_out) return RKNN_ERR_PARAM_INVALID;
            fill_output_attr(m, attr->index, attr);
            return RKNN_SUCC;
        }
#ifndef STUB_MRT
        case RKNN_QUERY_INPUT_DYNAMIC_RANGE: {
            rknn_input_range* r = info;
            if (size != sizeof(rknn_input_range) || r->index != 0) return RKNN_ERR_PARAM_INVALID;
            r->shape_number = m->n_shapes;
            r->fmt = m->input_fmt;
            r->n_dims = m->n_dims;
            snprintf(r->name, sizeof r->name, "%s", m->input_name);
            memcpy(r->dyn_range, m->shapes, sizeof m->shapes);
            return RKNN_SUCC;
        }
        case RKNN_QUERY_PERF_DETAIL: {
            if (size != sizeof(rknn_perf_detail) || !(m->flags & RKNN_FLAG_COLLECT_PERF_MASK)) return RKNN_ERR_PARAM_INVALID;
            rknn_perf_detail* p = info;
            p->perf_data = m->perf_text;
            p->data_len = strlen(m->perf_text);
            return RKNN_SUCC;
        }
        case RKNN_QUERY_PERF_RUN: {
            if (size != sizeof(rknn_perf_run)) return RKNN_ERR_PARAM_INVALID;
            ((rknn_perf_run*)info)->run_duration = m->last_run_us;
            return RKNN_SUCC;
        }
#endif
        case RKNN_QUERY_SDK_VERSION: {
            if (size != sizeof(rknn_sdk_version)) return RKNN_ERR_PARAM_INVALID;
            rknn_sdk_version* v = info;
            snprintf(v->api_version, sizeof v->api_version, "%s", strchr(LIB_VERSION, ':') + 2);
            snprintf(v->drv_version, sizeof v->drv_version, "0.9.8");
            return RKNN_SUCC;
        }
        case RKNN_QUERY_MEM_SIZE: {
            if (size != sizeof(rknn_mem_size)) return RKNN_ERR_PARAM_INVALID;
            rknn_mem_size* s = info;
            memset(s, 0, sizeof *s);
            s->total_weight_size = 1024u * m->n_out;
            s->total_internal_size = 4u * n_elems(m);
            s->total_dma_allocated_size = (uint64_t)s->total_weight_size + s->total_internal_size + 4096u;
            s->total_sram_size = 8192;
            s->free_sram_size = 4096;
            return RKNN_SUCC;
        }
        case RKNN_QUERY_CUSTOM_STRING: {
            if (size != sizeof(rknn_custom_string)) return RKNN_ERR_PARAM_INVALID;
            snprintf(((rknn_custom_string*)info)->string, 1024, "%s", m->custom_string);
            return RKNN_SUCC;
        }
        default:
            return RKNN_ERR_PARAM_INVALID;
    }
}

static float half_to_float(uint16_t h) {
    int e = (h >> 10) & 0x1f, f = h & 0x3ff;
    float v = e ? ldexpf((float)(f | 0x400), e - 25) : ldexpf((float)f, -24);
    return (h & 0x8000) ? -v : v;
}

static double element(const void* buf, rknn_tensor_type type, size_t i) {
    switch (type) {
        case RKNN_TENSOR_FLOAT32: return ((const float*)buf)[i];
        case RKNN_TENSOR_FLOAT16: return half_to_float(((const uint16_t*)buf)[i]);
        case RKNN_TENSOR_INT8: return ((const int8_t*)buf)[i];
        case RKNN_TENSOR_UINT8: return ((const uint8_t*)buf)[i];
        case RKNN_TENSOR_INT16: return ((const int16_t*)buf)[i];
        case RKNN_TENSOR_INT32: return ((const int32_t*)buf)[i];
        case RKNN_TENSOR_INT64: return (double)((const int64_t*)buf)[i];
        default: return 0;
    }
}

/* Read one input buffer into m->x (NHWC order, real values), as the runtime converts user inputs. */
static int take_input(stub_model* m, const void* buf, uint32_t size, rknn_tensor_type type, rknn_tensor_format fmt,
                      int pass_through, uint32_t w_stride) {
    uint32_t n = n_elems(m);
    rknn_tensor_type t = pass_through ? m->input_type : type;
    uint32_t w = m->n_dims == 4 ? m->dims[2] : 1, stride = (w_stride > w && m->n_dims == 4) ? w_stride : w;
    if (size < (size_t)n / w * stride * type_size(t)) return RKNN_ERR_INPUT_INVALID;
    free(m->x);
    m->x = malloc(n * sizeof(float));
    for (uint32_t i = 0; i < n; i++) {
        size_t src = i;
        if (m->n_dims == 4) {
            uint32_t H = m->dims[1], W = m->dims[2], C = m->dims[3];
            uint32_t c = i % C, x = (i / C) % W, y = (i / C / W) % H, b = i / C / W / H;
            src = fmt == RKNN_TENSOR_NCHW ? ((size_t)(b * C + c) * H + y) * W + x : ((size_t)(b * H + y) * stride + x) * C + c;
        }
        double v = element(buf, t, src);
        if (pass_through && t != RKNN_TENSOR_FLOAT32) v = (v - m->input_zp) * m->input_scale;
        m->x[i] = (float)v;
    }
    m->have_input = 1;
    return RKNN_SUCC;
}

#ifndef STUB_MRT
int rknn_inputs_set(rknn_context ctx, uint32_t n_inputs, rknn_input inputs[]) {
    stub_model* m = model_of(ctx);
    if (!m) return RKNN_ERR_CTX_INVALID;
    if (n_inputs != 1 || inputs[0].index != 0) return RKNN_ERR_PARAM_INVALID;
    return take_input(m, inputs[0].buf, inputs[0].size, inputs[0].type, inputs[0].fmt, inputs[0].pass_through, 0);
}

int rknn_set_core_mask(rknn_context ctx, rknn_core_mask core_mask) {
    stub_model* m = model_of(ctx);
    if (!m) return RKNN_ERR_CTX_INVALID;
    if (core_mask != RKNN_NPU_CORE_ALL && (core_mask & ~7)) return RKNN_ERR_PARAM_INVALID;
    m->core_mask = core_mask;
    return RKNN_SUCC;
}

int rknn_set_input_shapes(rknn_context ctx, uint32_t n_inputs, rknn_tensor_attr attr[]) {
    stub_model* m = model_of(ctx);
    if (!m) return RKNN_ERR_CTX_INVALID;
    if (n_inputs != 1 || !m->n_shapes || attr[0].n_dims != m->n_dims) return RKNN_ERR_PARAM_INVALID;
    for (uint32_t s = 0; s < m->n_shapes; s++) {
        if (!memcmp(m->shapes[s], attr[0].dims, m->n_dims * sizeof(uint32_t))) {
            memcpy(m->dims, attr[0].dims, sizeof m->dims);
            m->have_input = 0;
            return RKNN_SUCC;
        }
    }
    return RKNN_ERR_INPUT_INVALID;
}
#endif

int rknn_register_custom_ops(rknn_context ctx, void* ops, uint32_t n) {
    stub_model* m = model_of(ctx);
    if (!m || !ops) return RKNN_ERR_PARAM_INVALID;
    for (uint32_t i = 0; i < n && m->n_registered < MAX_OPS; i++) {
        /* rknn_custom_op starts with uint32 version, enum target, char op_type[64] */
        snprintf(m->registered_ops[m->n_registered++], 64, "%s", (const char*)ops + 8);
    }
    return RKNN_SUCC;
}

static void write_npy(const char* dir, int index, const char* op, const char* name, const float* v, const stub_model* m) {
    char path[1024], header[256], shape[128] = "";
    for (uint32_t i = 0; i < m->n_dims; i++) {
        char d[16];
        snprintf(d, sizeof d, "%u, ", m->dims[i]);
        strcat(shape, d);
    }
    snprintf(path, sizeof path, "%s/%03d_%s_%s.npy", dir, index, op, name);
    FILE* f = fopen(path, "wb");
    if (!f) return;
    int len = snprintf(header, sizeof header, "{'descr': '<f4', 'fortran_order': False, 'shape': (%s), }", shape);
    int total = 10 + len + 1;
    int pad = (64 - total % 64) % 64;
    unsigned short hlen = (unsigned short)(len + pad + 1);
    fwrite("\x93NUMPY\x01\x00", 1, 8, f);
    fwrite(&hlen, 2, 1, f);
    fwrite(header, 1, (size_t)len, f);
    for (int i = 0; i < pad; i++) fputc(' ', f);
    fputc('\n', f);
    fwrite(v, sizeof(float), n_elems(m), f);
    fclose(f);
}

static void dump_layers(const stub_model* m) {
    const char* level = getenv("RKNN_LOG_LEVEL");
    if (!level || atoi(level) < 5) return;
    const char* dir = getenv("RKNN_DUMP_DIR");
    if (!dir) dir = "/userdata/dumps";
    write_npy(dir, 1, "InputOperator", m->input_name, m->x, m);
    for (uint32_t i = 0; i < m->n_out; i++) write_npy(dir, (int)i + 2, "Mul", m->out[i].name, m->out[i].values, m);
    for (uint32_t i = 0; i < m->n_out; i++)
        write_npy(dir, (int)(m->n_out + 2 + i), "OutputOperator", m->out[i].name, m->out[i].values, m);
}

int rknn_run(rknn_context ctx, rknn_run_extend* extend) {
    (void)extend;
    stub_model* m = model_of(ctx);
    if (!m) return RKNN_ERR_CTX_INVALID;
    if (m->in_mem) {
        int ret = take_input(m, m->in_mem->virt_addr, m->in_mem->size, m->in_attr.type, m->in_attr.fmt,
                             m->in_attr.pass_through, m->in_attr.w_stride);
        if (ret) return ret;
    }
    if (!m->have_input) return RKNN_ERR_INPUT_INVALID;
    if (m->required_op[0]) {
        int found = 0;
        for (uint32_t i = 0; i < m->n_registered; i++) found |= !strcmp(m->registered_ops[i], m->required_op);
        if (!found) {
            fprintf(stderr, "E RKNN: Meet unsupport %s operator\n", m->required_op);
            return RKNN_ERR_MODEL_INVALID;
        }
    }
    uint32_t n = n_elems(m);
    for (uint32_t k = 0; k < m->n_out; k++) {
        stub_output* o = &m->out[k];
        free(o->values);
        free(o->raw);
        o->values = malloc(n * sizeof(float));
        o->raw = malloc(n * type_size(o->type));
        for (uint32_t i = 0; i < n; i++) {
            float y = o->a * m->x[i] + o->b;
            o->values[i] = y;
            if (o->type == RKNN_TENSOR_INT8) {
                long q = lroundf(y / o->scale) + o->zp;
                ((int8_t*)o->raw)[i] = (int8_t)(q < -128 ? -128 : q > 127 ? 127 : q);
            } else {
                ((float*)o->raw)[i] = y;
            }
        }
        if (o->mem) memcpy(o->mem->virt_addr, o->raw, n * type_size(o->type));
    }
    m->last_run_us = 1000 + n;
    format_perf(m);
    dump_layers(m);
    return RKNN_SUCC;
}

#ifndef STUB_MRT
int rknn_outputs_get(rknn_context ctx, uint32_t n_outputs, rknn_output outputs[], rknn_output_extend* extend) {
    (void)extend;
    stub_model* m = model_of(ctx);
    if (!m) return RKNN_ERR_CTX_INVALID;
    if (n_outputs != m->n_out || !m->out[0].raw) return RKNN_ERR_PARAM_INVALID;
    uint32_t n = n_elems(m);
    for (uint32_t k = 0; k < n_outputs; k++) {
        stub_output* o = &m->out[outputs[k].index];
        if (outputs[k].want_float) {
            float* f = malloc(n * sizeof(float));
            for (uint32_t i = 0; i < n; i++)
                f[i] = o->type == RKNN_TENSOR_INT8 ? (((int8_t*)o->raw)[i] - o->zp) * o->scale : ((float*)o->raw)[i];
            outputs[k].buf = f;
            outputs[k].size = n * sizeof(float);
        } else {
            outputs[k].size = n * (uint32_t)type_size(o->type);
            outputs[k].buf = malloc(outputs[k].size);
            memcpy(outputs[k].buf, o->raw, outputs[k].size);
        }
    }
    return RKNN_SUCC;
}

int rknn_outputs_release(rknn_context ctx, uint32_t n_outputs, rknn_output outputs[]) {
    (void)ctx;
    for (uint32_t k = 0; k < n_outputs; k++) {
        free(outputs[k].buf);
        outputs[k].buf = NULL;
    }
    return RKNN_SUCC;
}
#endif

rknn_tensor_mem* rknn_create_mem(rknn_context ctx, uint32_t size) {
    (void)ctx;
    rknn_tensor_mem* mem = calloc(1, sizeof *mem);
    mem->virt_addr = calloc(1, size);
    mem->size = size;
    mem->fd = -1;
    mem->flags = 1;
    return mem;
}

int rknn_destroy_mem(rknn_context ctx, rknn_tensor_mem* mem) {
    stub_model* m = model_of(ctx);
    if (m && m->in_mem == mem) m->in_mem = NULL;
    for (uint32_t k = 0; m && k < m->n_out; k++)
        if (m->out[k].mem == mem) m->out[k].mem = NULL;
    free(mem->virt_addr);
    free(mem);
    return RKNN_SUCC;
}

int rknn_set_io_mem(rknn_context ctx, rknn_tensor_mem* mem, rknn_tensor_attr* attr) {
    stub_model* m = model_of(ctx);
    if (!m || !mem || !attr) return RKNN_ERR_PARAM_INVALID;
    if (!strcmp(attr->name, m->input_name)) {
        m->in_mem = mem;
        m->in_attr = *attr;
        return RKNN_SUCC;
    }
    for (uint32_t k = 0; k < m->n_out; k++) {
        if (!strcmp(attr->name, m->out[k].name)) {
            if (mem->size < n_elems(m) * type_size(m->out[k].type)) return RKNN_ERR_PARAM_INVALID;
            m->out[k].mem = mem;
            return RKNN_SUCC;
        }
    }
    return RKNN_ERR_PARAM_INVALID;
}
