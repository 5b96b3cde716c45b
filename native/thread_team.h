/* A team of threads, each pinned to one CPU for its whole life, that run one job
 * together and sleep between jobs: the STREAM workers, the copy pool and the Adam
 * step's team. The hand-off (a mutex, a "go" and a "done" condition) wakes the threads
 * and collects them; nothing of it runs inside a job, so a job that times itself (the
 * STREAM kernels, between their own barriers) times only its own work.
 *
 * The team lives inside its owner's struct; team_start fills it, team_end empties it. */
#ifndef PYCXL_THREAD_TEAM_H
#define PYCXL_THREAD_TEAM_H
#include "pinned_thread.h" /* first: it defines _GNU_SOURCE */

#include <errno.h>
#include <stdlib.h>

/* What every thread runs for one dispatch: index is the thread's, 0 .. nthreads-1. */
typedef void team_job(void *arg, int index);

struct team_member {
    struct thread_team *team;
    int index;
};

struct thread_team {
    int nthreads; /* threads running */
    pthread_t *tids;
    struct team_member *members;
    pthread_mutex_t lock; /* over everything below */
    pthread_cond_t go, done;
    unsigned long generation; /* bumped for each job */
    int busy;                 /* threads still in the current job */
    int quit;
    team_job *job;
    void *arg;
};

static inline void *team_thread(void *p)
{
    struct team_member *me = p;
    struct thread_team *t = me->team;
    unsigned long seen = 0;
    for (;;) {
        pthread_mutex_lock(&t->lock);
        while (t->generation == seen && !t->quit)
            pthread_cond_wait(&t->go, &t->lock);
        if (t->quit) {
            pthread_mutex_unlock(&t->lock);
            return NULL;
        }
        seen = t->generation;
        team_job *job = t->job;
        void *arg = t->arg;
        pthread_mutex_unlock(&t->lock);
        job(arg, me->index);
        pthread_mutex_lock(&t->lock);
        if (--t->busy == 0)
            pthread_cond_signal(&t->done);
        pthread_mutex_unlock(&t->lock);
    }
}

/* Stop the threads (each finishes the job it is in first), wait for them, free what
 * team_start allocated. */
static inline void team_end(struct thread_team *t)
{
    pthread_mutex_lock(&t->lock);
    t->quit = 1;
    pthread_cond_broadcast(&t->go);
    pthread_mutex_unlock(&t->lock);
    for (int i = 0; i < t->nthreads; i++)
        pthread_join(t->tids[i], NULL);
    pthread_mutex_destroy(&t->lock);
    pthread_cond_destroy(&t->go);
    pthread_cond_destroy(&t->done);
    free(t->tids);
    free(t->members);
}

/* nthreads threads, thread i pinned to cpus[i], asleep until the first job. Returns 0,
 * or an errno value when they cannot all start (then none is left running and there
 * is nothing to end). */
static inline int team_start(struct thread_team *t, int nthreads, const int *cpus)
{
    *t = (struct thread_team){0};
    t->tids = calloc((size_t)nthreads, sizeof(pthread_t));
    t->members = calloc((size_t)nthreads, sizeof(struct team_member));
    pthread_mutex_init(&t->lock, NULL);
    pthread_cond_init(&t->go, NULL);
    pthread_cond_init(&t->done, NULL);
    if (!t->tids || !t->members) {
        team_end(t);
        return ENOMEM;
    }
    for (int i = 0; i < nthreads; i++) {
        t->members[i] = (struct team_member){t, i};
        int rc = start_pinned_thread(&t->tids[i], cpus[i], team_thread, &t->members[i]);
        if (rc) {
            team_end(t); /* the started threads are asleep: they wake to quit */
            return rc;
        }
        t->nthreads++;
    }
    return 0;
}

/* Every thread starts job(arg, its index); returns at once. One job at a time: the
 * previous one has been waited for. */
static inline void team_go(struct thread_team *t, team_job *job, void *arg)
{
    pthread_mutex_lock(&t->lock);
    t->job = job;
    t->arg = arg;
    t->busy = t->nthreads;
    t->generation++;
    pthread_cond_broadcast(&t->go);
    pthread_mutex_unlock(&t->lock);
}

/* Until every thread has returned from the job team_go started. */
static inline void team_wait(struct thread_team *t)
{
    pthread_mutex_lock(&t->lock);
    while (t->busy)
        pthread_cond_wait(&t->done, &t->lock);
    pthread_mutex_unlock(&t->lock);
}

/* team_go, then team_wait. */
static inline void team_run(struct thread_team *t, team_job *job, void *arg)
{
    team_go(t, job, arg);
    team_wait(t);
}
#endif
