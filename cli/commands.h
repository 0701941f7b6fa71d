// The ckpt command line: each subcommand lives in its own cmd_<name>.cc and registers itself with
// CKPT_REGISTER_COMMAND; run() builds the CLI11 app, parses, and returns the exit code.
// Exit codes (stable, documented in --help and README):
//   0 success / equal          1 checkpoints differ or verification failed
//   2 bad usage (flags)        3 corrupt or invalid input file
//   4 I/O error or not found   5 unsupported input       70 internal error
#pragma once

#include <CLI/CLI.hpp>
#include <functional>

#include "formats/base/status.h"

namespace ckpt::cli {

// A subcommand registers options on `sub` and returns the action run after a successful parse.
using CommandAction = std::function<int()>;
using CommandSetup = std::function<CommandAction(CLI::App& sub)>;

struct CommandRegistrar {
  CommandRegistrar(const char* name, const char* description, CommandSetup setup);
};

#define CKPT_REGISTER_COMMAND(name, description, setup) \
  static ::ckpt::cli::CommandRegistrar CKPT_CONCAT(ckpt_cmd_registrar_, __COUNTER__)(name, description, setup)

int exit_code_for(const Status& s);
// Prints "ckpt: <error>" to stderr and returns its exit code. Under MPI (once Comm::world()
// started it), it then takes the exit path of reshard/dist/comm.h (Comm::abandon): the caller must
// return that code from main without touching MPI again.
int report_error(const Status& s);
// report_error(s) when `print`, else the same exit path without the message (the ranks of an
// mpirun job other than the one that prints an agreed error).
int error_exit(const Status& s, bool print);
// True when stderr is a terminal (progress bars are drawn only then).
bool stderr_is_tty();

int run(int argc, char** argv);

}  // namespace ckpt::cli
