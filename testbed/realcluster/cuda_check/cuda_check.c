/*
 * cuda-check: proves a GPU works inside a container using only what the runtime injected.
 *
 * The image holds no NVIDIA file: libcuda.so.1 is dlopen()ed through the normal loader search
 * (no path), so it is found only if gpuready's CDI spec mounted it where the container's loader
 * looks (its default directories or its ld.so.cache, which the runtime must update). No CUDA
 * header is needed: the few driver API types and prototypes used are declared here.
 *
 * Prints exactly one JSON object on one line on stdout and a one-line summary on stderr.
 * Exit status: 0 libcuda loaded, cuInit succeeded, kernel verified; 2 libcuda not loaded;
 * 3 cuInit or another CUDA step before the kernel's result failed; 4 kernel result wrong.
 * With --expect-no-gpu: 0 when (libcuda is absent or cuInit fails) and no /dev/nvidia* exists,
 * else 1.
 *
 * Build: gcc -O2 -Wall -Wextra -Werror -o cuda-check cuda_check.c   (glibc < 2.34 also needs -ldl)
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <link.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* ---- the CUDA driver API, declared by hand ---- */
typedef int CUresult;
typedef int CUdevice;
typedef void *CUcontext;
typedef void *CUmodule;
typedef void *CUfunction;
typedef void *CUstream;
typedef unsigned long long CUdeviceptr;
typedef struct { unsigned char bytes[16]; } CUuuid;

typedef CUresult (*cuInit_t)(unsigned int);
typedef CUresult (*cuGetErrorName_t)(CUresult, const char **);
typedef CUresult (*cuDeviceGetCount_t)(int *);
typedef CUresult (*cuDeviceGet_t)(CUdevice *, int);
typedef CUresult (*cuDeviceGetName_t)(char *, int, CUdevice);
typedef CUresult (*cuDeviceGetUuid_t)(CUuuid *, CUdevice);
typedef CUresult (*cuCtxCreate_t)(CUcontext *, unsigned int, CUdevice);
typedef CUresult (*cuCtxDestroy_t)(CUcontext);
typedef CUresult (*cuCtxSynchronize_t)(void);
typedef CUresult (*cuMemAlloc_t)(CUdeviceptr *, size_t);
typedef CUresult (*cuMemFree_t)(CUdeviceptr);
typedef CUresult (*cuMemcpyHtoD_t)(CUdeviceptr, const void *, size_t);
typedef CUresult (*cuMemcpyDtoH_t)(void *, CUdeviceptr, size_t);
typedef CUresult (*cuModuleLoadData_t)(CUmodule *, const void *);
typedef CUresult (*cuModuleUnload_t)(CUmodule);
typedef CUresult (*cuModuleGetFunction_t)(CUfunction *, CUmodule, const char *);
typedef CUresult (*cuLaunchKernel_t)(CUfunction, unsigned int, unsigned int, unsigned int, unsigned int,
                                     unsigned int, unsigned int, unsigned int, CUstream, void **, void **);

#define CUDA_SUCCESS 0
#define CHUNK_MIB 256
#define BLOCK 256
/* The kernel covers at most the first 1 GiB of the buffer (2^28 u32, 32-bit index arithmetic). */
#define MAX_KERNEL_ELEMENTS (1u << 28)

/* data[i] = data[i] * 3 + i for i < n, over u32. PTX ISA 7.0 / sm_50: JIT-compiled by any
 * driver since CUDA 11 for its GPU. */
