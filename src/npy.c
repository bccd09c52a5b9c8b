/* npy: reader and writer for NumPy's .npy format.
 *
 *     offset 0   "\x93NUMPY"  magic (6 bytes)
 *            6   major, minor version bytes: 1.0 (2-byte header length) or 2.0/3.0 (4-byte)
 *            8   header length, little-endian
 *       10/12   header: a Python dict literal, space padded, ending in '\n':
 *                 {'descr': '<f4', 'fortran_order': False, 'shape': (3, 4), }
 *   10/12 + hl   data: numel * itemsize bytes, C order, nothing after it
 *
 * Invariants of the reader:
 *  1. Every byte count is checked before it is read: magic, preamble, header, data; a short file
 *     says how many bytes were expected and how many were found.
 *  2. The header is parsed as the small dict grammar numpy writes (keys descr, fortran_order,
 *     shape, in any order, single or double quotes); anything else is an error naming the spot.
 *  3. The element count is computed with overflow checks and capped at PS_NPY_MAX_NUMEL before
 *     any allocation, so a hostile shape cannot make us allocate or overflow.
 *  4. Data bytes are decoded with memcpy (no alignment assumptions) and little-endian byte order
 *     (big-endian files are rejected, not swapped).
 * The writer emits version 1.0 with the header padded so the data starts at a multiple of 64,
 * as numpy >= 1.23 does.
 */
#include "src/npy.h"

#include "src/diag.h"
#include "src/file.h"
#include "src/memlimit.h"

#include <errno.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char MAGIC[6] = {'\x93', 'N', 'U', 'M', 'P', 'Y'};

struct dtype {
    const char *descr;
    size_t size;
    char kind; /* 'f' float, 'i' signed, 'u' unsigned, 'b' bool */
};

static const struct dtype DTYPES[] = {
    {"<f4", 4, 'f'}, {"<f8", 8, 'f'}, {"<i4", 4, 'i'}, {"<i8", 8, 'i'},
    {"|u1", 1, 'u'}, {"|i1", 1, 'i'}, {"|b1", 1, 'b'},
};

static const struct dtype *find_dtype(const char *descr)
{
    for (size_t i = 0; i < sizeof(DTYPES) / sizeof(DTYPES[0]); i++)
        if (strcmp(DTYPES[i].descr, descr) == 0) return &DTYPES[i];
    return NULL;
}

static void format_shape(const int64_t *shape, int ndim, char *buf, size_t len)
{
    size_t o = (size_t)snprintf(buf, len, "(");
    for (int i = 0; i < ndim && o < len; i++)
        o += (size_t)snprintf(buf + o, len - o, "%s%lld", i ? ", " : "", (long long)shape[i]);
    if (o < len) snprintf(buf + o, len - o, ndim == 1 ? ",)" : ")");
}

/* ---- header dict parser ------------------------------------------------------------------ */

struct hparse {
    const char *s, *end;
    const char *where;
    struct ps_diag *d;
};

static void skip_ws(struct hparse *p)
{
    while (p->s < p->end && (*p->s == ' ' || *p->s == '\t' || *p->s == '\n' || *p->s == '\r'))
        p->s++;
}

static int bad_header(struct hparse *p, const char *expected)
{
    char near[24];
    size_t n = (size_t)(p->end - p->s);
    if (n > 16) n = 16;
    size_t o = 0;
    for (size_t i = 0; i < n && o + 1 < sizeof(near); i++)
        near[o++] = (p->s[i] >= 32 && p->s[i] < 127) ? p->s[i] : '?';
    near[o] = '\0';
    if (p->s >= p->end)
        return ps_diag_set(p->d, -EINVAL, p->where, "bad header: expected %s, found the end",
                           expected);
    return ps_diag_set(p->d, -EINVAL, p->where, "bad header: expected %s near \"%s\"", expected,
                       near);
}

static int expect_char(struct hparse *p, char c, const char *what)
{
    skip_ws(p);
    if (p->s >= p->end || *p->s != c) return bad_header(p, what);
    p->s++;
    return 0;
}

static int parse_string(struct hparse *p, char *out, size_t len)
{
    skip_ws(p);
    if (p->s >= p->end || (*p->s != '\'' && *p->s != '"')) return bad_header(p, "a quoted string");
    char q = *p->s++;
    size_t o = 0;
    while (p->s < p->end && *p->s != q) {
        if (o + 1 >= len) return bad_header(p, "a short string");
        out[o++] = *p->s++;
    }
    if (p->s >= p->end) return bad_header(p, "a closing quote");
    p->s++;
    out[o] = '\0';
    return 0;
}

