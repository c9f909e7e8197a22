#include "common/drafters/specformer/specformer_model.h"

#include <algorithm>
#include <cmath>
#include <filesystem>

#include "common/drafters/drafter_checkpoint.h"
#include "common/model/cpu_kernels.h"
#include "common/model/model_runner.h"
#include "common/model/paged_attention.h"
#include "common/model/paged_attention_layout.h"
#include "common/model/rope.h"
#include "common/util/mapped_file.h"

namespace specula {

SpecFormerImpl::SpecFormerImpl(const SpecFormerConfig& config, const ModelConfig& target)
    : config_(config), layer_config_(config.LayerConfig(target)) {
  const int64_t d = config.target_hidden_size, K = config.hook_inputs();
  const double eps = config.rms_norm_eps;
  hook_norms = register_module("hook_norms", torch::nn::ModuleList());
  for (int64_t k = 0; k < K; ++k) hook_norms->push_back(RMSNorm(d, eps));
  downsampler = register_module("downsampler",
                                torch::nn::Linear(torch::nn::LinearOptions(K * d, d).bias(false)));
  context_norm = register_module("context_norm", RMSNorm(d, eps));
  context_attn = register_module("context_attn", SelfAttention(layer_config_));
  positional_norm = register_module("positional_norm", RMSNorm(d, eps));
  positional_ffn = register_module(
      "positional_ffn",
      torch::nn::Linear(torch::nn::LinearOptions(d, config.draft_len * d).bias(true)));
  draft_attn_norm = register_module("draft_attn_norm", RMSNorm(d, eps));
  draft_attn = register_module("draft_attn", SelfAttention(layer_config_));
  draft_mlp_norm = register_module("draft_mlp_norm", RMSNorm(d, eps));
  draft_mlp = register_module("draft_mlp", Mlp(layer_config_));
  inv_freq_ = RopeInverseFrequencies(layer_config_, torch::kCPU);
}

void SpecFormerImpl::SetTargetWeights(const torch::Tensor& embedding,
                                      const torch::Tensor& norm_weight,
                                      const torch::Tensor& lm_head_weight, double norm_eps) {
  embedding_ = embedding.detach();
  head_norm_weight_ = norm_weight.detach();
  head_.Set(lm_head_weight);
  head_norm_eps_ = norm_eps;
}

void SpecFormerImpl::FuseForServing() {
  context_attn->FuseProjections();
  draft_attn->FuseProjections();
  draft_mlp->FuseProjections();
}

std::pair<torch::Tensor, torch::Tensor> SpecFormerImpl::RopeFor(const torch::Tensor& positions) {
  const auto& w = downsampler->weight;
  return RopeCosSin(inv_freq_.to(w.device()), positions.to(w.device()), w.scalar_type());
}

torch::Tensor SpecFormerImpl::Hook(const std::vector<torch::Tensor>& hidden,
                                   const torch::Tensor& next_tokens) {
  const size_t K = config_.hidden_layers.size();
  TORCH_CHECK(hidden.size() == K, "SpecFormer: expected ", K, " hidden-state tensors, got ",
              hidden.size());
  std::vector<torch::Tensor> normed;
  for (size_t k = 0; k < K; ++k) {
    normed.push_back(hook_norms[k]->as<RMSNorm>()->forward(hidden[k]));
  }
  if (config_.pending_token) {
    TORCH_CHECK(embedding_.defined(), "SpecFormer: SetTargetWeights was not called");
    TORCH_CHECK(next_tokens.defined() && next_tokens.size(0) == hidden[0].size(0),
                "SpecFormer: pending_token needs one next token per row");
    auto e = embedding_.index_select(0, next_tokens.to(embedding_.device()));
    normed.push_back(hook_norms[K]->as<RMSNorm>()->forward(e.to(hidden[0].scalar_type())));
  }
  return ServingLinear(torch::cat(normed, -1), downsampler->weight, {});  // [N, K*d] -> [N, d]
}

torch::Tensor SpecFormerImpl::Context(const torch::Tensor& x, const AttentionInputs& in,
                                      LayerKvCache* kv) {
  return x + context_attn(context_norm(x), in, kv);
}

torch::Tensor SpecFormerImpl::Slots(const torch::Tensor& c, int64_t slots) {
  const int64_t M = c.size(0), d = c.size(1), l_d = config_.draft_len;
  const int64_t wanted = slots < 0 ? l_d : std::min(slots, l_d);
  const int64_t l = config_.causal_draft ? wanted : l_d;  // the slots that must run
  auto w = positional_ffn->weight, b = positional_ffn->bias;
  if (l < l_d) {
    w = w.narrow(0, 0, l * d);
    b = b.narrow(0, 0, l * d);
  }
  auto x = ServingLinear(positional_norm(c), w, b).reshape({M * l, d});  // [M * l, d]
  const auto device = x.device();
  if (!torch::GradMode::is_enabled() && PagedKernelSupports(device, x.scalar_type())) {
    // Serving on CPU: each sequence's slots as one block of a scratch cache (block m holds
    // sequence m's slot keys), attended by the in-place kernel; causal slots as a chain over an
    // empty prefix. MaskedAttention's batched matmul would dispatch ~10 LibTorch ops per
    // (sequence, head) matrix.
    const int64_t nkv = layer_config_.num_key_value_heads, hd = layer_config_.head_dim;
    std::vector<std::vector<int32_t>> tables;
    const PagedAttentionLayout layout = SlotLayout(M, l, config_.causal_draft, tables);
    std::vector<int64_t> positions = layout.positions();
    auto cs = RopeFor(torch::tensor(positions, torch::kLong));
    AttentionInputs in = MakePagedInputs(layout, cs.first, cs.second);
    LayerKvCache scratch{torch::empty({M * l, nkv, hd}, x.options()),
                         torch::empty({M * l, nkv, hd}, x.options())};
    x = x + draft_attn(draft_attn_norm(x), in, &scratch);
    x = x + draft_mlp(draft_mlp_norm(x));
  } else {
    AttentionInputs in;
    in.batch = M;
    in.max_q = l;
    in.max_k = l;
    auto cs = RopeFor(torch::arange(l, torch::kLong).repeat({M}));
    in.cos = cs.first;
    in.sin = cs.second;
    auto mask = torch::ones({l, l}, torch::TensorOptions().dtype(torch::kBool).device(device));
    if (config_.causal_draft) mask = mask.tril();
    in.mask = mask.view({1, 1, 1, l, l});
    x = x + draft_attn(draft_attn_norm(x), in, nullptr);
    x = x + draft_mlp(draft_mlp_norm(x));
  }
  auto out = x.view({M, l, d});
  return wanted < l ? out.narrow(1, 0, wanted) : out;
}

torch::Tensor SpecFormerImpl::Logits(const torch::Tensor& states) {
  TORCH_CHECK(head_.defined(), "SpecFormer: SetTargetWeights was not called");
  // The target's final RMSNorm, exactly as RMSNormImpl computes it, then its lm_head.
  torch::Tensor normed;
  if (!torch::GradMode::is_enabled() && CpuKernelsApply(states) &&
      CpuKernelsApply(head_norm_weight_)) {
    normed = RmsNormCpu(states, head_norm_weight_, head_norm_eps_);
  } else {
    auto xf = states.to(torch::kFloat);
    auto var = xf.pow(2).mean(-1, /*keepdim=*/true);
    normed = head_norm_weight_ * (xf * torch::rsqrt(var + head_norm_eps_)).to(states.scalar_type());
  }
  return head_(normed);
}

AttentionInputs SpecFormerImpl::DenseContextInputs(int64_t batch, int64_t seq_len) {
  AttentionInputs in;
  in.batch = batch;
  in.max_q = seq_len;
  in.max_k = seq_len;
  auto cs = RopeFor(torch::arange(seq_len, torch::kLong).repeat({batch}));
  in.cos = cs.first;
  in.sin = cs.second;
  in.mask =
      torch::ones({seq_len, seq_len},
                  torch::TensorOptions().dtype(torch::kBool).device(downsampler->weight.device()))
          .tril()
          .view({1, 1, 1, seq_len, seq_len});
  return in;
}

void SpecFormerImpl::InitWeights(uint64_t seed) {
  torch::NoGradGuard no_grad;
  torch::manual_seed(seed);
  for (auto& p : named_parameters()) {
    const std::string& name = p.key();
    auto& t = p.value();
    if (name.size() >= 5 && name.compare(name.size() - 5, 5, ".bias") == 0) {
      t.zero_();
    } else if (name.find("norm") != std::string::npos) {
      t.fill_(1.0);
    } else if (name.find("o_proj") != std::string::npos ||
               name.find("down_proj") != std::string::npos) {
      t.normal_(0.0, 0.02 / std::sqrt(2.0 * 2.0));  // two residual layers (context, draft)
    } else {
      t.normal_(0.0, 0.02);
    }
  }
}

PagedAttentionLayout SlotLayout(int64_t sequences, int64_t slots, bool causal,
                                std::vector<std::vector<int32_t>>& tables) {
  tables.assign(sequences, {});
  PagedAttentionLayout layout(slots, /*sliding_window=*/0);
  for (int64_t m = 0; m < sequences; ++m) {
    tables[m] = {static_cast<int32_t>(m)};
    if (causal) {
      layout.AddSequence(tables[m], /*cached=*/0, slots);
    } else {
      layout.AddBidirectionalBlock(tables[m], /*cached=*/0, slots);
    }
  }
  return layout;
}

Status SaveSpecFormerDir(SpecFormerImpl& model, const std::string& dir) {
  return SaveDrafterDir(model, dir, kSpecFormerKind, model.config().ToJson());
}

StatusOr<std::shared_ptr<SpecFormerImpl>> LoadSpecFormerDir(const std::string& dir,
                                                            const ModelConfig& target) {
  return LoadDrafterDir<SpecFormerImpl, SpecFormerConfig>(dir, target, "SpecFormer");
}

}  // namespace specula
