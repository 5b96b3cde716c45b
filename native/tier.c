/* Device-addressable memory on a host NUMA node (a tier), for CUDA programs.
 *
 * Each allocation is physical memory the driver creates on one host node
 * (cuMemCreate with a CU_MEM_LOCATION_TYPE_HOST_NUMA location), mapped at a virtual
 * address of the GPU's address space (cuMemAddressReserve + cuMemMap) and made readable
 * and writable by every GPU (cuMemSetAccess). Mapped so, it is device memory as far as
 * CUDA's copies are concerned (cudaMemcpy device to device works on it, which it does
 * not on host-typed memory such as a host-NUMA memory pool's), while every byte is on
 * the host node. Freed mappings are kept for reuse, in stream order: a free records an
 * event on its stream, and a reuse on another stream waits for it.
 *
 * Two ways in:
 * - pycxl_tier_malloc_N / pycxl_tier_free_N: the allocator of one tier (slot N), for a
 *   PyTorch MemPool (CUDAPluggableAllocator) or any caller that wants tier memory;
 * - pycxl_cuda_malloc / pycxl_cuda_free: a whole-process allocator that takes the GPU's
 *   own memory first (its default stream-ordered pool) and, when that is out of memory,
 *   the spill tier; a thread may prefer a tier for what it allocates (tier_prefer).
 *
 * Where the driver cannot create memory on a host node (drivers before 12.2 refuse the
 * HOST_NUMA location), or where asked, a slot is "registered" instead: each allocation is
 * anonymous memory bound to the node by mbind (MPOL_BIND), pinned and mapped for every
 * GPU by cuMemHostRegister (DEVICEMAP), as HostMemory does in Python. Kernels read and
 * write it in place, and PyTorch's copies between it and HBM work (unified addressing
 * lets the driver tell host memory from device memory whatever the copy says).
 *
 * Placement is checked, not assumed: the pages of each new mapping are asked for their
 * node (move_pages without moving); a mapping with a page elsewhere is released and the
 * allocation refused. The driver is reached through dlopen, so the module loads on
 * machines without it. */
#include <dlfcn.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <unistd.h>

#define TIER_SLOTS 8
#define TIER_DEVICES 64
#define TIER_PAGE 4096
#define CU_OK 0
#define CU_OUT_OF_MEMORY 2
#define CU_INVALID_VALUE 1
#define CU_NOT_SUPPORTED 801
/* tier_open's modes */
enum { TIER_AUTO = 0, TIER_VMM = 1, TIER_REGISTERED = 2 };
#define REGISTERED_GRANULE ((size_t)2 << 20)
#define MPOL_BIND_MODE 2
#define HOST_REGISTER_PORTABLE 1
#define HOST_REGISTER_DEVICEMAP 2

typedef int cu_result;
typedef unsigned long long cu_ptr;
typedef unsigned long long cu_handle;
typedef void *cu_stream;
typedef void *cu_event;
typedef struct { int type; int id; } cu_location;
typedef struct {
    int type;
    int handle_types;
    cu_location location;
    void *win32_metadata;
    unsigned char flags[8]; /* compression, RDMA, usage, reserved: zero */
} cu_alloc_prop;
typedef struct { cu_location location; int flags; } cu_access;

enum { LOC_DEVICE = 1, LOC_HOST = 2, LOC_HOST_NUMA = 3 };
/* CUmemPool_attribute: what the device's stream-ordered pool keeps, and when it gives
 * freed memory back to the driver */
enum { POOL_RELEASE_THRESHOLD = 4, POOL_RESERVED_CURRENT = 5, POOL_RESERVED_HIGH = 6,
       POOL_USED_CURRENT = 7 };
enum { ALLOC_PINNED = 1, ACCESS_READWRITE = 3, GRANULARITY_MINIMUM = 0, EVENT_NO_TIMING = 2 };

static struct {
    int loaded;
    cu_result (*create)(cu_handle *, size_t, const cu_alloc_prop *, unsigned long long);
    cu_result (*release)(cu_handle);
    cu_result (*reserve)(cu_ptr *, size_t, size_t, cu_ptr, unsigned long long);
    cu_result (*address_free)(cu_ptr, size_t);
    cu_result (*map)(cu_ptr, size_t, size_t, cu_handle, unsigned long long);
    cu_result (*unmap)(cu_ptr, size_t);
    cu_result (*set_access)(cu_ptr, size_t, const cu_access *, size_t);
    cu_result (*granularity)(size_t *, const cu_alloc_prop *, int);
    cu_result (*alloc_async)(cu_ptr *, size_t, cu_stream);
    cu_result (*free_async)(cu_ptr, cu_stream);
    cu_result (*event_create)(cu_event *, unsigned int);
    cu_result (*event_record)(cu_event, cu_stream);
    cu_result (*event_sync)(cu_event);
    cu_result (*event_destroy)(cu_event);
    cu_result (*stream_wait)(cu_stream, cu_event, unsigned int);
    cu_result (*ctx_get_current)(void **);
    cu_result (*ctx_set_current)(void *);
    cu_result (*device_get)(int *, int);
    cu_result (*primary_retain)(void **, int);
    cu_result (*mem_info)(size_t *, size_t *);
    cu_result (*current_pool)(void **, int);
    cu_result (*pool_get)(void *, int, void *);
    cu_result (*pool_set)(void *, int, void *);
    cu_result (*pool_trim)(void *, size_t);
    cu_result (*host_register)(void *, size_t, unsigned int);
    cu_result (*host_unregister)(void *);
    cu_result (*host_device_pointer)(cu_ptr *, void *, unsigned int);
} tier_cu;

