#include "cli/commands.h"

#include <unistd.h>

#include <cstdio>
#include <map>
#include <memory>
#include <string>

#include "reshard/dist/comm.h"

namespace ckpt::cli {

namespace {
struct Entry {
  std::string description;
  CommandSetup setup;
};
std::map<std::string, Entry>& registry() {
  static std::map<std::string, Entry> r;
  return r;
}
}  // namespace

CommandRegistrar::CommandRegistrar(const char* name, const char* description, CommandSetup setup) {
  registry()[name] = Entry{description, std::move(setup)};
}

int exit_code_for(const Status& s) {
  if (s.ok()) return 0;
  switch (s.kind()) {
    case ErrorKind::kMismatch:
    case ErrorKind::kChecksum: return 1;
    case ErrorKind::kInvalidArgument: return 2;
    case ErrorKind::kCorruption:
    case ErrorKind::kOverflow: return 3;
    case ErrorKind::kIo:
    case ErrorKind::kNotFound: return 4;
    case ErrorKind::kUnsupported: return 5;
    case ErrorKind::kInternal: return 70;
  }
  return 70;
}

int report_error(const Status& s) { return error_exit(s, true); }

int error_exit(const Status& s, bool print) {
  if (print) std::fprintf(stderr, "ckpt: %s\n", s.to_string().c_str());
  std::fflush(stderr);
  Comm::abandon(s);  // no-op without MPI
  return exit_code_for(s);
}

bool stderr_is_tty() { return isatty(STDERR_FILENO) != 0; }

int run(int argc, char** argv) {
  CLI::App app{
      "ckpt: reshard, convert, inspect and verify LLM training checkpoints.\n"
      "Exit codes: 0 ok, 1 differ/verification failed, 2 usage, 3 corrupt input, 4 I/O or not found,\n"
      "5 unsupported, 70 internal error.",
      "ckpt"};
  app.require_subcommand(1);
  app.set_help_all_flag("--help-all", "Show help for every subcommand");
  std::map<std::string, std::unique_ptr<CommandAction>> actions;
  for (auto& [name, entry] : registry()) {
    CLI::App* sub = app.add_subcommand(name, entry.description);
    actions[name] = std::make_unique<CommandAction>(entry.setup(*sub));
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    app.exit(e);
    return 2;
  }
  for (auto& [name, action] : actions) {
    if (app.got_subcommand(name)) {
      try {
        return (*action)();
      } catch (const std::exception& e) {
        return report_error(Status::Internal(std::string("unexpected exception: ") + e.what()));
      }
    }
  }
  return 2;
}

}  // namespace ckpt::cli
