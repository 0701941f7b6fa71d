// ckpt convert SRC DST --profile NAME: converts a checkpoint to another vendor/framework profile
// (dtypes, vocab padding, QKV/MLP packing, orientation, names; docs/PROFILES.md), optionally
// changing its layout in the same streaming pass, and prints the exactness report (also written
// in DST's manifest). It is `ckpt reshard` with the profile required (cli/cmd_reshard.cc).
#include "cli/cmd_reshard.h"

namespace ckpt::cli {
namespace {

CommandAction setup_convert(CLI::App& sub) {
  CommandAction action = setup_reshard_command(sub, true);
  sub.footer(
      "Examples:\n"
      "  ckpt convert run/step-100 out --profile paddlenlp              same layout, PaddleNLP conventions\n"
      "  ckpt convert run/step-100 out --profile megatron-mcore --tp 1 --pp 3 --dp 1 --pp-layers 2,1,1\n"
      "  ckpt convert run/step-100 out --profile-file my_stack.json --saturate --json\n"
      "A narrowing cast that overflows (e.g. 7e4 into fp16) fails naming the tensors and counts, and nothing is\n"
      "written, unless --saturate (clamped values are reported). Dropped padding rows that are not zero are\n"
      "reported. Output is written to DST.partial and renamed when complete; under `mpirun -np K` the shard\n"
      "files are divided among the K processes and the report is merged over them.");
  return action;
}

}  // namespace

CKPT_REGISTER_COMMAND("convert",
                      "Convert a checkpoint to another vendor/framework profile (and layout) with an exactness report",
                      setup_convert);

}  // namespace ckpt::cli