/* What a spilling process's tier memory is made for (tier_kind), by thread */
enum { USE_KIND_OTHER = 0, USE_KIND_STATE = 1, USE_KIND_SAVED = 2 };
static __thread int use_kind = USE_KIND_OTHER;

/* One mapping: live (in the hash by address) or cached (on its slot's free list). */
struct tier_seg {
    cu_ptr ptr;
    size_t size; /* mapped: a multiple of the granularity */
    size_t asked;
    cu_handle handle;
    void *host; /* registered slots: the host mapping (NULL: a VMM mapping) */
    cu_event freed; /* recorded on the stream of the last free */
    int slot;
    int kind; /* what the spilling process made it for (USE_KIND_*), while live */
    struct tier_seg *next;
};

struct tier_slot {
    int open, node, ndevices;
    int registered; /* 1: mbind + cuMemHostRegister; 0: cuMemCreate on the host node */
    int devices[TIER_DEVICES];
    size_t granularity;
    struct tier_seg *cached;
    uint64_t now, peak, allocations, bytes_total, refused, misplaced_pages, mapped;
    uint64_t mapped_peak; /* since tier_use_reset */
    char error[256];
};

static struct tier_slot tier_slots[TIER_SLOTS];
static pthread_mutex_t tier_lock = PTHREAD_MUTEX_INITIALIZER;
static int spill_slot = -1;
/* What a spilling process leaves free of the GPU's memory for what does not come through
 * this allocator (cuBLAS and cuDNN handles and workspaces, made on first use on each
 * thread): a large allocation that would eat into it goes to the tier. */
static size_t spill_headroom = (size_t)512 << 20;
static __thread int preferred_slot = -1;
static uint64_t hbm_refusals;
static int log_spills; /* tier_log(1): each spill is told to Python (tier_spilled) */
static pid_t log_thread;
static void tier_spilled(int slot, size_t size);

#define BUCKETS 4096
static struct tier_seg *tier_live[BUCKETS];

static unsigned tier_bucket(cu_ptr p) { return (unsigned)((p >> 12) ^ (p >> 24)) % BUCKETS; }

static void tier_remember(struct tier_seg *s) {
    s->next = tier_live[tier_bucket(s->ptr)];
    tier_live[tier_bucket(s->ptr)] = s;
}

static struct tier_seg *tier_find(cu_ptr p) {
    for (struct tier_seg *s = tier_live[tier_bucket(p)]; s; s = s->next)
        if (s->ptr == p) return s;
    return NULL;
}

static struct tier_seg *tier_forget(cu_ptr p) {
    for (struct tier_seg **at = &tier_live[tier_bucket(p)]; *at; at = &(*at)->next)
        if ((*at)->ptr == p) {
            struct tier_seg *s = *at;
            *at = s->next;
            return s;
        }
    return NULL;
}

static int load_driver(char *err, size_t errlen) {
    if (tier_cu.loaded) return 0;
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
    if (!h) {
        snprintf(err, errlen, "cannot load libcuda.so.1: %s", dlerror());
        return -1;
    }
#define BIND(field, name) \
    if (!(*(void **)&tier_cu.field = dlsym(h, name))) { \
        snprintf(err, errlen, "the CUDA driver lacks %s (memory on a host NUMA node " \
                 "needs driver 12.2 or later)", name); \
        return -1; \
    }
    BIND(create, "cuMemCreate");
    BIND(release, "cuMemRelease");
    BIND(reserve, "cuMemAddressReserve");
    BIND(address_free, "cuMemAddressFree");
    BIND(map, "cuMemMap");
    BIND(unmap, "cuMemUnmap");
    BIND(set_access, "cuMemSetAccess");
    BIND(granularity, "cuMemGetAllocationGranularity");
    BIND(alloc_async, "cuMemAllocAsync");
    BIND(free_async, "cuMemFreeAsync");
    BIND(event_create, "cuEventCreate");
    BIND(event_record, "cuEventRecord");
    BIND(event_sync, "cuEventSynchronize");
    BIND(event_destroy, "cuEventDestroy_v2");
    BIND(stream_wait, "cuStreamWaitEvent");
    BIND(ctx_get_current, "cuCtxGetCurrent");
    BIND(ctx_set_current, "cuCtxSetCurrent");
    BIND(device_get, "cuDeviceGet");
    BIND(primary_retain, "cuDevicePrimaryCtxRetain");
    BIND(mem_info, "cuMemGetInfo_v2");
    BIND(current_pool, "cuDeviceGetMemPool");
    BIND(pool_get, "cuMemPoolGetAttribute");
    BIND(pool_set, "cuMemPoolSetAttribute");
    BIND(pool_trim, "cuMemPoolTrimTo");
    BIND(host_register, "cuMemHostRegister_v2");
    BIND(host_unregister, "cuMemHostUnregister");
    BIND(host_device_pointer, "cuMemHostGetDevicePointer_v2");
#undef BIND
    tier_cu.loaded = 1;
    return 0;
}

