/* A stand-in for librknnrt.so (and, with -DSTUB_MRT, librknnmrt.so) for tests without a board.
 *
 * It loads a tiny text model of the tests' own (see tests/rknnrt/stub_build.py), alone or appended to a
 * real .rknn container, and computes
 * output[i] = a * input[i % n_inputs] + b per element (inputs taken in NHWC order), with the real
 * runtime's conventions: quantized int8 tensors, want_float dequantization, NCHW/NHWC inputs,
 * pass_through, dynamic shapes, core masks, perf detail text, memory sizes, zero-copy memory,
 * custom-op registration and per-layer .npy dumps under RKNN_LOG_LEVEL>=5.
 */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rknn_stub_api.h"

#define MAX_TENSORS 4
#define MAX_CONTEXTS 64
#define MAX_DYN 8
#define MAX_OPS 8

#ifdef STUB_MRT
#define LIB_NAME "librknnmrt"
#define DEFAULT_DUMP_DIR "/tmp/dumps"
#else
#define LIB_NAME "librknnrt"
#define DEFAULT_DUMP_DIR "/userdata/dumps"
#endif

__attribute__((used)) static const char version_line[] = LIB_NAME " version: 2.3.2 (stub0000@2025-04-09T09:08:16)";

typedef struct {
    char name[RKNN_MAX_NAME_LEN];
    rknn_tensor_type type;
    rknn_tensor_format fmt;
    uint32_t n_dims;
    uint32_t dims[RKNN_MAX_DIMS];
    int32_t zp;
    float scale;
} tensor_decl;

typedef struct {
    int n_in, n_out;
    tensor_decl in[MAX_TENSORS], out[MAX_TENSORS];
    float a, b;
    uint32_t weight, internal, perf_us;
    uint64_t dma;
    char custom[1024];
    char requires_op[64];
    int n_dyn;
    uint32_t dyn[MAX_DYN][RKNN_MAX_DIMS];
    int shape_set;
    uint32_t flags, core_mask;
    int n_ops;
    char ops[MAX_OPS][64];
    float* in_vals[MAX_TENSORS];
    int in_ready[MAX_TENSORS];
    void* out_raw[MAX_TENSORS];
    rknn_tensor_mem* io_in[MAX_TENSORS];
    rknn_tensor_attr io_in_attr[MAX_TENSORS];
    rknn_tensor_mem* io_out[MAX_TENSORS];
    int ran;
    char* perf_text;
    int* weight_refs; /* contexts sharing this model's weights (rknn_dup_context) */
} stub_ctx;

static stub_ctx* contexts[MAX_CONTEXTS];
/* The weight bytes held for all loaded models: a model's once, however many contexts share it. */
static uint64_t resident_weight;

/* Not in librknnrt: what a test reads to count the models held in memory. */
uint64_t rknn_stub_resident_weight(void) { return resident_weight; }

static stub_ctx* get_ctx(rknn_context c) {
    if (c == 0 || c > MAX_CONTEXTS) return NULL;
    return contexts[c - 1];
}

static size_t type_size(rknn_tensor_type t) {
    switch (t) {
        case RKNN_TENSOR_FLOAT32: return 4;
        case RKNN_TENSOR_FLOAT16: case RKNN_TENSOR_INT16: return 2;
        default: return 1;
    }
}

#ifndef STUB_MRT
static const char* type_name(rknn_tensor_type t) {
    switch (t) {
        case RKNN_TENSOR_FLOAT32: return "FLOAT32";
        case RKNN_TENSOR_FLOAT16: return "FLOAT16";
        case RKNN_TENSOR_INT8: return "INT8";
        case RKNN_TENSOR_UINT8: return "UINT8";
        default: return "INT16";
    }
}
#endif

static int parse_type(const char* s, rknn_tensor_type* t) {
    if (!strcmp(s, "FP32")) *t = RKNN_TENSOR_FLOAT32;
    else if (!strcmp(s, "FP16")) *t = RKNN_TENSOR_FLOAT16;
    else if (!strcmp(s, "INT8")) *t = RKNN_TENSOR_INT8;
    else if (!strcmp(s, "UINT8")) *t = RKNN_TENSOR_UINT8;
    else return -1;
    return 0;
}

static int parse_fmt(const char* s, rknn_tensor_format* f) {
    if (!strcmp(s, "NCHW")) *f = RKNN_TENSOR_NCHW;
    else if (!strcmp(s, "NHWC")) *f = RKNN_TENSOR_NHWC;
    else if (!strcmp(s, "UNDEFINED")) *f = RKNN_TENSOR_UNDEFINED;
    else return -1;
    return 0;
}

static uint32_t parse_dims(char* s, uint32_t* dims) {
    uint32_t n = 0;
    for (char* tok = strtok(s, ","); tok && n < RKNN_MAX_DIMS; tok = strtok(NULL, ",")) dims[n++] = (uint32_t)atoi(tok);
    return n;
}

