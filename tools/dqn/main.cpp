// The dqn program: the command line lives in the engine's shared library (dqn/cli.hpp).
#include "dqn/cli.hpp"

int main(int argc, char** argv) { return dqn::cli_main(argc, argv); }
