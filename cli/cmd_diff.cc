// ckpt diff A B: compares two checkpoints tensor by tensor in global view (reshard/diff.h).
#include <cstdio>
#include <memory>
#include <string>

#include "cli/commands.h"
#include "cli/common_flags.h"
#include "converters/jobs/diff_job.h"
#include "formats/base/byte_size.h"
#include "reshard/diff.h"

namespace ckpt::cli {
namespace {

struct DiffArgs {
  std::string a, b;
  double atol = 0.0, rtol = 0.0;
  bool json = false;
  bool ignore_dtype = false;
  std::string max_memory = "256M";
  bool no_verify = false;
  std::string a_profile, b_profile;
};

int run_diff(const DiffArgs& args) {
  auto mem = parse_byte_size(args.max_memory, "--max-memory");
  if (!mem.ok()) return report_error(mem.status());
  DiffRequest req;
  req.a = args.a;
  req.b = args.b;
  req.a_profile = args.a_profile;
  req.b_profile = args.b_profile;
  req.options.atol = args.atol;
  req.options.rtol = args.rtol;
  req.options.max_memory = static_cast<int64_t>(*mem);
  req.options.ignore_dtype = args.ignore_dtype;
  req.no_verify = args.no_verify;
  auto out = run_diff_job(req);
  if (!out.ok()) return report_error(out.status());
  if (args.json)
    std::printf("%s\n", out->to_json().dump(2).c_str());
  else
    std::printf("%s", out->report.to_text().c_str());
  return out->report.equal() ? 0 : 1;
}

CommandAction setup_diff(CLI::App& sub) {
  auto args = std::make_shared<DiffArgs>();
  sub.add_option("A", args->a, "First checkpoint: native store dir, HF dir, .safetensors file, Megatron-layout dir, DCP dir or DeepSpeed ZeRO dir")
      ->required();
  sub.add_option("B", args->b, "Second checkpoint (same kinds)")->required();
  sub.add_option("--atol", args->atol, "Absolute tolerance: |a-b| <= atol + rtol*|b| counts as equal")
      ->check(CLI::NonNegativeNumber);
  sub.add_option("--rtol", args->rtol, "Relative tolerance (see --atol)")->check(CLI::NonNegativeNumber);
  sub.add_flag("--json", args->json, "Print the report as JSON");
  sub.add_flag("--ignore-dtype", args->ignore_dtype, "Compare values only: a dtype difference alone is not a difference");
  sub.add_option("--max-memory", args->max_memory, "Chunk buffer budget, e.g. 64M, 1G (default 256M)");
  add_no_verify_flag(sub, args->no_verify);
  add_source_profile_flag(sub, args->a_profile);
  sub.add_option("--b-source-profile", args->b_profile, "the profile B's tensors are stored in (as --source-profile for A)");
  sub.footer(
      "Both checkpoints are checked by their formats' own checks (native piece digests, torch zip CRC-32) while they are\n"
      "compared; a corrupt side is an error (exit 3), not a verdict. Exit code 0 when every tensor is identical or\n"
      "within tolerance, 1 when they differ.");
  return [args] { return run_diff(*args); };
}

}  // namespace

CKPT_REGISTER_COMMAND("diff", "Compare two checkpoints tensor by tensor in global view", setup_diff);

}  // namespace ckpt::cli