static int parse_tensor(char* rest, tensor_decl* t) {
    char name[RKNN_MAX_NAME_LEN], type[16], fmt[16], dims[128];
    t->zp = 0;
    t->scale = 1.0f;
    int n = sscanf(rest, "%255s %15s %15s %127s %d %f", name, type, fmt, dims, &t->zp, &t->scale);
    if (n < 4 || parse_type(type, &t->type) || parse_fmt(fmt, &t->fmt)) return -1;
    strcpy(t->name, name);
    t->n_dims = parse_dims(dims, t->dims);
    return t->n_dims ? 0 : -1;
}

/* The model's text: the whole file, or, in a real .rknn container (magic "RKNN") made by the toolkit,
 * what follows the line "rknn-stub 1" appended after the container's own bytes. */
static FILE* open_model(const char* path) {
    FILE* f = fopen(path, "rb");
    if (!f) return NULL;
    char magic[4];
    if (fread(magic, 1, sizeof magic, f) != sizeof magic || memcmp(magic, "RKNN", 4)) {
        rewind(f);
        return f;
    }
    static const char marker[] = "\nrknn-stub 1\n";
    size_t matched = 0;
    long offset = 4;
    int ch;
    while ((ch = fgetc(f)) != EOF) {
        offset++;
        matched = (ch == marker[matched]) ? matched + 1 : (ch == marker[0] ? 1 : 0);
        if (matched == sizeof marker - 1) {
            fseek(f, offset - (long)(sizeof marker - 2), SEEK_SET);
            return f;
        }
    }
    fclose(f);
    return NULL;
}

static int load_model(stub_ctx* c, const char* path) {
    FILE* f = open_model(path);
    if (!f) return -1;
    char line[1024];
    int ok = fgets(line, sizeof line, f) && !strncmp(line, "rknn-stub 1", 11);
    c->a = 1.0f;
    c->dma = 0;
    while (ok && fgets(line, sizeof line, f)) {
        line[strcspn(line, "\n")] = 0;
        char* sp = strchr(line, ' ');
        if (!sp) continue;
        *sp = 0;
        char* rest = sp + 1;
        if (!strcmp(line, "input") && c->n_in < MAX_TENSORS) ok = !parse_tensor(rest, &c->in[c->n_in++]);
        else if (!strcmp(line, "output") && c->n_out < MAX_TENSORS) ok = !parse_tensor(rest, &c->out[c->n_out++]);
        else if (!strcmp(line, "a")) c->a = strtof(rest, NULL);
        else if (!strcmp(line, "b")) c->b = strtof(rest, NULL);
        else if (!strcmp(line, "weight")) c->weight = (uint32_t)strtoul(rest, NULL, 10);
        else if (!strcmp(line, "internal")) c->internal = (uint32_t)strtoul(rest, NULL, 10);
        else if (!strcmp(line, "dma")) c->dma = strtoull(rest, NULL, 10);
        else if (!strcmp(line, "perf_us")) c->perf_us = (uint32_t)strtoul(rest, NULL, 10);
        else if (!strcmp(line, "custom_string")) snprintf(c->custom, sizeof c->custom, "%s", rest);
        else if (!strcmp(line, "requires_op")) snprintf(c->requires_op, sizeof c->requires_op, "%s", rest);
        else if (!strcmp(line, "dynamic")) {
            for (char* shape = strtok(rest, ";"); shape && c->n_dyn < MAX_DYN; shape = strtok(NULL, ";")) {
                char* saveptr;
                uint32_t n = 0;
                for (char* d = strtok_r(shape, ",", &saveptr); d && n < RKNN_MAX_DIMS; d = strtok_r(NULL, ",", &saveptr))
                    c->dyn[c->n_dyn][n++] = (uint32_t)atoi(d);
                c->n_dyn++;
            }
        }
    }
    fclose(f);
    return ok && c->n_in > 0 && c->n_out > 0 ? 0 : -1;
}

/* The current dims of input 0's shape drive every tensor of a dynamic model. */
static const uint32_t* in_dims(stub_ctx* c, int i) { return c->in[i].dims; }

static uint32_t n_elems_of(uint32_t n_dims, const uint32_t* dims) {
    uint32_t n = 1;
    for (uint32_t i = 0; i < n_dims; i++) n *= dims[i];
    return n;
}

static void fill_attr(const tensor_decl* t, uint32_t index, rknn_tensor_attr* a) {
    memset(a, 0, sizeof *a);
    a->index = index;
    a->n_dims = t->n_dims;
    memcpy(a->dims, t->dims, sizeof a->dims);
    strcpy(a->name, t->name);
    a->n_elems = n_elems_of(t->n_dims, t->dims);
    a->size = a->n_elems * (uint32_t)type_size(t->type);
    a->fmt = t->fmt;
    a->type = t->type;
    a->qnt_type = t->type == RKNN_TENSOR_INT8 ? RKNN_TENSOR_QNT_AFFINE_ASYMMETRIC : RKNN_TENSOR_QNT_NONE;
    a->zp = t->zp;
    a->scale = t->scale;
    a->w_stride = t->n_dims == 4 ? t->dims[2] : 0;
    a->size_with_stride = a->size;
}

