/* A pool of pinned threads that split one large memcpy between them: the CPU side of
 * the staged (pipelined) copy between pageable memory and a GPU. One thread copies
 * 5-7 GB/s (benchmarks/staged_tune.py); the copy engine moves 50 GB/s and more, so the
 * staging copy needs about ten. The threads live as long as the pool, so a copy of one chunk costs a wake-up,
 * not a thread creation. */
#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "pinned_thread.h"

#if defined(__x86_64__)
#include <emmintrin.h>
/* Non-temporal stores (SSE2, on every x86-64): the destination's lines are not read
 * first (no write-allocate) and do not evict the cache, which holds the staging
 * buffers the copy engine reads and writes. For copies out to pageable memory. */
static void copy_nt(char *dst, const char *src, size_t n)
{
    size_t i = 0;
    if (((uintptr_t)dst & 15) == 0) {
        for (; i + 64 <= n; i += 64) {
            __m128i a = _mm_loadu_si128((const __m128i *)(src + i));
            __m128i b = _mm_loadu_si128((const __m128i *)(src + i + 16));
            __m128i c = _mm_loadu_si128((const __m128i *)(src + i + 32));
            __m128i d = _mm_loadu_si128((const __m128i *)(src + i + 48));
            _mm_stream_si128((__m128i *)(dst + i), a);
            _mm_stream_si128((__m128i *)(dst + i + 16), b);
            _mm_stream_si128((__m128i *)(dst + i + 32), c);
            _mm_stream_si128((__m128i *)(dst + i + 48), d);
        }
        _mm_sfence();
    }
    memcpy(dst + i, src + i, n - i);
}
#else
static void copy_nt(char *dst, const char *src, size_t n)
{
    memcpy(dst, src, n);
}
#endif

struct copy_pool {
    int nthreads;
    pthread_t *tids;
    struct copy_worker *workers;
    pthread_mutex_t lock;
    pthread_cond_t go, done;
    unsigned long generation; /* bumped for each copy */
    int remaining;            /* workers still copying the current generation */
    int stop;
    char *dst;
    const char *src;
    size_t bytes;
    int nt; /* non-temporal stores */
};

struct copy_worker {
    struct copy_pool *pool;
    int index;
};

static void *copy_worker_main(void *arg)
{
    struct copy_worker *w = arg;
    struct copy_pool *p = w->pool;
    unsigned long seen = 0;
    for (;;) {
        pthread_mutex_lock(&p->lock);
        while (p->generation == seen && !p->stop)
            pthread_cond_wait(&p->go, &p->lock);
        if (p->stop) {
            pthread_mutex_unlock(&p->lock);
            return NULL;
        }
        seen = p->generation;
        char *dst = p->dst;
        const char *src = p->src;
        size_t bytes = p->bytes;
        int nt = p->nt;
        pthread_mutex_unlock(&p->lock);
        /* page-aligned parts, the last one takes the rest */
        size_t lo = (bytes * (size_t)w->index / (size_t)p->nthreads) & ~(size_t)4095;
        size_t hi = w->index == p->nthreads - 1
                        ? bytes
                        : (bytes * (size_t)(w->index + 1) / (size_t)p->nthreads) & ~(size_t)4095;
        if (hi > lo && nt)
            copy_nt(dst + lo, src + lo, hi - lo);
        else if (hi > lo)
            memcpy(dst + lo, src + lo, hi - lo);
        pthread_mutex_lock(&p->lock);
        if (--p->remaining == 0)
            pthread_cond_signal(&p->done);
        pthread_mutex_unlock(&p->lock);
    }
}

static void copy_pool_stop(struct copy_pool *p, int started)
{
    pthread_mutex_lock(&p->lock);
    p->stop = 1;
    pthread_cond_broadcast(&p->go);
    pthread_mutex_unlock(&p->lock);
    for (int i = 0; i < started; i++)
        pthread_join(p->tids[i], NULL);
    pthread_mutex_destroy(&p->lock);
    pthread_cond_destroy(&p->go);
    pthread_cond_destroy(&p->done);
    free(p->tids);
    free(p->workers);
    free(p);
}

/* nthreads threads, thread i pinned to cpus[i]; NULL when threads cannot be made. */
void *copy_pool_create(int nthreads, const int *cpus)
{
    struct copy_pool *p = calloc(1, sizeof *p);
    if (!p)
        return NULL;
    p->nthreads = nthreads;
    p->tids = calloc((size_t)nthreads, sizeof(pthread_t));
    p->workers = calloc((size_t)nthreads, sizeof(struct copy_worker));
    pthread_mutex_init(&p->lock, NULL);
    pthread_cond_init(&p->go, NULL);
    pthread_cond_init(&p->done, NULL);
    if (!p->tids || !p->workers) {
        copy_pool_stop(p, 0);
        return NULL;
    }
    for (int i = 0; i < nthreads; i++) {
        p->workers[i].pool = p;
        p->workers[i].index = i;
        if (start_pinned_thread(&p->tids[i], cpus[i], copy_worker_main, &p->workers[i])) {
            copy_pool_stop(p, i);
            return NULL;
        }
    }
    return p;
}

/* Copy `bytes` from src to dst with every thread of the pool (with non-temporal stores
 * if nt); returns when done. */
void copy_pool_run(void *pool, char *dst, const char *src, size_t bytes, int nt)
{
    struct copy_pool *p = pool;
    pthread_mutex_lock(&p->lock);
    p->dst = dst;
    p->src = src;
    p->bytes = bytes;
    p->nt = nt;
    p->remaining = p->nthreads;
    p->generation++;
    pthread_cond_broadcast(&p->go);
    while (p->remaining)
        pthread_cond_wait(&p->done, &p->lock);
    pthread_mutex_unlock(&p->lock);
}

void copy_pool_destroy(void *pool)
{
    struct copy_pool *p = pool;
    copy_pool_stop(p, p->nthreads);
}