static int parse_bool(struct hparse *p, bool *out)
{
    skip_ws(p);
    size_t n = (size_t)(p->end - p->s);
    if (n >= 4 && memcmp(p->s, "True", 4) == 0) {
        *out = true;
        p->s += 4;
        return 0;
    }
    if (n >= 5 && memcmp(p->s, "False", 5) == 0) {
        *out = false;
        p->s += 5;
        return 0;
    }
    return bad_header(p, "True or False");
}

static int parse_shape(struct hparse *p, int64_t *shape, int *ndim)
{
    int rc = expect_char(p, '(', "a shape tuple '('");
    if (rc < 0) return rc;
    *ndim = 0;
    for (;;) {
        skip_ws(p);
        if (p->s < p->end && *p->s == ')') {
            p->s++;
            return 0;
        }
        if (p->s >= p->end || *p->s < '0' || *p->s > '9')
            return bad_header(p, "a non-negative integer dimension");
        if (*ndim >= PS_NPY_MAX_DIMS)
            return ps_diag_set(p->d, -EINVAL, p->where, "more than %d dimensions",
                               PS_NPY_MAX_DIMS);
        int64_t v = 0;
        while (p->s < p->end && *p->s >= '0' && *p->s <= '9') {
            if (v > (INT64_MAX - 9) / 10) v = INT64_MAX; /* saturate; rejected as absurd */
            else v = v * 10 + (*p->s - '0');
            p->s++;
        }
        if (p->s < p->end && *p->s == 'L') p->s++; /* Python 2 longs */
        shape[(*ndim)++] = v;
        skip_ws(p);
        if (p->s < p->end && *p->s == ',') p->s++;
        else if (p->s < p->end && *p->s == ')') continue;
        else return bad_header(p, "',' or ')' in the shape");
    }
}

static int parse_header(struct hparse *p, char *descr, size_t descr_len, bool *fortran,
                        int64_t *shape, int *ndim)
{
    bool have_descr = false, have_fortran = false, have_shape = false;
    int rc = expect_char(p, '{', "'{'");
    if (rc < 0) return rc;
    for (;;) {
        skip_ws(p);
        if (p->s < p->end && *p->s == '}') {
            p->s++;
            break;
        }
        char key[32];
        if ((rc = parse_string(p, key, sizeof(key))) < 0) return rc;
        if ((rc = expect_char(p, ':', "':'")) < 0) return rc;
        if (strcmp(key, "descr") == 0) {
            rc = parse_string(p, descr, descr_len);
            have_descr = true;
        } else if (strcmp(key, "fortran_order") == 0) {
            rc = parse_bool(p, fortran);
            have_fortran = true;
        } else if (strcmp(key, "shape") == 0) {
            rc = parse_shape(p, shape, ndim);
            have_shape = true;
        } else {
            return ps_diag_set(p->d, -EINVAL, p->where, "bad header: unknown key '%s'", key);
        }
        if (rc < 0) return rc;
        skip_ws(p);
        if (p->s < p->end && *p->s == ',') p->s++;
        else if (p->s < p->end && *p->s == '}') continue;
        else return bad_header(p, "',' or '}'");
    }
    const char *missing = !have_descr ? "descr" : !have_fortran ? "fortran_order"
                          : !have_shape ? "shape" : NULL;
    if (missing) return ps_diag_set(p->d, -EINVAL, p->where, "bad header: no '%s' key", missing);
    return 0;
}

/* ---- reader ------------------------------------------------------------------------------ */

static uint64_t rd_le(const unsigned char *b, size_t n)
{
    uint64_t v = 0;
    for (size_t i = 0; i < n; i++) v |= (uint64_t)b[i] << (8 * i);
    return v;
}

static int convert(const unsigned char *src, const struct dtype *dt, size_t numel,
                   enum ps_npy_kind want, struct ps_npy *out, const char *where,
                   struct ps_diag *d)
{
    size_t esz = want == PS_NPY_F32 ? sizeof(float) : sizeof(int64_t);
    out->u.data = malloc((numel ? numel : 1) * esz);
    if (!out->u.data)
        return ps_diag_set(d, -ENOMEM, where, "out of memory for %zu elements", numel);
    for (size_t i = 0; i < numel; i++) {
        const unsigned char *e = src + i * dt->size;
        uint64_t raw = rd_le(e, dt->size);
        double fv = 0.0;
        int64_t iv = 0;
        bool is_float = dt->kind == 'f';
        if (dt->kind == 'f' && dt->size == 4) {
            uint32_t r32 = (uint32_t)raw;
            float f;
            memcpy(&f, &r32, 4);
            fv = f;
        } else if (dt->kind == 'f') {
            memcpy(&fv, &raw, 8);
        } else if (dt->kind == 'i') {
            unsigned bits = (unsigned)(8 * dt->size);
            if (bits < 64 && (raw >> (bits - 1)) & 1) raw |= ~UINT64_C(0) << bits;
            memcpy(&iv, &raw, 8);
        } else if (dt->kind == 'b') {
            iv = raw != 0;
        } else {
            iv = (int64_t)raw;
        }
        if (want == PS_NPY_F32) {
            out->u.f32[i] = is_float ? (float)fv : (float)iv;
        } else if (is_float) {
            if (!(fv == floor(fv) && fabs(fv) < 9.2e18)) {
                free(out->u.data);
                out->u.data = NULL;
                return ps_diag_set(d, -EINVAL, where,
                                   "element %zu is %g, not an integer (dtype '%s' read as int64)",
                                   i, fv, dt->descr);
            }
            out->u.i64[i] = (int64_t)fv;
        } else {
            out->u.i64[i] = iv;
        }
    }
    return 0;
}

