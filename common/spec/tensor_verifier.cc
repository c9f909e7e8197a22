#include "common/spec/tensor_verifier.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <limits>

namespace specula {
namespace {

at::Tensor Int64OnDevice(const std::vector<int64_t>& v, const at::Device& device) {
  return at::tensor(v, at::TensorOptions().dtype(at::kLong)).to(device);
}

Status ValidateJob(const TreeVerifyJob& job, int64_t rows, int64_t vocab) {
  if (job.tree == nullptr) return InvalidArgumentError("verify job has no tree");
  constexpr int32_t kUnlimited = std::numeric_limits<int32_t>::max();
  RETURN_IF_ERROR(job.tree->Validate(static_cast<int32_t>(vocab), kUnlimited, kUnlimited));
  RETURN_IF_ERROR(job.sampling.Validate());
  if (job.first_row < 0 || job.first_row + job.tree->size() + 1 > rows) {
    return InvalidArgumentError(StrCat("verify job rows [", job.first_row, ", ",
                                       job.first_row + job.tree->size() + 1,
                                       ") are outside the step's ", rows, " logits rows"));
  }
  if (!job.sampling.greedy() && job.rng == nullptr) {
    return InvalidArgumentError("a sampled verify job needs a random stream");
  }
  return OkStatus();
}

// Greedy: the target's argmax at every row of every job, then a walk over token ids.
void VerifyGreedyJobs(const at::Tensor& logits, std::span<const TreeVerifyJob> jobs,
                      const std::vector<size_t>& which,
                      std::vector<StatusOr<VerifyResult>>& results) {
  std::vector<int64_t> rows;
  for (size_t j : which) {
    for (int64_t r = 0; r <= jobs[j].tree->size(); ++r) rows.push_back(jobs[j].first_row + r);
  }
  const at::Tensor best =
      logits.index_select(0, Int64OnDevice(rows, logits.device())).argmax(1).to(at::kInt).cpu();
  const int32_t* argmax = best.data_ptr<int32_t>();
  for (size_t j : which) {
    const CandidateTree& tree = *jobs[j].tree;
    VerifyResult result;
    int32_t node = -1;
    while (true) {
      const int32_t target = argmax[node + 1];
      int32_t next = -1;
      for (int32_t child : tree.Children(node)) {
        if (tree.token(child) == target) {
          next = child;
          break;
        }
      }
      if (next < 0) {
        result.bonus_token = target;
        break;
      }
      result.accepted_nodes.push_back(next);
      node = next;
    }
    argmax += tree.size() + 1;
    results[j] = std::move(result);
  }
}

// Draws one token per row of `probs` ([S, V], rows summing to a positive total) with the uniforms
// `u` ([S]): the first token whose cumulative mass exceeds u * total (SampleFrom's rule).
at::Tensor SampleRows(const at::Tensor& probs, const at::Tensor& u) {
  const at::Tensor cum = probs.cumsum(1);
  const at::Tensor target = (u * cum.select(1, -1)).unsqueeze(1);
  at::Tensor idx = at::searchsorted(cum, target, /*out_int32=*/false, /*right=*/true).squeeze(1);
  // Rounding can put the target past the last sum: take the last token with mass.
  const at::Tensor positions =
      at::arange(probs.size(1), probs.options().dtype(at::kLong)).unsqueeze(0);
  const at::Tensor last = (positions * (probs > 0).to(at::kLong)).amax(1);
  return at::minimum(idx, last);
}

// Every tree is a chain (at most one child per node): Leviathan et al.'s rule for all depths at
// once. The acceptance tests need only the target's and the proposal's probability of each drafted
// token, so the only full-vocabulary work is the residual of the one row where each chain stops.
void VerifyChains(std::span<const TreeVerifyJob> jobs, const std::vector<size_t>& which,
                  const at::Tensor& P, const at::Tensor& Q, const at::Tensor& uniforms,
                  const std::vector<double>& bonus_u, int64_t max_slots, int64_t max_dists,
                  int64_t max_depth, std::vector<StatusOr<VerifyResult>>& results) {
  const at::Device device = P.device();
  const int64_t S = static_cast<int64_t>(which.size());
  const int64_t V = P.size(1);
  const int64_t D = std::max<int64_t>(max_depth, 1);
  // Per job and depth d (0-based): the drafted node, the slot of the row that judges it (its
  // parent's), the flat index of its token in that row and in its proposal, and its uniform.
  std::vector<std::vector<int32_t>> chain(S);
  std::vector<int64_t> p_index(S * D, 0), q_index(S * D, 0), u_index(S * D, 0), length(S, 0);
  std::vector<uint8_t> sampled(S * D, 0), valid(S * D, 0);
  for (int64_t s = 0; s < S; ++s) {
    const CandidateTree& tree = *jobs[which[s]].tree;
    int32_t node = -1;
    // Follow the unique child down.
    for (std::vector<int32_t> kids = tree.Children(node); !kids.empty();
         kids = tree.Children(node)) {
      node = kids[0];
      chain[s].push_back(node);
    }
    length[s] = static_cast<int64_t>(chain[s].size());
    for (int64_t d = 0; d < length[s]; ++d) {
      const int32_t n = chain[s][d];
      const int64_t parent_slot = d == 0 ? 0 : chain[s][d - 1] + 1;
      const int64_t k = s * D + d;
      p_index[k] = (s * max_slots + parent_slot) * V + tree.token(n);
      sampled[k] = tree.proposal(n) >= 0;
      q_index[k] = (s * max_dists + std::max(tree.proposal(n), 0)) * V + tree.token(n);
      u_index[k] = s * max_slots + n + 1;
      valid[k] = 1;
    }
  }
  const auto i64 = at::TensorOptions().dtype(at::kLong);
  const auto as_bool = [&](const std::vector<uint8_t>& v, int64_t columns) {
    return at::tensor(std::vector<int64_t>(v.begin(), v.end()), i64)
               .to(device)
               .view({S, columns}) != 0;
  };
  const at::Tensor px = P.view({-1}).index_select(0, Int64OnDevice(p_index, device)).view({S, D});
  const at::Tensor qx =
      at::where(as_bool(sampled, D),
                Q.view({-1}).index_select(0, Int64OnDevice(q_index, device)).view({S, D}),
                at::ones({S, D}, px.options()));
  const at::Tensor u = uniforms.index_select(0, Int64OnDevice(u_index, device)).view({S, D});
  // Accept depth d with probability min(1, p[x] / q[x]); the run of acceptances from the root.
  const at::Tensor accept = as_bool(valid, D) & (u * qx < px);
  const at::Tensor accepted = accept.to(at::kLong).cumprod(1).sum(1);  // [S]
  const at::Tensor host_accepted = accepted.cpu();
  const auto n_accepted = host_accepted.accessor<int64_t, 1>();
  // The row each chain stops at, and the node it rejected there (if any).
  std::vector<int64_t> stop_row(S), rejected_q(S, 0);
  std::vector<uint8_t> rejected(S, 0), rejected_sampled(S, 0);
  std::vector<int64_t> rejected_token(S, 0);
  for (int64_t s = 0; s < S; ++s) {
    const CandidateTree& tree = *jobs[which[s]].tree;
    const int64_t a = n_accepted[s];
    stop_row[s] = s * max_slots + (a == 0 ? 0 : chain[s][a - 1] + 1);
    if (a < length[s]) {
      const int32_t n = chain[s][a];
      rejected[s] = 1;
      rejected_token[s] = tree.token(n);
      rejected_sampled[s] = tree.proposal(n) >= 0;
      rejected_q[s] = s * max_dists + std::max(tree.proposal(n), 0);
    }
  }
  // r = max(0, p - q) renormalised after a rejection (p itself if rounding empties it), else p.
  const at::Tensor p = P.index_select(0, Int64OnDevice(stop_row, device));
  const at::Tensor token = Int64OnDevice(rejected_token, device).unsqueeze(1);
  const at::Tensor q =
      at::where(as_bool(rejected_sampled, 1), Q.index_select(0, Int64OnDevice(rejected_q, device)),
                at::zeros_like(p).scatter_(1, token, 1.0));
  const at::Tensor residual = (p - q).clamp_min(0.0);
  const at::Tensor total = residual.sum(1, /*keepdim=*/true);
  const at::Tensor use_residual = as_bool(rejected, 1) & (total > 0);
  const at::Tensor r = at::where(use_residual, residual / total.clamp_min(1e-300), p);
  const at::Tensor host_bonus =
      SampleRows(
          r,
          at::tensor(bonus_u, at::TensorOptions().dtype(at::kDouble)).to(device, r.scalar_type()))
          .cpu();
  const auto bonus = host_bonus.accessor<int64_t, 1>();
  for (int64_t s = 0; s < S; ++s) {
    VerifyResult result;
    result.accepted_nodes.assign(chain[s].begin(), chain[s].begin() + n_accepted[s]);
    result.bonus_token = static_cast<int32_t>(bonus[s]);
    results[which[s]] = std::move(result);
  }
}

// Sampled: recursive rejection sampling (SpecInfer's multi-candidate rule; Leviathan et al.'s
// for a chain) over every job's tree in lockstep. State per job: the node it stands at, the
// residual distribution r of that node's target row, and whether it is still walking.
void VerifySampledJobs(const at::Tensor& logits, std::span<const TreeVerifyJob> jobs,
                       const std::vector<size_t>& which,
                       std::vector<StatusOr<VerifyResult>>& results) {
  const at::Device device = logits.device();
  const int64_t S = static_cast<int64_t>(which.size());
  const int64_t V = logits.size(1);
  // Host tables, flattened per job: slot 0 is the root (-1), slot n + 1 is node n.
  int64_t max_slots = 1, max_children = 0, max_depth = 0, max_dists = 1;
  for (size_t j : which) {
    const CandidateTree& tree = *jobs[j].tree;
    max_slots = std::max<int64_t>(max_slots, tree.size() + 1);
    max_depth = std::max<int64_t>(max_depth, tree.max_depth());
    max_dists = std::max<int64_t>(max_dists, tree.num_distributions());
    std::vector<int64_t> count(tree.size() + 1, 0);
    for (int32_t i = 0; i < tree.size(); ++i) {
      max_children = std::max(max_children, ++count[tree.parent(i) + 1]);
    }
  }
  const int64_t C = std::max<int64_t>(max_children, 1);
  std::vector<int64_t> rows(S * max_slots), kids(S * max_slots * C, -1), tokens(S * max_slots, 0),
      proposal(S * max_slots, -1);
  std::vector<double> uniforms(S * max_slots, 0.0), bonus_u(S), temperature, top_p;
  std::vector<int64_t> top_k;
  std::vector<int64_t> q_index;  // flat [S * max_dists * V] positions of the proposals' entries
  std::vector<float> q_value;
  for (int64_t s = 0; s < S; ++s) {
    const TreeVerifyJob& job = jobs[which[s]];
    const CandidateTree& tree = *job.tree;
    std::vector<int64_t> filled(tree.size() + 1, 0);
    for (int64_t slot = 0; slot < max_slots; ++slot) {
      // Padding slots repeat the root's row; no walk reaches them.
      rows[s * max_slots + slot] = job.first_row + (slot <= tree.size() ? slot : 0);
    }
    for (int32_t i = 0; i < tree.size(); ++i) {
      const int64_t parent_slot = tree.parent(i) + 1;
      kids[(s * max_slots + parent_slot) * C + filled[parent_slot]++] = i;
      tokens[s * max_slots + i + 1] = tree.token(i);
      proposal[s * max_slots + i + 1] = tree.proposal(i);
    }
    for (int32_t i = 0; i < tree.size(); ++i) uniforms[s * max_slots + i + 1] = job.rng->Uniform();
    bonus_u[s] = job.rng->Uniform();
    for (int32_t d = 0; d < tree.num_distributions(); ++d) {
      // Dense proposals bring every entry, sparse ones (top-k over the wire) only their support.
      const std::span<const float> q = tree.distribution(d);
      const std::span<const int32_t> ids = tree.distribution_ids(d);
      const int64_t row = (s * max_dists + d) * V;
      for (size_t e = 0; e < q.size(); ++e) {
        q_index.push_back(row + (ids.empty() ? static_cast<int64_t>(e) : ids[e]));
        q_value.push_back(q[e]);
      }
    }
    for (int64_t slot = 0; slot < max_slots; ++slot) {
      temperature.push_back(job.sampling.temperature);
      top_k.push_back(job.sampling.top_k);
      top_p.push_back(job.sampling.top_p);
    }
  }
  const auto f64 = at::TensorOptions().dtype(at::kDouble);
  // Target distributions of every slot: [S * max_slots, V].
  const at::Tensor P = ShapedProbabilities(logits.index_select(0, Int64OnDevice(rows, device)),
                                           temperature, top_k, top_p);
  // Proposals, normalised to sum 1 (the host verifier's Normalize): [S * max_dists, V].
  // Only the proposals' entries cross to the device; the dense rows are built there.
  at::Tensor Q = at::zeros({S * max_dists * V}, P.options());
  if (!q_index.empty()) {
    Q.index_put_(
        {Int64OnDevice(q_index, device)},
        at::tensor(q_value, at::TensorOptions().dtype(at::kFloat)).to(device, Q.scalar_type()));
  }
  Q = Q.view({S * max_dists, V});
  Q = Q / Q.sum(1, /*keepdim=*/true).clamp_min(std::numeric_limits<double>::min());
  const at::Tensor kids_t = Int64OnDevice(kids, device);
  const at::Tensor tokens_t = Int64OnDevice(tokens, device);
  const at::Tensor proposal_t = Int64OnDevice(proposal, device);
  const at::Tensor u_t = at::tensor(uniforms, f64).to(device, P.scalar_type());
  const at::Tensor job_base = at::arange(S, f64.dtype(at::kLong)).to(device) * max_slots;
  const at::Tensor dist_base = at::arange(S, f64.dtype(at::kLong)).to(device) * max_dists;

  if (max_children <= 1) {
    VerifyChains(jobs, which, P, Q, u_t, bonus_u, max_slots, max_dists, max_depth, results);
    return;
  }
  at::Tensor slot = at::zeros({S}, f64.dtype(at::kLong)).to(device);  // where each job stands
  at::Tensor walking = at::ones({S}, f64.dtype(at::kBool)).to(device);
  at::Tensor r = P.index_select(0, job_base);
  at::Tensor final_r = r.clone();
  std::vector<at::Tensor> path;  // per level: the accepted node, or -1
  for (int64_t level = 0; level <= max_depth; ++level) {
    const at::Tensor children = kids_t.view({S * max_slots, C}).index_select(0, job_base + slot);
    at::Tensor trying = walking.clone();
    at::Tensor chosen = at::full({S}, -1, f64.dtype(at::kLong)).to(device);
    for (int64_t c = 0; c < C; ++c) {
      const at::Tensor child = children.select(1, c);
      const at::Tensor valid = trying & (child >= 0);
      const at::Tensor child_slot = job_base + child.clamp_min(-1) + 1;
      const at::Tensor x = tokens_t.index_select(0, child_slot).unsqueeze(1);
      const at::Tensor j = proposal_t.index_select(0, child_slot);
      // q: the child's proposal, or a point mass at its token for a deterministic child.
      const at::Tensor point = at::zeros_like(r).scatter_(1, x, 1.0);
      const at::Tensor sampled = Q.index_select(0, dist_base + j.clamp_min(0));
      const at::Tensor q = at::where((j >= 0).unsqueeze(1), sampled, point);
      const at::Tensor rx = r.gather(1, x).squeeze(1);
      const at::Tensor qx = q.gather(1, x).squeeze(1);
      // Accept with probability min(1, r[x] / q[x]).
      const at::Tensor accept = valid & (u_t.index_select(0, child_slot) * qx < rx);
      const at::Tensor reject = valid & ~accept;
      // On rejection r becomes max(0, r - q) renormalised (kept as it is if rounding empties it).
      const at::Tensor residual = (r - q).clamp_min(0.0);
      const at::Tensor total = residual.sum(1, /*keepdim=*/true);
      const at::Tensor next_r = at::where(total > 0, residual / total.clamp_min(1e-300), r);
      r = at::where(reject.unsqueeze(1), next_r, r);
      chosen = at::where(accept, child, chosen);
      trying = trying & ~accept;
    }
    const at::Tensor stops = walking & (chosen < 0);
    final_r = at::where(stops.unsqueeze(1), r, final_r);
    walking = walking & (chosen >= 0);
    path.push_back(at::where(walking, chosen, at::full_like(chosen, -1)));
    slot = at::where(walking, chosen + 1, slot);
    r = at::where(walking.unsqueeze(1), P.index_select(0, job_base + slot), r);
  }
  const at::Tensor bonus =
      SampleRows(final_r, at::tensor(bonus_u, f64).to(device, P.scalar_type()));
  const at::Tensor host_path = at::stack(path).cpu();  // [levels, S]
  const at::Tensor host_bonus = bonus.cpu();
  const auto path_a = host_path.accessor<int64_t, 2>();
  const auto bonus_a = host_bonus.accessor<int64_t, 1>();
  for (int64_t s = 0; s < S; ++s) {
    VerifyResult result;
    for (int64_t level = 0; level < host_path.size(0); ++level) {
      if (path_a[level][s] < 0) break;
      result.accepted_nodes.push_back(static_cast<int32_t>(path_a[level][s]));
    }
    result.bonus_token = static_cast<int32_t>(bonus_a[s]);
    results[which[s]] = std::move(result);
  }
}

}  // namespace

at::Tensor ShapedProbabilities(const at::Tensor& logits, const std::vector<double>& temperature,
                               const std::vector<int64_t>& top_k,
                               const std::vector<double>& top_p) {
  const at::Device device = logits.device();
  const int64_t V = logits.size(1);
  const auto f64 = at::TensorOptions().dtype(at::kDouble);
  // float32: [rows, vocab] float64 tensors of a large vocabulary would cost gigabytes on a device,
  // and on a CPU float32's vectorised exp is what makes this cheaper than the host loops
  // (docs/BENCHMARKS.md). Probabilities agree with the host oracle's float64 to ~1e-7.
  const at::ScalarType type = at::kFloat;
  const at::Tensor inv_t = (1.0 / at::tensor(temperature, f64)).to(device, type).unsqueeze(1);
  const at::Tensor l = logits.to(type);
  const bool truncates =
      std::any_of(top_k.begin(), top_k.end(), [&](int64_t k) { return k > 0 && k < V; }) ||
      std::any_of(top_p.begin(), top_p.end(), [](double p) { return p < 1.0; });
  if (!truncates) {
    const at::Tensor e = ((l - std::get<0>(l.max(1, /*keepdim=*/true))) * inv_t).exp();
    return e / e.sum(1, /*keepdim=*/true);
  }
  // In order of decreasing logit, ties to the lower id (a stable sort), as Probabilities() ranks.
  auto [sorted, order] = l.sort(/*stable=*/true, /*dim=*/1, /*descending=*/true);
  std::vector<int64_t> keep_k(top_k.size());
  for (size_t i = 0; i < top_k.size(); ++i) keep_k[i] = top_k[i] > 0 && top_k[i] < V ? top_k[i] : V;
  const at::Tensor rank = at::arange(V, f64.dtype(at::kLong)).to(device).unsqueeze(0);
  at::Tensor kept = rank < Int64OnDevice(keep_k, device).unsqueeze(1);
  at::Tensor e = ((sorted - sorted.select(1, 0).unsqueeze(1)) * inv_t).exp() * kept;
  // top-p: keep the smallest prefix whose mass reaches top_p, i.e. the ranks whose mass before
  // them is still below it.
  const at::Tensor p_limit = at::tensor(top_p, f64).to(device, type).unsqueeze(1);
  const at::Tensor cum = (e / e.sum(1, /*keepdim=*/true)).cumsum(1);
  const at::Tensor before =
      at::cat({at::zeros_like(cum.narrow(1, 0, 1)), cum.narrow(1, 0, V - 1)}, 1);
  kept = kept & ((before < p_limit) | (p_limit >= 1.0));
  e = e * kept;
  const at::Tensor p_sorted = e / e.sum(1, /*keepdim=*/true);
  return at::zeros_like(p_sorted).scatter_(1, order, p_sorted);
}

std::vector<StatusOr<VerifyResult>> VerifyTreesOnTensors(const at::Tensor& logits,
                                                         std::span<const TreeVerifyJob> jobs) {
  std::vector<StatusOr<VerifyResult>> results(jobs.size(), InternalError("not verified"));
  if (logits.dim() != 2 || logits.scalar_type() != at::kFloat) {
    for (auto& r : results)
      r = InvalidArgumentError("logits must be a float32 [rows, vocab] tensor");
    return results;
  }
  std::vector<size_t> greedy, sampled;
  for (size_t j = 0; j < jobs.size(); ++j) {
    Status valid = ValidateJob(jobs[j], logits.size(0), logits.size(1));
    if (!valid.ok()) {
      results[j] = valid.WithContext("verification");
      continue;
    }
    (jobs[j].sampling.greedy() ? greedy : sampled).push_back(j);
  }
  if (!greedy.empty()) VerifyGreedyJobs(logits, jobs, greedy, results);
  if (!sampled.empty()) VerifySampledJobs(logits, jobs, sampled, results);
  return results;
}

}  // namespace specula