/* A thread PyTorch allocates on (autograd's backward thread) may have no current driver
 * context: the runtime binds one lazily for its own calls, the driver calls here need
 * it. The device's primary context is the runtime's. */
static void *primary_contexts[TIER_DEVICES];

static void ensure_context(int device) {
    void *current = NULL;
    if (!tier_cu.loaded || (tier_cu.ctx_get_current(&current) == CU_OK && current)) return;
    if (device < 0 || device >= TIER_DEVICES) return;
    pthread_mutex_lock(&tier_lock);
    if (!primary_contexts[device]) {
        int dev = 0;
        if (tier_cu.device_get(&dev, device) == CU_OK)
            tier_cu.primary_retain(&primary_contexts[device], dev);
    }
    void *ctx = primary_contexts[device];
    pthread_mutex_unlock(&tier_lock);
    if (ctx) tier_cu.ctx_set_current(ctx);
}

static cu_alloc_prop prop_of(int node) {
    cu_alloc_prop p;
    memset(&p, 0, sizeof p);
    p.type = ALLOC_PINNED;
    p.location.type = LOC_HOST_NUMA;
    p.location.id = node;
    return p;
}

/* Open slot ``slot`` on host node ``node`` for the CUDA ``devices``, its memory made as
 * ``mode`` says (TIER_AUTO: on the host node where the driver can, else registered). 0,
 * or the CUDA result (the call in err), or -1 (a message in err). */
int tier_open(int slot, int node, const int *devices, int ndevices, int mode, char *err, size_t errlen) {
    if (slot < 0 || slot >= TIER_SLOTS || ndevices < 1 || ndevices > TIER_DEVICES ||
        mode < TIER_AUTO || mode > TIER_REGISTERED || node < 0 || node >= 1024) {
        snprintf(err, errlen, "tier slot %d is not one of 0-%d (or no devices, or mode %d, "
                 "or node %d)", slot, TIER_SLOTS - 1, mode, node);
        return -1;
    }
    if (load_driver(err, errlen)) return -1;
    pthread_mutex_lock(&tier_lock);
    struct tier_slot *s = &tier_slots[slot];
    int rc = 0;
    if (!s->open) {
        cu_alloc_prop prop = prop_of(node);
        size_t g = 0;
        int registered = mode == TIER_REGISTERED;
        if (!registered && (rc = tier_cu.granularity(&g, &prop, GRANULARITY_MINIMUM))) {
            if (mode == TIER_AUTO && (rc == CU_NOT_SUPPORTED || rc == CU_INVALID_VALUE))
                registered = 1, rc = 0; /* no host-node memory in this driver */
            else
                snprintf(err, errlen, "cuMemGetAllocationGranularity on host node %d", node);
        }
        if (!rc) {
            memset(s, 0, sizeof *s);
            s->open = 1, s->node = node, s->ndevices = ndevices, s->registered = registered;
            s->granularity = registered ? REGISTERED_GRANULE : g;
            memcpy(s->devices, devices, sizeof(int) * (size_t)ndevices);
        }
    }
    pthread_mutex_unlock(&tier_lock);
    return rc;
}

/* Pages of [p, p + size) not on ``node``, asked of the kernel (move_pages, no move);
 * pages it cannot say count as elsewhere. */
static uint64_t pages_elsewhere(cu_ptr p, size_t size, int node) {
    enum { BATCH = 1024 };
    void *addr[BATCH];
    int status[BATCH];
    uint64_t off = 0, bad = 0;
    size_t n = (size + TIER_PAGE - 1) / TIER_PAGE;
    while (off < n) {
        size_t k = n - off < BATCH ? n - off : BATCH;
        for (size_t i = 0; i < k; i++) addr[i] = (void *)(uintptr_t)(p + (off + i) * TIER_PAGE);
        if (syscall(SYS_move_pages, 0, k, addr, NULL, status, 0) != 0) return n - off + bad;
        for (size_t i = 0; i < k; i++) bad += status[i] != node;
        off += k;
    }
    return bad;
}

static void unmap_seg(struct tier_seg *g) {
    if (g->freed) {
        tier_cu.event_sync(g->freed);
        tier_cu.event_destroy(g->freed);
    }
    if (g->host) {
        tier_cu.host_unregister(g->host);
        munmap(g->host, g->size);
        free(g);
        return;
    }
    tier_cu.unmap(g->ptr, g->size);
    tier_cu.release(g->handle);
    tier_cu.address_free(g->ptr, g->size);
    free(g);
}

/* A registered mapping: anonymous memory bound to the slot's node, pinned and mapped for
 * the GPUs by the driver (which faults its pages in, where the policy puts them). */
