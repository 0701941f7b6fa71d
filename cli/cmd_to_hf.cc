// ckpt to-hf SRC OUT: exports a checkpoint's model weights as a HuggingFace directory.
#include <algorithm>
#include <cstdio>
#include <memory>
#include <string>

#include "cli/commands.h"
#include "cli/common_flags.h"
#include "cli/progress.h"
#include "converters/hf_export.h"
#include "formats/byte_size.h"
#include "converters/open_checkpoint.h"
#include "formats/safetensors/st_index.h"

namespace ckpt::cli {
namespace {

CommandAction setup_to_hf(CLI::App& sub) {
  struct Opts {
    std::string src, out, dtype, max_shard = "5GB";
    StreamFlags stream;
    IoFlags io;
    bool no_fsync = false;
  };
  auto o = std::make_shared<Opts>();
  sub.add_option("SRC", o->src, "native store dir, HuggingFace dir, .safetensors file, Megatron-layout dir or DCP dir (ckpt inspect --help lists the kinds)")->required();
  sub.add_option("OUT", o->out, "output directory (must not exist, or be empty)")->required();
  sub.add_option("--dtype", o->dtype, "cast float weights to bf16|fp16|fp32 (default: keep)");
  sub.add_option("--max-shard-size", o->max_shard, "largest shard, e.g. 5GB, 500MB, 2GiB (default 5GB)");
  o->stream.add(sub);
  o->io.add(sub);
  sub.add_flag("--no-fsync", o->no_fsync, "skip fsync (tests, benchmarks)");
  sub.footer(
      "SRC may be a native checkpoint of any layout (tp/pp/dp/zero): every output tensor is assembled chunk by chunk\n"
      "from the pieces that cover it, within --max-memory, and the output does not depend on the layout.\n"
      "Tokenizer files carried in the checkpoint (from-hf) are written next to config.json.");
  return [o]() -> int {
    HfExportOptions opts;
    opts.threads = o->stream.threads;
    opts.fsync = !o->no_fsync;
    if (auto io = o->io.mode(); io.ok()) opts.io = *io; else return report_error(io.take_status());
    if (auto dt = float_dtype_flag(o->dtype); dt.ok()) opts.dtype = *dt; else return report_error(dt.take_status());
    auto ms = parse_byte_size(o->max_shard, "--max-shard-size");
    if (!ms.ok()) return report_error(ms.take_status());
    opts.max_shard_size = *ms;
    auto src = open_checkpoint(o->src);
    if (!src.ok()) return report_error(src.status());
    auto plan = plan_hf_export(**src, o->src, opts);
    if (!plan.ok()) return report_error(plan.take_status().with_file(o->src));
    auto chunk = o->stream.chunk_bytes_for(**src, plan->pieces);
    if (!chunk.ok()) return report_error(chunk.take_status());
    opts.max_chunk_bytes = *chunk;
    ProgressBar bar("to-hf", stderr_is_tty());
    opts.progress = bar.callback();
    Status st = run_hf_export(**src, *plan, o->out, opts);
    bar.finish();
    if (!st.ok()) return report_error(st);
    std::printf("wrote %zu tensors (%llu bytes)%s to %s", plan->tensors.size(), static_cast<unsigned long long>(plan->total_bytes),
                plan->config ? " + config.json" : "", o->out.c_str());
    if (!plan->skipped.empty()) std::printf("; left out %zu non-model tensors", plan->skipped.size());
    std::printf("\n");
    return 0;
  };
}

CKPT_REGISTER_COMMAND("to-hf", "Export model weights to a HuggingFace safetensors directory (config.json, index when sharded)",
                      setup_to_hf);

}  // namespace
}  // namespace ckpt::cli