/* Output i mirrors input i % n_in: a dynamic model's outputs follow the current input shape. */
static tensor_decl current_output(stub_ctx* c, int i) {
    tensor_decl t = c->out[i];
    if (c->n_dyn) {
        const tensor_decl* src = &c->in[i % c->n_in];
        t.n_dims = src->n_dims;
        memcpy(t.dims, in_dims(c, i % c->n_in), sizeof t.dims);
    }
    return t;
}

static float half_to_float(uint16_t h) {
    int e = (h >> 10) & 0x1f, m = h & 0x3ff;
    float v = e == 0 ? ldexpf((float)m, -24) : ldexpf((float)(m | 0x400), e - 25);
    return (h & 0x8000) ? -v : v;
}

static float quant_roundtrip(float v, const tensor_decl* t) {
    float q = roundf(v / t->scale) + (float)t->zp;
    if (q < -128) q = -128;
    if (q > 127) q = 127;
    return (q - (float)t->zp) * t->scale;
}

static float element(const void* buf, rknn_tensor_type type, size_t i, const tensor_decl* t, int raw) {
    switch (type) {
        case RKNN_TENSOR_FLOAT32: return ((const float*)buf)[i];
        case RKNN_TENSOR_FLOAT16: return half_to_float(((const uint16_t*)buf)[i]);
        case RKNN_TENSOR_UINT8: return (float)((const uint8_t*)buf)[i];
        case RKNN_TENSOR_INT16: return (float)((const int16_t*)buf)[i];
        case RKNN_TENSOR_INT8: {
            float v = (float)((const int8_t*)buf)[i];
            return raw ? (v - (float)t->zp) * t->scale : v;
        }
    }
    return 0;
}

/* Reads one input as the runtime would: converts type, NCHW -> NHWC, and, for an int8 model input,
 * quantizes the value unless it already arrives quantized (pass_through or int8 data). */
static int load_input(stub_ctx* c, uint32_t idx, const void* buf, uint32_t size, rknn_tensor_type type,
                      rknn_tensor_format fmt, int pass_through) {
    const tensor_decl* t = &c->in[idx];
    if (c->n_dyn && !c->shape_set) return RKNN_ERR_INPUT_INVALID;
    if (pass_through && (type != t->type)) return RKNN_ERR_INPUT_INVALID;
    const uint32_t* dims = in_dims(c, (int)idx);
    uint32_t n = n_elems_of(t->n_dims, dims);
    if (size < n * type_size(type)) return RKNN_ERR_INPUT_INVALID;
    int raw = pass_through || (type == RKNN_TENSOR_INT8 && t->type == RKNN_TENSOR_INT8);
    float* vals = realloc(c->in_vals[idx], n * sizeof(float));
    if (!vals) return RKNN_ERR_MALLOC_FAIL;
    c->in_vals[idx] = vals;
    int transpose = t->n_dims == 4 && fmt == RKNN_TENSOR_NCHW && t->fmt == RKNN_TENSOR_NHWC && !pass_through;
    uint32_t H = dims[1], W = dims[2], C = dims[3];
    for (uint32_t i = 0; i < n; i++) {
        size_t src = i;
        if (transpose) {
            uint32_t ch = i % C, w = (i / C) % W, h = (i / C / W) % H, b = i / C / W / H;
            src = (((size_t)b * C + ch) * H + h) * W + w;
        }
        float v = element(buf, type, src, t, raw);
        vals[i] = (!raw && t->type == RKNN_TENSOR_INT8) ? quant_roundtrip(v, t) : v;
    }
    c->in_ready[idx] = 1;
    return RKNN_SUCC;
}

static int registered(stub_ctx* c, const char* op) {
    for (int i = 0; i < c->n_ops; i++)
        if (!strcmp(c->ops[i], op)) return 1;
    return 0;
}

static void shape_text(char* out, size_t cap, uint32_t n_dims, const uint32_t* dims, const char* sep) {
    size_t len = 0;
    out[0] = 0;
    for (uint32_t i = 0; i < n_dims && len < cap; i++)
        len += (size_t)snprintf(out + len, cap - len, "%s%u", i ? sep : "", dims[i]);
}

