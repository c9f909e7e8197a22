#!/usr/bin/python3
"""Independent reference of Hugging Face Llama / Qwen2 / Qwen3 / Mistral forward semantics.

This file re-implements, in plain PyTorch (no `transformers`, no `safetensors` package), what
HF's modeling_llama.py, modeling_qwen2.py, modeling_qwen3.py and modeling_mistral.py compute with
eager attention in float32. It exists to check Specula's C++ engine against HF semantics on small
random models that the test creates itself.

    /usr/bin/python3 tests/reference/hf_reference.py --out DIR --arch ARCH [--seed N]

writes
    DIR/model/config.json + weights   an HF-layout checkpoint (sharded for --arch llama)
    DIR/cases.safetensors             scenario inputs and the expected outputs (see `build_cases`)

ARCH is one of llama, qwen2, qwen3, mistral, llama3 (Llama with rope_scaling rope_type=llama3).

The HF semantics reproduced here, step by step (each is a place where engines commonly drift):
  * RMSNorm: computed in float32, `weight * normed.to(input_dtype)`.
  * RoPE: inv_freq = 1 / theta ** (arange(0, d, 2) / d) in float32, "rotate_half" layout (the
    first and second halves of each head form the rotation pairs), cos/sin of position * inv_freq.
    rope_type "llama3" rescales inv_freq as in HF's `_compute_llama3_parameters`.
  * Attention: scores = q k^T * head_dim^-0.5 plus an additive mask of finfo.min, softmax in
    float32; grouped-query attention by repeating each kv head (repeat_kv).
  * Qwen2: bias on q/k/v (not o). Qwen3: RMSNorm over head_dim on q and k before RoPE, explicit
    head_dim. Llama: attention_bias puts a bias on q/k/v AND o.
  * Mistral: a query at position i sees keys j with i - sliding_window < j <= i (itself and the
    sliding_window - 1 previous ones). Qwen2 ignores sliding_window unless use_sliding_window.
  * MLP: down(silu(gate(x)) * up(x)).
  * hidden_states tuple: index 0 = embeddings, i (1 <= i < L) = output of decoder layer i
    (1-based), L = output of the last layer AFTER the final norm.
  * tie_word_embeddings: the logits use embed_tokens.weight and the checkpoint has no lm_head.
"""

import argparse
import json
import math
import os
import struct

import numpy as np
import torch

# ---------------------------------------------------------------------------------------------
# Model configurations: small enough to run in milliseconds, each exercising different features.
# ---------------------------------------------------------------------------------------------

