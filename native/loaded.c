/* Latency under load: traffic generators paced by a bandwidth, and a pointer chase timed
 * in short windows, run together.
 *
 * Each load thread owns one slice of the load buffer and moves it in steps of STEP
 * bytes per stream with one of five read/write mixes. Bytes are counted as the memory
 * sees them: a plain store first reads the line it writes (write-allocate), so a copy
 * moves two reads and one write; a non-temporal store only writes.
 *
 *   read      loads only                                  1:0
 *   3:1       two loads, one plain store  (d = a + b)     3 reads : 1 write
 *   2:1       one load, one plain store   (d = a)         2 reads : 1 write
 *   1:1       one load, one NT store      (d = a)         1 read  : 1 write
 *   nt-write  NT stores only              (d = const)     0 reads : 1 write
 *
 * Pacing is the thread's own: after each step it compares the bytes it has moved with
 * what its rate allows by now and spins until the clock catches up. A thread that cannot
 * keep up simply never waits, and the bandwidth it reached is what is reported. Each
 * thread publishes its byte count after every step, so the bandwidth is measured over
 * exactly the time the chase runs.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "pinned_thread.h"
#if defined(__x86_64__)
#include <immintrin.h>
#define LOAD_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define LOAD_CLONES
#endif

enum { MIX_READ = 0, MIX_3_1 = 1, MIX_2_1 = 2, MIX_1_1 = 3, MIX_NT_WRITE = 4 };
#define STEP 16384 /* bytes per stream between clock checks */

static inline uint64_t load_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* streams each mix walks (the slice is cut into this many parts) and the bytes the
 * memory moves per byte of one stream */
static const int mix_streams[] = {1, 3, 2, 2, 1};
static const int mix_traffic[] = {1, 4, 3, 2, 1};

int load_mix_streams(int mix) { return mix_streams[mix]; }
int load_mix_traffic(int mix) { return mix_traffic[mix]; }

static volatile uint64_t load_sink;

LOAD_CLONES
static uint64_t read_step(const uint64_t *restrict a, size_t n)
{
    uint64_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;
    for (size_t i = 0; i < n; i += 4) {
        s0 += a[i];
        s1 += a[i + 1];
        s2 += a[i + 2];
        s3 += a[i + 3];
    }
    return s0 + s1 + s2 + s3;
}

LOAD_CLONES
static void add_step(uint64_t *restrict d, const uint64_t *restrict a,
                     const uint64_t *restrict b, size_t n)
{
    for (size_t i = 0; i < n; i++)
        d[i] = a[i] + b[i];
}

LOAD_CLONES
static void copy_step(uint64_t *restrict d, const uint64_t *restrict a, size_t n)
{
    for (size_t i = 0; i < n; i++)
        d[i] = a[i];
}

#if defined(__x86_64__)
__attribute__((target("avx")))
static void copy_nt_step(uint64_t *restrict d, const uint64_t *restrict a, size_t n)
{
    for (size_t i = 0; i < n; i += 4)
        _mm256_stream_si256((__m256i *)(d + i), _mm256_load_si256((const __m256i *)(a + i)));
}

__attribute__((target("avx")))
static void fill_nt_step(uint64_t *restrict d, size_t n, uint64_t v)
{
    __m256i x = _mm256_set1_epi64x((long long)v);
    for (size_t i = 0; i < n; i += 4)
        _mm256_stream_si256((__m256i *)(d + i), x);
}
#endif

int load_has_nt(void)
{
#if defined(__x86_64__)
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx");
#else
    return 0;
#endif
}

struct load_job {
    char *buf;
    size_t slice; /* bytes per thread, a multiple of streams * STEP */
    int nthreads, mix;
    double ns_per_byte; /* per thread; 0: as fast as it goes */
    volatile int stop;
    volatile uint64_t *moved; /* per thread: bytes the memory moved so far */
};

struct load_worker {
    struct load_job *job;
    int index;
};

