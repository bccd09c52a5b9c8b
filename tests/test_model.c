/* test_model: shapes, parameters, FLOPs, saved bytes and autograd nodes, worked by hand for
 * small models, and the per-partition sums. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "src/file.h"
#include "src/model.h"
#include "src/spec.h"

struct built {
    struct ps_spec *spec;
    struct ps_model *model;
};

/* layers: the JSON array body; balance: the JSON array body. */
static struct built build(const char *input, const char *layers, const char *balance)
{
    char json[4096], buf[2048];
    snprintf(json, sizeof(json),
             "{\"pipescope\": 1, \"batch\": 8, \"model\": {\"input\": %s, \"layers\": [%s], "
             "\"loss\": \"sum\"}, \"pipeline\": {\"balance\": [%s], \"chunks\": 2}}",
             input, layers, balance);
    struct built b = {NULL, NULL};
    struct ps_diag d;
    ps_diag_clear(&d);
    int rc = ps_spec_parse(json, "m.json", ".", &b.spec, &d);
    if (!rc) rc = ps_model_build(b.spec, &b.model, &d);
    if (rc) print_error("%s\n", ps_diag_format(&d, buf, sizeof(buf)));
    assert_int_equal(rc, 0);
    return b;
}

static void destroy(struct built *b)
{
    ps_model_destroy(b->model);
    ps_spec_destroy(b->spec);
}

/* The formatted error of a model that must not build. */
static void build_fails(const char *input, const char *layers, const char *balance,
                        const char *want)
{
    char json[4096], buf[2048];
    snprintf(json, sizeof(json),
             "{\"pipescope\": 1, \"batch\": 8, \"model\": {\"input\": %s, \"layers\": [%s], "
             "\"loss\": \"sum\"}, \"pipeline\": {\"balance\": [%s], \"chunks\": 2}}",
             input, layers, balance);
    struct ps_spec *s = NULL;
    struct ps_model *m = (struct ps_model *)1;
    struct ps_diag d;
    ps_diag_clear(&d);
    assert_int_equal(ps_spec_parse(json, "spec.json", ".", &s, &d), 0);
    assert_int_equal(ps_model_build(s, &m, &d), -EINVAL);
    assert_null(m);
    assert_string_equal(ps_diag_format(&d, buf, sizeof(buf)), want);
    ps_spec_destroy(s);
}

static void test_linear(void **state)
{
    (void)state;
    struct built b = build("[8]", "{\"op\": \"linear\", \"out\": 16}", "1");
    const struct ps_layer_info *l = &b.model->layers[0];
    assert_int_equal(l->n_out_dims, 1);
    assert_int_equal(l->out[0], 16);
    assert_int_equal(l->in_numel, 8);
    assert_int_equal(l->out_numel, 16);
    assert_int_equal(l->params, 144);
    assert_int_equal(l->buffers, 0);
    assert_true(l->fwd_flops == 2 * 8 * 16 + 16);
    assert_true(l->bwd_flops == 2 * (2 * 8 * 16 + 16));
    assert_true(l->fwd_bytes == 4 * (8 + 16));
    assert_true(l->bwd_bytes == 4 * (16 + 2 * 8));
    assert_true(l->fwd_param_bytes == 4 * 144);
    assert_true(l->bwd_param_bytes == 8 * 144);
    assert_int_equal(l->saved_bytes, 4 * 8);
    assert_int_equal(l->autograd_nodes, 2);
    assert_false(l->in_requires_grad);
    assert_int_equal(b.model->total_params, 144);
    assert_int_equal(b.model->out_numel, 16);
    destroy(&b);

    b = build("[8]", "{\"op\": \"linear\", \"out\": 16, \"bias\": false}", "1");
    l = &b.model->layers[0];
    assert_int_equal(l->params, 128);
    assert_true(l->fwd_flops == 2 * 8 * 16);
    assert_int_equal(l->autograd_nodes, 2); /* TBackward0 + MmBackward0 */
    destroy(&b);
}

