#include "common/model/model_config.h"

#include <nlohmann/json.hpp>

#include "common/util/mapped_file.h"

namespace specula {
namespace {

using nlohmann::json;

// Reads an integer field; `required` decides between an error and keeping the default.
Status ReadInt(const json& j, const char* key, bool required, int64_t* out, std::string_view src) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) {
    if (required) return InvalidArgumentError(StrCat(src, ": missing required field '", key, "'"));
    return OkStatus();
  }
  if (!it->is_number_integer()) {
    return InvalidArgumentError(StrCat(src, ": field '", key, "' must be an integer"));
  }
  *out = it->get<int64_t>();
  return OkStatus();
}

Status ReadDouble(const json& j, const char* key, double* out, std::string_view src) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return OkStatus();
  if (!it->is_number())
    return InvalidArgumentError(StrCat(src, ": field '", key, "' must be a number"));
  *out = it->get<double>();
  return OkStatus();
}

Status ReadBool(const json& j, const char* key, bool* out, std::string_view src) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return OkStatus();
  if (!it->is_boolean())
    return InvalidArgumentError(StrCat(src, ": field '", key, "' must be a boolean"));
  *out = it->get<bool>();
  return OkStatus();
}

}  // namespace

std::string_view ArchitectureName(Architecture arch) {
  switch (arch) {
    case Architecture::kLlama:
      return "llama";
    case Architecture::kQwen2:
      return "qwen2";
    case Architecture::kQwen3:
      return "qwen3";
    case Architecture::kMistral:
      return "mistral";
  }
  return "unknown";
}

StatusOr<ModelConfig> ModelConfig::FromFile(const std::string& path) {
  ASSIGN_OR_RETURN(std::string text, ReadFileToString(path));
  return FromJson(text, path);
}

