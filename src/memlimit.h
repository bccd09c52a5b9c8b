/* memlimit: how much memory one command may plan to use, checked before it allocates.
 *
 * A spec can ask for more than any machine has (chunks x partitions graph nodes, batch x
 * activation elements, synthetic samples); with overcommit the allocation succeeds and the
 * kernel's OOM killer ends the process later without a word. So every stage that allocates in
 * proportion to the spec (graph build, executor) first estimates its bytes and refuses, with the
 * numbers and how to raise the limit, when they exceed:
 *
 *     PIPESCOPE_MEM_LIMIT (bytes, optional K/M/G/T suffix, binary units), when set;
 *     else min(16 GiB, 3/4 of physical memory);
 *     and never more than 3/4 of an address-space or data limit (ulimit -v / -d).
 *
 * Estimates are upper bounds within a small factor, not accounting: the point is a clear error
 * instead of a kill, not a tight budget.
 */
#ifndef PS_MEMLIMIT_H
#define PS_MEMLIMIT_H

#include <stdint.h>
#include <stdio.h>

#include "src/diag.h"

#define PS_MEMLIMIT_DEFAULT ((uint64_t)16 << 30)
#define PS_MEMLIMIT_ENV "PIPESCOPE_MEM_LIMIT"

/* The limit in bytes. Returns 0, or -EINVAL with diag when PIPESCOPE_MEM_LIMIT is malformed. */
int ps_memlimit_get(uint64_t *bytes, struct ps_diag *d);

/* Returns 0 when `need` bytes fit the limit, else -E2BIG (or -EINVAL for a bad environment
 * variable) with diag: "WHERE: WHAT would need 8.6 TiB of memory; the limit is 16 GiB" and the
 * hint "SMALLER, or raise the limit with PIPESCOPE_MEM_LIMIT=SIZE (e.g. 64G)". */
int ps_memlimit_check(double need, const char *where, const char *what, const char *smaller,
                      struct ps_diag *d);

/* "16 GiB", "8.6 TiB" */
const char *ps_memlimit_format(double bytes, char *buf, int len);

#endif