static void test_conv_pool_flatten(void **state)
{
    (void)state;
    struct built b = build("[4, 16, 16]",
                           "{\"op\": \"conv2d\", \"out\": 4, \"kernel\": 3, \"padding\": 1},"
                           "{\"op\": \"maxpool2d\", \"kernel\": 2},"
                           "{\"op\": \"flatten\"},"
                           "{\"op\": \"linear\", \"out\": 10}",
                           "2, 2");
    const struct ps_layer_info *c = &b.model->layers[0], *p = &b.model->layers[1],
                               *f = &b.model->layers[2], *l = &b.model->layers[3];
    /* Conv2d(4, 4, 3, padding=1) on 4x16x16 */
    assert_int_equal(c->n_out_dims, 3);
    assert_int_equal(c->out[0], 4);
    assert_int_equal(c->out[1], 16);
    assert_int_equal(c->out[2], 16);
    assert_int_equal(c->params, 148);
    assert_true(c->fwd_flops == 2.0 * 4 * 3 * 3 * 4 * 16 * 16 + 4 * 16 * 16);
    assert_true(c->bwd_flops == 2 * c->fwd_flops);
    assert_int_equal(c->saved_bytes, 4 * 4 * 16 * 16);
    assert_int_equal(c->autograd_nodes, 1);
    /* MaxPool2d(2) -> 4x8x8 */
    assert_int_equal(p->out[1], 8);
    assert_int_equal(p->out[2], 8);
    assert_int_equal(p->out_numel, 256);
    assert_int_equal(p->params, 0);
    assert_true(p->fwd_flops == 2 * 2 * 256);
    assert_int_equal(p->saved_bytes, 4 * 1024 + 8 * 256);
    assert_int_equal(p->autograd_nodes, 1);
    assert_true(p->in_requires_grad);
    /* Flatten -> [256] */
    assert_int_equal(f->n_out_dims, 1);
    assert_int_equal(f->out[0], 256);
    assert_int_equal(f->autograd_nodes, 1);
    assert_true(f->fwd_flops == 0);
    assert_int_equal(f->saved_bytes, 0);
    /* Linear(256, 10) */
    assert_int_equal(l->params, 2570);
    /* partitions */
    const struct ps_partition_info *p0 = &b.model->parts[0], *p1 = &b.model->parts[1];
    assert_int_equal(b.model->n_partitions, 2);
    assert_int_equal(p0->first, 0);
    assert_int_equal(p0->count, 2);
    assert_int_equal(p1->first, 2);
    assert_int_equal(p1->count, 2);
    assert_int_equal(p0->params, 148);
    assert_int_equal(p1->params, 2570);
    assert_int_equal(p0->in_numel, 1024);
    assert_int_equal(p0->out_numel, 256);
    assert_int_equal(p1->in_numel, 256);
    assert_int_equal(p1->out_numel, 10);
    assert_true(p0->fwd_flops == c->fwd_flops + p->fwd_flops);
    assert_true(p0->bwd_flops == c->bwd_flops + p->bwd_flops);
    assert_true(p1->fwd_bytes == f->fwd_bytes + l->fwd_bytes);
    assert_true(p1->fwd_param_bytes == 4 * 2570);
    assert_int_equal(p0->saved_bytes, c->saved_bytes + p->saved_bytes);
    assert_int_equal(p0->autograd_nodes, 2);
    assert_int_equal(p1->autograd_nodes, 3);
    assert_int_equal(b.model->total_params, 148 + 2570);
    destroy(&b);
}