ARCH_CONFIGS = {
    # Llama-2 style: GQA (4 heads / 2 kv heads), head_dim 12, untied, sharded checkpoint.
    "llama": dict(
        architectures=["LlamaForCausalLM"], model_type="llama", vocab_size=96, hidden_size=48,
        intermediate_size=112, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
        max_position_embeddings=256, rms_norm_eps=1e-5, rope_theta=10000.0,
        tie_word_embeddings=False, attention_bias=False, mlp_bias=False, hidden_act="silu",
        bos_token_id=1, eos_token_id=2, torch_dtype="float32"),
    # Qwen2: q/k/v bias, MQA (1 kv head), tied embeddings. sliding_window is present but
    # use_sliding_window is false, so HF ignores it (real Qwen2 configs look like this).
    "qwen2": dict(
        architectures=["Qwen2ForCausalLM"], model_type="qwen2", vocab_size=112, hidden_size=64,
        intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=1,
        max_position_embeddings=512, rms_norm_eps=1e-6, rope_theta=1000000.0,
        tie_word_embeddings=True, use_sliding_window=False, sliding_window=4,
        max_window_layers=2, hidden_act="silu", bos_token_id=0, eos_token_id=[1, 2],
        torch_dtype="float32"),
    # Qwen3: q/k RMSNorm, explicit head_dim (24) != hidden/heads (32/4 = 8), tied embeddings,
    # bfloat16 weights on disk (the engine loads them into float32).
    "qwen3": dict(
        architectures=["Qwen3ForCausalLM"], model_type="qwen3", vocab_size=128, hidden_size=32,
        intermediate_size=80, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
        head_dim=24, max_position_embeddings=512, rms_norm_eps=1e-6, rope_theta=1000000.0,
        tie_word_embeddings=True, attention_bias=False, use_sliding_window=False,
        sliding_window=None, hidden_act="silu", bos_token_id=0, eos_token_id=1,
        torch_dtype="bfloat16"),
    # Mistral: sliding window of 5 (sequences here are up to 12 long), MQA, untied.
    "mistral": dict(
        architectures=["MistralForCausalLM"], model_type="mistral", vocab_size=80,
        hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=1, max_position_embeddings=256, rms_norm_eps=1e-5,
        rope_theta=10000.0, sliding_window=5, tie_word_embeddings=False, hidden_act="silu",
        bos_token_id=1, eos_token_id=2, torch_dtype="float32"),
    # Llama-3.1 style: rope_scaling llama3 with a small original context so that the three
    # frequency bands (kept / smoothed / divided by factor) all occur at head_dim 16;
    # attention_bias=true also puts a bias on o_proj.
    "llama3": dict(
        architectures=["LlamaForCausalLM"], model_type="llama", vocab_size=100, hidden_size=64,
        intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=1,
        max_position_embeddings=2048, rms_norm_eps=1e-5, rope_theta=500000.0,
        rope_scaling=dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0,
                          high_freq_factor=4.0, original_max_position_embeddings=256),
        tie_word_embeddings=False, attention_bias=True, mlp_bias=False, hidden_act="silu",
        bos_token_id=1, eos_token_id=[2, 3], torch_dtype="float32"),
}

SHARDED_ARCHS = {"llama"}


class Config:
    """The handful of derived hyperparameters the forward needs, read like HF reads them."""

    def __init__(self, cfg):
        self.raw = cfg
        self.model_type = cfg["model_type"]
        self.vocab_size = cfg["vocab_size"]
        self.hidden_size = cfg["hidden_size"]
        self.intermediate_size = cfg["intermediate_size"]
        self.num_layers = cfg["num_hidden_layers"]
        self.num_heads = cfg["num_attention_heads"]
        self.num_kv_heads = cfg.get("num_key_value_heads") or self.num_heads
        # HF: getattr(config, "head_dim", None) or hidden_size // num_attention_heads
        self.head_dim = cfg.get("head_dim") or self.hidden_size // self.num_heads
        self.eps = cfg["rms_norm_eps"]
        self.rope_theta = cfg["rope_theta"]
        self.rope_scaling = cfg.get("rope_scaling")
        self.tie = cfg.get("tie_word_embeddings", False)
        if self.model_type == "qwen2":
            self.qkv_bias, self.o_bias = True, False
        elif self.model_type in ("llama", "qwen3"):
            self.qkv_bias = self.o_bias = bool(cfg.get("attention_bias", False))
        else:  # mistral
            self.qkv_bias = self.o_bias = False
        self.qk_norm = self.model_type == "qwen3"
        # Only Mistral applies its sliding_window unconditionally; Qwen2/Qwen3 need
        # use_sliding_window (and this reference never enables it for them).
        self.sliding_window = None
        if self.model_type == "mistral":
            self.sliding_window = cfg.get("sliding_window")
        elif cfg.get("use_sliding_window"):
            raise ValueError("use_sliding_window is not modelled by this reference")


# ---------------------------------------------------------------------------------------------
# Safetensors writer (the format is tiny: u64 LE header length, JSON header, raw LE data).
# ---------------------------------------------------------------------------------------------

_ST_DTYPES = {
    torch.float32: ("F32", np.float32),
    torch.int32: ("I32", np.int32),
    torch.int64: ("I64", np.int64),
}


