/* Device-addressable memory on a host NUMA node (a tier), for CUDA programs.
 *
 * Each tier is a CUDA stream-ordered memory pool whose location is a host NUMA node
 * (CU_MEM_LOCATION_TYPE_HOST_NUMA), readable and writable by the GPU: allocations are
 * pinned host pages on that node, cached by the pool, freed in stream order. Two ways in:
 *
 * - pycxl_tier_malloc_N / pycxl_tier_free_N: the allocator of one tier (slot N), for a
 *   PyTorch MemPool (CUDAPluggableAllocator) or any caller that wants tier memory;
 * - pycxl_cuda_malloc / pycxl_cuda_free: a whole-process allocator that takes the GPU's
 *   own memory first (its default stream-ordered pool) and, when that is out of memory,
 *   the spill tier; a thread may prefer a tier for what it allocates (tier_prefer).
 *
 * Placement is checked, not assumed: whenever a pool's reserve grows, the pages of the
 * new allocation are asked for their node (move_pages without moving); an allocation
 * with a page elsewhere is freed and refused. The driver is reached through dlopen, so
 * the module loads on machines without it. */
#include <dlfcn.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <unistd.h>

#define TIER_SLOTS 8
#define TIER_PAGE 4096
#define CU_OK 0
#define CU_OUT_OF_MEMORY 2

typedef int cu_result;
typedef unsigned long long cu_ptr;
typedef void *cu_pool;
typedef void *cu_stream;
typedef struct { int type; int id; } cu_location;
typedef struct {
    int alloc_type;
    int handle_types;
    cu_location location;
    void *win32_security;
    unsigned char rest[64]; /* maxSize, usage, reserved: zero */
} cu_pool_props;
typedef struct { cu_location location; int flags; } cu_access;

enum { LOC_DEVICE = 1, LOC_HOST_NUMA = 3, ALLOC_PINNED = 1, ACCESS_READWRITE = 3 };
enum { POOL_RELEASE_THRESHOLD = 4, POOL_RESERVED_CURRENT = 5 };

static struct {
    int loaded;
    cu_result (*pool_create)(cu_pool *, const cu_pool_props *);
    cu_result (*pool_destroy)(cu_pool);
    cu_result (*pool_set_access)(cu_pool, const cu_access *, size_t);
    cu_result (*pool_set_attribute)(cu_pool, int, void *);
    cu_result (*pool_get_attribute)(cu_pool, int, void *);
    cu_result (*pool_trim)(cu_pool, size_t);
    cu_result (*alloc_from_pool)(cu_ptr *, size_t, cu_pool, cu_stream);
    cu_result (*alloc_async)(cu_ptr *, size_t, cu_stream);
    cu_result (*free_async)(cu_ptr, cu_stream);
    cu_result (*stream_sync)(cu_stream);
} tier_cu;

struct tier_slot {
    int open, node;
    cu_pool pool;
    uint64_t reserved;             /* the pool's reserve after its last growth */
    uint64_t now, peak, allocations, bytes_total, refused;
    uint64_t misplaced_pages;
    char error[256];
};

static struct tier_slot tier_slots[TIER_SLOTS];
static pthread_mutex_t tier_lock = PTHREAD_MUTEX_INITIALIZER;
static int spill_slot = -1;
static __thread int preferred_slot = -1;
static uint64_t hbm_refusals;
static int log_spills; /* tier_log(1): each spill is told to Python (tier_spilled) */
static pid_t log_thread;
static uint64_t unlogged_spills;
static void tier_spilled(int slot, size_t size, int in_python);

/* ptr -> slot of each live tier allocation (the whole-process allocator frees both) */
#define BUCKETS 4096
struct tier_entry { cu_ptr ptr; size_t size; int slot; struct tier_entry *next; };
static struct tier_entry *tier_live[BUCKETS];

static unsigned tier_bucket(cu_ptr p) { return (unsigned)((p >> 9) ^ (p >> 21)) % BUCKETS; }

static void tier_remember(cu_ptr p, size_t size, int slot) {
    struct tier_entry *l = malloc(sizeof *l);
    if (!l) return;
    l->ptr = p, l->size = size, l->slot = slot;
    l->next = tier_live[tier_bucket(p)], tier_live[tier_bucket(p)] = l;
}

static int tier_forget(cu_ptr p, size_t *size) {
    struct tier_entry **at = &tier_live[tier_bucket(p)];
    for (; *at; at = &(*at)->next)
        if ((*at)->ptr == p) {
            struct tier_entry *l = *at;
            int slot = l->slot;
            *size = l->size;
            *at = l->next;
            free(l);
            return slot;
        }
    return -1;
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
        snprintf(err, errlen, "the CUDA driver lacks %s (stream-ordered memory pools " \
                 "need driver 11.2 or later; host NUMA pools 12.2)", name); \
        return -1; \
    }
    BIND(pool_create, "cuMemPoolCreate");
    BIND(pool_destroy, "cuMemPoolDestroy");
    BIND(pool_set_access, "cuMemPoolSetAccess");
    BIND(pool_set_attribute, "cuMemPoolSetAttribute");
    BIND(pool_get_attribute, "cuMemPoolGetAttribute");
    BIND(pool_trim, "cuMemPoolTrimTo");
    BIND(alloc_from_pool, "cuMemAllocFromPoolAsync");
    BIND(alloc_async, "cuMemAllocAsync");
    BIND(free_async, "cuMemFreeAsync");
    BIND(stream_sync, "cuStreamSynchronize");
