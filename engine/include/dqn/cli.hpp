/** @file cli.hpp
 *  @brief The dqn command line as a function of the engine's shared library: the installed `dqn`
 *  is this call, and a program that embeds the engine can run its subcommands the same way.
 */
#pragma once

#include "dqn/export.hpp"

namespace dqn {

/// Runs `dqn` with these arguments (argv[0] the program's name): train, step, bench, check-head,
/// validate, plugins, doc. Returns the process exit status; prints its own output and errors.
DQN_API int cli_main(int argc, char** argv);

}  // namespace dqn