static struct tier_seg *map_registered(struct tier_slot *s, int slot, size_t rounded, char *why, size_t whylen) {
    struct tier_seg *seg = calloc(1, sizeof *seg);
    const char *call = "";
    cu_result rc = 0;
    if (!seg) return NULL;
    seg->size = rounded, seg->slot = slot;
    void *p = mmap(NULL, rounded, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) {
        snprintf(why, whylen, "mmap of %zu bytes failed", rounded);
        free(seg);
        return NULL;
    }
    unsigned long mask[1024 / (8 * sizeof(unsigned long))] = {0};
    mask[s->node / (8 * sizeof(unsigned long))] |= 1UL << (s->node % (8 * sizeof(unsigned long)));
    if (syscall(SYS_mbind, p, rounded, MPOL_BIND_MODE, mask, (unsigned long)1024 + 1, 0) != 0) {
        snprintf(why, whylen, "mbind of %zu bytes to node %d failed", rounded, s->node);
        munmap(p, rounded);
        free(seg);
        return NULL;
    }
    if ((rc = tier_cu.host_register(p, rounded, HOST_REGISTER_PORTABLE | HOST_REGISTER_DEVICEMAP))) {
        call = "cuMemHostRegister";
        munmap(p, rounded);
        goto fail;
    }
    seg->host = p;
    if ((rc = tier_cu.host_device_pointer(&seg->ptr, p, 0))) { call = "cuMemHostGetDevicePointer"; goto undo; }
    if ((rc = tier_cu.event_create(&seg->freed, EVENT_NO_TIMING))) {
        seg->freed = NULL;
        call = "cuEventCreate";
        goto undo;
    }
    return seg;
undo:
    snprintf(why, whylen, "%s of %zu bytes on host node %d: CUDA error %d", call, rounded, s->node, rc);
    unmap_seg(seg);
    return NULL;
fail:
    snprintf(why, whylen, "%s of %zu bytes on host node %d: CUDA error %d", call, rounded, s->node, rc);
    free(seg);
    return NULL;
}

/* A new mapping of ``size`` bytes (rounded up) on the slot's node; NULL with the reason
 * in the slot's error. Called without the lock. */
static struct tier_seg *map_new(struct tier_slot *s, int slot, size_t size, char *why, size_t whylen) {
    size_t g = s->granularity, rounded = (size + g - 1) / g * g;
    if (s->registered) return map_registered(s, slot, rounded, why, whylen);
    cu_alloc_prop prop = prop_of(s->node);
    struct tier_seg *seg = calloc(1, sizeof *seg);
    cu_result rc;
    const char *call = "";
    if (!seg) return NULL;
    seg->size = rounded, seg->slot = slot;
    if ((rc = tier_cu.reserve(&seg->ptr, rounded, g, 0, 0))) { call = "cuMemAddressReserve"; goto fail; }
    if ((rc = tier_cu.create(&seg->handle, rounded, &prop, 0))) {
        call = "cuMemCreate";
        tier_cu.address_free(seg->ptr, rounded);
        goto fail;
    }
    if ((rc = tier_cu.map(seg->ptr, rounded, 0, seg->handle, 0))) {
        call = "cuMemMap";
        tier_cu.release(seg->handle);
        tier_cu.address_free(seg->ptr, rounded);
        goto fail;
    }
    cu_access acc[TIER_DEVICES + 1];
    int n = 0;
    for (int i = 0; i < s->ndevices; i++)
        acc[n++] = (cu_access){{LOC_DEVICE, s->devices[i]}, ACCESS_READWRITE};
    if ((rc = tier_cu.set_access(seg->ptr, rounded, acc, (size_t)n))) {
        call = "cuMemSetAccess (GPUs)";
        goto unmap;
    }
    /* the CPU reads and writes it too, and must: otherwise the kernel cannot say where
     * its pages are, and memory whose node is not known is not given out */
    cu_access host = {{LOC_HOST, 0}, ACCESS_READWRITE};
    if ((rc = tier_cu.set_access(seg->ptr, rounded, &host, 1))) {
        call = "cuMemSetAccess (the CPU, to count its pages)";
        goto unmap;
    }
    if ((rc = tier_cu.event_create(&seg->freed, EVENT_NO_TIMING))) {
        seg->freed = NULL;
        call = "cuEventCreate";
        goto unmap;
    }
    return seg;
unmap:
    {
        cu_event e = seg->freed;
        seg->freed = NULL;
        if (e) tier_cu.event_destroy(e);
        unmap_seg(seg);
        snprintf(why, whylen, "%s of %zu bytes on host node %d: CUDA error %d", call, rounded, s->node, rc);
        return NULL;
    }
fail:
    snprintf(why, whylen, "%s of %zu bytes on host node %d: CUDA error %d", call, rounded, s->node, rc);
    free(seg);
    return NULL;
}

/* The cached mapping that fits ``size`` best (at most twice it), taken off the list. */
static struct tier_seg *take_cached(struct tier_slot *s, size_t size) {
    struct tier_seg **best = NULL;
    for (struct tier_seg **at = &s->cached; *at; at = &(*at)->next)
        if ((*at)->size >= size && (*at)->size <= 2 * size + s->granularity &&
            (!best || (*at)->size < (*best)->size))
            best = at;
    if (!best) return NULL;
    struct tier_seg *g = *best;
    *best = g->next;
    return g;
}

static void release_cached(struct tier_slot *s) {
    while (s->cached) {
        struct tier_seg *g = s->cached;
        s->cached = g->next;
        s->mapped -= g->size;
        unmap_seg(g);
    }
}

