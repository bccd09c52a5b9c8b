/* Tests for the input reader (src/file.h): whole files and lines from regular files, gzip
 * streams (one member, several, truncated, trailing garbage), a FIFO, /dev/zero and a folder,
 * each bounded by PIPESCOPE_MEM_LIMIT; expected texts are written by the tests themselves. */
#include <errno.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <zlib.h>

#include <cmocka.h>

#include "src/file.h"
#include "src/memlimit.h"

static char dir[] = "/tmp/ps_test_file.XXXXXX";

static const char *path_of(const char *name)
{
    static char buf[4][256];
    static int k;
    k = (k + 1) % 4;
    snprintf(buf[k], sizeof(buf[k]), "%s/%s", dir, name);
    return buf[k];
}

static void write_file(const char *name, const void *data, size_t n)
{
    FILE *f = fopen(path_of(name), "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(data, 1, n, f), n);
    assert_int_equal(fclose(f), 0);
}

/* gzip of data (one member), malloc'd */
static unsigned char *gz(const void *data, size_t n, size_t *out_n)
{
    z_stream z;
    memset(&z, 0, sizeof(z));
    assert_int_equal(deflateInit2(&z, 6, Z_DEFLATED, 15 + 16, 8, Z_DEFAULT_STRATEGY), Z_OK);
    size_t cap = deflateBound(&z, (uLong)n);
    unsigned char *out = malloc(cap);
    assert_non_null(out);
    z.next_in = (Bytef *)data;
    z.avail_in = (uInt)n;
    z.next_out = out;
    z.avail_out = (uInt)cap;
    assert_int_equal(deflate(&z, Z_FINISH), Z_STREAM_END);
    *out_n = cap - z.avail_out;
    deflateEnd(&z);
    return out;
}

static int setup(void **state)
{
    (void)state;
    if (!mkdtemp(dir)) return -1;
    unsetenv(PS_MEMLIMIT_ENV);
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    char cmd[300];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
    return system(cmd) == 0 ? 0 : -1;
}

static void test_regular(void **state)
{
    (void)state;
    /* bigger than the first buffer, not a multiple of anything */
    size_t n = 200003;
    char *data = malloc(n);
    assert_non_null(data);
    for (size_t i = 0; i < n; i++) data[i] = (char)('a' + i % 26);
    write_file("plain.txt", data, n);
    struct ps_diag d;
    ps_diag_clear(&d);
    char *t;
    size_t len;
    struct ps_file_opts o = {.factor = 8};
    assert_int_equal(ps_file_read(path_of("plain.txt"), &o, &t, &len, &d), 0);
    assert_int_equal(len, n);
    assert_memory_equal(t, data, n);
    assert_int_equal(t[n], '\0');
    free(t);
    /* gzip allowed but the file is plain: read as-is */
    o.gzip = true;
    assert_int_equal(ps_file_read(path_of("plain.txt"), &o, &t, &len, &d), 0);
    assert_int_equal(len, n);
    assert_memory_equal(t, data, n);
    free(t);
    /* empty file */
    write_file("empty", "", 0);
    assert_int_equal(ps_file_read(path_of("empty"), &o, &t, &len, &d), 0);
    assert_int_equal(len, 0);
    assert_string_equal(t, "");
    free(t);
    free(data);
}

static void test_gzip(void **state)
{
    (void)state;
    const char *a = "{\"traceEvents\": [\n", *b = "]}\n";
    size_t na, nb;
    unsigned char *ga = gz(a, strlen(a), &na), *gb = gz(b, strlen(b), &nb);
    unsigned char *both = malloc(na + nb + 8);
    memcpy(both, ga, na);
    memcpy(both + na, gb, nb);
    write_file("two.json.gz", both, na + nb); /* cat a.gz b.gz */
    struct ps_diag d;
    ps_diag_clear(&d);
    char *t;
    size_t len;
    struct ps_file_opts o = {.factor = 8, .gzip = true};
    assert_int_equal(ps_file_read(path_of("two.json.gz"), &o, &t, &len, &d), 0);
    assert_int_equal(len, strlen(a) + strlen(b));
    assert_memory_equal(t, a, strlen(a));
    assert_string_equal(t + strlen(a), b);
    free(t);
    /* without the gzip option the bytes come as they are */
    o.gzip = false;
    assert_int_equal(ps_file_read(path_of("two.json.gz"), &o, &t, &len, &d), 0);
    assert_int_equal(len, na + nb);
    assert_memory_equal(t, both, na + nb);
    free(t);
    /* truncated in the middle of the first member */
    o.gzip = true;
    write_file("cut.gz", ga, na - 5);
    ps_diag_clear(&d);
    assert_int_equal(ps_file_read(path_of("cut.gz"), &o, &t, &len, &d), -EIO);
    assert_null(t);
    assert_string_equal(d.where, path_of("cut.gz"));
    assert_string_equal(d.msg, "corrupt gzip stream: truncated");
    /* garbage after a complete member */
    memcpy(both + na, "junk", 4);
    write_file("junk.gz", both, na + 4);
    ps_diag_clear(&d);
    assert_int_equal(ps_file_read(path_of("junk.gz"), &o, &t, &len, &d), -EIO);
    assert_string_equal(d.msg, "corrupt gzip stream: unexpected data after the end of the stream");
    /* a corrupted body */
    memcpy(both, ga, na);
    for (size_t i = 10; i < na - 8; i++) both[i] ^= 0x55;
    write_file("bad.gz", both, na);
    ps_diag_clear(&d);
    assert_int_equal(ps_file_read(path_of("bad.gz"), &o, &t, &len, &d), -EIO);
    assert_non_null(strstr(d.msg, "corrupt gzip stream"));
    free(ga);
    free(gb);
    free(both);
}

static void test_limits(void **state)
{
    (void)state;
    struct ps_diag d;
    char buf[2048];
    char *t;
    size_t len;
    /* a regular file: refused from its size before reading (8 x 200003 bytes > 1 MiB) */
    setenv(PS_MEMLIMIT_ENV, "1M", 1);
    struct ps_file_opts o = {.factor = 8};
    ps_diag_clear(&d);
    assert_int_equal(ps_file_read(path_of("plain.txt"), &o, &t, &len, &d), -E2BIG);
    assert_null(t);
    snprintf(buf, sizeof(buf), "%s: reading this file would need 1.53 MiB of memory; the limit is 1 MiB",
             path_of("plain.txt"));
    char got[2048];
    snprintf(got, sizeof(got), "%s: %s", d.where, d.msg);
    assert_string_equal(got, buf);
    /* /dev/zero never ends: stopped at 1 MiB / 8 = 131072 bytes, one byte more is the error */
    ps_diag_clear(&d);
    assert_int_equal(ps_file_read("/dev/zero", &o, &t, &len, &d), -E2BIG);
    assert_string_equal(d.where, "/dev/zero:1:131074");
    assert_string_equal(d.msg, "reading this file would need more than 1 MiB of memory; the limit is 1 MiB");
    assert_non_null(strstr(d.hint, "PIPESCOPE_MEM_LIMIT"));
    /* a gzip bomb: 64 MiB of newlines in ~64 KiB, stopped at the limit with the line */
    size_t n = (size_t)64 << 20, gn;
    char *nl = malloc(n);
    memset(nl, '\n', n);
    unsigned char *g = gz(nl, n, &gn);
    free(nl);
    write_file("bomb.gz", g, gn);
    free(g);
    o.gzip = true;
    ps_diag_clear(&d);
    assert_int_equal(ps_file_read(path_of("bomb.gz"), &o, &t, &len, &d), -E2BIG);
    snprintf(buf, sizeof(buf), "%s:131074:1", path_of("bomb.gz"));
    assert_string_equal(d.where, buf);
    /* max_bytes: a cap of its own */
    unsetenv(PS_MEMLIMIT_ENV);
    struct ps_file_opts capped = {.noun = "the spec", .factor = 1, .max_bytes = 4096};
    ps_diag_clear(&d);
    assert_int_equal(ps_file_read(path_of("plain.txt"), &capped, &t, &len, &d), -EFBIG);
    assert_string_equal(d.msg, "file exceeds the limit of 4096 bytes (4 KiB)");
    ps_diag_clear(&d);
    assert_int_equal(ps_file_read("/dev/zero", &capped, &t, &len, &d), -EFBIG);
    /* a folder, a missing file */
    ps_diag_clear(&d);
    assert_int_equal(ps_file_read(dir, &o, &t, &len, &d), -EISDIR);
    assert_string_equal(d.msg, "cannot read: Is a directory");
    ps_diag_clear(&d);
    assert_int_equal(ps_file_read(path_of("nope"), &capped, &t, &len, &d), -ENOENT);
    assert_string_equal(d.msg, "cannot read the spec: No such file or directory");
}

static void test_fifo(void **state)
{
    (void)state;
    const char *p = path_of("fifo");
    assert_int_equal(mkfifo(p, 0600), 0);
    /* a writer that sends 300000 known bytes in small pieces */
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        FILE *f = fopen(p, "wb");
        if (!f) _exit(1);
        for (int i = 0; i < 300000; i++) fputc('0' + i % 10, f);
        _exit(fclose(f) == 0 ? 0 : 1);
    }
    struct ps_diag d;
    ps_diag_clear(&d);
    char *t;
    size_t len;
    struct ps_file_opts o = {.factor = 1, .gzip = true};
    assert_int_equal(ps_file_read(p, &o, &t, &len, &d), 0);
    int st;
    assert_int_equal(waitpid(pid, &st, 0), pid);
    assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    assert_int_equal(len, 300000);
    for (size_t i = 0; i < len; i++)
        if (t[i] != '0' + (int)(i % 10)) fail_msg("byte %zu differs", i);
    free(t);
    /* an endless writer under a 1 MiB limit: refused, and the writer gets SIGPIPE */
    pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        FILE *f = fopen(p, "wb");
        if (!f) _exit(1);
        for (;;)
            if (fputs("0123456789\n", f) < 0) _exit(0);
    }
    setenv(PS_MEMLIMIT_ENV, "1M", 1);
    ps_diag_clear(&d);
    assert_int_equal(ps_file_read(p, &o, &t, &len, &d), -E2BIG);
    unsetenv(PS_MEMLIMIT_ENV);
    char want[300];
    snprintf(want, sizeof(want), "%s:95326:3", p); /* 1048577 bytes = 95325 lines of 11 and 2 */
    assert_string_equal(d.where, want);
    kill(pid, SIGKILL);
    waitpid(pid, &st, 0);
}