static const char PTX[] =
    ".version 7.0\n"
    ".target sm_50\n"
    ".address_size 64\n"
    "\n"
    ".visible .entry triple_plus_index(\n"
    "    .param .u64 param_data,\n"
    "    .param .u32 param_n\n"
    ")\n"
    "{\n"
    "    .reg .pred %p<2>;\n"
    "    .reg .b32 %r<8>;\n"
    "    .reg .b64 %rd<5>;\n"
    "\n"
    "    ld.param.u64 %rd1, [param_data];\n"
    "    ld.param.u32 %r1, [param_n];\n"
    "    mov.u32 %r2, %ctaid.x;\n"
    "    mov.u32 %r3, %ntid.x;\n"
    "    mov.u32 %r4, %tid.x;\n"
    "    mad.lo.u32 %r5, %r2, %r3, %r4;\n"
    "    setp.ge.u32 %p1, %r5, %r1;\n"
    "    @%p1 bra END;\n"
    "    cvta.to.global.u64 %rd2, %rd1;\n"
    "    mul.wide.u32 %rd3, %r5, 4;\n"
    "    add.u64 %rd4, %rd2, %rd3;\n"
    "    ld.global.u32 %r6, [%rd4];\n"
    "    mad.lo.u32 %r7, %r6, 3, %r5;\n"
    "    st.global.u32 [%rd4], %r7;\n"
    "END:\n"
    "    ret;\n"
    "}\n";
static const char KERNEL_NAME[] = "triple_plus_index";

/* ---- a growing string buffer for the JSON line ---- */
typedef struct {
    char *data;
    size_t len, cap;
} buf_t;

static void buf_printf(buf_t *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static void buf_printf(buf_t *b, const char *fmt, ...) {
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int n = vsnprintf(b->data ? b->data + b->len : NULL, b->data ? b->cap - b->len : 0, fmt, ap);
        va_end(ap);
        if (n < 0)
            return;
        if (b->data && b->len + (size_t)n < b->cap) {
            b->len += (size_t)n;
            return;
        }
        size_t cap = b->cap ? b->cap : 4096;
        while (cap <= b->len + (size_t)n)
            cap *= 2;
        char *grown = realloc(b->data, cap);
        if (!grown) {
            fputs("cuda-check: out of memory\n", stderr);
            exit(1);
        }
        b->data = grown;
        b->cap = cap;
    }
}

/* A JSON string (quoted, escaped), or null for NULL. */
static void buf_json_str(buf_t *b, const char *s) {
    if (!s) {
        buf_printf(b, "null");
        return;
    }
    buf_printf(b, "\"");
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        switch (*p) {
        case '"': buf_printf(b, "\\\""); break;
        case '\\': buf_printf(b, "\\\\"); break;
        case '\n': buf_printf(b, "\\n"); break;
        case '\r': buf_printf(b, "\\r"); break;
        case '\t': buf_printf(b, "\\t"); break;
        default:
            if (*p < 0x20 || *p == 0x7f)
                buf_printf(b, "\\u%04x", *p);
            else
                buf_printf(b, "%c", *p);
        }
    }
    buf_printf(b, "\"");
}

static void buf_json_ms(buf_t *b, double ms) {
    if (ms < 0)
        buf_printf(b, "null");
    else
        buf_printf(b, "%.3f", ms);
}

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

/* ---- /dev/nvidia* ---- */
typedef struct {
    char **items;
    size_t n, cap;
} strlist_t;

static void strlist_add(strlist_t *l, const char *s) {
    if (l->n == l->cap) {
        size_t cap = l->cap ? l->cap * 2 : 16;
        char **grown = realloc(l->items, cap * sizeof *grown);
        if (!grown) {
            fputs("cuda-check: out of memory\n", stderr);
            exit(1);
        }
        l->items = grown;
        l->cap = cap;
    }
    l->items[l->n] = strdup(s);
    if (!l->items[l->n]) {
        fputs("cuda-check: out of memory\n", stderr);
        exit(1);
    }
    l->n++;
}

static int cmp_str(const void *a, const void *b) {
    return strcmp(*(char *const *)a, *(char *const *)b);
}

static void list_dir(strlist_t *out, const char *dir, int only_nvidia) {
    DIR *d = opendir(dir);
    if (!d)
        return;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
            continue;
        if (only_nvidia && strncmp(e->d_name, "nvidia", 6) != 0)
            continue;
        char path[4096];
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        strlist_add(out, path);
    }
    closedir(d);
}