static void write_npy(const char* dir, int id, const char* op, const char* name, uint32_t n_dims,
                      const uint32_t* dims, const float* data) {
    char path[1024], shape_us[256], shape_py[256], header[512];
    shape_text(shape_us, sizeof shape_us, n_dims, dims, "_");
    shape_text(shape_py, sizeof shape_py, n_dims, dims, ", ");
    snprintf(path, sizeof path, "%s/%03d_%s_%s_shape_%s_float.npy", dir, id, op, name, shape_us);
    FILE* f = fopen(path, "wb");
    if (!f) {
        fprintf(stderr, "E RKNN: failed open dump path: %s\n", path);
        return;
    }
    int len = snprintf(header, sizeof header, "{'descr': '<f4', 'fortran_order': False, 'shape': (%s%s), }",
                       shape_py, n_dims == 1 ? "," : "");
    int total = 10 + len + 1;
    int pad = (64 - total % 64) % 64;
    memset(header + len, ' ', (size_t)pad);
    header[len + pad] = '\n';
    uint16_t hlen = (uint16_t)(len + pad + 1);
    fwrite("\x93NUMPY\x01\x00", 1, 8, f);
    fwrite(&hlen, 2, 1, f);
    fwrite(header, 1, hlen, f);
    fwrite(data, sizeof(float), n_elems_of(n_dims, dims), f);
    fclose(f);
}

static void dump_layers(stub_ctx* c, float* const* outs) {
    const char* level = getenv("RKNN_LOG_LEVEL");
    if (!level || atoi(level) < 5) return;
    const char* dir = getenv("RKNN_DUMP_DIR");
    if (!dir || !*dir) dir = DEFAULT_DUMP_DIR;
    int id = 0;
    for (int i = 0; i < c->n_in; i++)
        write_npy(dir, id++, "InputOperator", c->in[i].name, c->in[i].n_dims, in_dims(c, i), c->in_vals[i]);
    for (int i = 0; i < c->n_out; i++) {
        tensor_decl t = current_output(c, i);
        char name[300];
        snprintf(name, sizeof name, "%s_conv", t.name);
        write_npy(dir, id++, "Conv", name, t.n_dims, t.dims, outs[i]);
    }
}

#ifndef STUB_MRT
static void append(char** buf, size_t* len, size_t* cap, const char* fmt, ...) {
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int n = vsnprintf(*buf + *len, *cap - *len, fmt, ap);
        va_end(ap);
        if ((size_t)n < *cap - *len) {
            *len += (size_t)n;
            return;
        }
        *cap *= 2;
        *buf = realloc(*buf, *cap);
    }
}

static void workload_text(stub_ctx* c, char* out, size_t cap) {
    int cores = 0;
    double share[3] = {0, 0, 0};
    for (int k = 0; k < 3; k++)
        if (c->core_mask & (1u << k)) cores++;
    if (c->core_mask == 0 || c->core_mask == RKNN_NPU_CORE_ALL || cores == 0) {
        share[0] = 100.0;
    } else {
        for (int k = 0; k < 3; k++)
            if (c->core_mask & (1u << k)) share[k] = 100.0 / cores;
    }
    snprintf(out, cap, "%.1f%%/%.1f%%/%.1f%%--Up:%.1f%%", share[0], share[1], share[2], cores > 1 ? 100.0 * (cores - 1) : 0.0);
}

