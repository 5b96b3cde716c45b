/* Measurement loops: dependent-load pointer chase, STREAM (copy, scale, add, triad) on
 * pinned threads, and per-page first-touch timing. Python never sits in a timed loop:
 * every timed region is here, timed with CLOCK_MONOTONIC around the whole loop.
 *
 * Built by cffi at install time without -march: the STREAM loops are compiled for
 * several instruction sets (target_clones) and the widest one the CPU has is chosen
 * when the library loads; non-temporal stores use AVX when the CPU has it.
 *
 * No call runs much past the time budget it is given: each stops at the first sample
 * (STREAM kernel, page, group of chase lines) that ends after it and says how far it
 * got, and the caller calls again to go on (the STREAM threads sleep in between). Python
 * runs its signal handlers between calls, so Ctrl-C is a KeyboardInterrupt there and the
 * caller's cleanup stops the threads and frees the memory. The loops never look at
 * signals and no check sits inside a timed region. (chase_run takes no budget: its
 * caller cuts a long chase into calls of fewer loads.)
 */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "thread_team.h"
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

/* A cycle under construction, linked group by group across calls. */
struct chase_builder {
    char *buf;
    size_t stride, per_group, n_groups, next; /* next: the next group (in walk order) */
    size_t *groups, *lines;
    uint64_t seed;
    char *first;
    char **prev;
};

/* Ready to link n_lines lines of `stride` bytes in groups of `group` bytes; NULL with
 * *err -1 when a group is not a whole number of lines that divides n_lines, -2 when
 * memory is short. The groups' order is drawn here, each group's lines as it is linked. */
void *chase_build_start(char *buf, size_t n_lines, size_t stride, size_t group, uint64_t seed,
                        int *err)
{
    size_t per_group = group / stride;
    if (per_group == 0 || n_lines % per_group) {
        *err = -1;
        return NULL;
    }
    struct chase_builder *b = calloc(1, sizeof *b);
    size_t n_groups = n_lines / per_group;
    size_t *groups = malloc(n_groups * sizeof(size_t));
    size_t *lines = malloc(per_group * sizeof(size_t));
    if (!b || !groups || !lines) {
        free(b);
        free(groups);
        free(lines);
        *err = -2;
        return NULL;
    }
    b->buf = buf;
    b->stride = stride;
    b->per_group = per_group;
    b->n_groups = n_groups;
    b->groups = groups;
    b->lines = lines;
    b->seed = seed ? seed : 0x9E3779B97F4A7C15ull;
    for (size_t g = 0; g < n_groups; g++)
        groups[g] = g;
    shuffle(groups, n_groups, &b->seed);
    *err = 0;
    return b;
}

/* Link groups until every one is linked (returns 1: the cycle is closed) or
 * `budget_ns` has passed (returns 0: call again). */
int chase_build_step(void *builder, uint64_t budget_ns)
{
    struct chase_builder *b = builder;
    uint64_t end = now_ns() + budget_ns;
    while (b->next < b->n_groups) {
        size_t g = b->next++;
        for (size_t l = 0; l < b->per_group; l++)
            b->lines[l] = l;
        shuffle(b->lines, b->per_group, &b->seed);
        for (size_t l = 0; l < b->per_group; l++) {
            char *line = b->buf + (b->groups[g] * b->per_group + b->lines[l]) * b->stride;
            if (b->prev)
                *b->prev = line;
            else
                b->first = line;
            b->prev = (char **)line;
        }
        if (b->next < b->n_groups && now_ns() >= end)
            return 0;
    }
    if (b->prev)
        *b->prev = b->first; /* close the cycle */
    return 1;
}

void chase_build_end(void *builder)
{
    struct chase_builder *b = builder;
    free(b->groups);
    free(b->lines);
    free(b);
}

/* Follow the chain `loads` times (a multiple of 16) from `*cursor`; returns elapsed ns
 * and leaves `*cursor` where the chase stopped, so that the next call goes on from there
 * (one sample may be several calls). Storing the end also keeps the compiler from
 * dropping the loop. */
