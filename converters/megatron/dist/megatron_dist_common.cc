#include "converters/megatron/dist/megatron_dist_common.h"

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <system_error>

#include "converters/megatron/megatron_moe_args.h"
#include "converters/megatron/megatron_torch_optim.h"
#include "formats/base/json_read.h"
#include "formats/torch/torch_file.h"

namespace ckpt {

namespace dist_common_detail {

namespace fs = std::filesystem;

// By file names only (detection is cheap); read_megatron_dist_common checks the backend.
bool is_dist_iter_dir(const std::string& dir) {
  std::error_code ec;
  return fs::is_regular_file(dir + "/metadata.json", ec) && fs::is_regular_file(dir + "/.metadata", ec);
}

Status bad_common(const std::string& file, const std::string& msg) {
  return Status::Error("BadMegatronArgs", "'" + file + "': " + msg).with_file(file);
}

// The scalar attributes of an args Namespace (nested values and tensors left out).
// The scalar entries (bool, int, float, str, None) of the dict `st` with string keys (at most 4096).
nlohmann::json scalar_dict_to_json(const torch::PyObj* st) {
  nlohmann::json j = nlohmann::json::object();
  if (!st || !st->is(torch::PyType::kDict)) return j;
  for (const auto& [k, v] : st->entries) {
    if (j.size() >= 4096) break;
    if (!k->is(torch::PyType::kStr)) continue;
    switch (v->type) {
      case torch::PyType::kBool: j[k->s] = v->b; break;
      case torch::PyType::kInt: j[k->s] = v->i; break;
      case torch::PyType::kFloat: j[k->s] = v->f; break;
      case torch::PyType::kStr: j[k->s] = v->s; break;
      case torch::PyType::kNone: j[k->s] = nullptr; break;
      case torch::PyType::kList:  // MoE args such as moe_layer_freq [0, 1, 1, 1]: up to 1 << 20 integers
        if (k->s.rfind("moe_", 0) == 0 && v->items.size() <= (1u << 20)) {
          nlohmann::json list = nlohmann::json::array();
          for (const torch::PyObj* e : v->items)
            if (e->is(torch::PyType::kInt)) list.push_back(e->i);
          if (list.size() == v->items.size()) j[k->s] = std::move(list);
        }
        break;
      default: break;
    }
  }
  return j;
}

nlohmann::json namespace_to_json(const torch::PyObj* ns) {
  const torch::PyObj* st = ns->state;
  if (st && st->is(torch::PyType::kTuple) && !st->items.empty()) st = st->items[0];
  return scalar_dict_to_json(st);
}

Result<int64_t> arg_int(const nlohmann::json& j, const std::string& file, const char* key, int64_t lo, int64_t hi,
                        std::optional<int64_t> fallback = std::nullopt) {
  if (!j.contains(key) || j.at(key).is_null()) {
    if (fallback) return *fallback;
    return bad_common(file, std::string("args has no '") + key + "'");
  }
  if (!j.at(key).is_number_integer()) return bad_common(file, std::string("args.") + key + " must be an integer");
  const int64_t v = j.at(key).get<int64_t>();
  if (v < lo || v > hi)
    return bad_common(file, std::string("args.") + key + " = " + std::to_string(v) + " outside " + std::to_string(lo) +
                                ".." + std::to_string(hi));
  return v;
}

torch::TorchFileLimits common_limits() {
  torch::TorchFileLimits lim;
  lim.max_pickle_bytes = uint64_t{64} << 20;
  return lim;
}

// The step of every param group when they agree (fully_reshardable keeps the optimizer's
// state_dict without its per-parameter state: {'optimizer': {'param_groups': [...]}}).
std::optional<int64_t> groups_step(const torch::PyObj* inner) {
  const torch::PyObj* groups = inner && inner->is(torch::PyType::kDict) ? inner->get("param_groups") : nullptr;
  if (!groups || !groups->is(torch::PyType::kList) || groups->items.empty()) return std::nullopt;
  std::optional<int64_t> step;
  for (const torch::PyObj* g : groups->items) {
    const torch::PyObj* s = g && g->is(torch::PyType::kDict) ? g->get("step") : nullptr;
    if (!s || !(s->is(torch::PyType::kInt) || s->is(torch::PyType::kFloat))) return std::nullopt;
    const int64_t v = s->is(torch::PyType::kInt) ? s->i : static_cast<int64_t>(s->f);
    if (step && *step != v) return std::nullopt;
    step = v;
  }
  return step;
}

std::optional<int64_t> param_groups_step(const torch::PyObj* opt) {
  return groups_step(opt && opt->is(torch::PyType::kDict) ? opt->get("optimizer") : nullptr);
}

// What the common state dict `root` holds (common.pt's root, or common_state's [0]).
Result<MegatronDistCommon> common_from_root(torch::TorchFile& tf, const torch::PyObj* root, const std::string& file,
                                            const std::string& source) {
  MegatronDistCommon out;
  out.source = source;
  if (const torch::PyObj* a = root->get("args")) {
    if (!a->is_record("argparse.Namespace")) return bad_common(file, "'args' is not an argparse.Namespace");
    out.args = namespace_to_json(a);
  }
  if (const torch::PyObj* it = root->get("iteration"); it && it->is(torch::PyType::kInt)) out.iteration = it->i;
  if (const torch::PyObj* s = root->get("opt_param_scheduler"); s && s->is(torch::PyType::kDict))
    out.opt_param_scheduler = scalar_dict_to_json(s);
  const torch::PyObj* opt = root->get("optimizer");
  const torch::PyObj* state = opt ? opt->get("state") : nullptr;
  const torch::PyObj* step = state ? state->get("common_step") : nullptr;
  if (step && step->is(torch::PyType::kInt)) out.optimizer_step = step->i;
  if (step && step->is(torch::PyType::kFloat)) out.optimizer_step = static_cast<int64_t>(step->f);
  if (step && step->is(torch::PyType::kTensor) && step->tensor.size.empty() && step->tensor.storage.dtype == DType::kF32) {
    float v = 0;
    CKPT_RETURN_IF_ERROR(tf.read_tensor(step->tensor, Box{}, &v));
    out.optimizer_step = static_cast<int64_t>(v);
  }
  if (!out.optimizer_step) out.optimizer_step = param_groups_step(opt);
  if (const torch::PyObj* inner = opt && opt->is(torch::PyType::kDict) ? opt->get("optimizer") : nullptr;
      inner && inner->is(torch::PyType::kDict))
    out.adam = megatron_adam_hyper(inner->get("param_groups"));
  const torch::PyObj* cm = root->get("content_metadata");
  const torch::PyObj* st = cm && cm->is(torch::PyType::kDict) ? cm->get("distrib_optim_sharding_type") : nullptr;
  if (!st && opt && opt->is(torch::PyType::kDict)) st = opt->get("param_state_sharding_type");
  if (st && st->is(torch::PyType::kStr)) out.sharding_type = st->s;
  return out;
}

// The common_state item opened as a torch.save zip, after checking that it lies inside its file.
Result<std::unique_ptr<torch::TorchFile>> open_common_state(const std::string& dir, const torch::DcpBytesItem& item) {
  CKPT_RETURN_IF_ERROR(torch::check_dcp_relative_path(item.file, item.fqn));
  const std::string path = (fs::path(dir) / item.file).string();
  std::error_code ec;
  const uint64_t size = fs::file_size(path, ec);
  if (ec)
    return Status::Error("BadMegatronCommonState", "'" + path + "': the file of item '" + item.fqn + "' cannot be read: " + ec.message())
        .with_file(path)
        .with_tensor(item.fqn);
  if (item.length == 0 || item.offset > size || item.length > size - item.offset)
    return Status::Error("BadMegatronCommonState", "'" + path + "': item '" + item.fqn + "' at bytes [" + std::to_string(item.offset) +
                                                       ", " + std::to_string(item.offset) + " + " + std::to_string(item.length) +
                                                       ") lies outside the file (" + std::to_string(size) + " bytes)")
        .with_file(path)
        .with_tensor(item.fqn);
  auto tf = torch::TorchFile::open(path, item.offset, item.length, common_limits());
  if (!tf.ok()) return tf.take_status().with_context("common state item '" + item.fqn + "' of '" + path + "'").with_file(path);
  return std::move(tf).value();
}

// The distributed optimizer (dp_reshardable, dp_zero_gather_scatter) keeps its param_groups in
// the ShardedObjects optimizer.distributed.dp_group_idx_<g>.optimizer (beside common.pt or
// common_state alike): the step when all agree, and the hyper-parameters. Groups without a step
// (Lion's: megatron-core saves param_groups without one under Apex / TE) are read all the same.
Status distributed_optimizer_groups(const std::string& dir, const torch::DcpMetadata& md, MegatronDistCommon& out) {
  for (const auto& b : md.bytes) {
    if (out.optimizer_step || b.fqn.rfind("optimizer.distributed.", 0) != 0 || b.fqn.find(".optimizer/shard_") == std::string::npos)
      continue;
    CKPT_ASSIGN_OR_RETURN(auto of, open_common_state(dir, b));
    const torch::PyObj* r = of->root();
    if (r && (r->is(torch::PyType::kList) || r->is(torch::PyType::kTuple)) && r->items.size() == 1 &&
        r->items[0]->is(torch::PyType::kDict)) {
      const torch::PyObj* groups = r->items[0]->get("param_groups");
      if (!groups || !groups->is(torch::PyType::kList)) continue;
      out.groups_read = true;
      out.optimizer_step = groups_step(r->items[0]);
      out.adam = megatron_adam_hyper(groups);
    }
  }
  return Status::Ok();
}

}  // namespace dist_common_detail

std::optional<std::string> find_megatron_dist_dir(const std::string& path) {
  using namespace dist_common_detail;
  if (is_dist_iter_dir(path)) return path;
  std::ifstream f(path + "/latest_checkpointed_iteration.txt");
  if (!f) return std::nullopt;
  std::string s;
  f >> s;
  std::string it;
  if (s == "release") {
    it = path + "/release";
  } else {
    if (s.empty() || s.size() > 12 || s.find_first_not_of("0123456789") != std::string::npos) return std::nullopt;
    char buf[32];
    std::snprintf(buf, sizeof buf, "/iter_%07lld", static_cast<long long>(std::stoll(s)));
    it = path + buf;
  }
  if (is_dist_iter_dir(it)) return it;
  return std::nullopt;
}

Result<MegatronDistCommon> read_megatron_dist_common(const std::string& dir, const torch::DcpMetadata* md) {
  using namespace dist_common_detail;
  const std::string mdfile = dir + "/metadata.json";
  CKPT_ASSIGN_OR_RETURN(nlohmann::json mj, read_json_file(mdfile, kStatusJsonLimits, "metadata.json"));
  if (!mj.is_object() || !mj.contains("sharded_backend") || mj["sharded_backend"] != "torch_dist")
    return Status::Unsupported("'" + mdfile + "': sharded_backend is " +
                               (mj.is_object() && mj.contains("sharded_backend") ? mj["sharded_backend"].dump() : "absent") +
                               ", ckpt reads torch_dist (zarr and fsdp_dtensor are not supported)")
        .with_file(mdfile);
  const std::string file = dir + "/common.pt";
  std::error_code ec;
  std::optional<torch::DcpMetadata> own;
  if (!md) {
    CKPT_ASSIGN_OR_RETURN(own, torch::read_dcp_metadata(dir));
    md = &*own;
  }
  if (fs::exists(file, ec)) {
    CKPT_ASSIGN_OR_RETURN(auto tf, torch::TorchFile::open(file, 0, UINT64_MAX, common_limits()));
    const torch::PyObj* root = tf->root();
    if (!root || !root->is(torch::PyType::kDict)) return bad_common(file, "the root object is not a dict");
    CKPT_ASSIGN_OR_RETURN(MegatronDistCommon out, common_from_root(*tf, root, file, "common.pt"));
    CKPT_RETURN_IF_ERROR(distributed_optimizer_groups(dir, *md, out));
    return out;
  }
  const torch::DcpBytesItem* item = nullptr;
  for (const auto& b : md->bytes)
    if (b.fqn == kMegatronCommonStateItem) item = &b;
  if (!item)
    return Status::Error("MissingMegatronCommonState",
                         "'" + dir + "' has neither common.pt (megatron-core <= 0.18) nor a '" + kMegatronCommonStateItem +
                             "' item in its .metadata (megatron-core 0.19): no args, iteration or optimizer step")
        .with_file(dir);
  CKPT_ASSIGN_OR_RETURN(auto tf, open_common_state(dir, *item));
  const std::string where = (fs::path(dir) / item->file).string();
  const torch::PyObj* root = tf->root();
  if (!root || !(root->is(torch::PyType::kList) || root->is(torch::PyType::kTuple)) || root->items.empty() ||
      !root->items[0]->is(torch::PyType::kDict))
    return Status::Error("BadMegatronCommonState", "'" + where + "': item '" + item->fqn +
                                                       "' is not a torch.save of [state dict] (megatron-core's ShardedObject common_state)")
        .with_file(where)
        .with_tensor(item->fqn);
  CKPT_ASSIGN_OR_RETURN(MegatronDistCommon out, common_from_root(*tf, root->items[0], where, item->fqn));
  CKPT_RETURN_IF_ERROR(distributed_optimizer_groups(dir, *md, out));
  return out;
}

Result<LlamaConfig> llama_config_from_megatron_args(const nlohmann::json& j, int64_t padded_vocab, const std::string& file) {
  using namespace dist_common_detail;
  constexpr int64_t kBig = int64_t{1} << 40;
  LlamaConfig c;
  CKPT_ASSIGN_OR_RETURN(c.num_hidden_layers, arg_int(j, file, "num_layers", 1, 1 << 20));
  CKPT_ASSIGN_OR_RETURN(c.hidden_size, arg_int(j, file, "hidden_size", 1, kBig));
  CKPT_ASSIGN_OR_RETURN(c.intermediate_size, arg_int(j, file, "ffn_hidden_size", 1, kBig));
  CKPT_ASSIGN_OR_RETURN(c.num_attention_heads, arg_int(j, file, "num_attention_heads", 1, 1 << 20));
  const bool gqa = j.contains("group_query_attention") && j["group_query_attention"] == true;
  CKPT_ASSIGN_OR_RETURN(c.num_key_value_heads,
                        gqa ? arg_int(j, file, "num_query_groups", 1, 1 << 20) : Result<int64_t>(c.num_attention_heads));
  CKPT_ASSIGN_OR_RETURN(c.head_dim, arg_int(j, file, "kv_channels", 1, 1 << 20, c.hidden_size / c.num_attention_heads));
  CKPT_ASSIGN_OR_RETURN(c.vocab_size, arg_int(j, file, "vocab_size", 1, padded_vocab, padded_vocab));
  if (j.contains("swiglu") && j["swiglu"] == false) return Status::Unsupported("'" + file + "': args.swiglu is false");
  if (j.contains("add_bias_linear") && j["add_bias_linear"] == true)
    return Status::Unsupported("'" + file + "': args.add_bias_linear is true (LLaMA has no linear biases)");
  c.attention_bias = j.contains("add_qkv_bias") && j["add_qkv_bias"] == true;
  c.tie_word_embeddings = !(j.contains("untie_embeddings_and_output_weights") && j["untie_embeddings_and_output_weights"] == true);
  if (j.contains("norm_epsilon") && j["norm_epsilon"].is_number()) c.rms_norm_eps = j["norm_epsilon"].get<double>();
  if (j.contains("rotary_base") && j["rotary_base"].is_number()) c.rope_theta = j["rotary_base"].get<double>();
  if (j.contains("max_position_embeddings") && j["max_position_embeddings"].is_number_integer())
    c.max_position_embeddings = j["max_position_embeddings"].get<int64_t>();
  if (Status v = c.validate(); !v.ok()) return std::move(v).with_context("model of '" + file + "' (Megatron args)");
  if (!megatron_args_moe(j)) return c;
  Layout saved;  // the canonical view does not depend on the saved ep / etp
  CKPT_RETURN_IF_ERROR(megatron_moe_from_args(j, file, c, saved));
  auto moe = LlamaConfig::from_json(c.to_json());
  if (!moe.ok()) return moe.take_status().with_file(file);
  return std::move(moe).value();
}

}  // namespace ckpt
