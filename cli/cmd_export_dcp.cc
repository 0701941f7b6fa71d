// ckpt export-dcp SRC OUT: exports a checkpoint's model weights as a torchtitan-style PyTorch
// Distributed Checkpoint (HF tensor names) that torch.distributed.checkpoint.load reads.
#include <algorithm>
#include <cstdio>
#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "cli/common_flags.h"
#include "cli/progress.h"
#include "converters/dcp/dcp_export.h"
#include "converters/jobs/open_checkpoint.h"
#include "converters/jobs/source_check_job.h"

namespace ckpt::cli {
namespace {

CommandAction setup_export_dcp(CLI::App& sub) {
  struct Opts {
    std::string src, out, dtype;
    int files = 1;
    StreamFlags stream;
    bool no_fsync = false, json = false, source_chunks = false, no_verify = false;
  };
  auto o = std::make_shared<Opts>();
  sub.add_option("SRC", o->src, "any checkpoint ckpt opens: native store, HuggingFace dir or .safetensors file, ...")->required();
  sub.add_option("OUT", o->out, "output DCP directory (must not exist, or be empty)")->required();
  sub.add_option("--dtype", o->dtype, "cast float weights to bf16|fp16|fp32 (default: keep)");
  sub.add_option("--files", o->files, "number of __R_0.distcp files (writer ranks), tensors balanced by bytes (default 1)")
      ->check(CLI::Range(1, 4096));
  sub.add_flag("--source-chunks", o->source_chunks,
               "one DCP chunk per distinct box of the source's pieces (e.g. the tp shards of a native checkpoint) instead of one per tensor");
  o->stream.add(sub);
  sub.add_flag("--no-fsync", o->no_fsync, "skip fsync (tests, benchmarks)");
  add_no_verify_flag(sub, o->no_verify);
  sub.add_flag("--json", o->json, "print a JSON summary on stdout");
  sub.footer(
      "Writes what torch.distributed.checkpoint.save (FileSystemWriter, torch_save items) writes for a model's\n"
      "state_dict: `.metadata` and `__R_0.distcp` files, one chunk per tensor (or per source piece with --source-chunks),\n"
      "under the HuggingFace names (torchtitan's convention). Load it with\n"
      "    torch.distributed.checkpoint.load(model.state_dict(), checkpoint_id=OUT)\n"
      "Optimizer state and rotary inv_freq buffers are left out. The directory is built as OUT.partial and renamed\n"
      "when complete; on failure nothing is left at OUT.");
  return [o]() -> int {
    DcpExportOptions opts;
    opts.threads = o->stream.threads;
    opts.fsync = !o->no_fsync;
    opts.files = o->files;
    opts.source_chunks = o->source_chunks;
    if (auto dt = float_dtype_flag(o->dtype); dt.ok()) opts.dtype = *dt; else return report_error(dt.take_status());
    JobSourceCheck check;  // forked before this process opens SRC
    check.start(o->src, IoMode::kBuffered, opts.threads, o->no_verify);
    auto src = open_checkpoint(o->src);
    if (!src.ok()) return report_error(src.status());
    opts.before_commit = check.before_commit(**src);
    auto plan = plan_dcp_export(**src, o->src, opts);
    if (!plan.ok()) return report_error(plan.take_status().with_file(o->src));
    auto chunk = o->stream.chunk_bytes_for(**src, plan->pieces);
    if (!chunk.ok()) return report_error(chunk.take_status());
    opts.max_chunk_bytes = *chunk;
    ProgressBar bar("export-dcp", stderr_is_tty());
    opts.progress = bar.callback();
    Status st = run_dcp_export(**src, *plan, o->out, opts);
    bar.finish();
    if (!st.ok()) return report_error(st);
    if (o->json) {
      nlohmann::json j{{"out", o->out}, {"tensors", plan->tensors.size()}, {"chunks", plan->pieces.size()}, {"bytes", plan->total_bytes},
                       {"files", o->files}, {"skipped", plan->skipped}, {"source_check", check.to_json()}};
      std::printf("%s\n", j.dump().c_str());
    } else {
      std::printf("wrote %zu tensors (%llu bytes) as a DCP in %d file(s) to %s", plan->tensors.size(),
                  static_cast<unsigned long long>(plan->total_bytes), o->files, o->out.c_str());
      if (!plan->skipped.empty()) std::printf("; left out %zu non-model tensors", plan->skipped.size());
      std::printf("\n");
    }
    return 0;
  };
}

CKPT_REGISTER_COMMAND("export-dcp", "Export model weights as a torchtitan-style PyTorch Distributed Checkpoint (DCP)",
                      setup_export_dcp);

}  // namespace
}  // namespace ckpt::cli
