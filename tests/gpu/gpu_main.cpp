// Entry point of the gpu suite: exits 77 (skipped) where no CUDA device is present.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <cstdio>

#include "core/runtime.hpp"

int main(int argc, char** argv) {
  if (!dqn::cuda_available()) {
    std::puts("no CUDA device (or built without CUDA): skipping");
    return 77;
  }
  doctest::Context ctx(argc, argv);
  return ctx.run();
}