static void test_strides(void **state)
{
    (void)state;
    /* floor((7 + 0 - 3) / 2) + 1 = 3; maxpool k3 s1 p1 keeps 3; floor((3 + 2 - 2)/2)+1 = 2 */
    struct built b = build("[2, 7, 7]",
                           "{\"op\": \"conv2d\", \"out\": 5, \"kernel\": 3, \"stride\": 2},"
                           "{\"op\": \"maxpool2d\", \"kernel\": 3, \"stride\": 1, \"padding\": 1},"
                           "{\"op\": \"maxpool2d\", \"kernel\": 2, \"padding\": 1}",
                           "3");
    assert_int_equal(b.model->layers[0].out[1], 3);
    assert_int_equal(b.model->layers[0].out[2], 3);
    assert_int_equal(b.model->layers[0].params, 5 * 2 * 9 + 5);
    assert_int_equal(b.model->layers[1].out[1], 3);
    assert_int_equal(b.model->layers[2].out[1], 2);
    assert_int_equal(b.model->out_numel, 5 * 2 * 2);
    destroy(&b);
}

static void test_batchnorm(void **state)
{
    (void)state;
    struct built b = build("[4, 5, 5]",
                           "{\"op\": \"batchnorm\"}, {\"op\": \"flatten\"},"
                           "{\"op\": \"batchnorm\", \"affine\": false}",
                           "1, 2");
    const struct ps_layer_info *b2 = &b.model->layers[0], *b1 = &b.model->layers[2];
    assert_int_equal(b2->params, 8);
    assert_int_equal(b2->buffers, 9);
    assert_int_equal(b2->channels, 4);
    assert_true(b2->fwd_flops == 8 * 100);
    assert_int_equal(b2->saved_bytes, 400);
    assert_int_equal(b2->autograd_nodes, 1); /* affine weight requires grad */
    assert_int_equal(b1->params, 0);
    assert_int_equal(b1->buffers, 201);
    assert_int_equal(b1->channels, 100);
    assert_int_equal(b1->autograd_nodes, 1); /* its input requires grad (from layer 0) */
    assert_int_equal(b.model->layers[1].autograd_nodes, 1);
    destroy(&b);

    /* affine=false first: nothing requires grad, no node */
    b = build("[6]", "{\"op\": \"batchnorm\", \"affine\": false}, {\"op\": \"linear\", \"out\": 2}", "2");
    assert_int_equal(b.model->layers[0].autograd_nodes, 0);
    assert_int_equal(b.model->layers[0].saved_bytes, 0);
    assert_int_equal(b.model->layers[0].buffers, 13);
    destroy(&b);
}

static void test_elementwise_and_grad(void **state)
{
    (void)state;
    struct built b = build("[6]",
                           "{\"op\": \"relu\"}, {\"op\": \"dropout\", \"p\": 0.2},"
                           "{\"op\": \"flatten\"}, {\"op\": \"linear\", \"out\": 3},"
                           "{\"op\": \"relu\"}, {\"op\": \"dropout\", \"p\": 0.2},"
                           "{\"op\": \"dropout\", \"p\": 0}, {\"op\": \"flatten\"}",
                           "4, 4");
    const struct ps_layer_info *L = b.model->layers;
    /* before the first parameter nothing requires grad: no nodes, nothing saved */
    assert_int_equal(L[0].autograd_nodes, 0);
    assert_int_equal(L[1].autograd_nodes, 0);
    assert_int_equal(L[2].autograd_nodes, 0);
    assert_int_equal(L[0].saved_bytes, 0);
    assert_true(L[0].fwd_flops == 6);
    assert_int_equal(L[3].autograd_nodes, 2);
    assert_int_equal(L[4].autograd_nodes, 1);
    assert_int_equal(L[4].saved_bytes, 4 * 3); /* relu keeps its output */
    assert_true(L[4].fwd_flops == 3 && L[4].bwd_flops == 3);
    assert_int_equal(L[5].autograd_nodes, 1);
    assert_int_equal(L[5].saved_bytes, 3); /* 1-byte mask */
    assert_int_equal(L[6].autograd_nodes, 0); /* p = 0 returns its input */
    assert_true(L[6].fwd_flops == 0);
    assert_int_equal(L[7].autograd_nodes, 0); /* flatten of a flat input */
    assert_int_equal(L[7].out[0], 3);
    assert_int_equal(b.model->parts[0].autograd_nodes, 2);
    assert_int_equal(b.model->parts[1].autograd_nodes, 2);
    destroy(&b);
}

