/* fuzz: what the fuzz targets (tests/fuzz/fuzz_*.c) share.
 *
 * Each target defines LLVMFuzzerTestOneInput. Built with -Dfuzz=true (clang) it links
 * libFuzzer's main; always, it also links replay.c, whose main feeds every file of the folders
 * it is given (seed corpus, regression cases) to the same entry point, so the normal test suite
 * replays every crasher ever found without libFuzzer.
 *
 * A target checks the contract of what it calls, not only that it does not crash: FUZZ_CHECK
 * aborts (a crash the fuzzer reports) when a failing call left no error message, or a
 * successful one broke an invariant of its header.
 */
#ifndef PS_FUZZ_H
#define PS_FUZZ_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define FUZZ_CHECK(cond)                                                                        \
    do {                                                                                       \
        if (!(cond)) {                                                                         \
            fprintf(stderr, "%s:%d: fuzz check failed: %s\n", __FILE__, __LINE__, #cond);     \
            abort();                                                                           \
        }                                                                                      \
    } while (0)

#endif