/* ---- options ---- */
typedef struct {
    long alloc_mib;
    long try_alloc_mib; /* -1: not asked */
    long fill_mib;      /* -1: not asked */
    long hold_seconds;
    int expect_no_gpu;
    strlist_t open_dev;
} opts_t;

static void usage(FILE *f) {
    fputs("usage: cuda-check [--alloc-mib N] [--try-alloc-mib M] [--fill-mib M] [--hold-seconds S]\n"
          "                  [--open-dev PATH]... [--expect-no-gpu]\n", f);
}

static long parse_num(const char *opt, const char *s, long min) {
    char *end = NULL;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || !end || *end || end == s || v < min) {
        fprintf(stderr, "cuda-check: %s wants an integer >= %ld, got '%s'\n", opt, min, s);
        exit(64);
    }
    return v;
}

static void parse_args(int argc, char **argv, opts_t *o) {
    o->alloc_mib = 64;
    o->try_alloc_mib = -1;
    o->fill_mib = -1;
    o->hold_seconds = 0;
    o->expect_no_gpu = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (strcmp(a, "--expect-no-gpu") == 0) {
            o->expect_no_gpu = 1;
            continue;
        }
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            usage(stdout);
            exit(0);
        }
        if (!v) {
            fprintf(stderr, "cuda-check: unknown option or missing value: %s\n", a);
            usage(stderr);
            exit(64);
        }
        if (strcmp(a, "--alloc-mib") == 0)
            o->alloc_mib = parse_num(a, v, 1);
        else if (strcmp(a, "--try-alloc-mib") == 0)
            o->try_alloc_mib = parse_num(a, v, 0);
        else if (strcmp(a, "--fill-mib") == 0)
            o->fill_mib = parse_num(a, v, 0);
        else if (strcmp(a, "--hold-seconds") == 0)
            o->hold_seconds = parse_num(a, v, 0);
        else if (strcmp(a, "--open-dev") == 0)
            strlist_add(&o->open_dev, v);
        else {
            fprintf(stderr, "cuda-check: unknown option: %s\n", a);
            usage(stderr);
            exit(64);
        }
        i++;
    }
}

/* ---- CUDA ---- */
static void *lib;
static cuGetErrorName_t p_cuGetErrorName;

static void *sym(const char *name) {
    return lib ? dlsym(lib, name) : NULL;
}

static const char *err_name(CUresult rc) {
    const char *name = NULL;
    if (p_cuGetErrorName && p_cuGetErrorName(rc, &name) == CUDA_SUCCESS && name)
        return name;
    return rc == CUDA_SUCCESS ? "CUDA_SUCCESS" : "CUDA_ERROR_UNKNOWN_NAME";
}

static char error_text[1024];

static void set_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

static void set_error(const char *fmt, ...) {
    if (error_text[0])
        return; /* the first failure is the one that matters */
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(error_text, sizeof error_text, fmt, ap);
    va_end(ap);
}

/* Resolve a symbol into *out, or record which one is missing. */
#define NEED(var, type, name)                                                          \
    do {                                                                               \
        var = (type)sym(name);                                                         \
        if (!var) {                                                                    \
            set_error("libcuda.so.1 has no symbol %s", name);                          \
        }                                                                              \
    } while (0)

/* Call a CUDA function; on failure record it and jump to `label`. */
#define CU(label, call, name)                                                          \
    do {                                                                               \
        CUresult rc_ = (call);                                                         \
        if (rc_ != CUDA_SUCCESS) {                                                     \
            set_error("%s: %s (%d)", name, err_name(rc_), rc_);                        \
            goto label;                                                                \
        }                                                                              \
    } while (0)

static void format_uuid(const CUuuid *u, char out[41]) {
    const unsigned char *b = u->bytes;
    snprintf(out, 41,
             "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x",
             b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13],
             b[14], b[15]);
}