static void test_errors(void **state)
{
    (void)state;
    build_fails("[16, 8, 8]", "{\"op\": \"relu\"}, {\"op\": \"linear\", \"out\": 4}", "2",
                "spec.json: model.layers[1]: linear needs a flat input but gets [16,8,8] (hint: "
                "add {\"op\": \"flatten\"} before it)");
    build_fails("[8]", "{\"op\": \"conv2d\", \"out\": 4, \"kernel\": 3}", "1",
                "spec.json: model.layers[0]: conv2d needs [C,H,W] input but gets [8]");
    build_fails("[8]", "{\"op\": \"maxpool2d\", \"kernel\": 2}", "1",
                "spec.json: model.layers[0]: maxpool2d needs [C,H,W] input but gets [8]");
    build_fails("[1, 3, 9]", "{\"op\": \"maxpool2d\", \"kernel\": 4, \"padding\": 0}", "1",
                "spec.json: model.layers[0]: maxpool2d kernel 4 does not fit the padded input 3x9 "
                "(output size floor((H + 2*0 - 4) / 4) + 1 would be < 1) (hint: use a kernel of "
                "at most 3 or more padding)");
}

/* Activation memory of tasks (model.c "Activation memory"), worked by hand per sample for
 * [conv2d 1->2 k3 p1, relu, maxpool2d 2] on [1,4,4]. Buffers: b0 the input 16 floats = 64 B,
 * b1 the conv output [2,4,4] = 128 B, b2 the relu output 128 B, b3 the pool output [2,2,2] =
 * 32 B; the pool's int64 indices 8 x 8 = 64 B. What PyTorch keeps: the conv its input (b0), the
 * relu its result (b2), the pool its input (b2 again: one tensor) and indices: 256 B.
 * One partition (the last: its output b3 lives until the loss at the end of F):
 *   F plain: +b1 128, b0 kept 192, +b2 320 (high-water), b1 freed 192, +b3 +idx 288, loss 256.
 *   F checkpointed (no indices, only b0 kept): +b1 128, b0 kept 192, +b2 320, b1 freed 192,
 *     +b3 224, b2 freed 96, loss 64: net 64.
 *   R from b0: +b1 128, +b2 256 (high-water), b1 freed 128, the pool is not skipped (indices):
 *     scratch b3 + idx 224, scratch freed 192: net 192 (b2 + idx).
 * Split [conv, relu | maxpool]: the relu is last in partition 0, so its input b1 stands for its
 * output (which leaves for device 1): partition 0 keeps b0 + b1 = 192 and sends out b2 (128);
 * partition 1 receives b2 (in 128), keeps it for the pool with the indices: +b3 +idx 96, loss 64. */
static void test_task_memory(void **state)
{
    (void)state;
    const char *layers = "{\"op\": \"conv2d\", \"out\": 2, \"kernel\": 3, \"padding\": 1},"
                         "{\"op\": \"relu\"}, {\"op\": \"maxpool2d\", \"kernel\": 2}";
    struct built b = build("[1, 4, 4]", layers, "3");
    const struct ps_partition_info *p = &b.model->parts[0];
    assert_int_equal(p->in_bytes, 0);
    assert_int_equal(p->out_bytes, 0);
    assert_int_equal(p->fwd.net, 256);
    assert_int_equal(p->fwd.peak, 320);
    assert_int_equal(p->fwd_ckpt.net, 64);
    assert_int_equal(p->fwd_ckpt.peak, 320);
    assert_int_equal(p->rec.net, 192);
    assert_int_equal(p->rec.peak, 256);
    /* per layer, what PyTorch saves (not deduplicated) and the lower bound per layer */
    assert_int_equal(b.model->layers[2].saved_bytes, 128 + 64);
    assert_int_equal(ps_layer_kept_bytes(b.spec, b.model, 0), 64);
    assert_int_equal(ps_layer_kept_bytes(b.spec, b.model, 1), 0);
    assert_int_equal(ps_layer_kept_bytes(b.spec, b.model, 2), 128 + 64);
    destroy(&b);

    b = build("[1, 4, 4]", layers, "2, 1");
    p = &b.model->parts[0];
    assert_int_equal(p->in_bytes, 0);
    assert_int_equal(p->out_bytes, 128);
    assert_int_equal(p->fwd.net, 192);
    assert_int_equal(p->fwd.peak, 192);
    assert_true(ps_model_keeps_buffer(b.spec, b.model, 0, 2, 1)); /* the last relu's input */
    p = &b.model->parts[1];
    assert_int_equal(p->in_bytes, 128);
    assert_int_equal(p->out_bytes, 0);
    assert_int_equal(p->fwd.net, 64);
    assert_int_equal(p->fwd.peak, 96);
    destroy(&b);
}