int ps_npy_parse(const void *buf, size_t len, const char *where, enum ps_npy_kind want,
                 struct ps_npy *out, struct ps_diag *d)
{
    const unsigned char *b = buf;
    memset(out, 0, sizeof(*out));
    if (len < sizeof(MAGIC) || memcmp(b, MAGIC, sizeof(MAGIC)) != 0) {
        ps_diag_set(d, -EINVAL, where, "not a .npy file (bad magic: expected \\x93NUMPY)");
        ps_diag_hint(d, "write it with numpy.save");
        return -EINVAL;
    }
    if (len < 8)
        return ps_diag_set(d, -EINVAL, where, "truncated header: expected at least 10 bytes, found %zu",
                           len);
    unsigned major = b[6], minor = b[7];
    if (major < 1 || major > 3 || minor != 0)
        return ps_diag_set(d, -EINVAL, where,
                           "unsupported .npy format version %u.%u (expected 1.0 or 2.0)", major,
                           minor);
    size_t pre = major == 1 ? 10 : 12;
    if (len < pre)
        return ps_diag_set(d, -EINVAL, where, "truncated header: expected at least %zu bytes, found %zu",
                           pre, len);
    size_t hlen = (size_t)rd_le(b + 8, pre - 8);
    if (len - pre < hlen)
        return ps_diag_set(d, -EINVAL, where, "truncated header: expected %zu bytes, found %zu",
                           pre + hlen, len);

    struct hparse p = {(const char *)b + pre, (const char *)b + pre + hlen, where, d};
    char descr[16];
    bool fortran = false;
    int ndim = 0;
    int64_t shape[PS_NPY_MAX_DIMS];
    int rc = parse_header(&p, descr, sizeof(descr), &fortran, shape, &ndim);
    if (rc < 0) return rc;

    const struct dtype *dt = find_dtype(descr);
    if (!dt) {
        if (descr[0] == '>' && find_dtype((char[]){'<', descr[1], descr[2], descr[3], 0})) {
            ps_diag_set(d, -EINVAL, where, "unsupported dtype '%s' (big-endian)", descr);
            ps_diag_hint(d, "save a.astype('<%s') instead", descr + 1);
        } else {
            ps_diag_set(d, -EINVAL, where, "unsupported dtype '%s'", descr);
            ps_diag_hint(d, "use float32, float64, int32, int64, uint8 or bool");
        }
        return -EINVAL;
    }
    if (fortran) {
        ps_diag_set(d, -EINVAL, where, "fortran_order is True; only C order is supported");
        ps_diag_hint(d, "save numpy.ascontiguousarray(a)");
        return -EINVAL;
    }
    char sh[PS_NPY_MAX_DIMS * 24 + 4];
    format_shape(shape, ndim, sh, sizeof(sh));
    int64_t numel = 1;
    for (int i = 0; i < ndim; i++) {
        if (shape[i] > PS_NPY_MAX_NUMEL || (shape[i] != 0 && numel > PS_NPY_MAX_NUMEL / shape[i]))
            return ps_diag_set(d, -EINVAL, where,
                               "absurd shape %s: more than 2^31 elements", sh);
        numel *= shape[i];
    }
    size_t expected = (size_t)numel * dt->size, have = len - pre - hlen;
    if (have < expected)
        return ps_diag_set(d, -EINVAL, where,
                           "truncated data: expected %zu bytes for shape %s of '%s', found %zu",
                           expected, sh, descr, have);
    if (have > expected)
        return ps_diag_set(d, -EINVAL, where,
                           "%zu trailing bytes after the %zu bytes of data for shape %s of '%s'",
                           have - expected, expected, sh, descr);
    rc = convert(b + pre + hlen, dt, (size_t)numel, want, out, where, d);
    if (rc < 0) return rc;
    out->ndim = ndim;
    memcpy(out->shape, shape, sizeof(int64_t) * (size_t)ndim);
    out->numel = (size_t)numel;
    memcpy(out->descr, dt->descr, strlen(dt->descr) + 1);
    out->kind = want;
    return 0;
}