static void sleep_seconds(long s) {
    struct timespec left = {.tv_sec = s, .tv_nsec = 0};
    while (nanosleep(&left, &left) != 0 && errno == EINTR) {
    }
}

int main(int argc, char **argv) {
    opts_t o;
    memset(&o, 0, sizeof o);
    parse_args(argc, argv, &o);
    double t0 = now_ms();

    /* Results. */
    const char *libcuda_path = NULL;
    char *dlerr = NULL;
    int have_init = 0;
    CUresult init_rc = 0;
    int have_count = 0, device_count = 0;
    strlist_t dev_uuids = {0}, dev_names = {0};
    double ctx_ms = -1, alloc_ms = -1, kernel_ms = -1;
    int have_alloc = 0;
    CUresult alloc_rc = 0;
    int kernel_ok = 0, kernel_wrong = 0, cuda_failed = 0;
    int have_try = 0;
    CUresult try_rc = 0;
    long fill_done = -1;

    /* Device nodes. */
    strlist_t nodes = {0};
    list_dir(&nodes, "/dev", 1);
    list_dir(&nodes, "/dev/nvidia-caps", 0);
    if (nodes.n)
        qsort(nodes.items, nodes.n, sizeof *nodes.items, cmp_str);

    int *open_errno = calloc(o.open_dev.n ? o.open_dev.n : 1, sizeof *open_errno);
    if (!open_errno)
        return 1;
    for (size_t i = 0; i < o.open_dev.n; i++) {
        int fd = open(o.open_dev.items[i], O_RDWR | O_CLOEXEC);
        open_errno[i] = fd < 0 ? errno : 0;
        if (fd >= 0)
            close(fd);
    }

    /* The driver library, through the loader's normal search. */
    CUcontext ctx = NULL;
    CUmodule mod = NULL;
    CUdeviceptr dbuf = 0;
    uint32_t *host = NULL;
    cuMemFree_t p_cuMemFree = NULL;
    lib = dlopen("libcuda.so.1", RTLD_NOW);
    if (!lib) {
        const char *e = dlerror();
        dlerr = strdup(e ? e : "dlopen failed");
        goto report;
    }
    {
        struct link_map *lm = NULL;
        if (dlinfo(lib, RTLD_DI_LINKMAP, &lm) == 0 && lm && lm->l_name && lm->l_name[0])
            libcuda_path = lm->l_name;
        void *init_sym = sym("cuInit");
        Dl_info info;
        if (!libcuda_path && init_sym && dladdr(init_sym, &info) && info.dli_fname)
            libcuda_path = info.dli_fname;
    }
    p_cuGetErrorName = (cuGetErrorName_t)sym("cuGetErrorName");

    cuInit_t p_cuInit;
    NEED(p_cuInit, cuInit_t, "cuInit");
    if (!p_cuInit) {
        cuda_failed = 1;
        goto report;
    }
    init_rc = p_cuInit(0);
    have_init = 1;
    if (init_rc != CUDA_SUCCESS) {
        set_error("cuInit: %s (%d)", err_name(init_rc), init_rc);
        cuda_failed = 1;
        goto report;
    }

    {
        cuDeviceGetCount_t p_cuDeviceGetCount;
        cuDeviceGet_t p_cuDeviceGet;
        cuDeviceGetName_t p_cuDeviceGetName;
        cuDeviceGetUuid_t p_cuDeviceGetUuid = (cuDeviceGetUuid_t)sym("cuDeviceGetUuid_v2");
        if (!p_cuDeviceGetUuid)
            p_cuDeviceGetUuid = (cuDeviceGetUuid_t)sym("cuDeviceGetUuid");
        cuCtxCreate_t p_cuCtxCreate;
        cuMemAlloc_t p_cuMemAlloc;
        cuMemcpyHtoD_t p_cuMemcpyHtoD;
        cuMemcpyDtoH_t p_cuMemcpyDtoH;
        cuModuleLoadData_t p_cuModuleLoadData;
        cuModuleGetFunction_t p_cuModuleGetFunction;
        cuLaunchKernel_t p_cuLaunchKernel;
        cuCtxSynchronize_t p_cuCtxSynchronize;
        NEED(p_cuDeviceGetCount, cuDeviceGetCount_t, "cuDeviceGetCount");
        NEED(p_cuDeviceGet, cuDeviceGet_t, "cuDeviceGet");
        NEED(p_cuDeviceGetName, cuDeviceGetName_t, "cuDeviceGetName");
        NEED(p_cuCtxCreate, cuCtxCreate_t, "cuCtxCreate_v2");
        NEED(p_cuMemAlloc, cuMemAlloc_t, "cuMemAlloc_v2");
        NEED(p_cuMemFree, cuMemFree_t, "cuMemFree_v2");
        NEED(p_cuMemcpyHtoD, cuMemcpyHtoD_t, "cuMemcpyHtoD_v2");
        NEED(p_cuMemcpyDtoH, cuMemcpyDtoH_t, "cuMemcpyDtoH_v2");
        NEED(p_cuModuleLoadData, cuModuleLoadData_t, "cuModuleLoadData");
        NEED(p_cuModuleGetFunction, cuModuleGetFunction_t, "cuModuleGetFunction");
        NEED(p_cuLaunchKernel, cuLaunchKernel_t, "cuLaunchKernel");
        NEED(p_cuCtxSynchronize, cuCtxSynchronize_t, "cuCtxSynchronize");
        if (!p_cuDeviceGetUuid)
            set_error("libcuda.so.1 has neither cuDeviceGetUuid_v2 nor cuDeviceGetUuid");
        if (error_text[0]) {
            cuda_failed = 1;
            goto report;
        }

        CU(cuda_fail, p_cuDeviceGetCount(&device_count), "cuDeviceGetCount");
        have_count = 1;
        for (int i = 0; i < device_count; i++) {
            CUdevice dev;
            char name[256] = {0};
            CUuuid uuid;
            char uuid_text[41];
            CU(cuda_fail, p_cuDeviceGet(&dev, i), "cuDeviceGet");
            CU(cuda_fail, p_cuDeviceGetName(name, (int)sizeof name - 1, dev), "cuDeviceGetName");
            CU(cuda_fail, p_cuDeviceGetUuid(&uuid, dev), "cuDeviceGetUuid");
            format_uuid(&uuid, uuid_text);
            strlist_add(&dev_uuids, uuid_text);
            strlist_add(&dev_names, name);
        }
        if (device_count < 1) {
            set_error("cuDeviceGetCount: no device");
            goto cuda_fail;
        }

        CUdevice dev0;
        CU(cuda_fail, p_cuDeviceGet(&dev0, 0), "cuDeviceGet");
        double t = now_ms();
        CU(cuda_fail, p_cuCtxCreate(&ctx, 0, dev0), "cuCtxCreate_v2");
        ctx_ms = now_ms() - t;

        size_t bytes = (size_t)o.alloc_mib << 20;
        t = now_ms();
        alloc_rc = p_cuMemAlloc(&dbuf, bytes);
        alloc_ms = now_ms() - t;
        have_alloc = 1;
        if (alloc_rc != CUDA_SUCCESS) {
            dbuf = 0;
            set_error("cuMemAlloc_v2(%ld MiB): %s (%d)", o.alloc_mib, err_name(alloc_rc), alloc_rc);
            goto cuda_fail;
        }

        size_t count = bytes / sizeof(uint32_t);
        unsigned int n = count > MAX_KERNEL_ELEMENTS ? MAX_KERNEL_ELEMENTS : (unsigned int)count;
        host = malloc((size_t)n * sizeof *host);
        if (!host) {
            set_error("malloc of the host buffer failed");
            goto cuda_fail;
        }
        for (unsigned int i = 0; i < n; i++)
            host[i] = i * 7u + 1u;

        CUfunction fn;
        CU(cuda_fail, p_cuModuleLoadData(&mod, PTX), "cuModuleLoadData");
        CU(cuda_fail, p_cuModuleGetFunction(&fn, mod, KERNEL_NAME), "cuModuleGetFunction");

        t = now_ms();
        CU(cuda_fail, p_cuMemcpyHtoD(dbuf, host, (size_t)n * sizeof *host), "cuMemcpyHtoD_v2");
        void *params[] = {&dbuf, &n};
        unsigned int grid = (n + BLOCK - 1) / BLOCK;
        CU(cuda_fail, p_cuLaunchKernel(fn, grid, 1, 1, BLOCK, 1, 1, 0, NULL, params, NULL), "cuLaunchKernel");
        CU(cuda_fail, p_cuCtxSynchronize(), "cuCtxSynchronize");
        memset(host, 0, (size_t)n * sizeof *host);
        CU(cuda_fail, p_cuMemcpyDtoH(host, dbuf, (size_t)n * sizeof *host), "cuMemcpyDtoH_v2");
        kernel_ms = now_ms() - t;

        kernel_ok = 1;
        for (unsigned int i = 0; i < n; i++) {
            uint32_t want = (i * 7u + 1u) * 3u + i;
            if (host[i] != want) {
                set_error("kernel result wrong at element %u: expected %u, got %u", i, want, host[i]);
                kernel_ok = 0;
                kernel_wrong = 1;
                break;
            }
        }

        /* Extra allocations on top of the first one (MPS memory limits). */
        if (o.try_alloc_mib >= 0) {
            CUdeviceptr extra = 0;
            try_rc = p_cuMemAlloc(&extra, (size_t)o.try_alloc_mib << 20);
            have_try = 1;
            if (try_rc == CUDA_SUCCESS)
                p_cuMemFree(extra);
        }
        if (o.fill_mib >= 0) {
            size_t cap = (size_t)o.fill_mib / CHUNK_MIB + 2;
            CUdeviceptr *chunks = calloc(cap, sizeof *chunks);
            size_t nchunks = 0;
            fill_done = 0;
            while (chunks && fill_done < o.fill_mib && nchunks < cap) {
                long mib = o.fill_mib - fill_done < CHUNK_MIB ? o.fill_mib - fill_done : CHUNK_MIB;
                if (p_cuMemAlloc(&chunks[nchunks], (size_t)mib << 20) != CUDA_SUCCESS)
                    break;
                nchunks++;
                fill_done += mib;
            }
            for (size_t i = 0; i < nchunks; i++)
                p_cuMemFree(chunks[i]);
            free(chunks);
        }
        goto report;
    }

cuda_fail:
    cuda_failed = 1;

report:;
    double total_ms = now_ms() - t0;
    buf_t b = {0};
    buf_printf(&b, "{\"libcuda\":");
    buf_json_str(&b, libcuda_path);
    buf_printf(&b, ",\"dlerror\":");
    buf_json_str(&b, dlerr);
    buf_printf(&b, ",\"dev_nodes\":[");
    for (size_t i = 0; i < nodes.n; i++) {
        if (i)
            buf_printf(&b, ",");
        buf_json_str(&b, nodes.items[i]);
    }
    buf_printf(&b, "],\"open_dev\":{");
    for (size_t i = 0; i < o.open_dev.n; i++) {
        if (i)
            buf_printf(&b, ",");
        buf_json_str(&b, o.open_dev.items[i]);
        buf_printf(&b, ":%d", open_errno[i]);
    }
    buf_printf(&b, "},\"cuInit\":");
    if (have_init) {
        buf_printf(&b, "%d,\"cuInit_name\":", init_rc);
        buf_json_str(&b, err_name(init_rc));
    } else {
        buf_printf(&b, "null,\"cuInit_name\":null");
    }
    buf_printf(&b, ",\"device_count\":");
    if (have_count)
        buf_printf(&b, "%d", device_count);
    else
        buf_printf(&b, "null");
    buf_printf(&b, ",\"devices\":[");
    for (size_t i = 0; i < dev_uuids.n; i++) {
        buf_printf(&b, "%s{\"uuid\":", i ? "," : "");
        buf_json_str(&b, dev_uuids.items[i]);
        buf_printf(&b, ",\"name\":");
        buf_json_str(&b, dev_names.items[i]);
        buf_printf(&b, "}");
    }
    buf_printf(&b, "],\"ctx_ms\":");
    buf_json_ms(&b, ctx_ms);
    buf_printf(&b, ",\"alloc_mib\":%ld,\"alloc\":", o.alloc_mib);
    if (have_alloc)
        buf_printf(&b, "%d", alloc_rc);
    else
        buf_printf(&b, "null");
    buf_printf(&b, ",\"alloc_ms\":");
    buf_json_ms(&b, alloc_ms);
    buf_printf(&b, ",\"kernel_ok\":%s,\"kernel_ms\":", kernel_ok ? "true" : "false");
    buf_json_ms(&b, kernel_ms);
    buf_printf(&b, ",\"total_ms\":");
    buf_json_ms(&b, total_ms);
    buf_printf(&b, ",\"uid\":%u,\"gid\":%u,\"try_alloc\":", (unsigned)getuid(), (unsigned)getgid());
    if (have_try) {
        buf_printf(&b, "{\"mib\":%ld,\"result\":%d,\"name\":", o.try_alloc_mib, try_rc);
        buf_json_str(&b, err_name(try_rc));
        buf_printf(&b, "}");
    } else {
        buf_printf(&b, "null");
    }
    buf_printf(&b, ",\"fill_mib\":");
    if (fill_done >= 0)
        buf_printf(&b, "%ld", fill_done);
    else
        buf_printf(&b, "null");
    buf_printf(&b, ",\"error\":");
    buf_json_str(&b, error_text[0] ? error_text : NULL);
    buf_printf(&b, "}\n");
    fputs(b.data, stdout);
    fflush(stdout);

    int status;
    if (!lib)
        status = 2;
    else if (cuda_failed)
        status = 3;
    else if (kernel_wrong)
        status = 4;
    else
        status = 0;
    if (o.expect_no_gpu) {
        int no_gpu = (!lib || (have_init && init_rc != CUDA_SUCCESS)) && nodes.n == 0;
        status = no_gpu ? 0 : 1;
    }

    if (!lib)
        fprintf(stderr, "cuda-check: libcuda.so.1 not loaded (%s); %zu /dev/nvidia* node(s); exit %d\n",
                dlerr ? dlerr : "?", nodes.n, status);
    else if (status == 0 && !o.expect_no_gpu)
        fprintf(stderr, "cuda-check: OK: %s from %s, %d device(s), %ld MiB, kernel %.1f ms, total %.1f ms\n",
                dev_names.n ? dev_names.items[0] : "?", libcuda_path ? libcuda_path : "?", device_count,
                o.alloc_mib, kernel_ms, total_ms);
    else
        fprintf(stderr, "cuda-check: %s (libcuda from %s); %zu /dev/nvidia* node(s); exit %d\n",
                error_text[0] ? error_text : "no error", libcuda_path ? libcuda_path : "?", nodes.n, status);
    fflush(stderr);

    if (o.hold_seconds > 0)
        sleep_seconds(o.hold_seconds);

    if (lib) {
        cuModuleUnload_t p_unload = (cuModuleUnload_t)sym("cuModuleUnload");
        cuCtxDestroy_t p_destroy = (cuCtxDestroy_t)sym("cuCtxDestroy_v2");
        if (dbuf && p_cuMemFree)
            p_cuMemFree(dbuf);
        if (mod && p_unload)
            p_unload(mod);
        if (ctx && p_destroy)
            p_destroy(ctx);
    }
    free(host);
    free(b.data);
    return status;
}