uint64_t chase_run(void **cursor, uint64_t loads)
{
    void **p = (void **)*cursor;
    uint64_t t0 = now_ns();
    uint64_t i = loads / 16;
    while (i--) {
        p = (void **)*p; p = (void **)*p; p = (void **)*p; p = (void **)*p;
        p = (void **)*p; p = (void **)*p; p = (void **)*p; p = (void **)*p;
        p = (void **)*p; p = (void **)*p; p = (void **)*p; p = (void **)*p;
        p = (void **)*p; p = (void **)*p; p = (void **)*p; p = (void **)*p;
    }
    uint64_t t1 = now_ns();
    *cursor = p;
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

/* A team of pinned threads that runs STREAM kernels in batches of steps (stream_steps)
 * and sleeps between batches: the same threads for a whole run, however many calls it
 * takes. */
struct stream_team {
    struct thread_team team;
    pthread_barrier_t barrier; /* around each kernel */
    /* the batch */
    const int *kernels;
    int nkernels, nt;
    size_t first, nsteps; /* steps of the whole run this batch does */
    double *a, *b, *c;
    size_t n;
    double s;
    uint64_t *times;
    uint64_t *t_start, *t_end; /* per thread, this step */
    uint64_t deadline;
    size_t done; /* steps done, and whether to stop: thread 0's, between the barriers */
    int stop;
};

static void stream_batch(void *arg, int index)
{
    struct stream_team *j = arg;
    size_t lo = j->n * (size_t)index / (size_t)j->team.nthreads;
    size_t hi = j->n * (size_t)(index + 1) / (size_t)j->team.nthreads;
    for (size_t k = j->first; k < j->first + j->nsteps; k++) {
        int kernel = j->kernels[k % (size_t)j->nkernels];
        pthread_barrier_wait(&j->barrier);
        /* set by thread 0 before this barrier (which orders memory); read before the
         * clock starts */
        if (j->stop)
            return;
        j->t_start[index] = now_ns();
#if defined(__x86_64__)
        if (j->nt)
            stream_chunk_nt_avx(kernel, j->a, j->b, j->c, lo, hi, j->s);
        else
#endif
            stream_chunk(kernel, j->a, j->b, j->c, lo, hi, j->s);
        j->t_end[index] = now_ns();
        pthread_barrier_wait(&j->barrier);
        if (index == 0) {
            /* the kernel lasts from the first thread's start to the last one's end */
            uint64_t first = j->t_start[0], last = j->t_end[0];
            for (int t = 1; t < j->team.nthreads; t++) {
                if (j->t_start[t] < first) first = j->t_start[t];
                if (j->t_end[t] > last) last = j->t_end[t];
            }
            j->times[k] = last - first;
            j->done = k + 1 - j->first;
            if (last >= j->deadline)
                j->stop = 1;
        }
    }
}

/* nthreads threads, thread i pinned to cpus[i], asleep until stream_steps; NULL with an
 * errno value in *err when they cannot all start (none is left running). */
void *stream_start(int nthreads, const int *cpus, int *err)
{
    struct stream_team *j = calloc(1, sizeof *j);
    if (!j) {
        *err = ENOMEM;
        return NULL;
    }
    j->t_start = calloc((size_t)nthreads, sizeof(uint64_t));
    j->t_end = calloc((size_t)nthreads, sizeof(uint64_t));
    int rc = j->t_start && j->t_end ? team_start(&j->team, nthreads, cpus) : ENOMEM;
    if (rc) {
        free(j->t_start);
        free(j->t_end);
        free(j);
        *err = rc;
        return NULL;
    }
    pthread_barrier_init(&j->barrier, NULL, (unsigned)nthreads);
    *err = 0;
    return j;
}

/* Steps first .. first+nsteps-1 of a run that repeats the kernels in order (STREAM's
 * order: step k runs kernels[k % nkernels]) over three arrays of n doubles. Step k's
 * time (from the first thread starting to the last one finishing) goes to times[k].
 * Stops after the first step that ends `budget_ns` after the call began; returns the
 * steps done (at least one). K_INIT first-touches the arrays from the team's threads. */
size_t stream_steps(void *team, const int *kernels, int nkernels, double *a, double *b,
                    double *c, size_t n, double s, int nt, size_t first, size_t nsteps,
                    uint64_t budget_ns, uint64_t *times)
{
    struct stream_team *j = team;
    /* the threads are asleep: team_go's lock hands them the batch */
    j->kernels = kernels;
    j->nkernels = nkernels;
    j->nt = nt;
    j->first = first;
    j->nsteps = nsteps;
    j->a = a;
    j->b = b;
    j->c = c;
    j->n = n;
    j->s = s;
    j->times = times;
    j->deadline = now_ns() + budget_ns;
    j->done = 0;
    j->stop = 0;
    team_run(&j->team, stream_batch, j);
    return j->done;
}

/* Stop the threads, wait for them, free the team. */
void stream_end(void *team)
{
    struct stream_team *j = team;
    team_end(&j->team);
    pthread_barrier_destroy(&j->barrier);
    free(j->t_start);
    free(j->t_end);
    free(j);
}

/* --- first touch ---------------------------------------------------------------------- */

/* Write the first byte of each page of buf, timing each write, until npages are done or
 * `budget_ns` has passed (checked against the clock read each page takes anyway);
 * returns the pages done (at least one), their total ns in *total_ns. ns[i] holds page
 * i's time, including one clock read (see timer_cost_ns). */
size_t first_touch(char *buf, size_t npages, size_t page, uint32_t *ns, uint64_t budget_ns,
                   uint64_t *total_ns)
{
    uint64_t start = now_ns(), t0 = start, end = start + budget_ns;
    size_t i = 0;
    while (i < npages) {
        buf[i * page] = 1;
        uint64_t t1 = now_ns();
        ns[i++] = (uint32_t)(t1 - t0);
        t0 = t1;
        if (t1 >= end)
            break;
    }
    *total_ns = t0 - start;
    return i;
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