StatusOr<ModelConfig> ModelConfig::FromJson(std::string_view text, std::string_view src) {
  json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    return InvalidArgumentError(StrCat(src, ": not a valid JSON object"));
  }
  ModelConfig c;
  auto mt = j.find("model_type");
  if (mt == j.end() || !mt->is_string()) {
    return InvalidArgumentError(StrCat(src, ": missing required field 'model_type'"));
  }
  c.model_type = mt->get<std::string>();
  if (c.model_type == "llama") {
    c.arch = Architecture::kLlama;
  } else if (c.model_type == "qwen2") {
    c.arch = Architecture::kQwen2;
    c.qkv_bias = true;
  } else if (c.model_type == "qwen3") {
    c.arch = Architecture::kQwen3;
    c.qk_norm = true;
  } else if (c.model_type == "mistral") {
    c.arch = Architecture::kMistral;
  } else {
    return UnimplementedError(
        StrCat(src, ": model_type '", c.model_type,
               "' is not supported (supported: llama, qwen2, qwen3, mistral)"));
  }
  RETURN_IF_ERROR(ReadInt(j, "vocab_size", true, &c.vocab_size, src));
  RETURN_IF_ERROR(ReadInt(j, "hidden_size", true, &c.hidden_size, src));
  RETURN_IF_ERROR(ReadInt(j, "intermediate_size", true, &c.intermediate_size, src));
  RETURN_IF_ERROR(ReadInt(j, "num_hidden_layers", true, &c.num_hidden_layers, src));
  RETURN_IF_ERROR(ReadInt(j, "num_attention_heads", true, &c.num_attention_heads, src));
  c.num_key_value_heads = c.num_attention_heads;
  RETURN_IF_ERROR(ReadInt(j, "num_key_value_heads", false, &c.num_key_value_heads, src));
  c.head_dim = 0;
  RETURN_IF_ERROR(ReadInt(j, "head_dim", false, &c.head_dim, src));
  if (c.head_dim == 0 && c.num_attention_heads > 0) {
    if (c.hidden_size % c.num_attention_heads != 0) {
      return InvalidArgumentError(StrCat(src, ": hidden_size (", c.hidden_size,
                                         ") is not a multiple of num_attention_heads (",
                                         c.num_attention_heads, ") and no head_dim is given"));
    }
    c.head_dim = c.hidden_size / c.num_attention_heads;
  }
  RETURN_IF_ERROR(ReadInt(j, "max_position_embeddings", false, &c.max_position_embeddings, src));
  RETURN_IF_ERROR(ReadDouble(j, "rms_norm_eps", &c.rms_norm_eps, src));
  RETURN_IF_ERROR(ReadDouble(j, "rope_theta", &c.rope_theta, src));
  RETURN_IF_ERROR(ReadBool(j, "tie_word_embeddings", &c.tie_word_embeddings, src));
  if (c.arch == Architecture::kLlama || c.arch == Architecture::kQwen3) {
    bool attention_bias = false;
    RETURN_IF_ERROR(ReadBool(j, "attention_bias", &attention_bias, src));
    c.qkv_bias = attention_bias;
    c.o_bias = attention_bias;
  }
  if (c.arch == Architecture::kMistral) {
    int64_t window = 0;
    RETURN_IF_ERROR(ReadInt(j, "sliding_window", false, &window, src));
    if (window > 0) c.sliding_window = window;
  }
  if (c.arch == Architecture::kQwen2) {
    bool use_sliding = false;
    RETURN_IF_ERROR(ReadBool(j, "use_sliding_window", &use_sliding, src));
    if (use_sliding) {
      return UnimplementedError(
          StrCat(src, ": use_sliding_window=true is not supported for qwen2"));
    }
  }
  auto rs = j.find("rope_scaling");
  if (rs != j.end() && !rs->is_null()) {
    if (!rs->is_object())
      return InvalidArgumentError(StrCat(src, ": field 'rope_scaling' must be an object"));
    std::string type;
    if (rs->contains("rope_type") && (*rs)["rope_type"].is_string()) {
      type = (*rs)["rope_type"].get<std::string>();
    } else if (rs->contains("type") && (*rs)["type"].is_string()) {
      type = (*rs)["type"].get<std::string>();
    }
    if (type == "llama3" || type == "linear") {
      c.rope_scaling.type = type;
      RETURN_IF_ERROR(ReadDouble(*rs, "factor", &c.rope_scaling.factor, src));
      RETURN_IF_ERROR(ReadDouble(*rs, "low_freq_factor", &c.rope_scaling.low_freq_factor, src));
      RETURN_IF_ERROR(ReadDouble(*rs, "high_freq_factor", &c.rope_scaling.high_freq_factor, src));
      RETURN_IF_ERROR(ReadInt(*rs, "original_max_position_embeddings", false,
                              &c.rope_scaling.original_max_position_embeddings, src));
    } else if (type != "default" && !type.empty()) {
      return UnimplementedError(
          StrCat(src, ": rope_scaling.rope_type '", type, "' is not supported"));
    }
  }
  int64_t bos = -1;
  RETURN_IF_ERROR(ReadInt(j, "bos_token_id", false, &bos, src));
  if (bos >= 0) c.bos_token_id = static_cast<int32_t>(bos);
  auto eos = j.find("eos_token_id");
  if (eos != j.end() && !eos->is_null()) {
    if (eos->is_number_integer()) {
      c.eos_token_ids.push_back(eos->get<int32_t>());
    } else if (eos->is_array()) {
      for (const auto& e : *eos) {
        if (!e.is_number_integer()) {
          return InvalidArgumentError(StrCat(src, ": field 'eos_token_id' must hold integers"));
        }
        c.eos_token_ids.push_back(e.get<int32_t>());
      }
    } else {
      return InvalidArgumentError(
          StrCat(src, ": field 'eos_token_id' must be an integer or a list"));
    }
  }
  auto dt = j.find("torch_dtype");
  if (dt != j.end() && dt->is_string()) c.torch_dtype = dt->get<std::string>();
  RETURN_IF_ERROR(c.Validate(src));
  return c;
}

