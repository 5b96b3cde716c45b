/* Measurement loops: dependent-load pointer chase, STREAM (copy, scale, add, triad) on
 * pinned threads, and per-page first-touch timing. Python never sits in a timed loop:
 * every timed region is here, timed with CLOCK_MONOTONIC around the whole loop.
 *
 * Built by cffi at install time without -march: the STREAM loops are compiled for
 * several instruction sets (target_clones) and the widest one the CPU has is chosen
 * when the library loads; non-temporal stores use AVX when the CPU has it.
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
#define PYCXL_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define PYCXL_CLONES
#endif

static inline uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* --- pointer chase ------------------------------------------------------------------ */

/* Link n_lines lines of `stride` bytes into one random cycle. Lines are grouped by
 * `group` bytes (the TLB locality, a page by default, as multichase does): the walk
 * visits every line of a group in random order, then moves to a random next group, so
 * each page costs one TLB miss per `group / stride` loads. */
static uint64_t rng_next(uint64_t *s)
{
    uint64_t x = *s;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    return *s = x;
}

static void shuffle(size_t *v, size_t n, uint64_t *seed)
{
    for (size_t i = n; i > 1; i--) {
        size_t j = rng_next(seed) % i;
        size_t t = v[i - 1];
        v[i - 1] = v[j];
        v[j] = t;
    }
}

int chase_build(char *buf, size_t n_lines, size_t stride, size_t group, uint64_t seed)
{
    size_t per_group = group / stride;
    if (per_group == 0 || n_lines % per_group)
        return -1;
    size_t n_groups = n_lines / per_group;
    size_t *groups = malloc(n_groups * sizeof(size_t));
    size_t *lines = malloc(per_group * sizeof(size_t));
    if (!groups || !lines) {
        free(groups);
        free(lines);
        return -2;
    }
    if (seed == 0)
        seed = 0x9E3779B97F4A7C15ull;
    for (size_t g = 0; g < n_groups; g++)
        groups[g] = g;
    shuffle(groups, n_groups, &seed);
    char *first = NULL;
    char **prev = NULL;
    for (size_t g = 0; g < n_groups; g++) {
        for (size_t l = 0; l < per_group; l++)
            lines[l] = l;
        shuffle(lines, per_group, &seed);
        for (size_t l = 0; l < per_group; l++) {
            char *line = buf + (groups[g] * per_group + lines[l]) * stride;
            if (prev)
                *prev = line;
            else
                first = line;
            prev = (char **)line;
        }
    }
    *prev = first; /* close the cycle */
    free(groups);
    free(lines);
    return 0;
}

/* Follow the chain `loads` times from `start`; returns elapsed ns. The end pointer is
 * stored so the compiler cannot drop the loop. */
static void *volatile chase_sink;

uint64_t chase_run(void *start, uint64_t loads)
{
    void **p = (void **)start;
    uint64_t t0 = now_ns();
    uint64_t i = loads / 16;
    while (i--) {
        p = (void **)*p; p = (void **)*p; p = (void **)*p; p = (void **)*p;
        p = (void **)*p; p = (void **)*p; p = (void **)*p; p = (void **)*p;
        p = (void **)*p; p = (void **)*p; p = (void **)*p; p = (void **)*p;
        p = (void **)*p; p = (void **)*p; p = (void **)*p; p = (void **)*p;
    }
    uint64_t t1 = now_ns();
    chase_sink = p;
    return t1 - t0;
}

/* --- STREAM --------------------------------------------------------------------------- */

enum { K_COPY = 0, K_SCALE = 1, K_ADD = 2, K_TRIAD = 3, K_INIT = 4 };

PYCXL_CLONES
static void stream_chunk(int kernel, double *restrict a, double *restrict b,
                         double *restrict c, size_t lo, size_t hi, double s)
{
    switch (kernel) {
    case K_COPY:
        for (size_t j = lo; j < hi; j++) c[j] = a[j];
        break;
    case K_SCALE:
        for (size_t j = lo; j < hi; j++) b[j] = s * c[j];
        break;
    case K_ADD:
        for (size_t j = lo; j < hi; j++) c[j] = a[j] + b[j];
        break;
    case K_TRIAD:
        for (size_t j = lo; j < hi; j++) a[j] = b[j] + s * c[j];
        break;
    case K_INIT:
        for (size_t j = lo; j < hi; j++) { a[j] = 1.0; b[j] = 2.0; c[j] = 0.0; }
        break;
    }
}

#if defined(__x86_64__)
/* Non-temporal stores: the destination line is written without being read first. */
__attribute__((target("avx")))
static void stream_chunk_nt_avx(int kernel, double *restrict a, double *restrict b,
                                double *restrict c, size_t lo, size_t hi, double s)
{
    /* align lo to 32 bytes with plain stores; the arrays are page aligned */
    while (lo < hi && (lo & 3)) {
        stream_chunk(kernel, a, b, c, lo, lo + 1, s);
        lo++;
    }
    size_t end = lo + ((hi - lo) & ~(size_t)3);
    __m256d vs = _mm256_set1_pd(s);
    switch (kernel) {
    case K_COPY:
        for (size_t j = lo; j < end; j += 4) _mm256_stream_pd(c + j, _mm256_load_pd(a + j));
        break;
    case K_SCALE:
        for (size_t j = lo; j < end; j += 4)
            _mm256_stream_pd(b + j, _mm256_mul_pd(vs, _mm256_load_pd(c + j)));
        break;
    case K_ADD:
        for (size_t j = lo; j < end; j += 4)
            _mm256_stream_pd(c + j, _mm256_add_pd(_mm256_load_pd(a + j), _mm256_load_pd(b + j)));
        break;
    case K_TRIAD:
        for (size_t j = lo; j < end; j += 4)
            _mm256_stream_pd(a + j, _mm256_add_pd(_mm256_load_pd(b + j),
                                                  _mm256_mul_pd(vs, _mm256_load_pd(c + j))));
        break;
    default:
        stream_chunk(kernel, a, b, c, lo, end, s);
    }
    _mm_sfence();
    stream_chunk(kernel, a, b, c, end, hi, s);
}
#endif