static void build_perf_text(stub_ctx* c) {
    size_t len = 0, cap = 1024;
    char* s = malloc(cap);
    char work[64], shp[128], shp2[128];
    workload_text(c, work, sizeof work);
    append(&s, &len, &cap, "Network Layer Information Table\n");
    append(&s, &len, &cap, "ID | OpType | DataType | Target | InputShape | OutputShape | DDRCycles | NPUCycles | MaxCycles | "
                           "Time(us) | MacUsage(%%) | WorkLoad(0/1/2)--ImproveTherical | TaskNumber | RW(KB) | FullName\n");
    int id = 1;
    uint32_t total = 0, t_in = 0, t_conv = 0, t_outop = 0;
    for (int i = 0; i < c->n_in; i++, id++) {
        uint32_t us = c->perf_us * (uint32_t)id;
        total += us;
        t_in += us;
        shape_text(shp, sizeof shp, c->in[i].n_dims, in_dims(c, i), ",");
        append(&s, &len, &cap, "%d | InputOperator | %s | CPU | \\ | (%s) | 0 | 0 | 0 | %u | \\ | %s | 0/0 | 0 | InputOperator:%s\n",
               id, type_name(c->in[i].type), shp, us, work, c->in[i].name);
    }
    for (int i = 0; i < c->n_out; i++, id++) {
        uint32_t us = c->perf_us * (uint32_t)id;
        total += us;
        t_conv += us;
        tensor_decl t = current_output(c, i);
        shape_text(shp, sizeof shp, c->in[i % c->n_in].n_dims, in_dims(c, i % c->n_in), ",");
        shape_text(shp2, sizeof shp2, t.n_dims, t.dims, ",");
        append(&s, &len, &cap, "%d | ConvRelu | INT8 | NPU | (%s),(1,1,1,1),(1) | (%s) | %u | %u | %u | %u | 0.00/0.00/0.00 | %s | 1/0 | %u | Conv:%s_conv\n",
               id, shp, shp2, 100u * id, 200u * id, 200u * id, us, work, 4u * id, t.name);
    }
    for (int i = 0; i < c->n_out; i++, id++) {
        uint32_t us = c->perf_us * (uint32_t)id;
        total += us;
        t_outop += us;
        tensor_decl t = current_output(c, i);
        shape_text(shp, sizeof shp, t.n_dims, t.dims, ",");
        append(&s, &len, &cap, "%d | OutputOperator | %s | CPU | (%s) | \\ | 0 | 0 | 0 | %u | \\ | %s | 0/0 | 0 | OutputOperator:%s\n",
               id, type_name(t.type), shp, us, work, t.name);
    }
    append(&s, &len, &cap, "\nTotal Operator Elapsed Per Frame Time(us): %u\nTotal Memory Read/Write Per Frame Size(KB): %.1f\n\n",
           total, 1.5 * c->n_out);
    append(&s, &len, &cap, "Operator Time Consuming Ranking Table\n"
                           "OpType | CallNumber | CPUTime(us) | GPUTime(us) | NPUTime(us) | TotalTime(us) | TimeRatio(%%)\n");
    append(&s, &len, &cap, "ConvRelu | %d | 0 | 0 | %u | %u | %.2f%%\n", c->n_out, t_conv, t_conv, 100.0 * t_conv / (total ? total : 1));
    append(&s, &len, &cap, "InputOperator | %d | %u | 0 | 0 | %u | %.2f%%\n", c->n_in, t_in, t_in, 100.0 * t_in / (total ? total : 1));
    append(&s, &len, &cap, "OutputOperator | %d | %u | 0 | 0 | %u | %.2f%%\n", c->n_out, t_outop, t_outop, 100.0 * t_outop / (total ? total : 1));
    free(c->perf_text);
    c->perf_text = s;
}

static uint32_t perf_total(stub_ctx* c) {
    uint32_t n = (uint32_t)(c->n_in + 2 * c->n_out), total = 0;
    for (uint32_t id = 1; id <= n; id++) total += c->perf_us * id;
    return total;
}
#endif

static int place_ctx(stub_ctx* c, rknn_context* context) {
    for (int i = 0; i < MAX_CONTEXTS; i++) {
        if (!contexts[i]) {
            contexts[i] = c;
            *context = (rknn_context)(i + 1);
            return 0;
        }
    }
    return -1;
}

int rknn_init(rknn_context* context, void* model, uint32_t size, uint32_t flag, rknn_init_extend* extend) {
    (void)extend;
    if (!context || !model || size != 0) return RKNN_ERR_PARAM_INVALID;
    stub_ctx* c = calloc(1, sizeof *c);
    if (!c) return RKNN_ERR_MALLOC_FAIL;
    if (load_model(c, (const char*)model)) {
        free(c);
        return RKNN_ERR_MODEL_INVALID;
    }
    c->flags = flag;
    if (c->n_dyn)
        memcpy(c->in[0].dims, c->dyn[c->n_dyn - 1], sizeof c->in[0].dims);
    c->weight_refs = calloc(1, sizeof *c->weight_refs);
    if (!c->weight_refs || place_ctx(c, context)) {
        free(c->weight_refs);
        free(c);
        return RKNN_ERR_MALLOC_FAIL;
    }
    *c->weight_refs = 1;
    resident_weight += c->weight;
    return RKNN_SUCC;
}

/* A new context over the weights of `context_in` (the real runtime shares them between the two):
   its own inputs, outputs, bound memory, core mask and shape; the model's declarations copied. */
int rknn_dup_context(rknn_context* context_in, rknn_context* context_out) {
    stub_ctx* src = context_in ? get_ctx(*context_in) : NULL;
    if (!src || !context_out) return RKNN_ERR_PARAM_INVALID;
    stub_ctx* c = malloc(sizeof *c);
    if (!c) return RKNN_ERR_MALLOC_FAIL;
    *c = *src;
    memset(c->in_vals, 0, sizeof c->in_vals);
    memset(c->in_ready, 0, sizeof c->in_ready);
    memset(c->out_raw, 0, sizeof c->out_raw);
    memset(c->io_in, 0, sizeof c->io_in);
    memset(c->io_out, 0, sizeof c->io_out);
    c->ran = 0;
    c->perf_text = NULL;
    c->n_ops = 0;
    c->core_mask = 0;
    c->shape_set = 0;
    if (c->n_dyn)
        memcpy(c->in[0].dims, c->dyn[c->n_dyn - 1], sizeof c->in[0].dims);
    if (place_ctx(c, context_out)) {
        free(c);
        return RKNN_ERR_MALLOC_FAIL;
    }
    (*c->weight_refs)++;
    return RKNN_SUCC;
}

