/* The `cpu` backend's helper threads (parallel.h says what bp_parallel guarantees).  One mutex guards the
 * pool and each job's seats and running helpers; chunks are claimed with one atomic add each. */

#define _GNU_SOURCE             /* sched_getaffinity, CPU_COUNT */

#include "parallel.h"

#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

/* Chunks per possible member: one that finds none left waits only for the chunks in flight, so smaller
 * chunks bound that wait; 8 keep a claim (one atomic add) negligible against a chunk's work. */
#define CHUNKS_PER_MEMBER 8

/* How often the caller looks for idle cores while helpers could still join: reading /proc/loadavg costs a
 * few microseconds, under 3% of this. */
#define RECHECK_NS 200000

struct bp_job {
    bp_member_fn *member;
    const void *ctx;
    int64_t items, chunk;
    int64_t next;           /* the first unclaimed item; claimed by atomic add */
    pthread_t caller;
    int helpers;            /* at most this many helpers may join */
    /* the caller's own: */
    int offered;            /* seats offered so far */
    int posted;             /* whether the job was posted to the pool */
    int64_t checked_ns;     /* when it last looked for idle cores (0: never) */
    /* under pool.lock: */
    int seats;              /* helpers that may still join */
    int running;            /* helpers inside member */
    int failed;             /* some helper's member returned nonzero */
};

static struct {
    pthread_mutex_t lock;
    pthread_cond_t wake;    /* helpers wait here for a seat */
    pthread_cond_t left;    /* callers wait here for their job's running helpers */
    struct bp_job *job;     /* the posted job, or NULL: one job at a time */
    uint64_t posts;         /* jobs posted so far, so that a helper serves each job at most once */
    int helpers;
} pool = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, PTHREAD_COND_INITIALIZER, NULL, 0, 0};

static int loadavg_fd = -1;
static pthread_once_t once = PTHREAD_ONCE_INIT;
static int eager;               /* bp_set_eager_helpers */

static int64_t now_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;
}

/* A helper: sleeps until the posted job is one it has not served and has a free seat, takes the seat and
 * runs the job's member.  The mutex orders the member's writes before the caller's return. */
static void *helper(void *unused)
{
    uint64_t served = 0;
    (void)unused;
    pthread_mutex_lock(&pool.lock);
    for (;;) {
        while (pool.job == NULL || pool.posts == served || pool.job->seats == 0)
            pthread_cond_wait(&pool.wake, &pool.lock);
        struct bp_job *job = pool.job;
        served = pool.posts;
        job->running++;
        if (--job->seats == 0)
            pthread_cond_broadcast(&pool.left);     /* an eager caller waits for every seat to be taken */
        pthread_mutex_unlock(&pool.lock);
        int failed = job->member(job->ctx, job);
        pthread_mutex_lock(&pool.lock);
        job->failed |= failed;
        if (--job->running == 0)
            pthread_cond_broadcast(&pool.left);
    }
    return NULL;
}

/* fork() copies only the forking thread: the child starts with no helper and no job.  The parent holds the
 * lock across the fork, so no helper is inside it in the copy; the child makes the condition variables
 * anew, since their copies still count the parent's sleeping helpers. */
static void lock_pool(void)
{
    pthread_mutex_lock(&pool.lock);
}

static void unlock_pool(void)
{
    pthread_mutex_unlock(&pool.lock);
}

static void reset_pool(void)
{
    pool.job = NULL;
    pool.helpers = 0;
    pthread_cond_init(&pool.wake, NULL);
    pthread_cond_init(&pool.left, NULL);
    pthread_mutex_unlock(&pool.lock);
}

static void init_pool(void)
{
    loadavg_fd = open("/proc/loadavg", O_RDONLY | O_CLOEXEC);
    pthread_atfork(lock_pool, unlock_pool, reset_pool);
}

/* Cores with nothing to run right now: the CPUs the caller may run on, less the runnable tasks of the
 * whole machine, the caller among them (the fourth field of /proc/loadavg, running/total, counts them when
 * it is read).  Where /proc/loadavg cannot be read, every CPU but the caller's counts as idle. */
static int idle_cores(void)
{
    cpu_set_t cpus;
    if (sched_getaffinity(0, sizeof cpus, &cpus) != 0)
        return 0;
    char text[128];
    ssize_t len = loadavg_fd < 0 ? -1 : pread(loadavg_fd, text, sizeof text - 1, 0);
    if (len <= 0)
        return CPU_COUNT(&cpus) - 1;
    text[len] = '\0';
    const char *field = text;
    for (int spaces = 0; spaces < 3 && *field != '\0'; field++)
        spaces += *field == ' ';
    return CPU_COUNT(&cpus) - (int)strtol(field, NULL, 10);
}