def _tensor_bytes(t):
    """(safetensors dtype name, raw little-endian bytes) of a CPU tensor."""
    t = t.detach().contiguous().cpu()
    if t.dtype == torch.bfloat16:
        # Reinterpret the 16 bits as int16 (numpy has no bfloat16) and write them verbatim.
        return "BF16", t.view(torch.int16).numpy().astype("<i2").tobytes()
    name, np_type = _ST_DTYPES[t.dtype]
    return name, t.numpy().astype(np.dtype(np_type).newbyteorder("<")).tobytes()


def write_safetensors(path, tensors, metadata=None):
    """Writes {name: tensor} (in sorted name order) as one safetensors file; returns data bytes."""
    header, blobs, offset = {}, [], 0
    for name in sorted(tensors):
        t = tensors[name]
        dtype, raw = _tensor_bytes(t)
        header[name] = {"dtype": dtype, "shape": list(t.shape),
                        "data_offsets": [offset, offset + len(raw)]}
        blobs.append(raw)
        offset += len(raw)
    if metadata:
        header["__metadata__"] = {k: str(v) for k, v in metadata.items()}
    text = json.dumps(header, separators=(",", ":")).encode("utf-8")
    text += b" " * ((8 - len(text) % 8) % 8)  # pad so the data section is 8-byte aligned
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for raw in blobs:
            f.write(raw)
    return offset


# ---------------------------------------------------------------------------------------------
# Weights: HF parameter names and shapes, random init with scales that make the logits O(1) so that
# a 1e-4 tolerance is meaningful (HF's 0.02 init would make every logit nearly zero).
# ---------------------------------------------------------------------------------------------


def make_weights(cfg, gen):
    def normal(shape, std):
        return torch.randn(*shape, generator=gen, dtype=torch.float32) * std

    def norm_weight(dim):
        return 1.0 + normal((dim,), 0.2)

    d, hd, inter = cfg.hidden_size, cfg.head_dim, cfg.intermediate_size
    q_out, kv_out = cfg.num_heads * hd, cfg.num_kv_heads * hd
    # Tied embeddings double as the output head: a smaller scale keeps those logits O(1) too.
    embed_std = 2.0 / math.sqrt(d) if cfg.tie else 1.0
    w = {"model.embed_tokens.weight": normal((cfg.vocab_size, d), embed_std),
         "model.norm.weight": norm_weight(d)}
    for i in range(cfg.num_layers):
        p = f"model.layers.{i}."
        w[p + "input_layernorm.weight"] = norm_weight(d)
        w[p + "post_attention_layernorm.weight"] = norm_weight(d)
        # Larger q/k scales give peaked attention, so mask and RoPE errors show in the logits.
        w[p + "self_attn.q_proj.weight"] = normal((q_out, d), 2.0 / math.sqrt(d))
        w[p + "self_attn.k_proj.weight"] = normal((kv_out, d), 2.0 / math.sqrt(d))
        w[p + "self_attn.v_proj.weight"] = normal((kv_out, d), 1.0 / math.sqrt(d))
        w[p + "self_attn.o_proj.weight"] = normal((d, q_out), 1.0 / math.sqrt(q_out))
        if cfg.qkv_bias:
            w[p + "self_attn.q_proj.bias"] = normal((q_out,), 0.5)
            w[p + "self_attn.k_proj.bias"] = normal((kv_out,), 0.5)
            w[p + "self_attn.v_proj.bias"] = normal((kv_out,), 0.5)
        if cfg.o_bias:
            w[p + "self_attn.o_proj.bias"] = normal((d,), 0.5)
        if cfg.qk_norm:
            w[p + "self_attn.q_norm.weight"] = norm_weight(hd)
            w[p + "self_attn.k_norm.weight"] = norm_weight(hd)
        w[p + "mlp.gate_proj.weight"] = normal((inter, d), 1.0 / math.sqrt(d))
        w[p + "mlp.up_proj.weight"] = normal((inter, d), 1.0 / math.sqrt(d))
        w[p + "mlp.down_proj.weight"] = normal((d, inter), 1.0 / math.sqrt(inter))
    if not cfg.tie:
        w["lm_head.weight"] = normal((cfg.vocab_size, d), 2.0 / math.sqrt(d))
    return w


