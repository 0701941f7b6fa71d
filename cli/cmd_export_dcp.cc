// ckpt export-dcp SRC OUT: exports a checkpoint's model weights as a torchtitan-style PyTorch
// Distributed Checkpoint (HF tensor names) that torch.distributed.checkpoint.load reads. The work
// is converters/jobs/export_jobs.h (run_export_dcp_job; also python's ckpt.export_dcp); this file
// parses the flags, draws the progress bar and prints the summary.
#include <cstdio>
#include <memory>
#include <string>

#include "cli/commands.h"
#include "cli/common_flags.h"
#include "cli/progress.h"
#include "converters/jobs/export_jobs.h"

namespace ckpt::cli {
namespace {

CommandAction setup_export_dcp(CLI::App& sub) {
  struct Opts {
    std::string src, out, dtype, source_profile;
    int files = 1;
    WriteFlags write;
    bool json = false, source_chunks = false;
  };
  auto o = std::make_shared<Opts>();
  sub.add_option("SRC", o->src, "any checkpoint ckpt opens: native store, HuggingFace dir or .safetensors file, ...")->required();
  sub.add_option("OUT", o->out, "output DCP directory (must not exist, or be empty)")->required();
  sub.add_option("--dtype", o->dtype, "cast float weights to bf16|fp16|fp32 (default: keep)");
  sub.add_option("--files", o->files, "number of __R_0.distcp files (writer ranks), tensors balanced by bytes (default 1)")
      ->check(CLI::Range(1, 4096));
  sub.add_flag("--source-chunks", o->source_chunks,
               "one DCP chunk per distinct box of the source's pieces (e.g. the tp shards of a native checkpoint) instead of one per tensor");
  o->write.add(sub);
  add_source_profile_flag(sub, o->source_profile);
  sub.add_flag("--json", o->json, "print a JSON summary on stdout");
  sub.footer(
      "Writes what torch.distributed.checkpoint.save (FileSystemWriter, torch_save items) writes for a model's\n"
      "state_dict: `.metadata` and `__R_0.distcp` files, one chunk per tensor (or per source piece with --source-chunks),\n"
      "under the HuggingFace names (torchtitan's convention). Load it with\n"
      "    torch.distributed.checkpoint.load(model.state_dict(), checkpoint_id=OUT)\n"
      "Optimizer state and rotary inv_freq buffers are left out. The directory is built as OUT.partial and renamed\n"
      "when complete; on failure nothing is left at OUT.");
  return [o]() -> int {
    auto parsed = [&]() -> Result<ExportDcpRequest> {  // the flag text parsed once (errors name the flag)
      ExportDcpRequest req;
      req.src = o->src;
      req.source_profile = o->source_profile;
      req.out = o->out;
      CKPT_ASSIGN_OR_RETURN(req.dtype, float_dtype_flag(o->dtype));
      CKPT_RETURN_IF_ERROR(o->write.fill(req));
      req.files = o->files;
      req.source_chunks = o->source_chunks;
      return req;
    }();
    if (!parsed.ok()) return report_error(parsed.status());
    ExportDcpRequest& req = *parsed;
    ProgressBar bar("export-dcp", stderr_is_tty());
    req.progress = bar.callback();
    auto r = run_export_dcp_job(req);
    bar.finish();
    if (!r.ok()) return report_error(r.status());
    if (o->json) {
      std::printf("%s\n", r->to_json().dump().c_str());
    } else {
      std::printf("wrote %zu tensors (%llu bytes) as a DCP in %d file(s) to %s", r->tensors,
                  static_cast<unsigned long long>(r->bytes), r->files, r->out.c_str());
      if (!r->skipped.empty()) std::printf("; left out %zu non-model tensors", r->skipped.size());
      std::printf("\n");
    }
    return 0;
  };
}

CKPT_REGISTER_COMMAND("export-dcp", "Export model weights as a torchtitan-style PyTorch Distributed Checkpoint (DCP)",
                      setup_export_dcp);

}  // namespace
}  // namespace ckpt::cli
