// The reshard command's flags and action, shared by `ckpt reshard` and `ckpt convert`
// (cli/cmd_reshard.cc, cli/cmd_convert.cc).
#pragma once

#include <CLI/CLI.hpp>

#include "cli/commands.h"

namespace ckpt::cli {

// Adds reshard's options to `sub`. `convert`: --profile or --profile-file required, the layout
// flags optional (the source's layout is kept when none is given).
CommandAction setup_reshard_command(CLI::App& sub, bool convert);

}  // namespace ckpt::cli
