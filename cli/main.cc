// ckpt command-line entry: parses flags with CLI11 and calls the libraries. No logic here.
#include "cli/commands.h"

int main(int argc, char** argv) { return ckpt::cli::run(argc, argv); }