int rknn_destroy(rknn_context context) {
    stub_ctx* c = get_ctx(context);
    if (!c) return RKNN_ERR_CTX_INVALID;
    for (int i = 0; i < MAX_TENSORS; i++) {
        free(c->in_vals[i]);
        free(c->out_raw[i]);
    }
    free(c->perf_text);
    if (--*c->weight_refs == 0) {
        resident_weight -= c->weight;
        free(c->weight_refs);
    }
    free(c);
    contexts[context - 1] = NULL;
    return RKNN_SUCC;
}

static int query_attr(stub_ctx* c, rknn_query_cmd cmd, rknn_tensor_attr* a) {
    int input = cmd == RKNN_QUERY_INPUT_ATTR || cmd == RKNN_QUERY_NATIVE_INPUT_ATTR || cmd == RKNN_QUERY_CURRENT_INPUT_ATTR;
    int n = input ? c->n_in : c->n_out;
    if (a->index >= (uint32_t)n) return RKNN_ERR_PARAM_INVALID;
    if ((cmd == RKNN_QUERY_CURRENT_INPUT_ATTR || cmd == RKNN_QUERY_CURRENT_OUTPUT_ATTR) && c->n_dyn && !c->shape_set)
        return RKNN_ERR_FAIL;
    uint32_t idx = a->index;
    if (input) {
        fill_attr(&c->in[idx], idx, a);
    } else {
        tensor_decl t = current_output(c, (int)idx);
        fill_attr(&t, idx, a);
    }
    return RKNN_SUCC;
}

int rknn_query(rknn_context context, rknn_query_cmd cmd, void* info, uint32_t size) {
    stub_ctx* c = get_ctx(context);
    if (!c) return RKNN_ERR_CTX_INVALID;
    if (!info) return RKNN_ERR_PARAM_INVALID;
    switch (cmd) {
        case RKNN_QUERY_IN_OUT_NUM: {
            if (size < sizeof(rknn_input_output_num)) return RKNN_ERR_PARAM_INVALID;
            rknn_input_output_num* io = info;
            io->n_input = (uint32_t)c->n_in;
            io->n_output = (uint32_t)c->n_out;
            return RKNN_SUCC;
        }
        case RKNN_QUERY_INPUT_ATTR: case RKNN_QUERY_OUTPUT_ATTR: case RKNN_QUERY_NATIVE_INPUT_ATTR:
        case RKNN_QUERY_NATIVE_OUTPUT_ATTR: case RKNN_QUERY_CURRENT_INPUT_ATTR: case RKNN_QUERY_CURRENT_OUTPUT_ATTR:
            if (size < sizeof(rknn_tensor_attr)) return RKNN_ERR_PARAM_INVALID;
            return query_attr(c, cmd, info);
        case RKNN_QUERY_INPUT_DYNAMIC_RANGE: {
            rknn_input_range* r = info;
            if (size < sizeof *r || r->index >= (uint32_t)c->n_in) return RKNN_ERR_PARAM_INVALID;
            uint32_t idx = r->index;
            memset(r, 0, sizeof *r);
            r->index = idx;
            r->fmt = c->in[idx].fmt;
            strcpy(r->name, c->in[idx].name);
            r->n_dims = c->in[idx].n_dims;
            r->shape_number = idx == 0 ? (uint32_t)c->n_dyn : 0;
            for (int s = 0; idx == 0 && s < c->n_dyn; s++) memcpy(r->dyn_range[s], c->dyn[s], sizeof c->dyn[s]);
            return RKNN_SUCC;
        }
        case RKNN_QUERY_PERF_DETAIL: {
#ifdef STUB_MRT
            return RKNN_ERR_PARAM_INVALID;
#else
            if (!(c->flags & RKNN_FLAG_COLLECT_PERF_MASK) || !c->ran || size < sizeof(rknn_perf_detail)) return RKNN_ERR_PARAM_INVALID;
            build_perf_text(c);
            rknn_perf_detail* d = info;
            d->perf_data = c->perf_text;
            d->data_len = strlen(c->perf_text);
            return RKNN_SUCC;
#endif
        }
        case RKNN_QUERY_PERF_RUN: {
#ifdef STUB_MRT
            return RKNN_ERR_PARAM_INVALID;
#else
            if (!c->ran || size < sizeof(rknn_perf_run)) return RKNN_ERR_PARAM_INVALID;
            ((rknn_perf_run*)info)->run_duration = (int64_t)perf_total(c);
            return RKNN_SUCC;
#endif
        }
        case RKNN_QUERY_SDK_VERSION: {
            rknn_sdk_version* v = info;
            if (size < sizeof *v) return RKNN_ERR_PARAM_INVALID;
            snprintf(v->api_version, sizeof v->api_version, "2.3.2 (stub0000@2025-04-09T09:08:16)");
            snprintf(v->drv_version, sizeof v->drv_version, "0.9.8");
            return RKNN_SUCC;
        }
        case RKNN_QUERY_MEM_SIZE: {
            rknn_mem_size* m = info;
            if (size < sizeof *m) return RKNN_ERR_PARAM_INVALID;
            memset(m, 0, sizeof *m);
            m->total_weight_size = c->weight;
            m->total_internal_size = c->internal;
            m->total_dma_allocated_size = c->dma;
            m->total_sram_size = 4096;
            m->free_sram_size = 1024;
            return RKNN_SUCC;
        }
        case RKNN_QUERY_CUSTOM_STRING: {
            if (size < sizeof(rknn_custom_string)) return RKNN_ERR_PARAM_INVALID;
            snprintf(((rknn_custom_string*)info)->string, 1024, "%s", c->custom);
            return RKNN_SUCC;
        }
    }
    return RKNN_ERR_PARAM_INVALID;
}

