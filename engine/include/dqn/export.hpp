/** @file export.hpp
 *  @brief DQN_API marks what the engine's shared library (libdqn_engine.so) exports: the
 *  functions and exception types declared in these headers. Nothing else of the engine is
 *  visible outside it (it is built with hidden visibility and a version script).
 */
#pragma once

#define DQN_API __attribute__((visibility("default")))