#undef BIND
    tier_cu.loaded = 1;
    return 0;
}

/* Open slot ``slot`` as a pool on host node ``node``, usable by each of ``ndevices``
 * CUDA devices. 0, or the CUDA result (a message in err), or -1 (a message in err). */
int tier_open(int slot, int node, const int *devices, int ndevices, char *err, size_t errlen) {
    if (slot < 0 || slot >= TIER_SLOTS) {
        snprintf(err, errlen, "tier slot %d is not one of 0-%d", slot, TIER_SLOTS - 1);
        return -1;
    }
    if (load_driver(err, errlen)) return -1;
    pthread_mutex_lock(&tier_lock);
    struct tier_slot *s = &tier_slots[slot];
    int rc = 0;
    if (s->open) goto out;
    cu_pool_props props;
    memset(&props, 0, sizeof props);
    props.alloc_type = ALLOC_PINNED;
    props.location.type = LOC_HOST_NUMA;
    props.location.id = node;
    cu_pool pool = 0;
    if ((rc = tier_cu.pool_create(&pool, &props))) {
        snprintf(err, errlen, "cuMemPoolCreate on host node %d", node);
        goto out;
    }
    for (int i = 0; i < ndevices; i++) {
        cu_access a = {{LOC_DEVICE, devices[i]}, ACCESS_READWRITE};
        if ((rc = tier_cu.pool_set_access(pool, &a, 1))) {
            snprintf(err, errlen, "cuMemPoolSetAccess for CUDA device %d", devices[i]);
            tier_cu.pool_destroy(pool);
            goto out;
        }
    }
    uint64_t keep = UINT64_MAX; /* the pool keeps what it reserved: no release per sync */
    tier_cu.pool_set_attribute(pool, POOL_RELEASE_THRESHOLD, &keep);
    memset(s, 0, sizeof *s);
    s->open = 1, s->node = node, s->pool = pool;
out:
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
    cu_ptr first = p & ~(cu_ptr)(TIER_PAGE - 1);
    size_t n = (size_t)((p + size - first + TIER_PAGE - 1) / TIER_PAGE);
    while (off < n) {
        size_t k = n - off < BATCH ? n - off : BATCH;
        for (size_t i = 0; i < k; i++) addr[i] = (void *)(uintptr_t)(first + (off + i) * TIER_PAGE);
        if (syscall(SYS_move_pages, 0, k, addr, NULL, status, 0) != 0) return n - off + bad;
        for (size_t i = 0; i < k; i++) bad += status[i] != node;
        off += k;
    }
    return bad;
}

static uint64_t reserve_of(struct tier_slot *s) {
    uint64_t v = 0;
    tier_cu.pool_get_attribute(s->pool, POOL_RESERVED_CURRENT, &v);
    return v;
}

static void *alloc_on(int slot, size_t size, cu_stream stream) {
    if (slot < 0 || slot >= TIER_SLOTS || !tier_slots[slot].open || size == 0) return NULL;
    struct tier_slot *s = &tier_slots[slot];
    cu_ptr p = 0;
    cu_result rc = tier_cu.alloc_from_pool(&p, size, s->pool, stream);
    pthread_mutex_lock(&tier_lock);
    if (rc != CU_OK) {
        s->refused++;
        snprintf(s->error, sizeof s->error, "cuMemAllocFromPoolAsync of %zu bytes on host "
                 "node %d: CUDA error %d", size, s->node, rc);
        pthread_mutex_unlock(&tier_lock);
        return NULL;
    }
    uint64_t reserve = reserve_of(s);
    if (reserve > s->reserved) { /* new pages: where did they land? */
        /* the pages exist once the GPU or the CPU touched them; the pool backs them at
         * allocation (pinned), so the kernel answers now */
        tier_cu.stream_sync(stream);
        uint64_t bad = pages_elsewhere(p, size, s->node);
        if (bad) {
            s->misplaced_pages += bad;
            s->refused++;
            snprintf(s->error, sizeof s->error, "%llu of the %zu-byte allocation's pages are "
                     "not on node %d", (unsigned long long)bad, size, s->node);
            pthread_mutex_unlock(&tier_lock);
            tier_cu.free_async(p, stream);
            return NULL;
        }
        s->reserved = reserve;
    }
    s->now += size;
    s->allocations++;
    s->bytes_total += size;
    if (s->now > s->peak) s->peak = s->now;
    tier_remember(p, size, slot);
    pthread_mutex_unlock(&tier_lock);
    return (void *)(uintptr_t)p;
}