def save_checkpoint(model_dir, raw_cfg, weights, sharded):
    """config.json + model.safetensors, or 2 shards + model.safetensors.index.json."""
    os.makedirs(model_dir, exist_ok=True)
    with open(os.path.join(model_dir, "config.json"), "w") as f:
        json.dump(raw_cfg, f, indent=2)
    on_disk = {k: v.to(torch.bfloat16) if raw_cfg["torch_dtype"] == "bfloat16" else v
               for k, v in weights.items()}
    meta = {"format": "pt"}
    if not sharded:
        write_safetensors(os.path.join(model_dir, "model.safetensors"), on_disk, meta)
        return
    names = sorted(on_disk)
    # Split so that one layer's tensors straddle both shards (as real shards often do).
    half = len(names) // 2
    shards = {"model-00001-of-00002.safetensors": names[:half],
              "model-00002-of-00002.safetensors": names[half:]}
    weight_map, total = {}, 0
    for fname, subset in shards.items():
        total += write_safetensors(os.path.join(model_dir, fname),
                                   {n: on_disk[n] for n in subset}, meta)
        weight_map.update({n: fname for n in subset})
    with open(os.path.join(model_dir, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2)


# ---------------------------------------------------------------------------------------------
# The forward pass.
# ---------------------------------------------------------------------------------------------


def rms_norm(x, weight, eps):
    input_dtype = x.dtype
    h = x.to(torch.float32)
    variance = h.pow(2).mean(-1, keepdim=True)
    h = h * torch.rsqrt(variance + eps)
    return weight * h.to(input_dtype)


def default_inv_freq(base, dim):
    return 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))


def llama3_inv_freq(inv_freq, scaling):
    """HF's _compute_llama3_parameters: keep high frequencies, divide low ones by `factor`,
    interpolate smoothly in between."""
    factor = scaling["factor"]
    low_freq_factor = scaling["low_freq_factor"]
    high_freq_factor = scaling["high_freq_factor"]
    old_context_len = scaling["original_max_position_embeddings"]
    low_freq_wavelen = old_context_len / low_freq_factor
    high_freq_wavelen = old_context_len / high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    inv_freq_llama = torch.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
    smooth_factor = (old_context_len / wavelen - low_freq_factor) / (
        high_freq_factor - low_freq_factor)
    smoothed = (1 - smooth_factor) * inv_freq_llama / factor + smooth_factor * inv_freq_llama
    is_medium = ~(wavelen < high_freq_wavelen) * ~(wavelen > low_freq_wavelen)
    return torch.where(is_medium, smoothed, inv_freq_llama)


def rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def repeat_kv(x, n_rep):
    """[B, n_kv, T, hd] -> [B, n_kv * n_rep, T, hd]; kv head j serves query heads j*n_rep..."""
    if n_rep == 1:
        return x
    b, n_kv, t, hd = x.shape
    return x[:, :, None, :, :].expand(b, n_kv, n_rep, t, hd).reshape(b, n_kv * n_rep, t, hd)


