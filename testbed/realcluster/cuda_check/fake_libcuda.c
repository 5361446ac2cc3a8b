/*
 * A stand-in libcuda.so.1 for machines without a GPU (CI): it exists only so that a test can show the
 * container's loader finds "libcuda.so.1" where the runtime put it. Every device query says there is
 * no device, like the real driver on a machine without one.
 *
 * Build: gcc -O2 -Wall -Wextra -Werror -shared -fPIC -Wl,-soname,libcuda.so.1 -o libcuda.so.X fake_libcuda.c
 */
#include <stddef.h>

#define CUDA_SUCCESS 0
#define CUDA_ERROR_INVALID_VALUE 1
#define CUDA_ERROR_NO_DEVICE 100

int cuInit(unsigned int flags);
int cuGetErrorName(int error, const char **name);
int cuDeviceGetCount(int *count);

int cuInit(unsigned int flags) {
    (void)flags;
    return CUDA_ERROR_NO_DEVICE;
}

int cuGetErrorName(int error, const char **name) {
    if (!name)
        return CUDA_ERROR_INVALID_VALUE;
    switch (error) {
    case CUDA_SUCCESS: *name = "CUDA_SUCCESS"; return CUDA_SUCCESS;
    case CUDA_ERROR_INVALID_VALUE: *name = "CUDA_ERROR_INVALID_VALUE"; return CUDA_SUCCESS;
    case CUDA_ERROR_NO_DEVICE: *name = "CUDA_ERROR_NO_DEVICE"; return CUDA_SUCCESS;
    default: *name = NULL; return CUDA_ERROR_INVALID_VALUE;
    }
}

int cuDeviceGetCount(int *count) {
    if (!count)
        return CUDA_ERROR_INVALID_VALUE;
    *count = 0;
    return CUDA_SUCCESS;
}