static void free_on(cu_ptr p, cu_stream stream) {
    size_t size = 0;
    pthread_mutex_lock(&tier_lock);
    int slot = tier_forget(p, &size);
    if (slot >= 0) tier_slots[slot].now -= size;
    pthread_mutex_unlock(&tier_lock);
    tier_cu.free_async(p, stream);
}

/* The per-tier allocators (PyTorch's pluggable allocator signature). */
#define SLOT_ALLOCATOR(N) \
    __attribute__((visibility("default"))) void *pycxl_tier_malloc_##N(ssize_t size, int device, cu_stream stream) { \
        (void)device; return alloc_on(N, (size_t)size, stream); } \
    __attribute__((visibility("default"))) void pycxl_tier_free_##N(void *ptr, ssize_t size, int device, cu_stream stream) { \
        (void)size; (void)device; free_on((cu_ptr)(uintptr_t)ptr, stream); }
SLOT_ALLOCATOR(0) SLOT_ALLOCATOR(1) SLOT_ALLOCATOR(2) SLOT_ALLOCATOR(3)
SLOT_ALLOCATOR(4) SLOT_ALLOCATOR(5) SLOT_ALLOCATOR(6) SLOT_ALLOCATOR(7)

/* The whole-process allocator: this thread's preferred tier, else the GPU's memory, else
 * the spill tier. */
__attribute__((visibility("default"))) void *pycxl_cuda_malloc(ssize_t size, int device, cu_stream stream) {
    (void)device;
    if (size <= 0) return NULL;
    if (preferred_slot >= 0) return alloc_on(preferred_slot, (size_t)size, stream);
    cu_ptr p = 0;
    cu_result rc = tier_cu.alloc_async(&p, (size_t)size, stream);
    if (rc == CU_OK) return (void *)(uintptr_t)p;
    if (rc != CU_OUT_OF_MEMORY || spill_slot < 0) return NULL;
    __atomic_add_fetch(&hbm_refusals, 1, __ATOMIC_RELAXED);
    void *out = alloc_on(spill_slot, (size_t)size, stream);
    /* Python hears of a spill only on the thread that turned the log on (the program's
     * own, running Python code: its frames are the call site); another thread (autograd's)
     * taking the GIL inside an allocation that a Python thread may be waiting for could
     * deadlock, so its spills are only counted */
    if (out && log_spills) {
        int mine = (pid_t)syscall(SYS_gettid) == log_thread;
        if (!mine) __atomic_add_fetch(&unlogged_spills, 1, __ATOMIC_RELAXED);
        else tier_spilled(spill_slot, (size_t)size, 1);
    }
    return out;
}

void tier_log(int on) {
    log_thread = (pid_t)syscall(SYS_gettid);
    log_spills = on;
}

uint64_t tier_unlogged_spills(void) { return __atomic_load_n(&unlogged_spills, __ATOMIC_RELAXED); }

__attribute__((visibility("default"))) void pycxl_cuda_free(void *ptr, ssize_t size, int device, cu_stream stream) {
    (void)size; (void)device;
    free_on((cu_ptr)(uintptr_t)ptr, stream);
}

int tier_spill_to(int slot) {
    if (slot >= TIER_SLOTS || (slot >= 0 && !tier_slots[slot].open)) return -1;
    spill_slot = slot;
    return 0;
}

int tier_prefer(int slot) {
    int before = preferred_slot;
    preferred_slot = slot;
    return before;
}

/* now, peak, allocations, bytes ever, refused, misplaced pages, the pool's reserve, and
 * (for every slot the same) the GPU allocations the whole-process allocator sent on */
int tier_stats(int slot, uint64_t *out, char *error, size_t errlen) {
    if (slot < 0 || slot >= TIER_SLOTS || !tier_slots[slot].open) return -1;
    pthread_mutex_lock(&tier_lock);
    struct tier_slot *s = &tier_slots[slot];
    out[0] = s->now, out[1] = s->peak, out[2] = s->allocations, out[3] = s->bytes_total;
    out[4] = s->refused, out[5] = s->misplaced_pages, out[6] = reserve_of(s);
    out[7] = __atomic_load_n(&hbm_refusals, __ATOMIC_RELAXED);
    snprintf(error, errlen, "%s", s->error);
    pthread_mutex_unlock(&tier_lock);
    return 0;
}

/* For callers outside PyTorch: one allocation on a tier, and its free. */
uint64_t tier_alloc(int slot, size_t size, void *stream) {
    return (uint64_t)(uintptr_t)alloc_on(slot, size, stream);
}

void tier_free(uint64_t ptr, void *stream) { free_on((cu_ptr)ptr, stream); }

/* Give the pool's unused reserve back to the system (after frees, once synchronised). */
int tier_trim(int slot) {
    if (slot < 0 || slot >= TIER_SLOTS || !tier_slots[slot].open) return -1;
    pthread_mutex_lock(&tier_lock);
    int rc = tier_cu.pool_trim(tier_slots[slot].pool, 0);
    tier_slots[slot].reserved = reserve_of(&tier_slots[slot]);
    pthread_mutex_unlock(&tier_lock);
    return rc;
}