/* The model's kept bytes per partition (in_bytes + fwd.net, per sample) equal what PyTorch 1.13's
 * autograd saves, distinct storages only, for partitions run as torchgpipe runs them
 * (tests/golden/memory/gen_saved.py wrote saved.json: conv/bn/relu/pool/flatten/linear and MLP
 * cases, several balances each, micro-batches of 3). */
static void test_saved_by_pytorch(void **state)
{
    (void)state;
    const char *root = getenv("PS_SOURCE_ROOT");
    char path[4096], buf[2048];
    snprintf(path, sizeof(path), "%s/tests/golden/memory/saved.json", root ? root : ".");
    char *text = NULL;
    size_t len = 0;
    struct ps_diag d;
    ps_diag_clear(&d);
    if (ps_file_read(path, NULL, &text, &len, &d))
        fail_msg("%s", ps_diag_format(&d, buf, sizeof(buf)));
    cJSON *root_js = cJSON_Parse(text);
    assert_non_null(root_js);
    int mb = cJSON_GetObjectItem(root_js, "micro_batch")->valueint;
    const cJSON *c;
    int n = 0;
    cJSON_ArrayForEach(c, cJSON_GetObjectItem(root_js, "cases"))
    {
        char *in = cJSON_PrintUnformatted(cJSON_GetObjectItem(c, "input"));
        char *ly = cJSON_PrintUnformatted(cJSON_GetObjectItem(c, "layers"));
        char *bal = cJSON_PrintUnformatted(cJSON_GetObjectItem(c, "balance"));
        assert_true(in && ly && bal && strlen(ly) > 2 && strlen(bal) > 2);
        ly[strlen(ly) - 1] = 0; /* build() takes the arrays' bodies */
        bal[strlen(bal) - 1] = 0;
        struct built b = build(in, ly + 1, bal + 1);
        const cJSON *want = cJSON_GetObjectItem(c, "saved_bytes");
        assert_int_equal(cJSON_GetArraySize(want), b.model->n_partitions);
        for (int j = 0; j < b.model->n_partitions; j++) {
            const struct ps_partition_info *p = &b.model->parts[j];
            int64_t got = (p->in_bytes + p->fwd.net) * mb;
            int64_t w = (int64_t)cJSON_GetArrayItem(want, j)->valuedouble;
            if (got != w)
                fail_msg("%s balance [%s], partition %d: model keeps %lld bytes, PyTorch saves "
                         "%lld",
                         cJSON_GetObjectItem(c, "name")->valuestring, bal + 1, j, (long long)got,
                         (long long)w);
        }
        destroy(&b);
        free(in);
        free(ly);
        free(bal);
        n++;
    }
    assert_true(n >= 10);
    cJSON_Delete(root_js);
    free(text);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_linear),    cmocka_unit_test(test_conv_pool_flatten),
        cmocka_unit_test(test_strides),   cmocka_unit_test(test_batchnorm),
        cmocka_unit_test(test_elementwise_and_grad), cmocka_unit_test(test_errors),
        cmocka_unit_test(test_task_memory),     cmocka_unit_test(test_saved_by_pytorch),
    };
    return cmocka_run_group_tests_name("model", tests, NULL, NULL);
}
