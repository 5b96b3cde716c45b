/* Threads pinned to one CPU from their first instruction (the affinity is set in the
 * attributes, not after the start), shared by the thread team (thread_team.h) and the
 * load threads; and the pause they spin with. */
#ifndef PYCXL_PINNED_THREAD_H
#define PYCXL_PINNED_THREAD_H
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <pthread.h>
#include <sched.h>
#if defined(__x86_64__)
#include <emmintrin.h>
#endif

/* In a spin-wait loop: lets the sibling hyperthread run and saves power. */
static inline void cpu_relax(void)
{
#if defined(__x86_64__)
    _mm_pause();
#endif
}

/* pthread_create's return value: 0, or an errno value. */
static inline int start_pinned_thread(pthread_t *tid, int cpu, void *(*fn)(void *), void *arg)
{
    pthread_attr_t attr;
    cpu_set_t set;
    pthread_attr_init(&attr);
    CPU_ZERO(&set);
    CPU_SET(cpu, &set);
    pthread_attr_setaffinity_np(&attr, sizeof(set), &set);
    int rc = pthread_create(tid, &attr, fn, arg);
    pthread_attr_destroy(&attr);
    return rc;
}
#endif
