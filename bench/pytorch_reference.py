#!/usr/bin/python3
"""An independent PyTorch reference of Foundry's models: the standard MoE ("arch": "moe") and
ZAYA1 ("arch": "zaya1"; its bench keeps the balancing biases at their initial values).

Plain eager PyTorch, written from the architecture description (src/model/model.h,
docs/formats.md), not from Foundry's kernels. Two uses:

  * performance baseline:  bench  --config configs/moe-bench.json --steps 12
    on a GPU (the peer of `foundry train --device cuda`):
                           bench  --config configs/gpu-moe-bench.json --device cuda --compile
    (bf16 autocast, causal scaled_dot_product_attention, fused AdamW, torch.compile of the
    model; the experts a loop, as in the CPU model)
  * numerical cross-check: check  --config CFG --checkpoint DIR --tokens FILE
    (loss, CE, aux loss and per-tensor gradient norms of a Foundry checkpoint on one batch;
    optionally compared element-wise with the gradient Foundry stored in the optimizer state)

Helpers that write a token file ({"inputs": [[...]], "targets": [[...]]}) for `check`:
  tokens --config CFG --synthetic-step N      Foundry's --synthetic-data batch of step N
  tokens --config CFG --val-data DIR          the first eval batch of a prepared dataset

Run with Debian's interpreter (python3-torch installs for it): /usr/bin/python3.

The model (names are the checkpoint's, Hugging Face Mixtral / Llama):
  x = embed[inputs]                                       embed: [padded_vocab, C], tied
  per layer:
    x += o_proj(attn(rope(q_proj(n1)), rope(k_proj(n1)), v_proj(n1)))   n1 = rms(x)
    x += sum_{j in topk} w_j * expert_j(n2)                               n2 = rms(x)
         router: probs = softmax(n2 @ gate^T) in fp32, top-k, renormalized if norm_topk_prob
         expert: w2(silu(w1 x) * w3 x)    (dense when n_experts == 1: mlp.gate/up/down_proj)
  logits = rms(x) @ embed^T, padded ids masked to -inf
  loss = mean CE + aux_loss_coef * mean over layers of E * sum_e f_e * P_e
         (f_e = share of the N*K assignments routed to e, detached; P_e = mean router prob)
"""

import argparse
import contextlib
import json
import math
import os
import platform
import statistics
import struct
import sys
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

# ----------------------------------------------------------------------------------------
# Run config: the same JSON Foundry reads, with the same defaults
# (src/model/config.h, src/train/run_config.h).

MODEL_DEFAULTS = dict(
    arch="moe", vocab_size=8192, d_model=512, n_layers=4, n_heads=8, n_kv_heads=8,
    head_dim=64, n_experts=8, top_k=2, ffn_dim=1024, norm_topk_prob=True, aux_loss_coef=0.01,
    rope_theta=10000.0, rms_norm_eps=1e-5, max_seq_len=256, init_std=0.02, tie_embeddings=True,
    rope_fraction=1.0, qk_norm="none",
    # arch zaya1 only
    cca_kernel_depthwise=2, cca_kernel_grouped=2, qk_temperature_init=1.0,
    router_latent_dim=256, router_eda=True, router_skip_class=True, skip_passes_input=False,
    router_init_std=0.0, balance_rule="newton", balance_bias_on="logits", balance_bias_lr=0.0,
    skip_bias_init=-1.0)
# What arch zaya1 changes of them (src/model/config.cpp).
ZAYA1_DEFAULTS = dict(top_k=1, norm_topk_prob=False, aux_loss_coef=0.0, rope_fraction=0.5)
TRAIN_DEFAULTS = dict(
    steps=1000, batch_size=8, seq_len=256, lr=3e-4, min_lr_ratio=0.1, warmup_steps=100,
    schedule="cosine", decay_fraction=0.2, weight_decay=0.1, beta1=0.9, beta2=0.95, eps=1e-8,
    grad_clip=1.0, precision="bf16", seed=1234, log_every=10, eval_every=100, eval_batches=8,
    checkpoint_every=500, keep_checkpoints=3, peak_gflops=0, run_dir="runs/default")


class Cfg(dict):
    __getattr__ = dict.__getitem__


def load_run_config(path, overrides=()):
    with open(path) as f:
        root = json.load(f)
    for o in overrides:  # "section.key=value", value parsed as JSON when it parses
        key, _, value = o.partition("=")
        section, _, name = key.partition(".")
        try:
            value = json.loads(value)
        except json.JSONDecodeError:
            pass
        root.setdefault(section, {})[name] = value
    model, train = dict(MODEL_DEFAULTS), dict(TRAIN_DEFAULTS)
    if root.get("model", {}).get("arch") == "zaya1":
        model.update(ZAYA1_DEFAULTS)
    for k, v in root.get("model", {}).items():
        if k not in model:
            sys.exit(f"error: {path}: unknown key model.{k}")
        model[k] = v
    # Train keys this reference does not model (the optimizer, checkpointing, devices) change
    # neither the loss nor the gradients it compares: kept, not refused.
    train.update(root.get("train", {}))
    m = Cfg(model)
    if m.arch not in ("moe", "zaya1") or not m.tie_embeddings:
        sys.exit("error: Foundry has arch 'moe' and 'zaya1', with tied embeddings")
    if m.arch == "moe" and (m.qk_norm != "none" or m.rope_fraction != 1.0):
        sys.exit("error: this reference's standard MoE has no qk_norm and full RoPE")
    assert m.n_heads % m.n_kv_heads == 0 and m.head_dim % 2 == 0 and m.top_k <= m.n_experts
    m["padded_vocab"] = (m.vocab_size + 127) // 128 * 128
    return m, Cfg(train), root.get("data", {})


# ----------------------------------------------------------------------------------------
# The model. Module attribute names spell out the checkpoint's tensor names, so
# named_parameters() yields exactly "model.layers.0.self_attn.q_proj.weight" etc.

class RMSNorm(nn.Module):
    def __init__(self, dim, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x):
        rstd = torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return x * rstd * self.weight


