/* balance: contiguous partitions of a layer sequence (SEMANTICS.md section 8).
 *
 * ps_balance_exact finds the partition into P non-empty contiguous blocks that minimises the
 * largest block cost (dynamic programme over prefix sums, O(P L^2); ties: the lexicographically
 * smallest balance vector, so results are stable), optionally under a cap on a second per-layer
 * quantity (memory) per block. ps_balance_blockpartition re-implements torchgpipe 0.0.7's
 * heuristic (balance/blockpartition.py, "Block Partitions of Sequences", Barany et al.): costs
 * normalised to [0, 1], equal-count initial splits, then single elements move from a neighbour
 * into the smallest block until max <= min + 1 (in normalised units). It is not an exact min-max.
 */
#ifndef PS_BALANCE_H
#define PS_BALANCE_H

/* bal[P] receives layers per block. mem/cap: NULL/<=0 = no cap. Returns 0, -EINVAL (P < 1 or
 * P > L), -ENOSPC (no partition fits the cap) or -ENOMEM. *max_cost = the largest block cost. */
int ps_balance_exact(const double *cost, const double *mem, double cap, int L, int P, int *bal,
                     double *max_cost);
int ps_balance_blockpartition(const double *cost, int L, int P, int *bal);
/* Largest block cost of a balance. */
double ps_balance_max(const double *cost, int L, const int *bal, int P);

#endif
