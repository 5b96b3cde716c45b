/* The optimizer step of Adam and AdamW on the CPU, over state that lives on a memory
 * tier: one pass over memory per step. Each element's gradient is read in its own
 * precision (fp32, bf16 or fp16) and scaled (a clipping coefficient, a loss scale's
 * inverse), the fp32 master weight and both moments are updated in place, and the
 * weight is written back in the model's precision beside it: 28 bytes of traffic per
 * bf16 parameter, where separate conversions and an unfused step read and write the
 * state three times.
 *
 * The work runs on a team of threads pinned to the tier's socket; they take chunks from
 * one counter, so a preempted thread delays one chunk. The arithmetic is PyTorch's
 * (torch.optim.Adam's single-tensor step) in fp32; the loop is compiled for several
 * instruction sets and the widest one the CPU has runs.
 *
 * The same team adds a later micro-batch's gradients onto those home (grad_accumulate),
 * taking the sum of squares of each result in the same pass, so the 2-norm of a gradient
 * summed on the host is known as it is made, at no cost in memory traffic. */
#define _GNU_SOURCE
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "thread_team.h"

/* No contraction into fused multiply-adds: each operation rounds as PyTorch's do. */
#pragma GCC push_options
#pragma GCC optimize("fp-contract=off")

#define ADAM_CHUNK 16384 /* elements a thread takes at a time: 448 KiB of traffic */
#if defined(__x86_64__)
#define ADAM_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define ADAM_CLONES
#endif

enum { ADAM_F32 = 0, ADAM_BF16 = 1, ADAM_F16 = 2, ADAM_NONE = -1 };

struct adam_job {
    size_t n;
    float *master, *m, *v, *vmax; /* vmax: amsgrad's running maximum, or NULL */
    const void *grad;
    int grad_kind;
    void *weight; /* the model's copy in weight_kind, or NULL */
    int weight_kind;
    float lr, beta1, beta2, eps, weight_decay, grad_scale;
    float step_size, bc2_sqrt;
    int decoupled, maximize;
};

struct adam_team {
    struct thread_team team;
    struct adam_job *job; /* the step running, set before the team starts it */
    atomic_size_t next;
};

