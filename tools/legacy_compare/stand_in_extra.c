/* What Rockchip's rknn_server 2.3.2 needs of librknnrt beyond the project's stand-in
 * (tests/rknnrt/stub), which is built here with -Drknn_init=stub_rknn_init_by_path:
 *  - rknn_init with the model in memory (size > 0): the server passes the bytes it received, the
 *    stand-in reads a model by path (size 0, as our daemon calls it), so the bytes go to a
 *    temporary file first;
 *  - the pre-1.5 rknn_set_input_shape, which the server dlsyms at load ("reuqired librknnrt.so >=
 *    1.5.0") though the compared sessions never call it: one input's shape, through the newer call. */
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "rknn_stub_api.h"

int stub_rknn_init_by_path(rknn_context* context, void* model, uint32_t size, uint32_t flag, rknn_init_extend* extend);
int rknn_set_input_shapes(rknn_context context, uint32_t n_inputs, rknn_tensor_attr attr[]);

int rknn_init(rknn_context* context, void* model, uint32_t size, uint32_t flag, rknn_init_extend* extend) {
    if (size == 0 || model == NULL) return stub_rknn_init_by_path(context, model, size, flag, extend);
    char path[] = "/tmp/legacy-compare-model-XXXXXX";
    int fd = mkstemp(path);
    if (fd < 0) return RKNN_ERR_FAIL;
    FILE* file = fdopen(fd, "wb");
    int written = file != NULL && fwrite(model, 1, size, file) == size;
    if (file != NULL) fclose(file);
    int result = written ? stub_rknn_init_by_path(context, path, 0, flag, extend) : RKNN_ERR_FAIL;
    unlink(path);
    return result;
}

int rknn_set_input_shape(rknn_context context, rknn_tensor_attr* attr) {
    return rknn_set_input_shapes(context, 1, attr);
}