static void *alloc_on(int slot, size_t size, cu_stream stream) {
    if (slot < 0 || slot >= TIER_SLOTS || !tier_slots[slot].open || size == 0) return NULL;
    struct tier_slot *s = &tier_slots[slot];
    char why[256] = "";
    pthread_mutex_lock(&tier_lock);
    struct tier_seg *seg = take_cached(s, size);
    pthread_mutex_unlock(&tier_lock);
    if (seg) {
        tier_cu.stream_wait(stream, seg->freed, 0); /* after the GPU work of its last use */
    } else {
        seg = map_new(s, slot, size, why, sizeof why);
        if (!seg) { /* the node may be full of what is cached: give that back, try again */
            pthread_mutex_lock(&tier_lock);
            int had = s->cached != NULL;
            release_cached(s);
            pthread_mutex_unlock(&tier_lock);
            if (had) seg = map_new(s, slot, size, why, sizeof why);
        }
        uint64_t bad = 0;
        if (seg) bad = pages_elsewhere(seg->host ? (cu_ptr)(uintptr_t)seg->host : seg->ptr, seg->size, s->node);
        pthread_mutex_lock(&tier_lock);
        if (seg) s->mapped += seg->size;
        if (seg && bad) {
            s->misplaced_pages += bad;
            s->mapped -= seg->size;
            snprintf(why, sizeof why, "%llu of the %zu-byte mapping's pages are not on node %d",
                     (unsigned long long)bad, seg->size, s->node);
            pthread_mutex_unlock(&tier_lock);
            unmap_seg(seg);
            seg = NULL;
            pthread_mutex_lock(&tier_lock);
        }
        if (!seg) {
            s->refused++;
            snprintf(s->error, sizeof s->error, "%s", why);
            pthread_mutex_unlock(&tier_lock);
            return NULL;
        }
        if (s->mapped > s->mapped_peak) s->mapped_peak = s->mapped; /* kept mappings only */
        pthread_mutex_unlock(&tier_lock);
    }
    pthread_mutex_lock(&tier_lock);
    seg->asked = size;
    seg->kind = use_kind;
    s->now += seg->size;
    s->allocations++;
    s->bytes_total += size;
    if (s->now > s->peak) s->peak = s->now;
    tier_remember(seg);
    pthread_mutex_unlock(&tier_lock);
    return (void *)(uintptr_t)seg->ptr;
}

/* 1 if ``p`` was a tier mapping (now cached for reuse after ``stream``'s work; ``kind``
 * what it was made for), else 0. */
static int free_on(cu_ptr p, cu_stream stream, int *kind) {
    pthread_mutex_lock(&tier_lock);
    struct tier_seg *seg = tier_forget(p);
    if (seg) {
        if (kind) *kind = seg->kind;
        seg->kind = USE_KIND_OTHER;
        struct tier_slot *s = &tier_slots[seg->slot];
        tier_cu.event_record(seg->freed, stream);
        s->now -= seg->size;
        seg->next = s->cached;
        s->cached = seg;
    }
    pthread_mutex_unlock(&tier_lock);
    return seg != NULL;
}

/* The per-tier allocators (PyTorch's pluggable allocator signature). */
#define SLOT_ALLOCATOR(N) \
    __attribute__((visibility("default"))) void *pycxl_tier_malloc_##N(ssize_t size, int device, cu_stream stream) { \
        ensure_context(device); return size > 0 ? alloc_on(N, (size_t)size, stream) : NULL; } \
    __attribute__((visibility("default"))) void pycxl_tier_free_##N(void *ptr, ssize_t size, int device, cu_stream stream) { \
        (void)size; ensure_context(device); free_on((cu_ptr)(uintptr_t)ptr, stream, NULL); }
SLOT_ALLOCATOR(0) SLOT_ALLOCATOR(1) SLOT_ALLOCATOR(2) SLOT_ALLOCATOR(3)
SLOT_ALLOCATOR(4) SLOT_ALLOCATOR(5) SLOT_ALLOCATOR(6) SLOT_ALLOCATOR(7)

/* What a spilling process holds, by device, counted as PyTorch's allocator statistics
 * count it (``torch.cuda.memory_stats`` reads these under the spill): bytes and
 * allocations in the small (1 MiB and under) and large classes and both together, and
 * the bytes in the GPU's memory and on the tier apart, those on the tier by what they
 * were made for (optimizer state, activations saved for the backward pass). Each figure
 * is current, peak, allocated (ever) and freed (ever); the peaks and totals are the
 * user's to reset. ``lifetime_peak`` is not: the placement reads it. */
enum { USE_BYTES, USE_BYTES_SMALL, USE_BYTES_LARGE, USE_COUNT, USE_COUNT_SMALL,
       USE_COUNT_LARGE, USE_HBM, USE_TIER, USE_TIER_STATE, USE_TIER_SAVED, USE_TIER_OTHER,
       USE_FIGURES };