int stream_has_nt(void)
{
#if defined(__x86_64__)
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx");
#else
    return 0;
#endif
}

struct stream_job {
    const int *kernels;
    int nkernels, ntimes, nthreads, nt;
    double *a, *b, *c;
    size_t n;
    double s;
    uint64_t *times;
    uint64_t *t_start, *t_end; /* per thread, this pass */
    pthread_barrier_t barrier;
};

struct stream_worker {
    struct stream_job *job;
    int index;
};

static void *stream_thread(void *arg)
{
    struct stream_worker *w = arg;
    struct stream_job *j = w->job;
    size_t lo = j->n * (size_t)w->index / (size_t)j->nthreads;
    size_t hi = j->n * (size_t)(w->index + 1) / (size_t)j->nthreads;
    for (int k = 0; k < j->ntimes; k++) {
        for (int q = 0; q < j->nkernels; q++) {
            int kernel = j->kernels[q];
            pthread_barrier_wait(&j->barrier);
            j->t_start[w->index] = now_ns();
#if defined(__x86_64__)
            if (j->nt)
                stream_chunk_nt_avx(kernel, j->a, j->b, j->c, lo, hi, j->s);
            else
#endif
                stream_chunk(kernel, j->a, j->b, j->c, lo, hi, j->s);
            j->t_end[w->index] = now_ns();
            pthread_barrier_wait(&j->barrier);
            if (w->index == 0) {
                /* the pass lasts from the first thread's start to the last one's end */
                uint64_t first = j->t_start[0], last = j->t_end[0];
                for (int t = 1; t < j->nthreads; t++) {
                    if (j->t_start[t] < first) first = j->t_start[t];
                    if (j->t_end[t] > last) last = j->t_end[t];
                }
                j->times[k * j->nkernels + q] = last - first;
            }
        }
    }
    return NULL;
}

/* Run the kernels in order, the whole sequence `ntimes` times (STREAM's order), on
 * nthreads threads, thread i pinned to cpus[i], the same threads throughout. Each
 * kernel's time in pass k (from the first thread starting to the last one finishing)
 * goes to times[k * nkernels + q]. K_INIT first-touches the arrays from
 * these threads. Returns 0, or an errno value. */
int stream_run(const int *kernels, int nkernels, double *a, double *b, double *c, size_t n,
               double s, int nthreads, const int *cpus, int ntimes, int nt, uint64_t *times)
{
    struct stream_job job = {kernels, nkernels, ntimes, nthreads, nt, a, b, c, n, s, times};
    pthread_t *tids = calloc((size_t)nthreads, sizeof(pthread_t));
    struct stream_worker *workers = calloc((size_t)nthreads, sizeof(struct stream_worker));
    job.t_start = calloc((size_t)nthreads, sizeof(uint64_t));
    job.t_end = calloc((size_t)nthreads, sizeof(uint64_t));
    if (!tids || !workers || !job.t_start || !job.t_end) {
        free(tids);
        free(workers);
        free(job.t_start);
        free(job.t_end);
        return 12; /* ENOMEM */
    }
    pthread_barrier_init(&job.barrier, NULL, (unsigned)nthreads);
    int rc = 0, started = 0;
    for (int i = 0; i < nthreads; i++) {
        workers[i].job = &job;
        workers[i].index = i;
        rc = start_pinned_thread(&tids[i], cpus[i], stream_thread, &workers[i]);
        if (rc)
            break;
        started++;
    }
    if (rc) {
        /* threads already started wait at the barrier for ever; do not leave them */
        abort();
    }
    for (int i = 0; i < started; i++)
        pthread_join(tids[i], NULL);
    pthread_barrier_destroy(&job.barrier);
    free(tids);
    free(workers);
    free(job.t_start);
    free(job.t_end);
    return rc;
}

/* --- first touch ---------------------------------------------------------------------- */

/* Write the first byte of each page of buf, timing each write; returns total ns.
 * ns[i] holds page i's time, including one clock read (see timer_cost_ns). */
uint64_t first_touch(char *buf, size_t npages, size_t page, uint32_t *ns)
{
    uint64_t start = now_ns(), t0 = start;
    for (size_t i = 0; i < npages; i++) {
        buf[i * page] = 1;
        uint64_t t1 = now_ns();
        ns[i] = (uint32_t)(t1 - t0);
        t0 = t1;
    }
    return t0 - start;
}

/* The cost of one clock read, to subtract from per-page times (best of many). */
uint64_t timer_cost_ns(void)
{
    uint64_t best = UINT64_MAX;
    for (int r = 0; r < 64; r++) {
        uint64_t t0 = now_ns();
        for (int i = 0; i < 64; i++)
            (void)now_ns();
        uint64_t d = (now_ns() - t0) / 65;
        if (d < best)
            best = d;
    }
    return best;
}
