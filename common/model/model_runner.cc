#include "common/model/model_runner.h"

#include <torch/torch.h>

#include <atomic>
#include <filesystem>
#include <unordered_set>

#include "common/model/checkpoint.h"
#include "common/model/rope.h"
#include "common/model/transformer.h"
#include "common/util/mapped_file.h"

namespace specula {

SeqId NewSequenceId() {
  static std::atomic<SeqId> next{1};
  return next++;
}

namespace {

std::string ShapeString(const at::IntArrayRef& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

}  // namespace

struct ModelRunner::Impl {
  ModelConfig config;
  std::shared_ptr<CausalLMImpl> module;
  std::unique_ptr<PagedKvCache> kv;
  std::vector<LayerKvCache> layer_kv;
  torch::Device device{torch::kCPU};
  torch::ScalarType dtype = torch::kFloat;
  torch::Tensor inv_freq;  // on device

  Status Validate(const ForwardBatch& batch) const;
};

ModelRunner::ModelRunner(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
ModelRunner::~ModelRunner() = default;

Status LoadWeightsInto(torch::nn::Module& model, const std::string& model_dir) {
  ASSIGN_OR_RETURN(auto weights, LoadSafetensorsDir(model_dir));
  torch::NoGradGuard no_grad;
  for (auto& p : model.named_parameters()) {
    auto it = weights.find(p.key());
    if (it == weights.end()) {
      return InvalidArgumentError(StrCat(model_dir, ": checkpoint has no tensor '", p.key(), "'"));
    }
    const at::Tensor& src = it->second;
    if (src.sizes() != p.value().sizes()) {
      return InvalidArgumentError(StrCat(model_dir, ": tensor '", p.key(), "' has shape ",
                                         ShapeString(src.sizes()), " but config.json implies ",
                                         ShapeString(p.value().sizes())));
    }
    if (!at::isFloatingType(src.scalar_type())) {
      return InvalidArgumentError(StrCat(model_dir, ": tensor '", p.key(), "' has non-float dtype ",
                                         c10::toString(src.scalar_type())));
    }
    // Same dtype: share the (copy-on-write) mapping instead of copying.
    p.value().set_data(
        src.scalar_type() == p.value().scalar_type() ? src : src.to(p.value().scalar_type()));
  }
  return OkStatus();
}

Status SaveModelDir(CausalLMImpl& model, const ModelConfig& config, const std::string& dir) {
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) return InternalError(StrCat("cannot create ", dir, ": ", ec.message()));
  std::map<std::string, at::Tensor> weights;
  for (const auto& p : model.named_parameters()) weights[p.key()] = p.value().detach();
  RETURN_IF_ERROR(SaveSafetensorsFile((fs::path(dir) / "model.safetensors").string(), weights,
                                      {{"format", "pt"}}));
  return WriteStringToFile((fs::path(dir) / "config.json").string(), config.ToJson());
}

StatusOr<std::unique_ptr<ModelRunner>> ModelRunner::Load(const std::string& model_dir,
                                                         const ModelRunnerOptions& options) {
  const std::string config_path = (std::filesystem::path(model_dir) / "config.json").string();
  ASSIGN_OR_RETURN(ModelConfig config, ModelConfig::FromFile(config_path));
  std::shared_ptr<CausalLMImpl> module;
  try {
    module = std::make_shared<CausalLMImpl>(config);
  } catch (const c10::Error& e) {
    return InternalError(StrCat("cannot build model: ", e.what_without_backtrace()));
  }
  RETURN_IF_ERROR(LoadWeightsInto(*module, model_dir));
  return FromModule(std::move(module), options);
}

StatusOr<std::unique_ptr<ModelRunner>> ModelRunner::FromModule(std::shared_ptr<CausalLMImpl> module,
                                                               const ModelRunnerOptions& options) {
  auto impl = std::make_unique<Impl>();
  impl->config = module->config();
  bool dtype_ok = false;
  impl->dtype = ParseTorchDtype(options.dtype, &dtype_ok);
  if (!dtype_ok) {
    return InvalidArgumentError(
        StrCat("unknown dtype '", options.dtype, "' (use float32, bfloat16, float16)"));
  }
  try {
    impl->device = torch::Device(options.device);
  } catch (const c10::Error& e) {
    return InvalidArgumentError(
        StrCat("bad device '", options.device, "' (use cpu, cuda or cuda:N)"));
  }
  if (impl->device.is_cuda() && !torch::cuda::is_available()) {
    return FailedPreconditionError(StrCat(
        "device '", options.device, "' requested but this LibTorch has no usable CUDA device"));
  }
  // Half-precision kernels are device- and version-dependent (LibTorch 1.13 has no float16 matmul
  // on CPU): probe once so the user gets an error at load time, not from the first request.
  if (impl->dtype != torch::kFloat) {
    try {
      auto probe =
          torch::ones({2, 2}, torch::TensorOptions().dtype(impl->dtype).device(impl->device));
      (void)torch::matmul(probe, probe);
    } catch (const c10::Error&) {
      return InvalidArgumentError(StrCat("dtype '", options.dtype, "' is not supported on device '",
                                         options.device,
                                         "' by this LibTorch (use float32 or bfloat16)"));
    }
  }
  try {
    module->eval();
    module->to(impl->device, impl->dtype);
    impl->inv_freq = module->inv_freq.to(impl->device);
    ASSIGN_OR_RETURN(impl->kv, PagedKvCache::Create(
                                   impl->config.num_hidden_layers, impl->config.num_key_value_heads,
                                   impl->config.head_dim, impl->dtype, impl->device, options.kv));
  } catch (const c10::Error& e) {
    return InternalError(
        StrCat("cannot place model on ", options.device, ": ", e.what_without_backtrace()));
  }
  for (int64_t l = 0; l < impl->config.num_hidden_layers; ++l) {
    impl->layer_kv.push_back({impl->kv->keys(l), impl->kv->values(l)});
  }
  impl->module = std::move(module);
  return std::unique_ptr<ModelRunner>(new ModelRunner(std::move(impl)));
}

const ModelConfig& ModelRunner::config() const { return impl_->config; }
std::string ModelRunner::device_name() const { return impl_->device.str(); }
std::string ModelRunner::dtype_name() const {
  switch (impl_->dtype) {
    case torch::kBFloat16:
      return "bfloat16";
    case torch::kHalf:
      return "float16";
    default:
      return "float32";
  }
}
std::shared_ptr<CausalLMImpl> ModelRunner::module() const { return impl_->module; }

Status ModelRunner::AddSequence(SeqId seq) { return impl_->kv->allocator().AddSequence(seq); }
Status ModelRunner::ReleaseSequence(SeqId seq) { return impl_->kv->allocator().FreeSequence(seq); }
bool ModelRunner::HasSequence(SeqId seq) const { return impl_->kv->allocator().HasSequence(seq); }
int64_t ModelRunner::SequenceLength(SeqId seq) const { return impl_->kv->allocator().Length(seq); }
KvCacheStats ModelRunner::kv_stats() const { return impl_->kv->stats(); }
const PagedKvCache& ModelRunner::kv_cache() const { return *impl_->kv; }
int64_t ModelRunner::free_kv_positions() const {
  return impl_->kv->allocator().num_free_blocks() * impl_->kv->allocator().block_size();
}

Status ModelRunner::KeepOnly(SeqId seq, int64_t start, const std::vector<int64_t>& offsets) {
  return impl_->kv->KeepOnly(seq, start, offsets);
}

Status ModelRunner::Truncate(SeqId seq, int64_t length) {
  return impl_->kv->allocator().Truncate(seq, length);
}

Status ModelRunner::Impl::Validate(const ForwardBatch& batch) const {
  const int64_t L = config.num_hidden_layers;
  for (int64_t layer : batch.hidden_layers) {
    if (layer < 0 || layer > L) {
      return InvalidArgumentError(StrCat("hidden_layers: index ", layer, " outside [0, ", L, "]"));
    }
  }
  if (batch.seqs.empty()) return InvalidArgumentError("batch has no sequences");
  std::unordered_set<SeqId> seen;
  const BlockAllocator& alloc = kv->allocator();
  int64_t blocks_needed = 0;
  for (size_t b = 0; b < batch.seqs.size(); ++b) {
    const SequenceChunk& s = batch.seqs[b];
    auto err = [&](const std::string& what) {
      return InvalidArgumentError(StrCat("sequence ", s.seq, ": ", what));
    };
    if (!alloc.HasSequence(s.seq))
      return NotFoundError(StrCat("sequence ", s.seq, " was not added"));
    if (!seen.insert(s.seq).second) return err("appears twice in one batch");
    const int64_t n = static_cast<int64_t>(s.tokens.size());
    if (n == 0) return err("tokens is empty");
    const int64_t cached = alloc.Length(s.seq);
    if (cached + n > config.max_position_embeddings) {
      return OutOfRangeError(StrCat("sequence ", s.seq, ": ", cached + n,
                                    " tokens exceed the context length of ",
                                    config.max_position_embeddings));
    }
    for (int64_t i = 0; i < n; ++i) {
      if (s.tokens[i] < 0 || s.tokens[i] >= config.vocab_size) {
        return err(StrCat("tokens[", i, "] = ", s.tokens[i], " is outside the vocabulary [0, ",
                          config.vocab_size, ")"));
      }
    }
    if (!s.positions.empty()) {
      if (static_cast<int64_t>(s.positions.size()) != n)
        return err("positions and tokens differ in length");
      for (int64_t i = 0; i < n; ++i) {
        if (s.positions[i] < 0 || s.positions[i] >= config.max_position_embeddings) {
          return err(StrCat("positions[", i, "] = ", s.positions[i], " is outside [0, ",
                            config.max_position_embeddings, ")"));
        }
      }
    }
    if (!s.parents.empty()) {
      if (static_cast<int64_t>(s.parents.size()) != n)
        return err("parents and tokens differ in length");
      for (int64_t i = 0; i < n; ++i) {
        if (s.parents[i] < -1 || s.parents[i] >= i) {
          return err(
              StrCat("parents[", i, "] = ", s.parents[i], " must be -1 or an earlier index"));
        }
      }
    }
    if (s.logits == LogitsRows::kExplicit) {
      for (int32_t r : s.logit_rows) {
        if (r < 0 || r >= n) return err(StrCat("logit row ", r, " outside [0, ", n, ")"));
      }
    }
    blocks_needed += alloc.BlocksNeeded(s.seq, n);
  }
  if (blocks_needed > alloc.num_free_blocks()) {
    return ResourceExhaustedError(StrCat("KV cache full: the batch needs ", blocks_needed,
                                         " blocks, ", alloc.num_free_blocks(), " of ",
                                         alloc.num_blocks(), " are free"));
  }
  return OkStatus();
}

StatusOr<ForwardOutput> ModelRunner::Forward(const ForwardBatch& batch) {
  Impl& m = *impl_;
  RETURN_IF_ERROR(m.Validate(batch));
  BlockAllocator& alloc = m.kv->allocator();
  const int64_t B = static_cast<int64_t>(batch.seqs.size());

  // Reserve cache positions (validated to fit) and remember lengths for rollback on failure.
  std::vector<int64_t> old_len(B), new_len(B);
  std::vector<std::vector<int64_t>> write_slots(B);
  int64_t max_q = 0, max_k = 0, N = 0;
  for (int64_t b = 0; b < B; ++b) {
    const SequenceChunk& s = batch.seqs[b];
    old_len[b] = alloc.Length(s.seq);
    auto slots = alloc.Append(s.seq, static_cast<int64_t>(s.tokens.size()));
    if (!slots.ok()) {
      for (int64_t r = 0; r < b; ++r) (void)alloc.Truncate(batch.seqs[r].seq, old_len[r]);
      return slots.status();
    }
    write_slots[b] = std::move(*slots);
    new_len[b] = alloc.Length(s.seq);
    const int64_t n = static_cast<int64_t>(s.tokens.size());
    max_q = std::max(max_q, n);
    max_k = std::max(max_k, new_len[b]);
    N += n;
  }

  // Host-side layout: packed tokens, positions, scatter indices, gather slots and the mask.
  std::vector<int64_t> tokens(N), positions(N), q_index(N), writes(N), reads(B * max_k, 0),
      logit_rows;
  std::vector<uint8_t> mask(static_cast<size_t>(B * max_q * max_k), 0);
  ForwardOutput out;
  out.token_offset.push_back(0);
  out.logits_offset.push_back(0);
  const int64_t window = m.config.sliding_window.value_or(0);
  int64_t row = 0;
  for (int64_t b = 0; b < B; ++b) {
    const SequenceChunk& s = batch.seqs[b];
    const int64_t n = static_cast<int64_t>(s.tokens.size()), L = old_len[b];
    std::vector<int64_t> all_slots = alloc.Slots(s.seq);
    std::copy(all_slots.begin(), all_slots.end(), reads.begin() + b * max_k);
    std::vector<int64_t> pos(n);
    for (int64_t i = 0; i < n; ++i) pos[i] = s.positions.empty() ? L + i : s.positions[i];
    for (int64_t i = 0; i < n; ++i) {
      tokens[row + i] = s.tokens[i];
      positions[row + i] = pos[i];
      q_index[row + i] = b * max_q + i;
      writes[row + i] = write_slots[b][i];
      uint8_t* mrow = &mask[static_cast<size_t>((b * max_q + i) * max_k)];
      for (int64_t j = 0; j < L; ++j) mrow[j] = (window == 0 || pos[i] - j < window);
      if (s.parents.empty()) {
        for (int64_t j = 0; j <= i; ++j) mrow[L + j] = (window == 0 || pos[i] - pos[j] < window);
      } else {
        for (int64_t a = i; a >= 0; a = s.parents[a])
          mrow[L + a] = (window == 0 || pos[i] - pos[a] < window);
      }
    }
    for (int64_t i = n; i < max_q; ++i)
      mask[static_cast<size_t>((b * max_q + i) * max_k)] = 1;  // padding row
    switch (s.logits) {
      case LogitsRows::kLast:
        logit_rows.push_back(row + n - 1);
        break;
      case LogitsRows::kAll:
        for (int64_t i = 0; i < n; ++i) logit_rows.push_back(row + i);
        break;
      case LogitsRows::kNone:
        break;
      case LogitsRows::kExplicit:
        for (int32_t r : s.logit_rows) logit_rows.push_back(row + r);
        break;
    }
    row += n;
    out.token_offset.push_back(row);
    out.logits_offset.push_back(static_cast<int64_t>(logit_rows.size()));
  }

  try {
    torch::NoGradGuard no_grad;
    auto long_opts = torch::TensorOptions().dtype(torch::kLong);
    auto to_dev = [&](std::vector<int64_t>& v) {
      return torch::from_blob(v.data(), {(int64_t)v.size()}, long_opts).to(m.device);
    };
    AttentionInputs in;
    in.batch = B;
    in.max_q = max_q;
    in.max_k = max_k;
    auto pos_t = to_dev(positions);
    auto cs = RopeCosSin(m.inv_freq, pos_t, m.dtype);
    in.cos = cs.first;
    in.sin = cs.second;
    in.q_index = to_dev(q_index);
    in.write_slots = to_dev(writes);
    in.read_slots = to_dev(reads);
    in.mask = torch::from_blob(mask.data(), {B, 1, 1, max_q, max_k},
                               torch::TensorOptions().dtype(torch::kBool))
                  .to(m.device);
    auto result = m.module->forward(to_dev(tokens), in, &m.layer_kv, batch.hidden_layers);
    if (!logit_rows.empty()) {
      out.logits = m.module->Logits(result.last_hidden.index_select(0, to_dev(logit_rows)))
                       .to(torch::kFloat);
    } else {
      out.logits = torch::empty({0, m.config.vocab_size}, torch::kFloat);
    }
    out.hidden = std::move(result.hidden_states);
  } catch (const c10::Error& e) {
    for (int64_t b = 0; b < B; ++b) (void)alloc.Truncate(batch.seqs[b].seq, old_len[b]);
    return InternalError(StrCat("forward failed: ", e.what_without_backtrace()));
  }
  return out;
}

}  // namespace specula