struct use_figure { int64_t current, peak, allocated, freed; };
static struct {
    struct use_figure f[USE_FIGURES];
    int64_t lifetime_peak;
    /* the spilled bytes (on the tier, made for nothing in particular): their lowest
     * since the last tier_spilled_rise, and the most they rose above a low before it:
     * what a step spilled, even where earlier spills were freed in it first */
    int64_t other_low, other_rise;
} use[TIER_DEVICES];
static pthread_mutex_t use_lock = PTHREAD_MUTEX_INITIALIZER;
#define SMALL_CLASS ((size_t)1 << 20)

static void figure_move(struct use_figure *f, int64_t by) {
    f->current += by;
    if (by > 0) f->allocated += by; else f->freed -= by;
    if (f->current > f->peak) f->peak = f->current;
}

static void use_move(int dev, size_t size, int on_tier, int kind, int sign) {
    if (dev < 0) return;
    int64_t by = sign * (int64_t)size;
    int small = size <= SMALL_CLASS; /* PyTorch's small pool: 1 MiB and under */
    pthread_mutex_lock(&use_lock);
    struct use_figure *f = use[dev].f;
    figure_move(&f[USE_BYTES], by);
    figure_move(&f[small ? USE_BYTES_SMALL : USE_BYTES_LARGE], by);
    figure_move(&f[USE_COUNT], sign);
    figure_move(&f[small ? USE_COUNT_SMALL : USE_COUNT_LARGE], sign);
    figure_move(&f[on_tier ? USE_TIER : USE_HBM], by);
    if (on_tier && kind == USE_KIND_STATE) figure_move(&f[USE_TIER_STATE], by);
    if (on_tier && kind == USE_KIND_SAVED) figure_move(&f[USE_TIER_SAVED], by);
    if (on_tier && kind == USE_KIND_OTHER) {
        figure_move(&f[USE_TIER_OTHER], by);
        int64_t now = f[USE_TIER_OTHER].current;
        if (now < use[dev].other_low) use[dev].other_low = now;
        if (now - use[dev].other_low > use[dev].other_rise)
            use[dev].other_rise = now - use[dev].other_low;
    }
    if (f[USE_BYTES].current > use[dev].lifetime_peak)
        use[dev].lifetime_peak = f[USE_BYTES].current;
    pthread_mutex_unlock(&use_lock);
}

/* Room in the GPU's memory for a spilling process: what the driver has free plus what
 * the device's stream-ordered pool (the one cuMemAllocAsync takes from) holds unused:
 * memory freed into it, which the driver counts as used but the pool gives out again.
 * Asked of the driver only when the last answer for the device, less what was allocated
 * on it since, comes near the size asked and the headroom: asking on every allocation
 * costs more than the allocation. Memory others allocate between answers goes unseen up
 * to ROOM_MARGIN. */
#define ROOM_MARGIN ((size_t)1 << 30)
static struct {
    size_t known;  /* bytes, at the last answer */
    int64_t used;  /* bytes allocated less bytes freed since that answer */
    void *pool;    /* the pool whose release threshold was raised */
} room[TIER_DEVICES];

static int room_index(int device) { return device >= 0 && device < TIER_DEVICES ? device : -1; }

static size_t hbm_room(int dev, size_t want) {
    if (dev < 0) return SIZE_MAX; /* no device to ask about: no reason to spill */
    int64_t used = __atomic_load_n(&room[dev].used, __ATOMIC_RELAXED);
    size_t known = __atomic_load_n(&room[dev].known, __ATOMIC_RELAXED);
    if (known && (int64_t)known - used > (int64_t)(want + spill_headroom + ROOM_MARGIN))
        return known - (size_t)used;
    size_t free_bytes = 0, total = 0;
    if (tier_cu.mem_info(&free_bytes, &total) != CU_OK) return SIZE_MAX; /* as before: no spill */
    void *pool = NULL;
    uint64_t reserved = 0, in_use = 0;
    if (tier_cu.current_pool(&pool, dev) == CU_OK &&
        tier_cu.pool_get(pool, POOL_RESERVED_CURRENT, &reserved) == CU_OK &&
        tier_cu.pool_get(pool, POOL_USED_CURRENT, &in_use) == CU_OK && reserved > in_use) {
        /* The headroom must be free in the driver's count, not idle in the pool: cuBLAS,
         * cuDNN and kernels that need more local memory ask the driver, not the pool, and
         * fail inside the library (CUBLAS_STATUS_INTERNAL_ERROR) when it has none. */
        if (free_bytes < spill_headroom) {
            size_t give = spill_headroom - free_bytes;
            size_t idle = (size_t)(reserved - in_use);
            tier_cu.pool_trim(pool, (size_t)reserved - (give < idle ? give : idle));
            size_t after = 0;
            if (tier_cu.mem_info(&after, &total) == CU_OK && after > free_bytes) {
                size_t given = after - free_bytes;
                idle = given < idle ? idle - given : 0;
                free_bytes = after;
            }
            reserved = in_use + idle;
        }
        free_bytes += (size_t)(reserved - in_use);
    }
    if (pool && pool != room[dev].pool) {
        /* keep what is freed for reuse (as PyTorch's cudaMallocAsync backend does): given
         * back at every synchronisation, it would be mapped again at the next step */
        uint64_t keep = UINT64_MAX;
        tier_cu.pool_set(pool, POOL_RELEASE_THRESHOLD, &keep);
        room[dev].pool = pool;
    }
    __atomic_store_n(&room[dev].used, 0, __ATOMIC_RELAXED);
    __atomic_store_n(&room[dev].known, free_bytes, __ATOMIC_RELAXED);
    return free_bytes;
}