int rknn_run(rknn_context context, rknn_run_extend* extend) {
    (void)extend;
    stub_ctx* c = get_ctx(context);
    if (!c) return RKNN_ERR_CTX_INVALID;
    if (c->requires_op[0] && !registered(c, c->requires_op)) {
        fprintf(stderr, "E RKNN: Meet unsupport %s operator\n", c->requires_op);
        return RKNN_ERR_MODEL_INVALID;
    }
    for (int i = 0; i < c->n_in; i++) {
        if (c->io_in[i]) {
            const rknn_tensor_attr* a = &c->io_in_attr[i];
            int ret = load_input(c, (uint32_t)i, c->io_in[i]->virt_addr, c->io_in[i]->size, a->type, a->fmt, a->pass_through);
            if (ret) return ret;
        }
        if (!c->in_ready[i]) return RKNN_ERR_INPUT_INVALID;
    }
    float* outs[MAX_TENSORS] = {0};
    for (int i = 0; i < c->n_out; i++) {
        tensor_decl t = current_output(c, i);
        uint32_t n = n_elems_of(t.n_dims, t.dims);
        const float* src = c->in_vals[i % c->n_in];
        outs[i] = malloc(n * sizeof(float));
        free(c->out_raw[i]);
        c->out_raw[i] = malloc(n * type_size(t.type));
        for (uint32_t k = 0; k < n; k++) {
            float y = c->a * src[k] + c->b;
            outs[i][k] = y;
            if (t.type == RKNN_TENSOR_INT8) {
                float q = roundf(y / t.scale) + (float)t.zp;
                ((int8_t*)c->out_raw[i])[k] = (int8_t)(q < -128 ? -128 : q > 127 ? 127 : q);
            } else {
                ((float*)c->out_raw[i])[k] = y;
            }
        }
        if (c->io_out[i]) memcpy(c->io_out[i]->virt_addr, c->out_raw[i], c->io_out[i]->size < n * type_size(t.type) ? c->io_out[i]->size : n * type_size(t.type));
    }
    dump_layers(c, outs);
    for (int i = 0; i < c->n_out; i++) free(outs[i]);
    c->ran = 1;
    return RKNN_SUCC;
}

rknn_tensor_mem* rknn_create_mem(rknn_context context, uint32_t size) {
    if (!get_ctx(context)) return NULL;
    rknn_tensor_mem* m = calloc(1, sizeof *m);
    m->virt_addr = calloc(1, size);
    m->size = size;
    m->fd = -1;
    m->flags = 1;
    return m;
}

int rknn_destroy_mem(rknn_context context, rknn_tensor_mem* mem) {
    stub_ctx* c = get_ctx(context);
    if (!c || !mem) return RKNN_ERR_PARAM_INVALID;
    for (int i = 0; i < MAX_TENSORS; i++) {
        if (c->io_in[i] == mem) c->io_in[i] = NULL;
        if (c->io_out[i] == mem) c->io_out[i] = NULL;
    }
    free(mem->virt_addr);
    free(mem);
    return RKNN_SUCC;
}

int rknn_set_io_mem(rknn_context context, rknn_tensor_mem* mem, rknn_tensor_attr* attr) {
    stub_ctx* c = get_ctx(context);
    if (!c || !mem || !attr) return RKNN_ERR_PARAM_INVALID;
    for (int i = 0; i < c->n_in; i++) {
        if (!strcmp(attr->name, c->in[i].name)) {
            c->io_in[i] = mem;
            c->io_in_attr[i] = *attr;
            return RKNN_SUCC;
        }
    }
    for (int i = 0; i < c->n_out; i++) {
        if (!strcmp(attr->name, c->out[i].name)) {
            c->io_out[i] = mem;
            return RKNN_SUCC;
        }
    }
    return RKNN_ERR_PARAM_INVALID;
}

