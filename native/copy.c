/* A pool of pinned threads: the CPU side of the staged (pipelined) copy between pageable
 * memory and a GPU. One thread copies 5-7 GB/s; the copy engine moves 50 GB/s and more,
 * so the staging copy needs about ten. The threads live as long as the pool.
 *
 * The pool runs streams (copy_stream_*): a whole transfer in chunks through `depth`
 * staging buffers. The threads take small slices from one counter and run on from
 * chunk to chunk without a barrier; the caller opens chunks as their buffers become
 * free (the copy engine has read them, or filled them) and waits for chunks the
 * threads have finished. A slow or preempted thread then delays one slice, not every
 * chunk, and no thread waits for a wake-up between chunks. */
#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "thread_team.h"

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
    struct thread_team team; /* runs one stream at a time */
    struct copy_stream *stream; /* set while a stream runs, else NULL */
};

/* Slices are what one thread takes at a time: small enough that 16 threads share a
 * 16 MiB chunk evenly, large enough that the shared counter is touched rarely. */
#define SLICE ((size_t)256 << 10)
/* Spin this many rounds before sleeping: a chunk takes hundreds of microseconds, a
 * wake-up from sleep tens. */
#define SPINS 4000

struct copy_stream {
    char *host;          /* the pageable side, `size` bytes */
    char *const *bufs;   /* `depth` staging buffers of `chunk` bytes */
    int depth;
    size_t size, chunk, chunks, slices_per_chunk, slices;
    int to_host;         /* copy staging -> host (else host -> staging) */
    int nt;
    atomic_size_t next_slice;
    atomic_size_t opened; /* chunks below this may be copied */
    atomic_int aborted;
    atomic_size_t *done;  /* slices finished, per chunk */
    pthread_mutex_t lock; /* over the sleeps on `gate` and `chunk_done` */
    int sleepers;         /* threads asleep on `gate` */
    pthread_cond_t gate, chunk_done;
};

static void copy_span(char *dst, const char *src, size_t n, int nt)
{
    if (nt)
        copy_nt(dst, src, n);
    else
        memcpy(dst, src, n);
}

/* Until chunk c is open (or the stream is aborted). */
static void stream_gate(struct copy_stream *s, size_t c)
{
    for (int i = 0; i < SPINS; i++) {
        if (c < atomic_load(&s->opened) || atomic_load(&s->aborted))
            return;
        cpu_relax();
    }
    pthread_mutex_lock(&s->lock);
    s->sleepers++;
    while (c >= atomic_load(&s->opened) && !atomic_load(&s->aborted))
        pthread_cond_wait(&s->gate, &s->lock);
    s->sleepers--;
    pthread_mutex_unlock(&s->lock);
}

/* One thread's share of a stream: slices in order until none is left. Slices are
 * claimed in order, so every slice of chunk c is claimed before any of chunk c+1 and a
 * thread waiting at a closed chunk never holds back an open one. */
static void stream_work(void *arg, int index)
{
    struct copy_stream *s = arg;
    (void)index; /* threads are told apart by the slices they claim */
    for (;;) {
        size_t k = atomic_fetch_add(&s->next_slice, 1);
        if (k >= s->slices)
            return;
        size_t c = k / s->slices_per_chunk;
        stream_gate(s, c);
        size_t base = c * s->chunk;
        size_t len = s->size - base < s->chunk ? s->size - base : s->chunk;
        size_t lo = (k % s->slices_per_chunk) * SLICE;
        if (lo < len && !atomic_load(&s->aborted)) {
            size_t n = len - lo < SLICE ? len - lo : SLICE;
            char *stage = s->bufs[c % (size_t)s->depth] + lo;
            char *host = s->host + base + lo;
            if (s->to_host)
                copy_span(host, stage, n, s->nt);
            else
                copy_span(stage, host, n, s->nt);
        }
        if (atomic_fetch_add(&s->done[c], 1) + 1 == s->slices_per_chunk) {
            pthread_mutex_lock(&s->lock);
            pthread_cond_broadcast(&s->chunk_done);
            pthread_mutex_unlock(&s->lock);
        }
    }
}

