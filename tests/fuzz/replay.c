/* replay: runs a fuzz target's entry point over files, without libFuzzer (see fuzz.h).
 *
 *     replay_<target> PATH...    each PATH a file or a folder of files (not recursive)
 *
 * Prints one line per folder and exits 0 when every input returned; a crash, a sanitizer report
 * or a FUZZ_CHECK failure ends the process, which the test harness reports as a failure.
 */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "tests/fuzz/fuzz.h"

static int run_file(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        perror(path);
        return -1;
    }
    size_t cap = 4096, len = 0;
    uint8_t *buf = malloc(cap);
    for (;;) {
        if (!buf) break;
        if (len == cap) {
            uint8_t *nb = realloc(buf, cap * 2);
            if (!nb) {
                free(buf);
                buf = NULL;
                break;
            }
            buf = nb;
            cap *= 2;
        }
        size_t got = fread(buf + len, 1, cap - len, f);
        if (got == 0) break;
        len += got;
    }
    fclose(f);
    if (!buf) {
        fprintf(stderr, "%s: out of memory\n", path);
        return -1;
    }
    LLVMFuzzerTestOneInput(buf, len);
    free(buf);
    return 0;
}

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

int main(int argc, char **argv)
{
    int bad = 0;
    for (int k = 1; k < argc; k++) {
        struct stat st;
        if (stat(argv[k], &st) != 0) {
            perror(argv[k]);
            bad++;
            continue;
        }
        if (!S_ISDIR(st.st_mode)) {
            bad += run_file(argv[k]) != 0;
            continue;
        }
        DIR *dir = opendir(argv[k]);
        if (!dir) {
            perror(argv[k]);
            bad++;
            continue;
        }
        char **names = NULL;
        size_t n = 0, cap = 0;
        struct dirent *e;
        while ((e = readdir(dir))) {
            if (e->d_name[0] == '.') continue;
            if (n == cap) {
                cap = cap ? cap * 2 : 64;
                char **nn = realloc(names, cap * sizeof(*names));
                if (!nn) break;
                names = nn;
            }
            names[n] = strdup(e->d_name);
            if (names[n]) n++;
        }
        closedir(dir);
        if (n) qsort(names, n, sizeof(*names), cmp_str); /* deterministic order */
        for (size_t i = 0; i < n; i++) {
            size_t L = strlen(argv[k]) + strlen(names[i]) + 2;
            char *p = malloc(L);
            if (p) {
                snprintf(p, L, "%s/%s", argv[k], names[i]);
                bad += run_file(p) != 0;
            }
            free(p);
            free(names[i]);
        }
        free(names);
        printf("%s: %zu inputs\n", argv[k], n);
    }
    return bad ? 1 : 0;
}