/* Starts helpers until there are n (under pool.lock).  One that cannot be started is left out: the caller
 * does whatever the helpers do not.  Helpers block every signal, so signals go to the threads that called
 * the backend (Python handles them in its main thread). */
static void start_helpers(int n)
{
    if (pool.helpers >= n)
        return;
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    while (pool.helpers < n) {
        pthread_t thread;
        if (pthread_create(&thread, &attr, helper, NULL) != 0)
            break;
        pool.helpers++;
    }
    pthread_attr_destroy(&attr);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
}

/* The caller, before a claim: wakes one helper per idle core, up to the helpers the job may still have.
 * A helper woken while every core is busy takes a core from someone, often from the caller. */
static void offer_seats(struct bp_job *job)
{
    int64_t now = now_ns();
    if (job->checked_ns != 0 && now - job->checked_ns < RECHECK_NS)
        return;
    job->checked_ns = now;
    int wait = __atomic_load_n(&eager, __ATOMIC_RELAXED);
    int n = wait ? job->helpers : idle_cores();
    if (n > job->helpers - job->offered)
        n = job->helpers - job->offered;
    if (n <= 0)
        return;
    pthread_mutex_lock(&pool.lock);
    if (pool.job == NULL && !job->posted) {
        pool.job = job;
        pool.posts++;
        job->posted = 1;
    }
    if (pool.job == job) {
        start_helpers(job->offered + n);
        if (n > pool.helpers - job->offered)
            n = pool.helpers - job->offered;        /* helpers that could not be started */
        job->offered += n;
        job->seats += n;
        for (int i = 0; i < n; i++)
            pthread_cond_signal(&pool.wake);
        while (wait && job->seats > 0)
            pthread_cond_wait(&pool.left, &pool.lock);
    } else {
        job->offered = job->helpers;    /* another caller's job (another Python thread) holds the pool: run alone */
    }
    pthread_mutex_unlock(&pool.lock);
}

int bp_claim(struct bp_job *job, int64_t *begin, int64_t *end)
{
    if (pthread_equal(job->caller, pthread_self()) && job->offered < job->helpers)
        offer_seats(job);
    int64_t start = __atomic_fetch_add(&job->next, job->chunk, __ATOMIC_RELAXED);
    if (start >= job->items)
        return 0;
    *begin = start;
    *end = job->items - start < job->chunk ? job->items : start + job->chunk;
    return 1;
}

int bp_parallel(bp_member_fn *member, const void *ctx, int64_t items, int nthreads)
{
    int helpers = nthreads > 1 && items > 1 ? nthreads - 1 : 0;
    /* alone, the caller claims every item at once */
    int64_t chunks = helpers ? (int64_t)(helpers + 1) * CHUNKS_PER_MEMBER : 1;
    int64_t chunk = items > chunks ? (items + chunks - 1) / chunks : 1;
    struct bp_job job = {member, ctx, items, chunk, 0, pthread_self(), helpers, 0, 0, 0, 0, 0, 0};
    if (helpers)
        pthread_once(&once, init_pool);
    int failed = member(ctx, &job);
    if (job.posted) {
        /* no helper joins from here on; wait only for those inside member */
        pthread_mutex_lock(&pool.lock);
        pool.job = NULL;
        while (job.running > 0)
            pthread_cond_wait(&pool.left, &pool.lock);
        failed |= job.failed;
        pthread_mutex_unlock(&pool.lock);
    }
    return failed ? -1 : 0;
}

void bp_set_eager_helpers(int on)
{
    __atomic_store_n(&eager, on, __ATOMIC_RELAXED);
}

struct range_loop {
    bp_range_fn *fn;
    const void *ctx;
};

static int range_member(const void *ctx, struct bp_job *job)
{
    const struct range_loop *loop = ctx;
    int64_t begin, end;
    while (bp_claim(job, &begin, &end))
        loop->fn(loop->ctx, begin, end);
    return 0;
}

void bp_parallel_for(bp_range_fn *fn, const void *ctx, int64_t items, int nthreads)
{
    const struct range_loop loop = {fn, ctx};
    bp_parallel(range_member, &loop, items, nthreads);
}