/* ``p`` (NULL: refused), counted in the process's figures (a tier mapping keeps the
 * thread's kind from alloc_on, for its free). */
static void *counted(void *p, int dev, size_t size, int on_tier) {
    if (p) use_move(dev, size, on_tier, use_kind, 1);
    return p;
}

/* The whole-process allocator: this thread's preferred tier, else the GPU's memory, else
 * the spill tier. */
__attribute__((visibility("default"))) void *pycxl_cuda_malloc(ssize_t size, int device, cu_stream stream) {
    if (size <= 0) return NULL;
    ensure_context(device);
    int dev = room_index(device);
    if (preferred_slot >= 0)
        return counted(alloc_on(preferred_slot, (size_t)size, stream), dev, (size_t)size, 1);
    cu_ptr p = 0;
    cu_result rc = CU_OUT_OF_MEMORY;
    int spill_now = spill_slot >= 0 && (size_t)size >= ((size_t)1 << 20) &&
                    hbm_room(dev, (size_t)size) < (size_t)size + spill_headroom;
    if (!spill_now) {
        rc = tier_cu.alloc_async(&p, (size_t)size, stream);
        if (rc == CU_OK) {
            if (dev >= 0) __atomic_add_fetch(&room[dev].used, (int64_t)size, __ATOMIC_RELAXED);
            return counted((void *)(uintptr_t)p, dev, (size_t)size, 0);
        }
        if (dev >= 0) /* refused: ask the driver next time */
            __atomic_store_n(&room[dev].known, 0, __ATOMIC_RELAXED);
    }
    if (rc != CU_OUT_OF_MEMORY || spill_slot < 0) return NULL;
    __atomic_add_fetch(&hbm_refusals, 1, __ATOMIC_RELAXED);
    void *out = counted(alloc_on(spill_slot, (size_t)size, stream), dev, (size_t)size, 1);
    /* Python hears of a spill only on the thread that turned the log on (the program's
     * own, running Python code: its frames are the call site); another thread (autograd's)
     * taking the GIL inside an allocation that a Python thread may be waiting for could
     * deadlock, so its spills are only counted (in the slot's allocations) */
    if (out && log_spills && (pid_t)syscall(SYS_gettid) == log_thread)
        tier_spilled(spill_slot, (size_t)size);
    return out;
}

__attribute__((visibility("default"))) void pycxl_cuda_free(void *ptr, ssize_t size, int device, cu_stream stream) {
    ensure_context(device);
    int dev = room_index(device), kind = USE_KIND_OTHER;
    if (free_on((cu_ptr)(uintptr_t)ptr, stream, &kind)) {
        use_move(dev, (size_t)size, 1, kind, -1);
    } else {
        tier_cu.free_async((cu_ptr)(uintptr_t)ptr, stream);
        if (dev >= 0) __atomic_sub_fetch(&room[dev].used, (int64_t)size, __ATOMIC_RELAXED);
        use_move(dev, (size_t)size, 0, kind, -1);
    }
}

/* The process's figures for ``device``: USE_FIGURES x (current, peak, allocated, freed),
 * then the lifetime peak of the bytes. -1: no such device. */
int tier_use(int device, int64_t *out) {
    int dev = room_index(device);
    if (dev < 0) return -1;
    pthread_mutex_lock(&use_lock);
    for (int i = 0; i < USE_FIGURES; i++) {
        struct use_figure *f = &use[dev].f[i];
        out[4 * i] = f->current, out[4 * i + 1] = f->peak;
        out[4 * i + 2] = f->allocated, out[4 * i + 3] = f->freed;
    }
    out[4 * USE_FIGURES] = use[dev].lifetime_peak;
    pthread_mutex_unlock(&use_lock);
    return 0;
}

/* How far the spilled bytes on ``device`` rose since the last call, from the lowest
 * they had been before the rise (so spills of an earlier step freed in this one and
 * made again count); the count starts again from now. -1: no such device. A step's
 * rise is what HBM lacked at its peak; spills that stay from earlier steps are not
 * counted again. */
int64_t tier_spilled_rise(int device) {
    int dev = room_index(device);
    if (dev < 0) return -1;
    pthread_mutex_lock(&use_lock);
    int64_t rise = use[dev].other_rise;
    use[dev].other_low = use[dev].f[USE_TIER_OTHER].current;
    use[dev].other_rise = 0;
    pthread_mutex_unlock(&use_lock);
    return rise;
}