/* nthreads threads, thread i pinned to cpus[i]; NULL when threads cannot be made. */
void *copy_pool_create(int nthreads, const int *cpus)
{
    struct copy_pool *p = calloc(1, sizeof *p);
    if (p && team_start(&p->team, nthreads, cpus)) {
        free(p);
        return NULL;
    }
    return p;
}

void copy_pool_destroy(void *pool)
{
    struct copy_pool *p = pool;
    team_end(&p->team);
    free(p);
}

/* Start a stream of `size` bytes between `host` and `depth` staging buffers of `chunk`
 * bytes (chunk i uses buffer i % depth): staging -> host if to_host, else host ->
 * staging. Chunks below `open` may be copied at once. Returns 0, or -1 when memory is
 * short (nothing started). */
int copy_stream_start(void *pool, char *host, char *const *bufs, int depth, size_t size,
                      size_t chunk, int to_host, int nt, size_t open)
{
    struct copy_pool *p = pool;
    struct copy_stream *s = calloc(1, sizeof *s);
    size_t chunks = (size + chunk - 1) / chunk;
    char **copies = calloc((size_t)depth, sizeof(char *));
    atomic_size_t *done = calloc(chunks ? chunks : 1, sizeof(atomic_size_t));
    if (!s || !copies || !done) {
        free(s);
        free(copies);
        free(done);
        return -1;
    }
    memcpy(copies, bufs, (size_t)depth * sizeof(char *));
    s->host = host;
    s->bufs = copies;
    s->depth = depth;
    s->size = size;
    s->chunk = chunk;
    s->chunks = chunks;
    s->slices_per_chunk = (chunk + SLICE - 1) / SLICE;
    s->slices = chunks * s->slices_per_chunk;
    s->to_host = to_host;
    s->nt = nt;
    s->done = done;
    atomic_init(&s->next_slice, 0);
    atomic_init(&s->opened, open);
    atomic_init(&s->aborted, 0);
    pthread_mutex_init(&s->lock, NULL);
    pthread_cond_init(&s->gate, NULL);
    pthread_cond_init(&s->chunk_done, NULL);
    p->stream = s;
    team_go(&p->team, stream_work, s);
    return 0;
}

/* Chunks below `chunks` may be copied now (their staging buffers are free or filled). */
void copy_stream_open(void *pool, size_t chunks)
{
    struct copy_pool *p = pool;
    struct copy_stream *s = p->stream;
    atomic_store(&s->opened, chunks);
    pthread_mutex_lock(&s->lock);
    if (s->sleepers)
        pthread_cond_broadcast(&s->gate);
    pthread_mutex_unlock(&s->lock);
}

/* Until every slice of chunk c is copied. */
void copy_stream_wait(void *pool, size_t c)
{
    struct copy_pool *p = pool;
    struct copy_stream *s = p->stream;
    for (int i = 0; i < SPINS; i++) {
        if (atomic_load(&s->done[c]) == s->slices_per_chunk)
            return;
        cpu_relax();
    }
    pthread_mutex_lock(&s->lock);
    while (atomic_load(&s->done[c]) != s->slices_per_chunk)
        pthread_cond_wait(&s->chunk_done, &s->lock);
    pthread_mutex_unlock(&s->lock);
}

/* End the stream: after every chunk was opened, wait for the threads to finish them;
 * with abort, the threads skip what they have not started. The pool is idle after. */
void copy_stream_end(void *pool, int abort)
{
    struct copy_pool *p = pool;
    struct copy_stream *s = p->stream;
    if (abort) {
        atomic_store(&s->aborted, 1);
        pthread_mutex_lock(&s->lock);
        pthread_cond_broadcast(&s->gate);
        pthread_mutex_unlock(&s->lock);
    }
    team_wait(&p->team);
    p->stream = NULL;
    pthread_mutex_destroy(&s->lock);
    pthread_cond_destroy(&s->gate);
    pthread_cond_destroy(&s->chunk_done);
    free((void *)s->bufs);
    free(s->done);
    free(s);
}