static void test_lines(void **state)
{
    (void)state;
    struct ps_diag d;
    struct ps_file_lines l;
    char *line;
    size_t len;
    write_file("a.csv", "a\nbb\r\n\nlast", 11);
    ps_diag_clear(&d);
    assert_int_equal(ps_file_lines_open(&l, path_of("a.csv"), &d), 0);
    static const char *const want[] = {"a", "bb\r", "", "last"};
    for (int k = 0; k < 4; k++) {
        assert_int_equal(ps_file_lines_next(&l, &line, &len, &d), 1);
        assert_string_equal(line, want[k]);
        assert_int_equal(len, strlen(want[k]));
        assert_int_equal(l.lineno, k + 1);
    }
    assert_int_equal(ps_file_lines_next(&l, &line, &len, &d), 0);
    ps_file_lines_close(&l);

    /* 5000 lines of growing length through gzip: every line intact, numbers right */
    size_t cap = 0, n = 0;
    for (int k = 0; k < 5000; k++) cap += (size_t)k % 300 + 1;
    char *text = malloc(cap);
    for (int k = 0; k < 5000; k++) {
        for (int j = 0; j < k % 300; j++) text[n++] = (char)('a' + (k + j) % 26);
        text[n++] = '\n';
    }
    size_t gn;
    unsigned char *g = gz(text, n, &gn);
    write_file("many.csv.gz", g, gn);
    free(g);
    assert_int_equal(ps_file_lines_open(&l, path_of("many.csv.gz"), &d), 0);
    size_t off = 0;
    for (int k = 0; k < 5000; k++) {
        assert_int_equal(ps_file_lines_next(&l, &line, &len, &d), 1);
        assert_int_equal(len, (size_t)k % 300);
        assert_memory_equal(line, text + off, len);
        off += len + 1;
    }
    assert_int_equal(ps_file_lines_next(&l, &line, &len, &d), 0);
    ps_file_lines_close(&l);
    free(text);

    /* a NUL byte: the line number */
    write_file("nul.csv", "1,2\n3,\0\n", 8);
    assert_int_equal(ps_file_lines_open(&l, path_of("nul.csv"), &d), 0);
    assert_int_equal(ps_file_lines_next(&l, &line, &len, &d), 1);
    ps_diag_clear(&d);
    assert_int_equal(ps_file_lines_next(&l, &line, &len, &d), -EINVAL);
    char w[300];
    snprintf(w, sizeof(w), "%s:2", path_of("nul.csv"));
    assert_string_equal(d.where, w);
    ps_file_lines_close(&l);

    /* one endless line (gzip) after 3 short ones under 1 MiB: refused at line 4 */
    size_t big = (size_t)32 << 20;
    char *one = malloc(big);
    memset(one, 'x', big);
    memcpy(one, "1\n2\n3\n", 6);
    g = gz(one, big, &gn);
    free(one);
    write_file("line.csv.gz", g, gn);
    free(g);
    setenv(PS_MEMLIMIT_ENV, "1M", 1);
    assert_int_equal(ps_file_lines_open(&l, path_of("line.csv.gz"), &d), 0);
    for (int k = 0; k < 3; k++) assert_int_equal(ps_file_lines_next(&l, &line, &len, &d), 1);
    ps_diag_clear(&d);
    assert_int_equal(ps_file_lines_next(&l, &line, &len, &d), -E2BIG);
    unsetenv(PS_MEMLIMIT_ENV);
    snprintf(w, sizeof(w), "%s:4:", path_of("line.csv.gz"));
    assert_memory_equal(d.where, w, strlen(w));
    assert_non_null(strstr(d.msg, "reading this file would need more than"));
    ps_file_lines_close(&l);
}

static void test_line_col(void **state)
{
    (void)state;
    int line, col;
    ps_file_line_col("ab\ncd\xc3\xa9" "f", 8, &line, &col); /* after "cd" + e-acute + "f" */
    assert_int_equal(line, 2);
    assert_int_equal(col, 5);
    ps_file_line_col("", 0, &line, &col);
    assert_int_equal(line, 1);
    assert_int_equal(col, 1);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_regular), cmocka_unit_test(test_gzip),
        cmocka_unit_test(test_limits),  cmocka_unit_test(test_fifo),
        cmocka_unit_test(test_lines),   cmocka_unit_test(test_line_col),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