class Reference:
    """A functional HF-semantics CausalLM over a dict of float32 weights."""

    def __init__(self, cfg, weights, use_rope_scaling=True, sliding_window="config"):
        self.cfg = cfg
        self.w = weights
        inv_freq = default_inv_freq(cfg.rope_theta, cfg.head_dim)
        scaling = cfg.rope_scaling
        if use_rope_scaling and scaling:
            kind = scaling.get("rope_type", scaling.get("type"))
            if kind == "llama3":
                inv_freq = llama3_inv_freq(inv_freq, scaling)
            elif kind not in (None, "default"):
                raise ValueError(f"rope_type {kind} not modelled")
        self.inv_freq = inv_freq
        # Sensitivity checks override the window; normally it is what HF uses for the config.
        self.window = cfg.sliding_window if sliding_window == "config" else sliding_window

    def _linear(self, x, name, bias):
        out = x @ self.w[name + ".weight"].t()
        if bias:
            out = out + self.w[name + ".bias"]
        return out

    def _rope(self, positions):
        """positions [T] -> cos, sin [1, 1, T, hd] (HF: float32, emb = cat(freqs, freqs))."""
        freqs = positions.float()[:, None] * self.inv_freq[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos()[None, None], emb.sin()[None, None]

    def _mask(self, t):
        """Additive causal (+ sliding window) mask [1, 1, T, T] of a single causal sequence."""
        i = torch.arange(t)[:, None]
        j = torch.arange(t)[None, :]
        allowed = j <= i
        if self.window is not None:
            allowed = allowed & (j > i - self.window)
        mask = torch.zeros(t, t, dtype=torch.float32)
        mask.masked_fill_(~allowed, torch.finfo(torch.float32).min)
        return mask[None, None]

    def _attention(self, x, p, cos, sin, mask):
        cfg = self.cfg
        b, t, _ = x.shape
        hd = cfg.head_dim
        q = self._linear(x, p + "q_proj", cfg.qkv_bias).view(b, t, cfg.num_heads, hd)
        k = self._linear(x, p + "k_proj", cfg.qkv_bias).view(b, t, cfg.num_kv_heads, hd)
        v = self._linear(x, p + "v_proj", cfg.qkv_bias).view(b, t, cfg.num_kv_heads, hd)
        if cfg.qk_norm:  # Qwen3: per-head RMSNorm over head_dim, before RoPE
            q = rms_norm(q, self.w[p + "q_norm.weight"], cfg.eps)
            k = rms_norm(k, self.w[p + "k_norm.weight"], cfg.eps)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)  # [B, heads, T, hd]
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        n_rep = cfg.num_heads // cfg.num_kv_heads
        k, v = repeat_kv(k, n_rep), repeat_kv(v, n_rep)
        scores = (q @ k.transpose(2, 3)) * (hd ** -0.5) + mask
        probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)
        out = (probs @ v).transpose(1, 2).reshape(b, t, cfg.num_heads * hd)
        return self._linear(out, p + "o_proj", cfg.o_bias)

    def forward(self, tokens, positions=None):
        """One causal sequence. tokens [T] -> (logits [T, V], hidden_states: L + 1 x [T, d])."""
        cfg = self.cfg
        tokens = torch.as_tensor(tokens, dtype=torch.int64)
        t = tokens.shape[0]
        if positions is None:
            positions = torch.arange(t)
        cos, sin = self._rope(torch.as_tensor(positions))
        mask = self._mask(t)
        h = self.w["model.embed_tokens.weight"][tokens][None]  # [1, T, d]
        hidden = [h]
        for i in range(cfg.num_layers):
            p = f"model.layers.{i}."
            residual = h
            x = rms_norm(h, self.w[p + "input_layernorm.weight"], cfg.eps)
            h = residual + self._attention(x, p + "self_attn.", cos, sin, mask)
            residual = h
            x = rms_norm(h, self.w[p + "post_attention_layernorm.weight"], cfg.eps)
            gate = self._linear(x, p + "mlp.gate_proj", False)
            up = self._linear(x, p + "mlp.up_proj", False)
            h = residual + self._linear(torch.nn.functional.silu(gate) * up,
                                        p + "mlp.down_proj", False)
            hidden.append(h)
        h = rms_norm(h, self.w["model.norm.weight"], cfg.eps)
        hidden[-1] = h  # HF: the last entry is the final-normed output, not the raw layer output
        head = self.w["model.embed_tokens.weight"] if cfg.tie else self.w["lm_head.weight"]
        logits = h @ head.t()
        return logits[0], [x[0] for x in hidden]