int ps_npy_load(const char *path, enum ps_npy_kind want, struct ps_npy *out, struct ps_diag *d)
{
    memset(out, 0, sizeof(*out));
    /* the file, then its elements converted: at most 3x its size (f32 or i64 from smaller) */
    struct ps_file_opts fo = {.factor = 3.0};
    struct ps_file_in in;
    int rc = ps_file_open(&in, path, &fo, d);
    if (rc) return rc;
    /* the magic first: a device or FIFO that is no .npy file fails before it is read whole */
    rc = ps_file_fill(&in, sizeof(MAGIC), d);
    if (rc == 0 && (in.len < sizeof(MAGIC) || memcmp(in.text, MAGIC, sizeof(MAGIC)) != 0))
        rc = ps_npy_parse(in.text, in.len, path, want, out, d);
    if (rc == 0) rc = ps_file_fill(&in, SIZE_MAX, d);
    if (rc == 0) rc = ps_npy_parse(in.text, in.len, path, want, out, d);
    ps_file_close(&in, false);
    return rc;
}

void ps_npy_finish(struct ps_npy *a)
{
    if (!a) return;
    free(a->u.data);
    memset(a, 0, sizeof(*a));
}

/* ---- writer ------------------------------------------------------------------------------ */

static int save(const char *path, const void *data, size_t esz, const char *descr, int ndim,
                const int64_t *shape, struct ps_diag *d)
{
    if (ndim < 0 || ndim > PS_NPY_MAX_DIMS)
        return ps_diag_set(d, -EINVAL, path, "cannot write %d dimensions (max %d)", ndim,
                           PS_NPY_MAX_DIMS);
    size_t numel = 1;
    for (int i = 0; i < ndim; i++) {
        if (shape[i] < 0) return ps_diag_set(d, -EINVAL, path, "negative dimension %d", i);
        numel *= (size_t)shape[i];
    }
    char sh[PS_NPY_MAX_DIMS * 24 + 4], hdr[512];
    format_shape(shape, ndim, sh, sizeof(sh));
    int n = snprintf(hdr, sizeof(hdr), "{'descr': '%s', 'fortran_order': False, 'shape': %s, }",
                     descr, sh);
    size_t hl = (size_t)n + 1; /* + '\n' */
    size_t total = (10 + hl + 63) / 64 * 64;
    hl = total - 10;
    if (hl >= sizeof(hdr) || hl > 65535)
        return ps_diag_set(d, -EINVAL, path, "header too long");
    memset(hdr + n, ' ', hl - 1 - (size_t)n);
    hdr[hl - 1] = '\n';
    unsigned char pre[10];
    memcpy(pre, MAGIC, 6);
    pre[6] = 1;
    pre[7] = 0;
    pre[8] = (unsigned char)(hl & 0xff);
    pre[9] = (unsigned char)(hl >> 8);

    FILE *f = fopen(path, "wb");
    if (!f) {
        int e = errno;
        return ps_diag_set(d, -e, path, "cannot create: %s", strerror(e));
    }
    bool ok = fwrite(pre, 1, 10, f) == 10 && fwrite(hdr, 1, hl, f) == hl;
    /* Elements are written little-endian whatever the host order is. */
    const unsigned char *src = data;
    for (size_t i = 0; ok && i < numel; i++) {
        uint64_t v = 0;
        memcpy(&v, src + i * esz, esz); /* host order */
        unsigned char le[8];
        if (esz == 4) {
            uint32_t v32;
            memcpy(&v32, src + i * esz, 4);
            v = v32;
        }
        for (size_t k = 0; k < esz; k++) le[k] = (unsigned char)(v >> (8 * k));
        ok = fwrite(le, 1, esz, f) == esz;
    }
    if (fclose(f) != 0) ok = false;
    if (!ok) return ps_diag_set(d, -EIO, path, "write error");
    return 0;
}

int ps_npy_save_f32(const char *path, const float *data, int ndim, const int64_t *shape,
                    struct ps_diag *d)
{
    return save(path, data, sizeof(float), "<f4", ndim, shape, d);
}

int ps_npy_save_i64(const char *path, const int64_t *data, int ndim, const int64_t *shape,
                    struct ps_diag *d)
{
    return save(path, data, sizeof(int64_t), "<i8", ndim, shape, d);
}