static void *load_thread(void *arg)
{
    struct load_worker *w = arg;
    struct load_job *j = w->job;
    int streams = mix_streams[j->mix], traffic = mix_traffic[j->mix];
    size_t part = j->slice / (size_t)streams;
    char *base = j->buf + j->slice * (size_t)w->index;
    uint64_t *s0 = (uint64_t *)base;
    uint64_t *s1 = (uint64_t *)(base + part);
    uint64_t *s2 = (uint64_t *)(base + 2 * part);
    size_t words = STEP / 8, off = 0;
    uint64_t moved = 0, sink = 0, t0 = load_now_ns();
    while (!j->stop) {
        switch (j->mix) {
        case MIX_READ:
            sink += read_step(s0 + off, words);
            break;
        case MIX_3_1:
            add_step(s2 + off, s0 + off, s1 + off, words);
            break;
        case MIX_2_1:
            copy_step(s1 + off, s0 + off, words);
            break;
#if defined(__x86_64__)
        case MIX_1_1:
            copy_nt_step(s1 + off, s0 + off, words);
            break;
        case MIX_NT_WRITE:
            fill_nt_step(s0 + off, words, moved);
            break;
#endif
        }
        off += words;
        if (off * 8 >= part)
            off = 0;
        moved += (uint64_t)traffic * STEP;
        j->moved[w->index] = moved;
        if (j->ns_per_byte > 0) {
            uint64_t due = t0 + (uint64_t)((double)moved * j->ns_per_byte);
            while (load_now_ns() < due && !j->stop)
                cpu_relax();
        }
    }
#if defined(__x86_64__)
    _mm_sfence();
#endif
    load_sink = sink;
    return NULL;
}

/* Time `loads` dependent loads per window, window after window, until `duration_ns`
 * has passed or `max_windows` are done; win_ns[i] is window i's time. Returns the
 * number of windows. `*cursor` is where the chase starts and, after, where it stopped
 * (the next call goes on from there: no line is revisited while still cached). */
size_t chase_windows(void **cursor, uint64_t loads, uint64_t duration_ns, uint32_t *win_ns,
                     size_t max_windows)
{
    void **p = (void **)*cursor;
    uint64_t end = load_now_ns() + duration_ns;
    size_t w = 0;
    while (w < max_windows) {
        uint64_t t0 = load_now_ns();
        for (uint64_t i = loads / 8; i; i--) {
            p = (void **)*p; p = (void **)*p; p = (void **)*p; p = (void **)*p;
            p = (void **)*p; p = (void **)*p; p = (void **)*p; p = (void **)*p;
        }
        uint64_t t1 = load_now_ns();
        win_ns[w++] = (uint32_t)(t1 - t0);
        if (t1 >= end)
            break;
    }
    *cursor = p;
    return w;
}

struct load_run {
    struct load_job job;
    pthread_t *tids;
    struct load_worker *workers;
    uint64_t *moved;
    int started;
};

/* Start `nthreads` load threads, thread i pinned to cpus[i], each on its slice of
 * `buf` (nthreads * slice bytes), at `bytes_per_s` in all (0: unpaced). Returns a
 * handle for load_moved/load_stop, or NULL (errno-like code in *err). */
void *load_start(char *buf, size_t slice, int nthreads, const int *cpus, int mix,
                 double bytes_per_s, int *err)
{
    struct load_run *r = calloc(1, sizeof(*r));
    if (!r) {
        *err = 12;
        return NULL;
    }
    r->tids = calloc((size_t)nthreads, sizeof(pthread_t));
    r->workers = calloc((size_t)nthreads, sizeof(struct load_worker));
    r->moved = calloc((size_t)nthreads, sizeof(uint64_t));
    if (!r->tids || !r->workers || !r->moved) {
        free(r->tids);
        free(r->workers);
        free(r->moved);
        free(r);
        *err = 12;
        return NULL;
    }
    r->job.buf = buf;
    r->job.slice = slice;
    r->job.nthreads = nthreads;
    r->job.mix = mix;
    r->job.ns_per_byte = bytes_per_s > 0 ? 1e9 * nthreads / bytes_per_s : 0;
    r->job.moved = r->moved;
    for (int i = 0; i < nthreads; i++) {
        r->workers[i].job = &r->job;
        r->workers[i].index = i;
        int rc = start_pinned_thread(&r->tids[i], cpus[i], load_thread, &r->workers[i]);
        if (rc) {
            r->job.stop = 1;
            for (int k = 0; k < r->started; k++)
                pthread_join(r->tids[k], NULL);
            free(r->tids);
            free(r->workers);
            free(r->moved);
            free(r);
            *err = rc;
            return NULL;
        }
        r->started++;
    }
    *err = 0;
    return r;
}

/* Bytes the memory has moved for the load so far, all threads together. */
uint64_t load_moved(void *handle)
{
    struct load_run *r = handle;
    uint64_t sum = 0;
    for (int i = 0; i < r->started; i++)
        sum += r->moved[i];
    return sum;
}

void load_stop(void *handle)
{
    struct load_run *r = handle;
    r->job.stop = 1;
    for (int i = 0; i < r->started; i++)
        pthread_join(r->tids[i], NULL);
    free(r->tids);
    free(r->workers);
    free(r->moved);
    free(r);
}