Status ModelConfig::Validate(std::string_view src) const {
  auto positive = [&](int64_t v, const char* name) -> Status {
    if (v <= 0)
      return InvalidArgumentError(StrCat(src, ": field '", name, "' must be positive, got ", v));
    return OkStatus();
  };
  RETURN_IF_ERROR(positive(vocab_size, "vocab_size"));
  RETURN_IF_ERROR(positive(hidden_size, "hidden_size"));
  RETURN_IF_ERROR(positive(intermediate_size, "intermediate_size"));
  RETURN_IF_ERROR(positive(num_hidden_layers, "num_hidden_layers"));
  RETURN_IF_ERROR(positive(num_attention_heads, "num_attention_heads"));
  RETURN_IF_ERROR(positive(num_key_value_heads, "num_key_value_heads"));
  RETURN_IF_ERROR(positive(head_dim, "head_dim"));
  RETURN_IF_ERROR(positive(max_position_embeddings, "max_position_embeddings"));
  if (num_attention_heads % num_key_value_heads != 0) {
    return InvalidArgumentError(StrCat(src, ": num_attention_heads (", num_attention_heads,
                                       ") must be a multiple of num_key_value_heads (",
                                       num_key_value_heads, ")"));
  }
  if (head_dim % 2 != 0)
    return InvalidArgumentError(StrCat(src, ": head_dim must be even for RoPE"));
  if (rms_norm_eps <= 0)
    return InvalidArgumentError(StrCat(src, ": field 'rms_norm_eps' must be positive"));
  return OkStatus();
}

std::string ModelConfig::ToJson() const {
  json j;
  static const char* kArchClass[] = {"LlamaForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM",
                                     "MistralForCausalLM"};
  j["architectures"] = {kArchClass[static_cast<int>(arch)]};
  j["model_type"] = std::string(ArchitectureName(arch));
  j["vocab_size"] = vocab_size;
  j["hidden_size"] = hidden_size;
  j["intermediate_size"] = intermediate_size;
  j["num_hidden_layers"] = num_hidden_layers;
  j["num_attention_heads"] = num_attention_heads;
  j["num_key_value_heads"] = num_key_value_heads;
  j["head_dim"] = head_dim;
  j["max_position_embeddings"] = max_position_embeddings;
  j["rms_norm_eps"] = rms_norm_eps;
  j["rope_theta"] = rope_theta;
  j["tie_word_embeddings"] = tie_word_embeddings;
  j["hidden_act"] = "silu";
  j["torch_dtype"] = torch_dtype;
  if (arch == Architecture::kLlama || arch == Architecture::kQwen3) j["attention_bias"] = qkv_bias;
  if (sliding_window) j["sliding_window"] = *sliding_window;
  if (bos_token_id) j["bos_token_id"] = *bos_token_id;
  if (eos_token_ids.size() == 1) j["eos_token_id"] = eos_token_ids[0];
  if (eos_token_ids.size() > 1) j["eos_token_id"] = eos_token_ids;
  if (!rope_scaling.type.empty()) {
    j["rope_scaling"] = {
        {"rope_type", rope_scaling.type},
        {"factor", rope_scaling.factor},
        {"low_freq_factor", rope_scaling.low_freq_factor},
        {"high_freq_factor", rope_scaling.high_freq_factor},
        {"original_max_position_embeddings", rope_scaling.original_max_position_embeddings}};
  }
  return j.dump(2) + "\n";
}

int64_t ModelConfig::num_parameters() const {
  const int64_t d = hidden_size, q = num_attention_heads * head_dim,
                kv = num_key_value_heads * head_dim;
  int64_t per_layer = d * q + 2 * d * kv + q * d + 3 * d * intermediate_size + 2 * d;
  if (qkv_bias) per_layer += q + 2 * kv;
  if (o_bias) per_layer += d;
  if (qk_norm) per_layer += 2 * head_dim;
  int64_t total = num_hidden_layers * per_layer + vocab_size * d + d;
  if (!tie_word_embeddings) total += vocab_size * d;
  return total;
}

}  // namespace specula