def rope_tables(seq, dims, theta, dtype):
    # HF Llama: inv_freq_i = theta^(-2i/dims) over the rotated dims (all of a head, or ZAYA1's
    # first rope_fraction of it: HF's partial_rotary_factor), cos/sin duplicated over both
    # halves. Angles in float64 (as Foundry computes them) then rounded to the working dtype.
    inv_freq = theta ** (-torch.arange(0, dims, 2, dtype=torch.float64) / dims)
    angles = torch.arange(seq, dtype=torch.float64)[:, None] * inv_freq[None, :]
    emb = torch.cat([angles, angles], dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def rotate_half(x):
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat([-x2, x1], dim=-1)


def apply_rope(x, cos, sin):  # x [B, H, T, D]; cos, sin [T, dims]: the first dims rotate
    dims = cos.shape[-1]
    if dims == x.shape[-1]:
        return x * cos + rotate_half(x) * sin
    rotated, rest = x[..., :dims], x[..., dims:]
    return torch.cat([rotated * cos + rotate_half(rotated) * sin, rest], dim=-1)


def causal_attention(q, k, v, causal_mask):
    """softmax(q kᵀ / √d, causal) v for q [B, H, T, d] and k, v [B, Hk, T, d] (query head h
    reads KV head h // (H / Hk)); [B, T, H·d]. causal_mask None: the fused kernel (GPU runs),
    the same causal softmax."""
    B, H, T, d = q.shape
    group = H // k.shape[1]
    if group > 1:
        k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    if causal_mask is None:
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    else:
        scores = (q @ k.transpose(-1, -2)) * (1.0 / math.sqrt(d))
        out = torch.softmax(scores.masked_fill(causal_mask, float("-inf")), dim=-1) @ v
    return out.transpose(1, 2).reshape(B, T, H * d)


def tied_logits(x, embed, c):
    """The tied output projection, x [B, T, C] -> [B, T, Vp], padded ids masked to -inf."""
    logits = x @ embed.t()
    if c.padded_vocab > c.vocab_size:
        pad = torch.arange(c.padded_vocab, device=logits.device) >= c.vocab_size
        logits = logits.masked_fill(pad, float("-inf"))
    return logits


def mean_cross_entropy(logits, targets, c):  # in fp32 at least
    work = torch.promote_types(logits.dtype, torch.float32)
    return F.cross_entropy(logits.reshape(-1, c.padded_vocab).to(work), targets.reshape(-1))


class Attention(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.c = c
        self.q_proj = nn.Linear(c.d_model, c.n_heads * c.head_dim, bias=False)
        self.k_proj = nn.Linear(c.d_model, c.n_kv_heads * c.head_dim, bias=False)
        self.v_proj = nn.Linear(c.d_model, c.n_kv_heads * c.head_dim, bias=False)
        self.o_proj = nn.Linear(c.n_heads * c.head_dim, c.d_model, bias=False)

    def forward(self, x, cos, sin, causal_mask):
        c = self.c
        B, T, _ = x.shape
        q = self.q_proj(x).view(B, T, c.n_heads, c.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(B, T, c.n_kv_heads, c.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(B, T, c.n_kv_heads, c.head_dim).transpose(1, 2)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        return self.o_proj(causal_attention(q, k, v, causal_mask))


class Expert(nn.Module):  # Mixtral naming: w1 gate, w3 up, w2 down
    def __init__(self, c):
        super().__init__()
        self.w1 = nn.Linear(c.d_model, c.ffn_dim, bias=False)
        self.w3 = nn.Linear(c.d_model, c.ffn_dim, bias=False)
        self.w2 = nn.Linear(c.ffn_dim, c.d_model, bias=False)

    def forward(self, x):
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class DenseMLP(nn.Module):  # SwiGLU, Llama naming: the FFN when n_experts == 1; ZAYA1's experts
    def __init__(self, c):
        super().__init__()
        self.gate_proj = nn.Linear(c.d_model, c.ffn_dim, bias=False)
        self.up_proj = nn.Linear(c.d_model, c.ffn_dim, bias=False)
        self.down_proj = nn.Linear(c.ffn_dim, c.d_model, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class SparseMoE(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.c = c
        self.gate = nn.Linear(c.d_model, c.n_experts, bias=False)  # the router
        self.experts = nn.ModuleList(Expert(c) for _ in range(c.n_experts))

    def forward(self, x):
        """Returns (output [B, T, C], aux loss of this layer, tokens per expert)."""
        c = self.c
        B, T, C = x.shape
        E, K = c.n_experts, c.top_k
        flat = x.reshape(-1, C)
        N = flat.shape[0]
        work = torch.promote_types(flat.dtype, torch.float32)  # fp32 (fp64 in check --dtype fp64)
        probs = torch.softmax(self.gate(flat).to(work), dim=-1)  # [N, E]
        topk_w, topk_idx = torch.topk(probs, K, dim=-1)          # [N, K]
        if c.norm_topk_prob:
            topk_w = topk_w / topk_w.sum(dim=-1, keepdim=True)
        topk_w = topk_w.to(x.dtype)
        # Switch-style load balancing: f_e (fraction of assignments, no gradient) times P_e.
        counts = torch.bincount(topk_idx.reshape(-1), minlength=E)
        f = (counts.to(probs.dtype) / (N * K)).detach()
        aux = E * (f * probs.mean(dim=0)).sum()

        out = torch.zeros_like(flat)
        for e in range(E):
            token, slot = torch.where(topk_idx == e)
            if token.numel() == 0:
                continue
            y = self.experts[e](flat[token]) * topk_w[token, slot, None]
            out = out.index_add(0, token, y)
        return out.view(B, T, C), aux, counts


class DecoderLayer(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.input_layernorm = RMSNorm(c.d_model, c.rms_norm_eps)
        self.self_attn = Attention(c)
        self.post_attention_layernorm = RMSNorm(c.d_model, c.rms_norm_eps)
        if c.n_experts == 1:
            self.mlp = DenseMLP(c)
        else:
            self.block_sparse_moe = SparseMoE(c)

    def forward(self, x, cos, sin, mask):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, mask)
        h = self.post_attention_layernorm(x)
        if hasattr(self, "mlp"):
            return x + self.mlp(h), None, None
        y, aux, counts = self.block_sparse_moe(h)
        return x + y, aux, counts


class Backbone(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.embed_tokens = nn.Embedding(c.padded_vocab, c.d_model)
        self.layers = nn.ModuleList(DecoderLayer(c) for _ in range(c.n_layers))
        self.norm = RMSNorm(c.d_model, c.rms_norm_eps)


class FoundryMoE(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.c = c
        self.model = Backbone(c)
        self._rope = {}

    def init_weights(self, generator=None):
        """Foundry's scheme (its RNG stream differs): N(0, init_std), output projections
        N(0, init_std / sqrt(2 * n_layers)), norms 1, padded vocabulary rows 0."""
        c = self.c
        std_out = c.init_std / math.sqrt(2 * c.n_layers)
        with torch.no_grad():
            for name, p in self.named_parameters():
                if name.endswith("norm.weight"):
                    p.fill_(1.0)
                    continue
                out_proj = name.endswith(("o_proj.weight", "w2.weight", "down_proj.weight"))
                p.normal_(0.0, std_out if out_proj else c.init_std, generator=generator)
            self.model.embed_tokens.weight[c.vocab_size:].zero_()

    def rope(self, T, dtype, device):
        key = (T, dtype, str(device))
        if key not in self._rope:
            cos, sin = rope_tables(T, self.c.head_dim, self.c.rope_theta, dtype)
            self._rope[key] = cos.to(device), sin.to(device)
        return self._rope[key]

    def forward(self, inputs, targets=None):
        """inputs, targets [B, T] int64. Returns dict(logits, loss, ce_loss, aux_loss)."""
        c = self.c
        B, T = inputs.shape
        x = self.model.embed_tokens(inputs)
        gpu = x.is_cuda
        cos, sin = self.rope(T, x.dtype, x.device)
        # True above the diagonal: the future (on a GPU the fused attention masks instead).
        mask = None if gpu else torch.ones(T, T, dtype=torch.bool).triu(1)
        aux_losses, expert_counts = [], []
        for layer in self.model.layers:
            x, aux, counts = layer(x, cos, sin, mask)
            if aux is not None:
                aux_losses.append(aux)
                if not gpu:  # a host copy each layer would stall a GPU step
                    expert_counts.append(counts.tolist())
        logits = tied_logits(self.model.norm(x), self.model.embed_tokens.weight, c)
        out = {"logits": logits, "expert_counts": expert_counts}  # assignments per expert
        if targets is not None:
            ce = mean_cross_entropy(logits, targets, c)
            aux = torch.stack(aux_losses).mean() if aux_losses else torch.zeros((), dtype=ce.dtype)
            out.update(ce_loss=ce, aux_loss=aux, loss=ce + c.aux_loss_coef * aux)
        return out


# ----------------------------------------------------------------------------------------
# ZAYA1 (docs/zaya1.md): CCA attention, the ZAYA1 router with EDA, the skip class and the
# balancing bias, residual scaling. Tensor names as docs/formats.md's ZAYA1 checkpoints.
#
#   res = (embed(tokens) + beta_in) * alpha_in
#   per layer:
#     h = CCA(RMSNorm(res));                 res = (res + b_r) * a_r + (h + b_h) * a_h
#     h = MoE(RMSNorm(res), router state);   res = (res + b_r) * a_r + (h + b_h) * a_h
#   logits = RMSNorm(res) @ embed^T   (padded vocabulary masked to -inf)
# CCA (x normalized): q0 = x Wq^T, k0 = x Wk^T, c = [q0 || k0]; mq[h] = (q0[h] + k0[h // g]) / 2,
#   mk[j] = mean of mq over group j; c padded with (t0-1)+(t1-1) zero rows before each
#   sequence, then the depthwise conv (bias b0) and the grouped conv (bias b1, Hq+Hk groups),
#   both unpadded; q = conv_q + mq, k = conv_k + mk; q, k scaled to norm sqrt(d)
#   (|x| = sqrt(sum x^2 + 1e-6)), k times its KV head's temperature; RoPE on the first
#   rope_fraction of each head; v = [x_t Wv1^T || x_{t-1} Wv2^T] as Hk heads of d; causal
#   softmax attention (scale 1/sqrt(d), query head h reads KV head h // g); o_proj.
# MoE (x normalized): r = x Wdown^T + b, r += gamma * r_prev (EDA; no gamma in the first MoE
#   sublayer); z = out(gelu(fc2(gelu(fc1(RMSNorm_R(r)))))) over E experts (+ the skip class),
#   p = softmax(z) in fp32; choice = top-k of z + bias (p + bias with balance_bias_on "probs");
#   y = sum over the chosen experts of p[e] * SwiGLU_e(x); the skip class adds 0 (p_skip * x
#   with skip_passes_input).

class ResidualScale(nn.Module):
    """res' = (res + residual_bias) * residual_scale + (h + hidden_states_bias) * hidden_states_scale"""

    def __init__(self, c):
        super().__init__()
        self.residual_scale = nn.Parameter(torch.ones(c))
        self.residual_bias = nn.Parameter(torch.zeros(c))
        self.hidden_states_scale = nn.Parameter(torch.ones(c))
        self.hidden_states_bias = nn.Parameter(torch.zeros(c))

    def forward(self, res, h):
        return ((res + self.residual_bias) * self.residual_scale
                + (h + self.hidden_states_bias) * self.hidden_states_scale)


def rotary_dims(c):
    return int(c.rope_fraction * c.head_dim + 0.5)


def scale_to_sqrt_d(x, d):  # over the last dim: x * sqrt(d) / sqrt(sum x^2 + 1e-6)
    return x * (math.sqrt(d) / torch.sqrt(x.pow(2).sum(-1, keepdim=True) + 1e-6))


class QkvProj(nn.Module):  # self_attn.qkv_proj.*
    def __init__(self, c):
        super().__init__()
        C, Hq, Hk, d = c.d_model, c.n_heads, c.n_kv_heads, c.head_dim
        packed = (Hq + Hk) * d
        self.q_proj = nn.Linear(C, Hq * d, bias=False)
        self.k_proj = nn.Linear(C, Hk * d, bias=False)
        self.v_proj_current = nn.Linear(C, Hk * d // 2, bias=False)
        self.v_proj_delayed = nn.Linear(C, Hk * d // 2, bias=False)
        # PyTorch Conv1d layouts: depthwise [packed, 1, t0], grouped [packed, d, t1]
        self.conv_qk_depthwise = nn.Conv1d(packed, packed, c.cca_kernel_depthwise,
                                           groups=packed, bias=True)
        self.conv_qk_grouped = nn.Conv1d(packed, packed, c.cca_kernel_grouped, groups=Hq + Hk,
                                         bias=True)


class QkNorm(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.temp = nn.Parameter(torch.full((c.n_kv_heads,), float(c.qk_temperature_init)))


class Cca(nn.Module):  # self_attn.*
    def __init__(self, c):
        super().__init__()
        self.c = c
        self.qkv_proj = QkvProj(c)
        self.qk_norm = QkNorm(c)
        self.o_proj = nn.Linear(c.n_heads * c.head_dim, c.d_model, bias=False)

    def forward(self, x, cos, sin, causal_mask):
        c, p = self.c, self.qkv_proj
        B, T, _ = x.shape
        Hq, Hk, d = c.n_heads, c.n_kv_heads, c.head_dim
        g = Hq // Hk
        t0, t1 = c.cca_kernel_depthwise, c.cca_kernel_grouped
        q0, k0 = p.q_proj(x), p.k_proj(x)
        mq = (q0.view(B, T, Hq, d) + k0.view(B, T, Hk, d).repeat_interleave(g, dim=2)) / 2
        mk = mq.view(B, T, Hk, g, d).mean(dim=3)
        # The two causal convolutions, padded as one pair.
        packed = F.pad(torch.cat([q0, k0], dim=-1).transpose(1, 2), ((t0 - 1) + (t1 - 1), 0))
        packed = F.conv1d(packed, p.conv_qk_depthwise.weight, p.conv_qk_depthwise.bias,
                          groups=packed.shape[1])
        packed = F.conv1d(packed, p.conv_qk_grouped.weight, p.conv_qk_grouped.bias,
                          groups=Hq + Hk).transpose(1, 2)
        q = scale_to_sqrt_d(packed[..., :Hq * d].reshape(B, T, Hq, d) + mq, d)
        k = scale_to_sqrt_d(packed[..., Hq * d:].reshape(B, T, Hk, d) + mk, d) \
            * self.qk_norm.temp.view(1, 1, Hk, 1)
        q = apply_rope(q.transpose(1, 2), cos, sin)  # the first rotary_dims(c) of each head
        k = apply_rope(k.transpose(1, 2), cos, sin)
        delayed = p.v_proj_delayed(x)
        delayed = torch.cat([torch.zeros_like(delayed[:, :1]), delayed[:, :-1]], dim=1)
        v = torch.cat([p.v_proj_current(x), delayed], dim=-1).view(B, T, Hk, d).transpose(1, 2)
        return self.o_proj(causal_attention(q, k, v, causal_mask))


class RouterMlp(nn.Module):
    def __init__(self, c, classes):
        super().__init__()
        R = c.router_latent_dim
        self.norm = RMSNorm(R, c.rms_norm_eps)
        self.fc1 = nn.Linear(R, R, bias=True)
        self.fc2 = nn.Linear(R, R, bias=True)
        self.out_proj = nn.Linear(R, classes, bias=False)


class ZayaRouter(nn.Module):  # mlp.gate.*
    def __init__(self, c, classes, eda):
        super().__init__()
        self.down_proj = nn.Linear(c.d_model, c.router_latent_dim, bias=True)
        if eda:
            self.router_states_scale = nn.Parameter(torch.ones(c.router_latent_dim))  # gamma
        self.router_mlp = RouterMlp(c, classes)

    def forward(self, x, r_prev):
        r = self.down_proj(x)
        if hasattr(self, "router_states_scale") and r_prev is not None:
            r = r + self.router_states_scale * r_prev
        mlp = self.router_mlp
        h = F.gelu(mlp.fc2(F.gelu(mlp.fc1(mlp.norm(r)))))  # exact (erf) GELU
        work = torch.promote_types(h.dtype, torch.float32)
        return F.linear(h.to(work), mlp.out_proj.weight.to(work)), r


class ZayaMoe(nn.Module):  # mlp.*
    def __init__(self, c, layer):
        super().__init__()
        self.c = c
        self.classes = c.n_experts + (1 if c.router_skip_class else 0)
        self.gate = ZayaRouter(c, self.classes, eda=c.router_eda and layer >= 1)
        self.experts = nn.ModuleList(DenseMLP(c) for _ in range(c.n_experts))
        # The balancing bias (no gradient), fp32 as Foundry keeps it: its initial values
        # until set_balancing_biases.
        bias = torch.zeros(self.classes, dtype=torch.float32)
        if c.router_skip_class:
            bias[-1] = c.skip_bias_init
        self.register_buffer("balancing_biases", bias, persistent=False)

    def forward(self, x, r_prev):
        c = self.c
        B, T, C = x.shape
        flat = x.reshape(-1, C)
        z, r = self.gate(flat, r_prev)
        p = torch.softmax(z, dim=-1)
        score = z if c.balance_bias_on == "logits" else p
        _, chosen = torch.topk(score + self.balancing_biases.to(score.dtype), c.top_k, dim=-1)
        gates = torch.gather(p, 1, chosen).to(x.dtype)  # unbiased, not renormalized
        counts = torch.bincount(chosen.reshape(-1), minlength=self.classes)
        out = torch.zeros_like(flat)
        passing = [(self.experts[e], e) for e in range(c.n_experts)]
        if c.router_skip_class and c.skip_passes_input:
            passing.append((lambda rows: rows, c.n_experts))
        for run, e in passing:
            token, slot = torch.where(chosen == e)
            if token.numel():
                out = out.index_add(0, token, run(flat[token]) * gates[token, slot, None])
        return out.view(B, T, C), r, counts


class ZayaLayer(nn.Module):
    def __init__(self, c, layer):
        super().__init__()
        self.input_layernorm = RMSNorm(c.d_model, c.rms_norm_eps)
        self.self_attn = Cca(c)
        self.post_attention_residual_scale = ResidualScale(c.d_model)
        self.post_attention_layernorm = RMSNorm(c.d_model, c.rms_norm_eps)
        self.mlp = ZayaMoe(c, layer)
        self.post_mlp_residual_scale = ResidualScale(c.d_model)


class ZayaBackbone(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.embed_tokens = nn.Embedding(c.padded_vocab, c.d_model)
        self.input_hidden_states_scale = nn.Parameter(torch.ones(c.d_model))
        self.input_hidden_states_bias = nn.Parameter(torch.zeros(c.d_model))
        self.layers = nn.ModuleList(ZayaLayer(c, i) for i in range(c.n_layers))
        self.norm = RMSNorm(c.d_model, c.rms_norm_eps)


class FoundryZaya1(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.c = c
        self.model = ZayaBackbone(c)

    def init_weights(self, generator=None):
        """Foundry's scheme (docs/zaya1.md; its RNG stream differs): projections and the
        embedding N(0, init_std), the projections into the residual stream (o_proj, the
        experts' down_proj) N(0, init_std / sqrt(2 * n_layers)), the convolutions
        N(0, 1 / sqrt(3 * fan_in)), the router MLP's weights N(0, router_init_std or 1 / sqrt(R)),
        biases 0, scales, EDA gammas and norms 1, key temperatures qk_temperature_init."""
        c = self.c
        std_out = c.init_std / math.sqrt(2 * c.n_layers)
        std_router = c.router_init_std or 1.0 / math.sqrt(c.router_latent_dim)
        with torch.no_grad():
            for name, p in self.named_parameters():
                if name.endswith("qk_norm.temp"):
                    p.fill_(c.qk_temperature_init)
                elif name.endswith(("norm.weight", "_scale")):
                    p.fill_(1.0)
                elif name.endswith(("bias", "_bias")):
                    p.zero_()
                elif "conv_qk" in name:  # [out, in per group, taps]: fan_in = in · taps
                    p.normal_(0.0, 1.0 / math.sqrt(3 * p.shape[1] * p.shape[2]),
                              generator=generator)
                elif "router_mlp" in name:
                    p.normal_(0.0, std_router, generator=generator)
                else:
                    out_proj = name.endswith("o_proj.weight") or (
                        "experts." in name and name.endswith("down_proj.weight"))
                    p.normal_(0.0, std_out if out_proj else c.init_std, generator=generator)
            self.model.embed_tokens.weight[c.vocab_size:].zero_()

    def set_balancing_biases(self, biases):
        """One vector of router classes per MoE sublayer, in layer order."""
        layers = self.model.layers
        if len(biases) != len(layers):
            sys.exit(f"error: {len(biases)} balancing-bias vectors for {len(layers)} MoE sublayers")
        for layer, b in zip(layers, biases):
            t = torch.as_tensor(np.asarray(b, dtype=np.float32))
            if t.shape != layer.mlp.balancing_biases.shape:
                sys.exit(f"error: a balancing bias of shape {tuple(t.shape)}, expected "
                         f"{tuple(layer.mlp.balancing_biases.shape)}")
            layer.mlp.balancing_biases.copy_(t)

    def forward(self, inputs, targets=None):
        """inputs, targets [B, T] int64. Returns dict(logits, loss, ce_loss, aux_loss = 0,
        expert_counts: per layer, the choices per router class, the skip class last)."""
        m, c = self.model, self.c
        B, T = inputs.shape
        dtype, device = m.embed_tokens.weight.dtype, inputs.device
        cos, sin = (t.to(device) for t in rope_tables(T, rotary_dims(c), c.rope_theta, dtype))
        # True above the diagonal: the future (on a GPU the fused attention masks instead).
        mask = None if inputs.is_cuda else torch.ones(T, T, dtype=torch.bool).triu(1)
        res = (m.embed_tokens(inputs) + m.input_hidden_states_bias) * m.input_hidden_states_scale
        r_prev, expert_counts = None, []
        for layer in m.layers:
            h = layer.self_attn(layer.input_layernorm(res), cos, sin, mask)
            res = layer.post_attention_residual_scale(res, h)
            h, r_prev, counts = layer.mlp(layer.post_attention_layernorm(res), r_prev)
            res = layer.post_mlp_residual_scale(res, h)
            if not inputs.is_cuda:  # a host copy each layer would stall a GPU step
                expert_counts.append(counts.tolist())
        logits = tied_logits(m.norm(res), m.embed_tokens.weight, c)
        out = {"logits": logits, "expert_counts": expert_counts}
        if targets is not None:
            ce = mean_cross_entropy(logits, targets, c)
            out.update(ce_loss=ce, aux_loss=torch.zeros((), dtype=ce.dtype), loss=ce)
        return out


def make_model(c):
    return FoundryZaya1(c) if c.arch == "zaya1" else FoundryMoE(c)


# ----------------------------------------------------------------------------------------
# safetensors, read by hand: u64 LE header length, JSON header, raw little-endian data.

SAFETENSORS_DTYPES = {"F32": np.float32, "F64": np.float64, "F16": np.float16,
                      "I32": np.int32, "I64": np.int64, "U8": np.uint8}


def read_safetensors(path):
    with open(path, "rb") as f:
        blob = f.read()
    (n,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8:8 + n].decode("utf-8"))
    data = memoryview(blob)[8 + n:]
    tensors = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        if info["dtype"] == "BF16":
            begin, end = info["data_offsets"]
            raw = np.frombuffer(data[begin:end], dtype="<u2").astype(np.uint32) << 16
            tensors[name] = raw.view(np.float32).reshape(info["shape"])
            continue
        begin, end = info["data_offsets"]
        dt = np.dtype(SAFETENSORS_DTYPES[info["dtype"]]).newbyteorder("<")
        tensors[name] = np.frombuffer(data[begin:end], dtype=dt).reshape(info["shape"]).copy()
    return tensors


def read_checkpoint_v2(ckpt_dir):
    """Every tensor of a format-2 checkpoint (docs/formats.md: metadata.json's pieces, boxes of
    row-major F32 in the rank files), parameters and optimizer moments ("NAME.exp_avg")."""
    with open(os.path.join(ckpt_dir, "metadata.json")) as f:
        meta = json.load(f)
    if meta.get("format_version") != 2:
        sys.exit(f"error: {ckpt_dir}: checkpoint format {meta.get('format_version')}, not 2")
    files = [np.fromfile(os.path.join(ckpt_dir, f["name"]), dtype=np.uint8) for f in meta["files"]]
    tensors = {name: np.zeros(t["shape"], dtype=np.float32) for name, t in meta["tensors"].items()}
    for p in meta["pieces"]:
        raw = files[p["file"]][p["byte_offset"]:p["byte_offset"] + p["byte_length"]]
        box = raw.view("<f4").reshape(p["lengths"])
        where = tuple(slice(o, o + n) for o, n in zip(p["offsets"], p["lengths"]))
        tensors[p["tensor"]][where] = box
    return meta, tensors


def checkpoint_tensors(ckpt_dir):
    """(parameters, optimizer moments) of a checkpoint of either format: name -> array, and
    "NAME.exp_avg"/"NAME.exp_avg_sq" -> array (format 1: optimizer.safetensors)."""
    if os.path.exists(os.path.join(ckpt_dir, "metadata.json")):
        _, tensors = read_checkpoint_v2(ckpt_dir)
        moments = {n: t for n, t in tensors.items()
                   if n.endswith((".exp_avg", ".exp_avg_sq", ".muon_momentum"))}
        return {n: t for n, t in tensors.items() if n not in moments}, moments
    params = read_safetensors(os.path.join(ckpt_dir, "model.safetensors"))
    optimizer = os.path.join(ckpt_dir, "optimizer.safetensors")
    return params, read_safetensors(optimizer) if os.path.exists(optimizer) else {}


def saved_balancing_biases(ckpt_dir, tensors):
    """ZAYA1's balancing biases as the checkpoint saved them (eval and generate route with
    these): format 2's trainer state, or an export's mlp.gate.balancing_biases tensors."""
    meta_path = os.path.join(ckpt_dir, "metadata.json")
    if os.path.exists(meta_path):
        with open(meta_path) as f:
            state = json.load(f).get("trainer_state", {})
        if "router_balancers" not in state:
            sys.exit(f"error: {meta_path}: no trainer_state.router_balancers")
        return [b["bias"] for b in state["router_balancers"]]
    names = sorted((n for n in tensors if n.endswith(".mlp.gate.balancing_biases")),
                   key=lambda n: int(n.split(".")[2]))
    if not names:
        sys.exit(f"error: {ckpt_dir}: no balancing biases (format 2 or an export is needed)")
    return [tensors[n] for n in names]


def load_foundry_checkpoint(model, ckpt_dir, router_biases="checkpoint"):
    """Loads the parameters; for ZAYA1 also the balancing biases: "checkpoint" (what the
    checkpoint saved, as eval uses), "initial" (the config's: a step from initialization
    routed with those), or another checkpoint's directory (the biases a step resumed from it
    routed with)."""
    tensors, _ = checkpoint_tensors(ckpt_dir)
    if isinstance(model, FoundryZaya1):
        if router_biases == "checkpoint":
            model.set_balancing_biases(saved_balancing_biases(ckpt_dir, tensors))
        elif router_biases != "initial":
            model.set_balancing_biases(
                saved_balancing_biases(router_biases, checkpoint_tensors(router_biases)[0]))
        tensors = {n: t for n, t in tensors.items() if not n.endswith(".balancing_biases")}
    params = dict(model.named_parameters())
    missing = sorted(set(params) - set(tensors))
    unexpected = sorted(set(tensors) - set(params))
    if missing or unexpected:
        sys.exit(f"error: checkpoint/model mismatch: missing {missing[:5]}, "
                 f"unexpected {unexpected[:5]}")
    with torch.no_grad():
        for name, p in params.items():
            t = torch.from_numpy(tensors[name])
            if tuple(t.shape) != tuple(p.shape):
                sys.exit(f"error: {name}: checkpoint shape {tuple(t.shape)}, model {tuple(p.shape)}")
            p.copy_(t.to(p.dtype))


# ----------------------------------------------------------------------------------------
# Token batches Foundry would use.

MASK64 = (1 << 64) - 1


def splitmix64(state):
    """Foundry's Rng::splitmix64(x): returns (new x, output)."""
    state = (state + 0x9E3779B97F4A7C15) & MASK64
    z = state
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
    return state, z ^ (z >> 31)


class Xoshiro256ss:
    """Foundry's Rng (base/rng.h): xoshiro256** seeded word by word with splitmix64."""

    def __init__(self, seed):
        x, self.s = seed & MASK64, []
        for _ in range(4):
            x, w = splitmix64(x)
            self.s.append(w)

    @staticmethod
    def _rotl(x, k):
        return ((x << k) | (x >> (64 - k))) & MASK64

    def next_u64(self):
        s = self.s
        result = (self._rotl((s[1] * 5) & MASK64, 7) * 9) & MASK64
        t = (s[1] << 17) & MASK64
        s[2] ^= s[0]
        s[3] ^= s[1]
        s[1] ^= s[2]
        s[0] ^= s[3]
        s[2] ^= t
        s[3] = self._rotl(s[3], 45)
        return result

    def below(self, n):
        return 0 if n == 0 else self.next_u64() % n


def synthetic_batch(m, t, step):
    """trainer.cpp synthetic_batch(): uniformly random tokens, a function of (seed, step)."""
    n = t.batch_size * t.seq_len
    key = (int(t.seed) ^ ((0x5851F42D4C957F2D * (step + 1)) & MASK64)) & MASK64
    _, seed = splitmix64(key)
    rng = Xoshiro256ss(seed)
    inputs, targets = [], []
    for _ in range(n):
        inputs.append(rng.below(m.vocab_size))
        targets.append(rng.below(m.vocab_size))
    shape = (t.batch_size, t.seq_len)
    return np.array(inputs).reshape(shape).tolist(), np.array(targets).reshape(shape).tolist()


def read_split(data_dir, split):
    """All tokens of a split of a `foundry data prepare` dataset (docs/formats.md)."""
    with open(os.path.join(data_dir, "meta.json")) as f:
        meta = json.load(f)
    parts = []
    for shard in meta["splits"][split]["shards"]:
        with open(os.path.join(data_dir, shard["file"]), "rb") as f:
            blob = f.read()
        magic, version, width, count = struct.unpack("<8sIIQ", blob[:24])
        assert magic == b"FDRYTOK\0" and version == 1, f"{shard['file']}: not a token shard"
        dt = "<u2" if width == 2 else "<u4"
        toks = np.frombuffer(blob[64:], dtype=dt)
        assert toks.size == count
        parts.append(toks.astype(np.int64))
    return np.concatenate(parts)


def eval_batch(data_dir, t, index=0):
    """BatchLoader::for_eval: the val split in order; window w = tokens[w*T, w*T + T],
    a row's inputs are its first T tokens, targets its last T; rows are consecutive windows
    (wrapping at the end). Returns batch number `index` (0-based)."""
    toks = read_split(data_dir, "val")
    T = t.seq_len
    windows = (toks.size - 1) // T
    if windows < 1:
        sys.exit(f"error: val split has {toks.size} tokens, fewer than seq_len + 1")
    inputs, targets = [], []
    for row in range(t.batch_size):
        w = (index * t.batch_size + row) % windows
        inputs.append(toks[w * T:w * T + T].tolist())
        targets.append(toks[w * T + 1:w * T + T + 1].tolist())
    return inputs, targets


# ----------------------------------------------------------------------------------------
# Modes

def learning_rate(t, step):  # src/optim/schedule.cpp
    peak, floor = t.lr, t.lr * t.min_lr_ratio
    if step <= t.warmup_steps:
        return peak * step / t.warmup_steps
    if t.schedule == "constant":
        return peak
    if t.schedule == "cosine":
        progress = min(1.0, (step - t.warmup_steps) / (t.steps - t.warmup_steps)) \
            if t.steps > t.warmup_steps else 1.0
        return floor + (peak - floor) * 0.5 * (1.0 + math.cos(math.pi * progress))
    decay_steps = round(min(max(t.decay_fraction, 0.0), 1.0) * t.steps)  # wsd
    decay_start = t.steps - decay_steps
    if step <= decay_start or decay_steps == 0:
        return peak
    return peak - (peak - floor) * min(1.0, (step - decay_start) / decay_steps)


def cmd_bench(args):
    m, t, _ = load_run_config(args.config, args.set)
    torch.set_num_threads(args.threads)
    torch.manual_seed(t.seed)
    gpu = args.device == "cuda"
    if gpu and not torch.cuda.is_available():
        sys.exit("error: --device cuda: PyTorch sees no CUDA GPU")
    device = torch.device(args.device)
    model = make_model(m)
    model.init_weights()
    model.to(device)
    decay, no_decay = [], []
    for name, p in model.named_parameters():  # no decay for vectors (norms, biases, scales)
        (no_decay if p.dim() < 2 or "embed_tokens" in name else decay).append(p)  # and embeddings
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": t.weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=t.lr, betas=(t.beta1, t.beta2), eps=t.eps,
                            **({"fused": True} if gpu else {}))
    # On a GPU: bf16 autocast over fp32 master weights (as Foundry's bf16), optionally compiled.
    precision = "bf16 autocast" if gpu else "fp32"
    step_model = torch.compile(model) if args.compile else model
    B, T = t.batch_size, t.seq_len
    n_params = sum(p.numel() for p in model.parameters())
    where = (torch.cuda.get_device_name(device) if gpu
             else f"{torch.get_num_threads()} threads")
    print(f"pytorch {torch.__version__} | {where} | {n_params / 1e6:.2f}M params | "
          f"batch {B} x {T} | {'compiled' if args.compile else 'eager'} {precision} | AdamW",
          file=sys.stderr)
    schedule_steps = max(t.steps, args.steps)
    rates, losses = [], []
    for step in range(1, args.steps + 1):
        inputs = torch.randint(0, m.vocab_size, (B, T), device=device)
        targets = torch.randint(0, m.vocab_size, (B, T), device=device)
        if gpu:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        for g in opt.param_groups:
            g["lr"] = learning_rate(Cfg(t, steps=schedule_steps), step)
        opt.zero_grad(set_to_none=True)
        with (torch.autocast("cuda", dtype=torch.bfloat16) if gpu else contextlib.nullcontext()):
            out = step_model(inputs, targets)
        out["loss"].backward()
        gnorm = torch.nn.utils.clip_grad_norm_(model.parameters(), t.grad_clip) \
            if t.grad_clip > 0 else torch.tensor(float("nan"))
        opt.step()
        if gpu:
            torch.cuda.synchronize()
        dt = time.perf_counter() - t0
        rates.append(B * T / dt)
        losses.append(out["ce_loss"].item())
        print(f"step {step:3d} | loss {losses[-1]:.4f} | aux {out['aux_loss'].item():.4f} | "
              f"grad norm {gnorm.item():.3f} | {dt:.3f} s | {rates[-1]:.0f} tok/s",
              file=sys.stderr)
    # The first steps warm up (and compile): the median of the rest.
    skip = max(2, args.steps // 4) if args.compile else 2
    timed = rates[skip:] if len(rates) > skip else rates
    result = {"system": "pytorch", "torch": torch.__version__,
              "precision": precision, "compiled": bool(args.compile), "device": where,
              "threads": torch.get_num_threads(), "config": args.config,
              "batch_size": B, "seq_len": T, "steps": args.steps, "timed_steps": len(timed),
              "tokens_per_s_median": statistics.median(timed),
              "tokens_per_s_mean": statistics.fmean(timed),
              "final_loss": losses[-1]}
    print(f"pytorch {precision}: median {result['tokens_per_s_median']:.0f} tokens/s, "
          f"mean {result['tokens_per_s_mean']:.0f} tokens/s over {len(timed)} steps",
          file=sys.stderr)
    print(json.dumps(result))


def cmd_tokens(args):
    m, t, _ = load_run_config(args.config, args.set)
    if args.synthetic_step is not None:
        inputs, targets = synthetic_batch(m, t, args.synthetic_step)
        source = {"synthetic_step": args.synthetic_step, "seed": t.seed}
    elif args.val_data:
        inputs, targets = eval_batch(args.val_data, t, args.batch_index)
        source = {"val_data": args.val_data, "batch_index": args.batch_index}
    else:
        sys.exit("error: give --synthetic-step N or --val-data DIR")
    doc = {"inputs": inputs, "targets": targets, "source": source}
    text = json.dumps(doc)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")
    else:
        print(text)


def rel_err(a, b):
    return float(torch.linalg.vector_norm(a - b) / max(torch.linalg.vector_norm(b).item(), 1e-300))


def cmd_check(args):
    m, t, _ = load_run_config(args.config, args.set)
    torch.set_num_threads(args.threads)
    dtype = torch.float64 if args.dtype == "fp64" else torch.float32
    model = make_model(m).to(dtype)
    load_foundry_checkpoint(model, args.checkpoint, args.router_biases)
    with open(args.tokens) as f:
        batch = json.load(f)
    inputs = torch.tensor(batch["inputs"], dtype=torch.int64)
    targets = torch.tensor(batch["targets"], dtype=torch.int64)
    assert inputs.shape == targets.shape and inputs.dim() == 2
    assert int(inputs.max()) < m.vocab_size and int(targets.max()) < m.vocab_size

    out = model(inputs, targets)
    out["loss"].backward()
    params = dict(model.named_parameters())
    grad_norms = {n: p.grad.double().norm().item() if p.grad is not None else 0.0
                  for n, p in params.items()}
    total = math.sqrt(sum(g * g for g in grad_norms.values()))
    result = {"dtype": args.dtype, "batch": list(inputs.shape),
              "loss": out["loss"].item(), "ce_loss": out["ce_loss"].item(),
              "aux_loss": out["aux_loss"].item(), "grad_norm": total,
              "expert_counts": out["expert_counts"], "grad_norms": grad_norms}

    if args.compare_adam_grads:
        # Foundry's gradient, recovered from its AdamW state: m_t = b1*m_{t-1} + (1-b1)*g_t
        # in float32. Valid for the step that produced this checkpoint when it ran with
        # grad_clip = 0 (unclipped) and lr = 0 (weights unchanged, so g_t was taken at these
        # weights). --adam-prev names the checkpoint of the step before (absent: m_{t-1} = 0).
        # The recovery is exact only up to the float32 rounding of m_t (and of b1*m_{t-1}):
        # `noise` bounds that per element, and the reported error is what exceeds it,
        #   err = || max(0, |g_ref - g_foundry| - noise) || / || g_ref ||
        # (0 when both are zero, e.g. an expert no token was routed to).
        b1 = np.float64(np.float32(t.beta1))
        c1 = np.float64(np.float32(1.0 - t.beta1))
        ulp = 2.0 ** -23
        m_now = checkpoint_tensors(args.checkpoint)[1]
        m_prev = checkpoint_tensors(args.adam_prev)[1] if args.adam_prev else None
        errs, raw = {}, {}
        for n, p in params.items():
            cur = m_now[n + ".exp_avg"].astype(np.float64)
            prev = m_prev[n + ".exp_avg"].astype(np.float64) if m_prev else np.zeros_like(cur)
            g_foundry = (cur - b1 * prev) / c1
            noise = (np.abs(cur) + b1 * np.abs(prev)) * ulp / c1
            g_ref = (p.grad.double() if p.grad is not None
                     else torch.zeros(p.shape, dtype=torch.float64)).numpy()
            excess = np.maximum(np.abs(g_ref - g_foundry) - noise, 0.0)
            ref_norm = np.linalg.norm(g_ref)
            errs[n] = float(np.linalg.norm(excess) / ref_norm) if ref_norm > 0 else \
                (0.0 if not excess.any() else float("inf"))
            raw[n] = float(np.linalg.norm(g_ref - g_foundry) / max(ref_norm, 1e-300))
        worst = max(errs, key=errs.get)
        result["grad_rel_err"] = errs
        result["grad_rel_err_raw"] = raw
        result["grad_rel_err_max"] = errs[worst]
        result["grad_rel_err_worst_tensor"] = worst
    print(json.dumps(result, indent=None if args.compact else 1))


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="mode", required=True)

    def common(p):
        p.add_argument("--config", required=True, help="Foundry run config (JSON)")
        p.add_argument("--set", nargs="+", action="extend", default=[], metavar="KEY=VALUE",
                       help="override section.key=value, as foundry --set")

    b = sub.add_parser("bench", help="train on random tokens, report tokens/s")
    common(b)
    b.add_argument("--steps", type=int, default=12)
    b.add_argument("--threads", type=int, default=2)
    b.add_argument("--device", choices=["cpu", "cuda"], default="cpu",
                   help="cuda: the GPU peer (bf16 autocast, fused attention and AdamW)")
    b.add_argument("--compile", action="store_true", help="torch.compile the model")
    b.set_defaults(fn=cmd_bench)

    c = sub.add_parser("check", help="loss and gradients of a Foundry checkpoint on one batch")
    common(c)
    c.add_argument("--checkpoint", required=True,
                   help="checkpoint dir (format 2 or 1), or a `foundry ckpt export --hf` dir")
    c.add_argument("--tokens", required=True, help='JSON {"inputs": [[...]], "targets": [[...]]}')
    c.add_argument("--dtype", choices=["fp32", "fp64"], default="fp32")
    c.add_argument("--threads", type=int, default=2)
    c.add_argument("--compare-adam-grads", action="store_true",
                   help="compare gradients element-wise with those in the checkpoint's AdamW "
                        "state (checkpoint from a step run with lr=0, grad_clip=0)")
    c.add_argument("--adam-prev", help="checkpoint of the previous step (its exp_avg)")
    c.add_argument("--router-biases", default="checkpoint", metavar="checkpoint|initial|DIR",
                   help="arch zaya1: route with the checkpoint's balancing biases (default), the "
                        "config's initial ones (a step from initialization), or those of the "
                        "checkpoint in DIR (a step resumed from it)")
    c.add_argument("--compact", action="store_true", help="one-line JSON")
    c.set_defaults(fn=cmd_check)

    k = sub.add_parser("tokens", help="write a token batch file for `check`")
    common(k)
    k.add_argument("--synthetic-step", type=int, help="Foundry's --synthetic-data batch of step N")
    k.add_argument("--val-data", help="dataset dir: batch of the eval loader (val split)")
    k.add_argument("--batch-index", type=int, default=0)
    k.add_argument("--out")
    k.set_defaults(fn=cmd_tokens)

    args = ap.parse_args()
    args.fn(args)


if __name__ == "__main__":
    main()
