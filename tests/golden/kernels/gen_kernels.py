#!/usr/bin/python3
"""Golden outputs of PyTorch for pipescope's CPU reference kernels (tests/test_kernels.c).

Run with /usr/bin/python3 (the interpreter that has PyTorch 1.13):
    cd tests/golden/kernels && /usr/bin/python3 gen_kernels.py
Deterministic (torch.manual_seed); writes <case>_<tensor>.npy next to this script, float32 except
labels, indices and num_batches_tracked (int64). The outputs are committed so the tests run
without PyTorch; rerun only when a case changes.
"""
import os

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
torch.manual_seed(20240601)
torch.set_num_threads(1)
written = []


def save(name, t):
    a = t.detach().cpu().numpy() if isinstance(t, torch.Tensor) else np.asarray(t)
    if a.dtype == np.float64:
        a = a.astype(np.float32)
    path = os.path.join(HERE, name + ".npy")
    np.save(path, np.ascontiguousarray(a))
    written.append(path)


def leaf(*shape):
    return torch.randn(*shape, requires_grad=True)


# ---- linear ----------------------------------------------------------------------------------
def linear_case(name, n, fin, fout):
    x, w, b = leaf(n, fin), leaf(fout, fin), leaf(fout)
    y = F.linear(x, w, b)
    dy = torch.randn_like(y)
    y.backward(dy)
    for k, v in dict(x=x, w=w, b=b, y=y, dy=dy, dx=x.grad, dw=w.grad, db=b.grad).items():
        save(f"{name}_{k}", v)


linear_case("linear_small", 5, 7, 6)
linear_case("linear_big", 33, 300, 19)  # K > 256 crosses a K block of the sgemm


# ---- conv2d ----------------------------------------------------------------------------------
def conv_case(name, n, cin, h, w, cout, kh, kw, stride, padding, bias):
    x, wt = leaf(n, cin, h, w), leaf(cout, cin, kh, kw)
    b = leaf(cout) if bias else None
    y = F.conv2d(x, wt, b, stride=stride, padding=padding)
    dy = torch.randn_like(y)
    y.backward(dy)
    t = dict(x=x, w=wt, y=y, dy=dy, dx=x.grad, dw=wt.grad)
    if bias:
        t.update(b=b, db=b.grad)
    for k, v in t.items():
        save(f"{name}_{k}", v)
    save(f"{name}_cfg", np.array([stride, padding], dtype=np.int64))


conv_case("conv_s2p1", 2, 3, 9, 9, 4, 3, 3, 2, 1, True)
conv_case("conv_s1p0", 2, 2, 6, 5, 3, 2, 3, 1, 0, False)
conv_case("conv_1x1", 3, 5, 4, 4, 6, 1, 1, 1, 0, True)


# ---- batchnorm -------------------------------------------------------------------------------
def bn_case(name, cls, shapes, momentum):
    c = shapes[0][1]
    bn = cls(c, momentum=momentum, eps=1e-5)
    with torch.no_grad():
        bn.weight.copy_(torch.rand(c) + 0.5)
        bn.bias.copy_(torch.randn(c) * 0.3)
    save(f"{name}_weight", bn.weight)
    save(f"{name}_bias", bn.bias)
    bn.train()
    for t, shape in enumerate(shapes):
        x = (torch.randn(*shape) * (1.0 + t) + 0.5 * t).requires_grad_(True)
        y = bn(x)
        dy = torch.randn_like(y)
        bn.weight.grad = None
        bn.bias.grad = None
        y.backward(dy)
        for k, v in dict(x=x, y=y, dy=dy, dx=x.grad, dweight=bn.weight.grad,
                         dbias=bn.bias.grad, running_mean=bn.running_mean,
                         running_var=bn.running_var).items():
            save(f"{name}_t{t}_{k}", v)
        save(f"{name}_t{t}_nbt", bn.num_batches_tracked.clone())
    bn.eval()
    x = (torch.randn(*shapes[0]) + 0.2).requires_grad_(True)
    y = bn(x)
    dy = torch.randn_like(y)
    bn.weight.grad = None
    bn.bias.grad = None
    y.backward(dy)
    for k, v in dict(x=x, y=y, dy=dy, dx=x.grad, dweight=bn.weight.grad,
                     dbias=bn.bias.grad).items():
        save(f"{name}_eval_{k}", v)


