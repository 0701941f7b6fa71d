// ckpt diff A B: compares two checkpoints tensor by tensor in global view (reshard/diff.h).
#include <cstdio>
#include <memory>
#include <string>

#include "cli/commands.h"
#include "converters/open_checkpoint.h"
#include "formats/byte_size.h"
#include "reshard/diff.h"

namespace ckpt::cli {
namespace {

struct DiffArgs {
  std::string a, b;
  double atol = 0.0, rtol = 0.0;
  bool json = false;
  bool ignore_dtype = false;
  std::string max_memory = "256M";
};

int run_diff(const DiffArgs& args) {
  auto mem = parse_byte_size(args.max_memory, "--max-memory");
  if (!mem.ok()) return report_error(mem.status());
  DiffOptions o;
  o.atol = args.atol;
  o.rtol = args.rtol;
  o.max_memory = static_cast<int64_t>(*mem);
  o.ignore_dtype = args.ignore_dtype;
  auto a = open_checkpoint(args.a);
  if (!a.ok()) return report_error(a.take_status().with_context("opening A"));
  auto b = open_checkpoint(args.b);
  if (!b.ok()) return report_error(b.take_status().with_context("opening B"));
  auto rep = diff_sources(**a, **b, o);
  if (!rep.ok()) return report_error(rep.status());
  if (args.json) {
    nlohmann::json j = rep->to_json();
    j["a"] = args.a;
    j["b"] = args.b;
    std::printf("%s\n", j.dump(2).c_str());
  } else {
    std::printf("%s", rep->to_text().c_str());
  }
  return rep->equal() ? 0 : 1;
}

CommandAction setup_diff(CLI::App& sub) {
  auto args = std::make_shared<DiffArgs>();
  sub.add_option("A", args->a, "First checkpoint: native store dir, HF dir, .safetensors file, Megatron-layout dir or DCP dir")->required();
  sub.add_option("B", args->b, "Second checkpoint (same kinds)")->required();
  sub.add_option("--atol", args->atol, "Absolute tolerance: |a-b| <= atol + rtol*|b| counts as equal")
      ->check(CLI::NonNegativeNumber);
  sub.add_option("--rtol", args->rtol, "Relative tolerance (see --atol)")->check(CLI::NonNegativeNumber);
  sub.add_flag("--json", args->json, "Print the report as JSON");
  sub.add_flag("--ignore-dtype", args->ignore_dtype, "Compare values only: a dtype difference alone is not a difference");
  sub.add_option("--max-memory", args->max_memory, "Chunk buffer budget, e.g. 64M, 1G (default 256M)");
  sub.footer("Exit code 0 when every tensor is identical or within tolerance, 1 when they differ.");
  return [args] { return run_diff(*args); };
}

}  // namespace

CKPT_REGISTER_COMMAND("diff", "Compare two checkpoints tensor by tensor in global view", setup_diff);

}  // namespace ckpt::cli
