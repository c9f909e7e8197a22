#include "common/model/model_runner.h"

#include <torch/torch.h>

#include <atomic>
#include <filesystem>
#include <unordered_set>

#include "common/model/checkpoint.h"
#include "common/model/cpu_forward.h"
#include "common/model/draft_head.h"
#include "common/model/paged_attention.h"
#include "common/model/rope.h"
#include "common/model/transformer.h"
#include "common/util/mapped_file.h"

namespace specula {

SeqId NewSequenceId() {
  static std::atomic<SeqId> next{1};
  return next++;
}

namespace {

// A LibTorch error without its C++ backtrace; any other exception's what().
std::string ExceptionMessage(const std::exception& e) {
  if (const auto* c10 = dynamic_cast<const c10::Error*>(&e)) return c10->what_without_backtrace();
  return e.what();
}

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
  // RoPE cos/sin for every position [max_position_embeddings, head_dim], model dtype, on device:
  // a forward gathers its rows instead of recomputing them.
  torch::Tensor rope_cos, rope_sin;
  DraftHead head;  // set only by RestrictVocabulary: logits for a draft vocabulary
  std::unique_ptr<CpuForward> cpu_forward;  // float32 CPU, unless options.cpu_forward is false

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
    auto all_positions = torch::arange(impl->config.max_position_embeddings,
                                       torch::TensorOptions().dtype(torch::kLong))
                             .to(impl->device);
    std::tie(impl->rope_cos, impl->rope_sin) =
        RopeCosSin(impl->inv_freq, all_positions, impl->dtype);
    module->FuseForServing();
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
  if (options.cpu_forward && impl->device.is_cpu() && impl->dtype == torch::kFloat) {
    impl->cpu_forward = std::make_unique<CpuForward>(impl->config);
    impl->cpu_forward->UseDraftMatmul(options.draft_matmul);
    impl->cpu_forward->UsePackedWeights(options.packed_weights);
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
void ModelRunner::Synchronize() const {
  if (impl_->device.is_cuda()) torch::cuda::synchronize(impl_->device.index());
}
std::shared_ptr<CausalLMImpl> ModelRunner::module() const { return impl_->module; }

DraftMatmul ModelRunner::draft_matmul() const {
  return impl_->cpu_forward ? impl_->cpu_forward->draft_matmul() : DraftMatmul::kFloat32;
}

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
  return CommitPaths({{.seq = seq, .start = start, .offsets = offsets}});
}

Status ModelRunner::Truncate(SeqId seq, int64_t length) {
  return impl_->kv->allocator().Truncate(seq, length);
}

Status ModelRunner::RestrictVocabulary(const std::vector<int32_t>& tokens) {
  Impl& m = *impl_;
  if (tokens.empty()) {
    m.head = DraftHead();
    return OkStatus();
  }
  std::vector<bool> seen(m.config.vocab_size, false);
  for (size_t i = 0; i < tokens.size(); ++i) {
    const int32_t t = tokens[i];
    if (t < 0 || t >= m.config.vocab_size) {
      return InvalidArgumentError(StrCat("vocabulary restriction: token ", i, " is ", t,
                                         ", outside [0, ", m.config.vocab_size, ")"));
    }
    if (seen[t]) {
      return InvalidArgumentError(StrCat("vocabulary restriction: token ", t, " is repeated"));
    }
    seen[t] = true;
  }
  try {
    c10::InferenceMode inference;
    DraftHead head;
    head.Set(m.module->lm_head_weight());
    head.Restrict(tokens);
    m.head = std::move(head);
  } catch (const std::exception& e) {
    return InternalError(StrCat("vocabulary restriction failed: ", ExceptionMessage(e)));
  }
  return OkStatus();
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
  std::vector<int64_t> old_len(B);
  std::vector<std::pair<SeqId, int64_t>> growth(B);
  for (int64_t b = 0; b < B; ++b) {
    old_len[b] = alloc.Length(batch.seqs[b].seq);
    growth[b] = {batch.seqs[b].seq, static_cast<int64_t>(batch.seqs[b].tokens.size())};
  }
  auto appended = alloc.AppendAll(growth);
  if (!appended.ok()) return appended.status();
  auto rollback = [&] {
    for (int64_t b = 0; b < B; ++b) (void)alloc.Truncate(batch.seqs[b].seq, old_len[b]);
  };

  // Host-side layout: packed tokens, which cache positions each row sees, logits rows.
  PagedAttentionLayout layout(alloc.block_size(), m.config.sliding_window.value_or(0));
  std::vector<int64_t> tokens, logit_rows;
  ForwardOutput out;
  out.token_offset.push_back(0);
  out.logits_offset.push_back(0);
  int64_t row = 0;
  for (int64_t b = 0; b < B; ++b) {
    const SequenceChunk& s = batch.seqs[b];
    const int64_t n = static_cast<int64_t>(s.tokens.size());
    layout.AddSequence(alloc.BlockTable(s.seq), old_len[b], n, s.positions, s.parents);
    tokens.insert(tokens.end(), s.tokens.begin(), s.tokens.end());
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
    // Inference mode: no autograd bookkeeping (version counters, views) on any op of the forward.
    c10::InferenceMode inference;
    if (m.cpu_forward && m.cpu_forward->Applies(*m.module, row)) {
      CpuForward::Result result =
          m.cpu_forward->Run(*m.module, tokens, layout, m.rope_cos, m.rope_sin, m.layer_kv,
                             logit_rows, m.head, batch.hidden_layers);
      out.logits = std::move(result.logits);
      out.hidden = std::move(result.hidden);
      return out;
    }
    auto long_opts = torch::TensorOptions().dtype(torch::kLong);
    auto to_dev = [&](std::vector<int64_t>& v) {
      return torch::from_blob(v.data(), {(int64_t)v.size()}, long_opts).to(m.device);
    };
    auto positions = to_dev(const_cast<std::vector<int64_t>&>(layout.positions()));
    AttentionInputs in = MakePagedInputs(layout, m.rope_cos.index_select(0, positions),
                                         m.rope_sin.index_select(0, positions));
    auto result = m.module->forward(to_dev(tokens), in, &m.layer_kv, batch.hidden_layers);
    if (!logit_rows.empty()) {
      auto rows = static_cast<int64_t>(logit_rows.size()) == row
                      ? result.last_hidden
                      : result.last_hidden.index_select(0, to_dev(logit_rows));
      out.logits = (m.head.restricted() ? m.head(rows) : m.module->Logits(rows)).to(torch::kFloat);
    } else {
      out.logits = torch::empty({0, m.config.vocab_size}, torch::kFloat);
    }
    out.hidden = std::move(result.hidden_states);
  } catch (const std::exception& e) {
    rollback();
    return InternalError(StrCat("forward failed: ", ExceptionMessage(e)));
  }
  return out;
}

Status ModelRunner::CommitPaths(const std::vector<PathCommit>& commits) {
  try {
    return impl_->kv->KeepOnlyAll(commits);
  } catch (const std::exception& e) {
    return InternalError(StrCat("KV commit failed: ", ExceptionMessage(e)));
  }
}

}  // namespace specula