# ---------------------------------------------------------------------------------------------
# Scenarios. Every expected output comes from separate causal runs of single sequences, so the
# engine's chunking, batching and tree attention are all checked against plain causal semantics.
# ---------------------------------------------------------------------------------------------

TREE_PARENTS = [-1, 0, 0, 1, 1, 2, 5, -1, 7]  # two roots; depths 0 1 1 2 2 2 3 0 1
TREE_ACCEPT = [0, 2, 5]                         # the committed path (indices into the tree)
DECODE_CHUNKS = [4, 5, 1, 1, 1]                 # a 9-token prompt in 2 chunks, then 3 decode steps


def tree_paths(parents):
    paths = []
    for i, p in enumerate(parents):
        paths.append((paths[p] if p >= 0 else []) + [i])
    return paths


def build_cases(ref, cfg, gen):
    v = cfg.vocab_size
    rand_tokens = lambda n: torch.randint(0, v, (n,), generator=gen, dtype=torch.int64)
    num_layers = cfg.num_layers
    hidden_layers = list(range(num_layers + 1))  # 0 .. L, all of them
    cases = {"hidden_layers": torch.tensor(hidden_layers, dtype=torch.int64)}

    def stack_hidden(hidden, rows=slice(None)):
        return torch.stack([hidden[l][rows] for l in hidden_layers])  # [K, T, d]

    # (a) prefill: one 9-token prompt, every position's logits and all hidden states.
    prompt = rand_tokens(9)
    logits, hidden = ref.forward(prompt)
    cases["prefill/tokens"] = prompt
    cases["prefill/logits"] = logits
    cases["prefill/hidden"] = stack_hidden(hidden)

    # (b) incremental decode: the same prompt + 3 more tokens, fed as DECODE_CHUNKS. Expected logits
    # of every chunk row are the full sequence's causal logits at those positions.
    seq = torch.cat([prompt, rand_tokens(3)])
    logits, hidden = ref.forward(seq)
    cases["decode/tokens"] = seq
    cases["decode/chunks"] = torch.tensor(DECODE_CHUNKS, dtype=torch.int64)
    cases["decode/logits"] = logits
    cases["decode/hidden"] = stack_hidden(hidden)

    # (c) ragged batch: 3 sequences of different lengths in one forward, packed in order.
    lens = [3, 7, 5]
    toks, lgs, hids = [], [], []
    for n in lens:
        t = rand_tokens(n)
        lg, hd = ref.forward(t)
        toks.append(t)
        lgs.append(lg)
        hids.append(stack_hidden(hd))
    cases["ragged/lengths"] = torch.tensor(lens, dtype=torch.int64)
    cases["ragged/tokens"] = torch.cat(toks)
    cases["ragged/logits"] = torch.cat(lgs)
    cases["ragged/hidden"] = torch.cat(hids, dim=1)

    # (d) tree: prefix, then a token tree whose node i sits at position prefix_len + depth(i).
    # Node i's expected output = the last row of the causal run of prefix + path(root .. i).
    prefix = rand_tokens(5)
    tree = rand_tokens(len(TREE_PARENTS))
    paths = tree_paths(TREE_PARENTS)
    tree_logits, tree_hidden = [], []
    for path in paths:
        lg, hd = ref.forward(torch.cat([prefix, tree[path]]))
        tree_logits.append(lg[-1])
        tree_hidden.append(stack_hidden(hd, -1))
    pre_logits, pre_hidden = ref.forward(prefix)
    cases["tree/prefix"] = prefix
    cases["tree/prefix_logits"] = pre_logits
    cases["tree/tokens"] = tree
    cases["tree/parents"] = torch.tensor(TREE_PARENTS, dtype=torch.int64)
    cases["tree/positions"] = torch.tensor([len(prefix) + len(p) - 1 for p in paths],
                                           dtype=torch.int64)
    cases["tree/logits"] = torch.stack(tree_logits)
    cases["tree/hidden"] = torch.stack(tree_hidden, dim=1)  # [K, nodes, d]
    # After committing TREE_ACCEPT, two more tokens continue the accepted sequence.
    accepted = torch.cat([prefix, tree[TREE_ACCEPT]])
    after = rand_tokens(2)
    lg, _ = ref.forward(torch.cat([accepted, after]))
    cases["tree/accept"] = torch.tensor(TREE_ACCEPT, dtype=torch.int64)
    cases["tree/next_tokens"] = after
    cases["tree/next_logits"] = lg[-2:]
    # A plain causal side sequence sharing both forwards with the tree sequence (4 tokens next to
    # the prefix, 3 next to the tree): trees and chains mixed in one batch.
    side = rand_tokens(7)
    lg, _ = ref.forward(side)
    cases["tree/side_tokens"] = side
    cases["tree/side_logits"] = lg
    cases["tree/side_split"] = torch.tensor([4], dtype=torch.int64)

    # Sensitivity: the tree answers must differ from a naive causal run over the flattened tree,
    # or the scenario could not catch a wrong tree mask.
    flat, _ = ref.forward(torch.cat([prefix, tree]))
    cases["check/tree_vs_flat"] = (flat[len(prefix):] - cases["tree/logits"]).abs().max()
    return cases


