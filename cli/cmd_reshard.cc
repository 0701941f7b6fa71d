// ckpt reshard SRC DST: re-splits a native-store checkpoint for another TP/PP/DP(ZeRO) layout
// (reshard/planner.h, reshard/store_reshard.h). Under mpirun the shard files are divided among
// the processes.
#include <chrono>
#include <cstdio>
#include <memory>
#include <string>

#include "cli/commands.h"
#include "cli/common_flags.h"
#include "cli/progress.h"
#include "converters/llama_config.h"
#include "converters/llama_sharding.h"
#include "converters/megatron_dir_source.h"
#include "formats/store/store_reader.h"
#include "reshard/dist.h"
#include "reshard/planner.h"
#include "reshard/source_verify.h"
#include "reshard/store_reshard.h"

namespace ckpt::cli {
namespace {

struct ReshardArgs {
  std::string src, dst, layout_file, compress = "none";
  LayoutFlags layout;
  StreamFlags stream;
  bool dry_run = false, json = false, no_verify = false;
};

Result<Layout> target_layout(const ReshardArgs& a, const LlamaConfig& cfg, const nlohmann::json& src_meta) {
  Layout l;
  if (!a.layout_file.empty()) {
    if (a.layout.given())
      return Status::InvalidArgument("--layout FILE excludes --tp/--pp/--dp/--zero/--pp-layers");
    CKPT_ASSIGN_OR_RETURN(l, Layout::from_file(a.layout_file));
  } else {
    if (!a.layout.given()) return Status::InvalidArgument("give --layout FILE, or --tp N --pp N --dp N (each >= 1)");
    CKPT_ASSIGN_OR_RETURN(l, a.layout.make(cfg.num_hidden_layers));
    if (src_meta.contains("layout")) l.keep_source_settings(src_meta["layout"]);
  }
  return l;
}

// The summary of a finished reshard on stdout: JSON (--json) or one line.
void print_result(const ReshardArgs& a, const TensorSource& src, const Plan& plan, const Layout& layout, double plan_s,
                  double secs, int processes) {
  if (a.json) {
    nlohmann::json j = plan.to_json();
    j["dst"] = a.dst;
    j["seconds"] = secs;
    j["plan_seconds"] = plan_s;
    j["processes"] = processes;
    std::printf("%s\n", j.dump(2).c_str());
  } else {
    std::printf("resharded %s -> %s (%s): %zu pieces in %zu files, %.2f GiB written in %.2f s\n", src.describe().c_str(),
                a.dst.c_str(), layout.to_string().c_str(), plan.pieces.size(), plan.files.size(),
                plan.bytes_written / 1073741824.0, secs);
  }
}

int run_reshard(const ReshardArgs& a) {
  Dist* dist = Dist::launched_under_mpi() ? &Dist::get() : nullptr;
  const bool root = !dist || dist->rank() == 0;
  auto fail = [&](Status st) { return root ? report_error(st) : exit_code_for(st); };

  auto sopts = store::parse_compress_spec(a.compress, "--compress");
  if (!sopts.ok()) return fail(sopts.take_status());
  sopts->hash_threads = a.stream.threads;

  // SRC re-hash, overlapped with the reshard in a child process (single-process runs only; under
  // mpirun rank 0 re-hashes inline before committing).
  BackgroundVerify bg;
  if (!a.no_verify && !a.dry_run && !dist && !is_megatron_dir(a.src)) (void)bg.start(a.src);

  // SRC: a native store (checksummed), or a Megatron-layout directory written by export-megatron
  // (packed QKV and fused gate/up are unpacked by its segment map).
  std::unique_ptr<store::StoreReader> store_src;
  std::unique_ptr<TensorSource> other_src;
  if (is_megatron_dir(a.src)) {
    auto m = open_megatron_dir(a.src);
    if (!m.ok()) return fail(m.take_status().with_context("opening SRC"));
    other_src = std::move(m).value();
  } else {
    auto reader = store::StoreReader::open(a.src);
    if (!reader.ok()) return fail(reader.take_status().with_context("opening SRC"));
    store_src = std::move(reader).value();
  }
  TensorSource& src = store_src ? static_cast<TensorSource&>(*store_src) : *other_src;
  const nlohmann::json& meta = src.metadata();
  if (!meta.contains("model_config"))
    return fail(Status::Error("NoModelConfig",
                              "SRC '" + src.describe() + "' has no model_config metadata: cannot derive sharding rules"));
  auto cfg = LlamaConfig::from_json(meta["model_config"]);
  if (!cfg.ok()) return fail(cfg.take_status().with_context("model_config of '" + src.describe() + "'"));
  LlamaShardingRules rules(*cfg);
  auto layout = target_layout(a, *cfg, meta);
  if (!layout.ok()) return fail(layout.take_status());

  // Buffer budget: the rest after what the store writer, HDF5 and the process itself need.
  ExecOptions eo;
  eo.threads = a.stream.threads;
  size_t max_src = 1;
  for (const auto& p : src.pieces()) max_src = std::max(max_src, dtype_size(p.dtype));
  auto chunk = a.stream.chunk_bytes(max_src, 1, kStoreWriterReserveBytes);
  if (!chunk.ok()) return fail(chunk.take_status());
  eo.max_chunk_bytes = *chunk;

  const auto t0 = std::chrono::steady_clock::now();
  auto plan = make_plan(src.tensors(), src.pieces(), meta, *layout, rules, eo);
  if (!plan.ok()) return fail(plan.take_status());
  const double plan_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

  if (a.dry_run) {
    if (root) {
      if (a.json) {
        nlohmann::json j = plan->to_json();
        j["plan_seconds"] = plan_s;
        std::printf("%s\n", j.dump(2).c_str());
      } else {
        std::printf("%s", plan->to_string().c_str());
      }
    }
    return 0;
  }

  StoreExecOptions so;
  so.exec = eo;
  so.store = *sopts;
  ProgressBar bar("reshard", root && stderr_is_tty() && !a.json);
  so.exec.progress = bar.callback();
  if (bg.started())
    so.before_commit = [&bg]() -> Status { return bg.wait(); };
  else if (!a.no_verify && store_src)
    so.before_commit = [&store_src]() -> Status { return verify_source_inline(*store_src); };
  Status st = execute_plan_to_store(src, *plan, a.dst, so, dist);
  bar.finish();
  if (!st.ok()) return fail(st);
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (root) print_result(a, src, *plan, *layout, plan_s, secs, dist ? dist->size() : 1);
  return 0;
}

CommandAction setup_reshard(CLI::App& sub) {
  auto a = std::make_shared<ReshardArgs>();
  sub.add_option("SRC", a->src, "Source checkpoint: native store dir, run dir (follows `latest`), or a Megatron-layout dir (export-megatron)")->required();
  sub.add_option("DST", a->dst, "New checkpoint dir (must not exist)")->required();
  sub.add_option("--layout", a->layout_file, "Target layout JSON file (tp, pp, dp, zero, layers_per_stage, ...)");
  a->layout.add(sub, "ZeRO stage of the optimizer state: 0 (replicated) or 1 (flat shards over DP)");
  a->stream.add(sub);
  sub.add_flag("--dry-run", a->dry_run, "Print the plan (pieces, files, bytes) without writing");
  sub.add_option("--compress", a->compress, "Shard compression: none, zstd[:LEVEL], shuffle+zstd[:LEVEL]");
  sub.add_flag("--json", a->json, "Print the plan / result as JSON");
  sub.add_flag("--no-verify", a->no_verify, "Skip re-hashing SRC pieces before committing DST");
  sub.footer(
      "Output is written to DST.partial and renamed when complete. Under `mpirun -np K` the shard files are\n"
      "divided among the K processes; the result is byte-identical to a single process.");
  return [a] { return run_reshard(*a); };
}

}  // namespace

CKPT_REGISTER_COMMAND("reshard", "Re-split a checkpoint for another TP/PP/DP(ZeRO) layout", setup_reshard);

}  // namespace ckpt::cli
