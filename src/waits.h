/* waits: which earlier work a stream node waits for on the DEVICE (SEMANTICS.md sections 2, 3, 5).
 *
 * The host issues the order's entries one after the other; every edge of the graph orders that
 * issue. On the device, a node with a stream starts only after
 *   - the previous entry of its stream (each stream runs in issue order), and
 *   - the ends of the entries this plan lists for it:
 *       EVENT    a wait node W/Wo (and their backward twins) waits for the last entry issued on
 *                the stream it waits on (`wait_on`), as wait_stream records an event at that
 *                moment and makes its stream wait for it;
 *       BARRIER  a copy runs on its own stream with a two-way barrier to `wait_on`: it waits for
 *                the last entry issued on `wait_on`, and the next entry of `wait_on` waits for it
 *                (a copy counts as issued on both streams);
 *       GRAD     a backward node waits for the producers of the real gradients it consumes when
 *                they ran on another stream (the autograd engine's sync), found through host-only
 *                nodes (fork, join, loss) along DATA edges. R(i,j) produces no gradient
 *                (Recompute.backward returns None), so it is no producer.
 * and nothing else: PHONY and HOST edges order the host only, and a forward DATA edge between
 * two streams with no wait on its way is a race (analysis.h reports it), not a device order.
 * Consequences: C(i,j-1->j) does not wait for F(i-1,j); R(i,j) waits neither for the output
 * gradient copy nor for B(i,j+1); only Wo'(i,j), hence B(i,j), waits for the copy.
 *
 * Invariants of a plan:
 *   W1. Waits point backwards in the order (at < k), and never at an entry of the waiter's own
 *       stream (the stream order covers those).
 *   W2. At most one wait per other stream and entry: the latest entry of that stream, which by
 *       the stream order implies every earlier one.
 *   W3. The plan depends on the graph and the order only, so the simulator, the executors and the
 *       checks that read it agree by construction; what makes it right is SEMANTICS.md, which
 *       tests check against hand-worked timelines.
 */
#ifndef PS_WAITS_H
#define PS_WAITS_H

#include <stdbool.h>
#include <stdint.h>

#include "src/diag.h"
#include "src/engine.h"
#include "src/graph.h"

enum ps_wait_kind { PS_WAIT_EVENT = 1, PS_WAIT_BARRIER, PS_WAIT_GRAD };

struct ps_waits {
    uint32_t n;      /* order entries */
    uint32_t *sprev; /* previous entry of the same stream, UINT32_MAX when none or no stream */
    uint32_t *off;   /* entry k waits for the ends of at[off[k] .. off[k+1]) */
    uint32_t *at;    /* order entries */
    uint8_t *kind;   /* enum ps_wait_kind of each wait */
    uint32_t n_waits;
};

/* Plans the waits of every entry of `order`. Returns 0 or -ENOMEM (diag set). */
int ps_waits_plan(const struct ps_graph *g, const struct ps_order *order, struct ps_waits *w,
                  struct ps_diag *diag);
void ps_waits_finish(struct ps_waits *w); /* accepts a zeroed struct */

/* Device happens-before: true when entry a ends before entry b starts in every timing, through
 * stream order and waits (a < b required; false otherwise). A search back from b, O(b - a). */
bool ps_waits_before(const struct ps_waits *w, const struct ps_graph *g,
                     const struct ps_order *order, uint32_t a, uint32_t b);

const char *ps_wait_kind_name(enum ps_wait_kind k);

#endif
