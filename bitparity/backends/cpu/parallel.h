/* The `cpu` backend's threads: parallel loops that run no slower than one thread on busy cores (issue 18).
 *
 * bp_parallel(member, ctx, items, nthreads) runs member on the calling thread, which claims chunks
 * [begin, end) of the items 0 .. items - 1 with bp_claim until none is left.  While it does, it looks (at
 * most every RECHECK_NS, parallel.c) for cores with nothing to run and wakes one helper thread per idle
 * core, up to nthreads - 1 in all; a helper runs member too and claims chunks alongside it.  Each chunk is
 * claimed by exactly one member.  The call returns when every chunk is done: it waits only for helpers
 * running a chunk, never for one that has not started.  So on busy cores no helper is woken and the call
 * is the one-thread call; a helper that wakes late finds the chunks taken.  Helpers sleep on a condition
 * variable between jobs; nothing spins.
 *
 * The OpenMP regions these loops used before (some ops still do) ran on torch's libgomp: a region ends at a
 * barrier that waits for every thread of its team, so one thread the scheduler had not run held the whole
 * call, and the runtime's idle threads spin for milliseconds after each region, taking busy cores from the
 * caller.  And waking any thread when every core is busy takes a core from someone, often from the caller
 * itself.  Measured in docs/benchmarks.md ("cpu backend threads under contention").
 *
 * Which member computes an item cannot change a bit: the items are independent (rows, (row, segment)
 * pairs, blocks of elements, sequences), and each is computed by the same code from the same operands. */

#ifndef BP_CPU_PARALLEL_H
#define BP_CPU_PARALLEL_H

#include <stdint.h>

struct bp_job;

/* One member of a job: claims chunks with bp_claim until it returns 0.  Returns 0, or nonzero if it could
 * not take part (its scratch could not be allocated), having claimed nothing. */
typedef int bp_member_fn(const void *ctx, struct bp_job *job);

/* The next unclaimed chunk [*begin, *end) of the job's items: 1, or 0 when none is left. */
int bp_claim(struct bp_job *job, int64_t *begin, int64_t *end);

/* Runs member over items on the caller and up to nthreads - 1 helpers (above).  Returns 0, or -1 if a
 * member returned nonzero. */
int bp_parallel(bp_member_fn *member, const void *ctx, int64_t items, int nthreads);

/* The items [begin, end) of a loop that needs no scratch of its own. */
typedef void bp_range_fn(const void *ctx, int64_t begin, int64_t end);

/* bp_parallel with members that call fn on each chunk they claim. */
void bp_parallel_for(bp_range_fn *fn, const void *ctx, int64_t items, int nthreads);

/* For tests: on != 0 makes every job wake its nthreads - 1 helpers at once, idle cores or not, and the
 * caller start claiming only when they have all joined, so that the split over threads is exercised
 * whatever the machine's load; 0 restores the policy above. */
void bp_set_eager_helpers(int on);

#endif /* BP_CPU_PARALLEL_H */