#ifndef STUB_MRT
int rknn_register_custom_ops(rknn_context context, rknn_custom_op* ops, uint32_t n) {
    stub_ctx* c = get_ctx(context);
    if (!c) return RKNN_ERR_CTX_INVALID;
    for (uint32_t i = 0; i < n && c->n_ops < MAX_OPS; i++) snprintf(c->ops[c->n_ops++], 64, "%s", ops[i].op_type);
    return RKNN_SUCC;
}

/* A test hook, not in the real runtime: the output bytes rknn_outputs_get has written into buffers
 * of its own (which the caller must copy out before rknn_outputs_release); outputs it wrote into the
 * caller's memory (is_prealloc) are not counted. */
unsigned long long rknn_stub_owned_output_bytes = 0;

int rknn_inputs_set(rknn_context context, uint32_t n_inputs, rknn_input inputs[]) {
    stub_ctx* c = get_ctx(context);
    if (!c) return RKNN_ERR_CTX_INVALID;
    if (n_inputs != (uint32_t)c->n_in) return RKNN_ERR_PARAM_INVALID;
    for (uint32_t i = 0; i < n_inputs; i++) {
        if (inputs[i].index >= n_inputs) return RKNN_ERR_PARAM_INVALID;
        int ret = load_input(c, inputs[i].index, inputs[i].buf, inputs[i].size, inputs[i].type, inputs[i].fmt, inputs[i].pass_through);
        if (ret) return ret;
    }
    return RKNN_SUCC;
}

int rknn_outputs_get(rknn_context context, uint32_t n_outputs, rknn_output outputs[], rknn_output_extend* extend) {
    (void)extend;
    stub_ctx* c = get_ctx(context);
    if (!c) return RKNN_ERR_CTX_INVALID;
    if (!c->ran || n_outputs > (uint32_t)c->n_out) return RKNN_ERR_OUTPUT_INVALID;
    for (uint32_t i = 0; i < n_outputs; i++) {
        uint32_t idx = outputs[i].index;
        if (idx >= (uint32_t)c->n_out) return RKNN_ERR_PARAM_INVALID;
        tensor_decl t = current_output(c, (int)idx);
        uint32_t n = n_elems_of(t.n_dims, t.dims);
        uint32_t bytes = outputs[i].want_float ? n * 4 : n * (uint32_t)type_size(t.type);
        void* dst;
        if (outputs[i].is_prealloc) {
            if (outputs[i].size < bytes) return RKNN_ERR_OUTPUT_INVALID;
            dst = outputs[i].buf;
        } else {
            dst = malloc(bytes);
            outputs[i].buf = dst;
            rknn_stub_owned_output_bytes += bytes;
        }
        outputs[i].size = bytes;
        if (outputs[i].want_float && t.type == RKNN_TENSOR_INT8) {
            for (uint32_t k = 0; k < n; k++) ((float*)dst)[k] = ((float)((int8_t*)c->out_raw[idx])[k] - (float)t.zp) * t.scale;
        } else {
            memcpy(dst, c->out_raw[idx], bytes);
        }
    }
    return RKNN_SUCC;
}

int rknn_outputs_release(rknn_context context, uint32_t n_outputs, rknn_output outputs[]) {
    if (!get_ctx(context)) return RKNN_ERR_CTX_INVALID;
    for (uint32_t i = 0; i < n_outputs; i++) {
        if (!outputs[i].is_prealloc) {
            free(outputs[i].buf);
            outputs[i].buf = NULL;
        }
    }
    return RKNN_SUCC;
}

int rknn_set_input_shapes(rknn_context context, uint32_t n_inputs, rknn_tensor_attr attr[]) {
    stub_ctx* c = get_ctx(context);
    if (!c) return RKNN_ERR_CTX_INVALID;
    if (!c->n_dyn || n_inputs != (uint32_t)c->n_in) return RKNN_ERR_PARAM_INVALID;
    for (int s = 0; s < c->n_dyn; s++) {
        if (attr[0].n_dims == c->in[0].n_dims && !memcmp(attr[0].dims, c->dyn[s], attr[0].n_dims * sizeof(uint32_t))) {
            memcpy(c->in[0].dims, c->dyn[s], sizeof c->in[0].dims);
            c->shape_set = 1;
            c->in_ready[0] = 0;
            return RKNN_SUCC;
        }
    }
    return RKNN_ERR_PARAM_INVALID;
}

int rknn_set_core_mask(rknn_context context, rknn_core_mask core_mask) {
    stub_ctx* c = get_ctx(context);
    if (!c) return RKNN_ERR_CTX_INVALID;
    const char* env = getenv("RKNN_STUB_NPU_CORES");
    unsigned cores = env ? (unsigned)atoi(env) : 3;
    if (core_mask != RKNN_NPU_CORE_ALL && (core_mask & ~((1u << cores) - 1u))) return RKNN_ERR_PARAM_INVALID;
    c->core_mask = core_mask;
    return RKNN_SUCC;
}
#endif