def sensitivity_checks(cfg, weights, cases):
    """Proves the scenarios can tell the feature apart: computing WITHOUT the feature must change the
    expected logits by far more than the 1e-4 tolerance. Returns {name: max abs change}."""
    out = {"tree_vs_flat": float(cases.pop("check/tree_vs_flat"))}
    seq = cases["decode/tokens"]
    base = cases["decode/logits"]
    if cfg.sliding_window is not None:
        lg, _ = Reference(cfg, weights, sliding_window=None).forward(seq)
        out["sliding_window"] = float((lg - base).abs().max())
    if cfg.raw.get("sliding_window") and cfg.sliding_window is None:
        # Qwen2 carries sliding_window with use_sliding_window=false: applying it would be wrong.
        lg, _ = Reference(cfg, weights, sliding_window=cfg.raw["sliding_window"]).forward(seq)
        out["ignored_sliding_window"] = float((lg - base).abs().max())
    if cfg.rope_scaling:
        lg, _ = Reference(cfg, weights, use_rope_scaling=False).forward(seq)
        out["rope_scaling"] = float((lg - base).abs().max())
    for name, value in out.items():
        if value < 1e-2:
            raise SystemExit(f"sensitivity check '{name}' too weak: {value}")
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[1])
    parser.add_argument("--out", required=True, help="output directory")
    parser.add_argument("--arch", required=True, choices=sorted(ARCH_CONFIGS))
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    torch.set_num_threads(1)
    raw_cfg = dict(ARCH_CONFIGS[args.arch])
    cfg = Config(raw_cfg)
    gen = torch.Generator().manual_seed(1000 + args.seed)
    weights = make_weights(cfg, gen)
    if raw_cfg["torch_dtype"] == "bfloat16":
        # The checkpoint stores bf16; the reference computes with exactly those values in fp32.
        weights = {k: v.to(torch.bfloat16).float() for k, v in weights.items()}
    save_checkpoint(os.path.join(args.out, "model"), raw_cfg, weights,
                    sharded=args.arch in SHARDED_ARCHS)

    ref = Reference(cfg, weights)
    with torch.no_grad():
        cases = build_cases(ref, cfg, gen)
        checks = sensitivity_checks(cfg, weights, cases)
    cases = {k: (v.float() if v.is_floating_point() else v) for k, v in cases.items()}
    write_safetensors(os.path.join(args.out, "cases.safetensors"), cases,
                      {"arch": args.arch, "seed": args.seed, "checks": json.dumps(checks)})
    print(f"{args.arch}: wrote {args.out}; max |logit| "
          f"{float(cases['prefill/logits'].abs().max()):.2f}; sensitivity "
          + ", ".join(f"{k}={v:.3g}" for k, v in checks.items()))


if __name__ == "__main__":
    main()
