// ckpt to-hf SRC OUT: exports a checkpoint's model weights as a HuggingFace directory. The work is
// converters/jobs/hf_jobs.h (run_to_hf_job; also python's ckpt.to_hf); this file parses the flags,
// draws the progress bar and prints the summary.
#include <cstdio>
#include <memory>
#include <string>

#include "cli/commands.h"
#include "cli/common_flags.h"
#include "cli/progress.h"
#include "converters/jobs/hf_jobs.h"
#include "converters/jobs/job_flags.h"

namespace ckpt::cli {
namespace {

CommandAction setup_to_hf(CLI::App& sub) {
  struct Opts {
    std::string src, out, dtype, max_shard = "5GB", quantize, source_profile, profile;
    WriteFlags write;
    bool json = false, keep_quantized = false;
  };
  auto o = std::make_shared<Opts>();
  sub.add_option("SRC", o->src,
                 "native store dir, HuggingFace dir, .safetensors file, PaddleNLP dir or .pdparams file, Megatron-layout dir, DCP dir or "
                 "DeepSpeed ZeRO dir (its fp32 weights, as zero_to_fp32; ckpt inspect --help lists the kinds)")
      ->required();
  sub.add_option("OUT", o->out, "output directory (must not exist, or be empty)")->required();
  sub.add_option("--dtype", o->dtype, "cast float weights to bf16|fp16|fp32 (default: keep)");
  sub.add_option("--max-shard-size", o->max_shard, "largest shard, e.g. 5GB, 500MB, 2GiB (default 5GB)");
  sub.add_option("--quantize", o->quantize,
                 "fp8-block[:RxC]: write the linear weights (*_proj.weight) as block-scaled FP8 with weight_scale_inv "
                 "(default block 128x128; transformers' FineGrainedFP8 rounding) and its quantization_config; mxfp4: as gpt-oss's "
                 "_blocks / _scales (E2M1 pairs, E8M0 per 32 values; triton_kernels' downcast_to_mxfp rounding)");
  sub.add_flag("--keep-quantized", o->keep_quantized,
               "a quantized SRC (block/per-tensor FP8, MXFP4): write weights and scales as stored, quantization_config kept "
               "(default: dequantize them into --dtype, bf16 when none; docs/QUANTIZATION.md)");
  o->write.add(sub);
  add_source_profile_flag(sub, o->source_profile);
  sub.add_option("--profile", o->profile,
                 "write another stack's files: paddlenlp or paddlenlp-fused (what PaddleNLP's from_pretrained loads: llama.* names, [in, out] "
                 "linears, bf16 as U16, safetensors format np, its config.json; docs/PADDLENLP.md); default hf")
      ->check(CLI::IsMember({"hf", "paddlenlp", "paddlenlp-fused"}));
  sub.add_flag("--json", o->json, "Print the result as JSON: out, tensors, bytes, config, files, skipped, seconds, memory, source_check");
  sub.footer(
      "SRC may be a native checkpoint of any layout (tp/pp/dp/zero): every output tensor is assembled chunk by chunk\n"
      "from the pieces that cover it, within --max-memory, and the output does not depend on the layout.\n"
      "Tokenizer files carried in the checkpoint (from-hf) are written next to config.json.");
  return [o]() -> int {
    auto parsed = [&]() -> Result<ToHfRequest> {  // the flag text parsed once (errors name the flag)
      ToHfRequest req;
      req.src = o->src;
      req.source_profile = o->source_profile;
      req.profile = o->profile;
      req.out = o->out;
      CKPT_RETURN_IF_ERROR(o->write.fill(req));
      CKPT_ASSIGN_OR_RETURN(req.dtype, float_dtype_flag(o->dtype));
      CKPT_ASSIGN_OR_RETURN(req.max_shard_size, parse_max_shard_size(o->max_shard));
      req.keep_quantized = o->keep_quantized;
      req.quantize = o->quantize;
      return req;
    }();
    if (!parsed.ok()) return report_error(parsed.status());
    ToHfRequest& req = *parsed;
    ProgressBar bar("to-hf", stderr_is_tty() && !o->json);
    req.progress = bar.callback();
    auto r = run_to_hf_job(req);
    bar.finish();
    if (!r.ok()) return report_error(r.status());
    o->write.stream.print_memory_note(r->memory);
    if (o->json) {
      std::printf("%s\n", r->to_json().dump(2).c_str());
      return 0;
    }
    if (!r->source.is_null()) std::printf("read %s as %s: %s\n", o->src.c_str(), r->source.value("profile", "").c_str(), r->source.dump().c_str());
    std::printf("wrote %zu tensors (%llu bytes)%s to %s", r->tensors, static_cast<unsigned long long>(r->bytes),
                r->config ? " + config.json" : "", o->out.c_str());
    if (!r->skipped.empty()) std::printf("; left out %zu non-model tensors", r->skipped.size());
    std::printf("\n");
    return 0;
  };
}

CKPT_REGISTER_COMMAND("to-hf", "Export model weights to a HuggingFace safetensors directory (config.json, index when sharded)",
                      setup_to_hf);

}  // namespace
}  // namespace ckpt::cli