static inline float bf16_to_f32(uint16_t h)
{
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static inline uint16_t f32_to_bf16(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    u += 0x7FFFu + ((u >> 16) & 1u); /* round to nearest even, as PyTorch converts */
    return (uint16_t)(u >> 16);
}

/* One range of elements; gk and wk are constants in each call site, so each copy of the
 * loop is specialised and vectorised for its precisions. */
static inline void adam_range(const struct adam_job *j, size_t lo, size_t hi, int gk, int wk)
{
    float *restrict p = j->master, *restrict m = j->m, *restrict v = j->v;
    const uint16_t *restrict g16 = j->grad;
    const _Float16 *restrict gh = j->grad;
    const float *restrict g32 = j->grad;
    uint16_t *restrict w16 = j->weight;
    _Float16 *restrict wh = j->weight;
    float *restrict w32 = j->weight;
    const float b1 = j->beta1, b2 = j->beta2, scale = j->maximize ? -j->grad_scale : j->grad_scale;
    const float decay = j->decoupled ? 1.0f - j->lr * j->weight_decay : 1.0f;
    const float l2 = j->decoupled ? 0.0f : j->weight_decay;
    const float step = j->step_size, bc2 = j->bc2_sqrt, eps = j->eps;
    for (size_t i = lo; i < hi; i++) {
        float g;
        if (gk == ADAM_BF16)
            g = bf16_to_f32(g16[i]);
        else if (gk == ADAM_F16)
            g = (float)gh[i];
        else
            g = g32[i];
        g *= scale;
        float w = p[i] * decay;
        g += l2 * w;
        float mi = m[i] + (1.0f - b1) * (g - m[i]); /* PyTorch's lerp */
        float vi = v[i] * b2 + (1.0f - b2) * (g * g); /* PyTorch's mul_ then addcmul_ */
        m[i] = mi;
        v[i] = vi;
        float denom = sqrtf(vi) / bc2 + eps;
        w += -step * (mi / denom); /* addcdiv_ */
        p[i] = w;
        if (wk == ADAM_BF16)
            w16[i] = f32_to_bf16(w);
        else if (wk == ADAM_F16)
            wh[i] = (_Float16)w;
        else if (wk == ADAM_F32)
            w32[i] = w;
    }
}

ADAM_CLONES static void adam_range_bf16_bf16(const struct adam_job *j, size_t lo, size_t hi)
{
    adam_range(j, lo, hi, ADAM_BF16, ADAM_BF16);
}

ADAM_CLONES static void adam_range_f32_none(const struct adam_job *j, size_t lo, size_t hi)
{
    adam_range(j, lo, hi, ADAM_F32, ADAM_NONE);
}

ADAM_CLONES static void adam_range_f16_f16(const struct adam_job *j, size_t lo, size_t hi)
{
    adam_range(j, lo, hi, ADAM_F16, ADAM_F16);
}

/* The general case (mixed precisions, amsgrad): correct for all, specialised for none. */
static void adam_range_any(const struct adam_job *j, size_t lo, size_t hi)
{
    if (j->vmax == NULL) {
        adam_range(j, lo, hi, j->grad_kind, j->weight_kind);
        return;
    }
    const float b1 = j->beta1, b2 = j->beta2, scale = j->maximize ? -j->grad_scale : j->grad_scale;
    const float decay = j->decoupled ? 1.0f - j->lr * j->weight_decay : 1.0f;
    const float l2 = j->decoupled ? 0.0f : j->weight_decay;
    for (size_t i = lo; i < hi; i++) {
        float g;
        if (j->grad_kind == ADAM_BF16)
            g = bf16_to_f32(((const uint16_t *)j->grad)[i]);
        else if (j->grad_kind == ADAM_F16)
            g = (float)((const _Float16 *)j->grad)[i];
        else
            g = ((const float *)j->grad)[i];
        g *= scale;
        float w = j->master[i] * decay;
        g += l2 * w;
        float mi = j->m[i] + (1.0f - b1) * (g - j->m[i]);
        float vi = j->v[i] * b2 + (1.0f - b2) * (g * g);
        j->m[i] = mi;
        j->v[i] = vi;
        float vm = j->vmax[i] > vi ? j->vmax[i] : vi;
        j->vmax[i] = vm;
        w += -j->step_size * (mi / (sqrtf(vm) / j->bc2_sqrt + j->eps));
        j->master[i] = w;
        if (j->weight_kind == ADAM_BF16)
            ((uint16_t *)j->weight)[i] = f32_to_bf16(w);
        else if (j->weight_kind == ADAM_F16)
            ((_Float16 *)j->weight)[i] = (_Float16)w;
        else if (j->weight_kind == ADAM_F32)
            ((float *)j->weight)[i] = w;
    }
}

static void adam_run(const struct adam_job *j, size_t lo, size_t hi)
{
    if (j->vmax == NULL && j->grad_kind == ADAM_BF16 && j->weight_kind == ADAM_BF16)
        adam_range_bf16_bf16(j, lo, hi);
    else if (j->vmax == NULL && j->grad_kind == ADAM_F32 && j->weight_kind == ADAM_NONE)
        adam_range_f32_none(j, lo, hi);
    else if (j->vmax == NULL && j->grad_kind == ADAM_F16 && j->weight_kind == ADAM_F16)
        adam_range_f16_f16(j, lo, hi);
    else
        adam_range_any(j, lo, hi);
}

static void adam_chunks(void *arg, int index)
{
    struct adam_team *t = arg;
    const struct adam_job *j = t->job;
    (void)index; /* threads are told apart by the chunks they claim */
    for (;;) {
        size_t lo = atomic_fetch_add(&t->next, ADAM_CHUNK);
        if (lo >= j->n)
            return;
        size_t hi = lo + ADAM_CHUNK < j->n ? lo + ADAM_CHUNK : j->n;
        adam_run(j, lo, hi);
    }
}

/* A team of nthreads threads, one pinned to each of cpus; NULL with *err set (an errno
 * value) when a thread cannot start. */
void *adam_team_start(int nthreads, const int *cpus, int *err)
{
    struct adam_team *t = calloc(1, sizeof(*t));
    if (t == NULL || nthreads < 1) {
        free(t);
        *err = ENOMEM;
        return NULL;
    }
    *err = team_start(&t->team, nthreads, cpus);
    if (*err) {
        free(t);
        return NULL;
    }
    return t;
}

void adam_team_end(void *team)
{
    struct adam_team *t = team;
    team_end(&t->team);
    free(t);
}

/* One Adam (decoupled=0) or AdamW (decoupled=1) step over n elements, run by the team;
 * returns when every element is done. step is the step number after this one (1 for
 * the first). One caller at a time per team. */
int adam_step(void *team, size_t n, float *master, float *m, float *v, float *vmax,
              const void *grad, int grad_kind, void *weight, int weight_kind, double lr,
              double beta1, double beta2, double eps, double weight_decay, int decoupled,
              int maximize, int64_t step, double grad_scale)
{
    struct adam_team *t = team;
    if (step < 1 || grad_kind < ADAM_F32 || grad_kind > ADAM_F16 || weight_kind < ADAM_NONE ||
        weight_kind > ADAM_F16 || (weight_kind != ADAM_NONE && weight == NULL))
        return -1;
    struct adam_job j = {
        .n = n, .master = master, .m = m, .v = v, .vmax = vmax, .grad = grad,
        .grad_kind = grad_kind, .weight = weight, .weight_kind = weight_kind,
        .lr = (float)lr, .beta1 = (float)beta1, .beta2 = (float)beta2, .eps = (float)eps,
        .weight_decay = (float)weight_decay, .grad_scale = (float)grad_scale,
        .decoupled = decoupled, .maximize = maximize,
    };
    /* The bias corrections in double, as PyTorch computes them in Python floats */
    j.step_size = (float)(lr / (1.0 - pow(beta1, (double)step)));
    j.bc2_sqrt = (float)sqrt(1.0 - pow(beta2, (double)step));
    atomic_store(&t->next, 0);
    t->job = &j;
    team_run(&t->team, adam_chunks, t);
    t->job = NULL;
    return 0;
}

/* --- gradients added up on the host, with their sums of squares ------------------------ */
#define GRAD_CHUNK 65536 /* elements a thread takes at a time */
#define GRAD_LANES 16    /* independent partial sums: a loop the compiler vectorises */
#define GRAD_RUN 1024    /* elements summed in float before their total joins a double */

struct grad_job {
    size_t n;
    void *home;
    const void *incoming;
    int kind, add;
    double *sums; /* one per chunk, added in chunk order: the same total every time */
    atomic_size_t next;
};

/* home = incoming (add=0) or home + incoming (add=1), rounded to the precision as
 * PyTorch's add_ rounds it; returns the sum of the squares of what was stored. */
static inline double grad_range(const struct grad_job *j, size_t lo, size_t hi, int kind)
{
    uint16_t *restrict h16 = j->home;
    const uint16_t *restrict i16 = j->incoming;
    _Float16 *restrict hh = j->home;
    const _Float16 *restrict ih = j->incoming;
    float *restrict h32 = j->home;
    const float *restrict i32 = j->incoming;
    const int add = j->add; /* loop-invariant: the compiler makes a loop of each */
    double s = 0.0;
    /* float lanes over short runs (fast), their totals in double (a chunk's sum to ~1e-7) */
    for (size_t run = lo; run < hi; run += GRAD_RUN) {
        size_t stop = run + GRAD_RUN < hi ? run + GRAD_RUN : hi;
        float lanes[GRAD_LANES] = {0};
        for (size_t base = run; base < stop; base += GRAD_LANES) {
            size_t end = base + GRAD_LANES < stop ? base + GRAD_LANES : stop;
            for (size_t i = base; i < end; i++) {
                float r;
                if (kind == ADAM_BF16) {
                    float x = bf16_to_f32(i16[i]);
                    uint16_t o = add ? f32_to_bf16(bf16_to_f32(h16[i]) + x) : i16[i];
                    h16[i] = o;
                    r = bf16_to_f32(o);
                } else if (kind == ADAM_F16) {
                    _Float16 o = add ? (_Float16)((float)hh[i] + (float)ih[i]) : ih[i];
                    hh[i] = o;
                    r = (float)o;
                } else {
                    r = add ? h32[i] + i32[i] : i32[i];
                    h32[i] = r;
                }
                lanes[i - base] += r * r;
            }
        }
        for (int k = 0; k < GRAD_LANES; k++)
            s += lanes[k];
    }
    return s;
}

ADAM_CLONES static double grad_range_bf16(const struct grad_job *j, size_t lo, size_t hi)
{
    return grad_range(j, lo, hi, ADAM_BF16);
}

ADAM_CLONES static double grad_range_f16(const struct grad_job *j, size_t lo, size_t hi)
{
    return grad_range(j, lo, hi, ADAM_F16);
}

ADAM_CLONES static double grad_range_f32(const struct grad_job *j, size_t lo, size_t hi)
{
    return grad_range(j, lo, hi, ADAM_F32);
}

static void grad_chunks(void *arg, int index)
{
    struct grad_job *j = arg;
    (void)index;
    for (;;) {
        size_t lo = atomic_fetch_add(&j->next, GRAD_CHUNK);
        if (lo >= j->n)
            return;
        size_t hi = lo + GRAD_CHUNK < j->n ? lo + GRAD_CHUNK : j->n;
        double s = j->kind == ADAM_BF16  ? grad_range_bf16(j, lo, hi)
                   : j->kind == ADAM_F16 ? grad_range_f16(j, lo, hi)
                                         : grad_range_f32(j, lo, hi);
        j->sums[lo / GRAD_CHUNK] = s;
    }
}

/* home = incoming (add=0) or home += incoming (add=1) over n elements of precision kind,
 * run by the team; *sumsq receives the sum of the squares of the result. 0, -1 for a
 * bad precision, or ENOMEM. One caller at a time per team. */
int grad_accumulate(void *team, size_t n, void *home, const void *incoming, int kind, int add,
                    double *sumsq)
{
    struct adam_team *t = team;
    if (kind < ADAM_F32 || kind > ADAM_F16)
        return -1;
    size_t chunks = (n + GRAD_CHUNK - 1) / GRAD_CHUNK;
    struct grad_job j = {.n = n, .home = home, .incoming = incoming, .kind = kind, .add = add};
    j.sums = calloc(chunks ? chunks : 1, sizeof(double));
    if (j.sums == NULL)
        return ENOMEM;
    atomic_store(&j.next, 0);
    team_run(&t->team, grad_chunks, &j);
    double s = 0.0;
    for (size_t c = 0; c < chunks; c++)
        s += j.sums[c];
    free(j.sums);
    *sumsq = s;
    return 0;
}

#pragma GCC pop_options