/* Reset the peaks (what = 0) or the totals ever allocated and freed (what = 1). */
int tier_use_reset(int device, int what) {
    int dev = room_index(device);
    if (dev < 0) return -1;
    pthread_mutex_lock(&use_lock);
    for (int i = 0; i < USE_FIGURES; i++) {
        struct use_figure *f = &use[dev].f[i];
        if (what == 0) f->peak = f->current; else f->allocated = f->freed = 0;
    }
    pthread_mutex_unlock(&use_lock);
    if (what == 0) {
        void *pool = NULL;
        uint64_t zero = 0; /* the driver resets a high mark to zero only */
        if (tier_cu.loaded && tier_cu.current_pool(&pool, device) == CU_OK)
            tier_cu.pool_set(pool, POOL_RESERVED_HIGH, &zero);
        pthread_mutex_lock(&tier_lock);
        if (spill_slot >= 0) tier_slots[spill_slot].mapped_peak = tier_slots[spill_slot].mapped;
        pthread_mutex_unlock(&tier_lock);
    }
    return 0;
}

/* 1 if ``p`` is the start of a live tier allocation, else 0. */
int tier_owns(uint64_t p) {
    pthread_mutex_lock(&tier_lock);
    int found = tier_find((cu_ptr)p) != NULL;
    pthread_mutex_unlock(&tier_lock);
    return found;
}

/* Bytes the spill tier maps now (in use or cached) and at its high mark; -1: no spill. */
int tier_spill_mapped(uint64_t *now, uint64_t *high) {
    if (spill_slot < 0) return -1;
    pthread_mutex_lock(&tier_lock);
    *now = tier_slots[spill_slot].mapped, *high = tier_slots[spill_slot].mapped_peak;
    pthread_mutex_unlock(&tier_lock);
    return 0;
}

/* Room for a spilling process in ``device``'s memory (hbm_room), SIZE_MAX where the
 * driver cannot tell; ``settle``: first give the pool's idle memory back. */
uint64_t tier_hbm_room(int device, int settle) {
    if (!tier_cu.loaded) return UINT64_MAX;
    ensure_context(device);
    void *pool = NULL;
    /* settled (after the caller synchronised): the pool's idle memory goes back to the
     * driver, so the room is what a new large allocation can get, not idle pieces */
    if (settle && tier_cu.current_pool(&pool, device) == CU_OK) tier_cu.pool_trim(pool, 0);
    return hbm_room(room_index(device), (size_t)1 << 40);
}

/* What this thread's tier allocations are made for from now on (USE_KIND_*); the kind
 * before. */
int tier_kind(int kind) {
    int before = use_kind;
    use_kind = kind;
    return before;
}

/* The driver's own figures for the device's stream-ordered pool, the one the spill
 * takes HBM from: bytes reserved now and at their high mark. -1 where it cannot tell. */
int tier_hbm_reserved(int device, uint64_t *now, uint64_t *high) {
    void *pool = NULL;
    if (!tier_cu.loaded || tier_cu.current_pool(&pool, device) != CU_OK) return -1;
    if (tier_cu.pool_get(pool, POOL_RESERVED_CURRENT, now) != CU_OK ||
        tier_cu.pool_get(pool, POOL_RESERVED_HIGH, high) != CU_OK) return -1;
    return 0;
}

int tier_spill_to(int slot, size_t headroom) {
    if (slot >= TIER_SLOTS || (slot >= 0 && !tier_slots[slot].open)) return -1;
    spill_headroom = headroom;
    spill_slot = slot;
    return 0;
}

int tier_prefer(int slot) {
    int before = preferred_slot;
    preferred_slot = slot;
    return before;
}

void tier_log(int on) {
    log_thread = (pid_t)syscall(SYS_gettid);
    log_spills = on;
}

/* now, peak, allocations, bytes ever asked, refused, misplaced pages, bytes mapped (in use
 * or cached), and (for every slot the same) the GPU allocations sent on to the spill tier */
int tier_stats(int slot, uint64_t *out, char *error, size_t errlen) {
    if (slot < 0 || slot >= TIER_SLOTS || !tier_slots[slot].open) return -1;
    pthread_mutex_lock(&tier_lock);
    struct tier_slot *s = &tier_slots[slot];
    out[0] = s->now, out[1] = s->peak, out[2] = s->allocations, out[3] = s->bytes_total;
    out[4] = s->refused, out[5] = s->misplaced_pages, out[6] = s->mapped;
    out[7] = __atomic_load_n(&hbm_refusals, __ATOMIC_RELAXED);
    snprintf(error, errlen, "%s", s->error);
    pthread_mutex_unlock(&tier_lock);
    return 0;
}

/* 1 if slot ``slot`` makes registered memory, 0 if memory on the host node, -1: not open. */
int tier_registered(int slot) {
    if (slot < 0 || slot >= TIER_SLOTS || !tier_slots[slot].open) return -1;
    return tier_slots[slot].registered;
}

/* For callers outside PyTorch: one allocation on a tier, and its free. */
uint64_t tier_alloc(int slot, size_t size, void *stream) {
    return (uint64_t)(uintptr_t)alloc_on(slot, size, stream);
}

void tier_free(uint64_t ptr, void *stream) { free_on((cu_ptr)ptr, stream, NULL); }

/* Give the cached mappings back (each after the GPU work of its last use). */
int tier_trim(int slot) {
    if (slot < 0 || slot >= TIER_SLOTS || !tier_slots[slot].open) return -1;
    pthread_mutex_lock(&tier_lock);
    release_cached(&tier_slots[slot]);
    pthread_mutex_unlock(&tier_lock);
    return 0;
}