bn_case("bn1d_m01", nn.BatchNorm1d, [(8, 4), (8, 4), (5, 4)], 0.1)
bn_case("bn1d_mnone", nn.BatchNorm1d, [(8, 4), (6, 4), (3, 4)], None)
bn_case("bn2d_m01", nn.BatchNorm2d, [(4, 3, 5, 5), (2, 3, 5, 5), (3, 3, 5, 5)], 0.1)
bn_case("bn2d_mnone", nn.BatchNorm2d, [(4, 3, 5, 5), (2, 3, 5, 5), (3, 3, 5, 5)], None)

# Deferred-BN cross-check: one plain update from the concatenated micro-batches of bn2d_m01 has
# the pooled mean; its running_var carries the UNBIASED pooled variance.
xs = [torch.from_numpy(np.load(os.path.join(HERE, f"bn2d_m01_t{t}_x.npy"))) for t in range(3)]
ref = nn.BatchNorm2d(3, momentum=0.1)
ref.train()
ref(torch.cat(xs))
save("bn2d_concat_running_mean", ref.running_mean)
save("bn2d_concat_running_var", ref.running_var)


# ---- relu ------------------------------------------------------------------------------------
x = leaf(4, 10)
y = F.relu(x)
dy = torch.randn_like(y)
y.backward(dy)
for k, v in dict(x=x, y=y, dy=dy, dx=x.grad).items():
    save(f"relu_{k}", v)


# ---- maxpool2d -------------------------------------------------------------------------------
def pool_case(name, shape, k, s, p):
    x = leaf(*shape)
    y, idx = F.max_pool2d(x, k, stride=s, padding=p, return_indices=True)
    dy = torch.randn_like(y)
    y.backward(dy)
    for key, v in dict(x=x, y=y, idx=idx, dy=dy, dx=x.grad).items():
        save(f"{name}_{key}", v)
    save(f"{name}_cfg", np.array([k, s, p], dtype=np.int64))


pool_case("pool_k2", (2, 3, 6, 6), 2, 2, 0)
pool_case("pool_k3s2p1", (2, 3, 7, 7), 3, 2, 1)


# ---- losses ----------------------------------------------------------------------------------
y = leaf(4, 5)
loss = y.sum()
loss.backward()
save("loss_sum_y", y)
save("loss_sum_loss", loss.reshape(1))
save("loss_sum_dy", y.grad)

y, t = leaf(4, 3), torch.randn(4, 3)
loss = F.mse_loss(y, t)
loss.backward()
for k, v in dict(y=y, t=t, loss=loss.reshape(1), dy=y.grad).items():
    save(f"loss_mse_{k}", v)

z = (torch.randn(6, 5) * 3).requires_grad_(True)
labels = torch.tensor([0, 4, 2, 2, 1, 3], dtype=torch.int64)
loss = F.cross_entropy(z, labels)
loss.backward()
for k, v in dict(z=z, labels=labels, loss=loss.reshape(1), dz=z.grad).items():
    save(f"loss_ce_{k}", v)


# ---- sgd -------------------------------------------------------------------------------------
p = nn.Parameter(torch.randn(10))
p.grad = torch.randn(10)
save("sgd_p", p)
save("sgd_g", p.grad)
torch.optim.SGD([p], lr=0.05).step()
save("sgd_p_new", p)

total = sum(os.path.getsize(f) for f in written)
print(f"wrote {len(written)} files, {total} bytes")
