// CUPTI callbacks that count the CUDA runtime and driver calls made while counting is on (the
// zero-sync tests). One subscriber at a time; unsubscribed on every way out of its scope.
#pragma once

#if DQN_HAVE_CUPTI
#include <cupti.h>
#include <doctest/doctest.h>

#include <map>
#include <mutex>
#include <string>

namespace dqn::gpu_test {

class CallCount {
 public:
  CallCount() {
    {
      std::lock_guard<std::mutex> lock(mu());
      calls().clear();  // nothing left from an earlier count
      on() = false;
    }
    REQUIRE(cuptiSubscribe(&handle_, reinterpret_cast<CUpti_CallbackFunc>(&CallCount::callback), nullptr) ==
            CUPTI_SUCCESS);
    active_ = true;
    REQUIRE(cuptiEnableDomain(1, handle_, CUPTI_CB_DOMAIN_RUNTIME_API) == CUPTI_SUCCESS);
    REQUIRE(cuptiEnableDomain(1, handle_, CUPTI_CB_DOMAIN_DRIVER_API) == CUPTI_SUCCESS);
  }
  ~CallCount() { stop(); }
  CallCount(const CallCount&) = delete;
  CallCount& operator=(const CallCount&) = delete;

  void set_on(bool v) {
    std::lock_guard<std::mutex> lock(mu());
    on() = v;
  }
  /// Unsubscribes and hands over the counts ("runtime:name" / "driver:name" → calls).
  std::map<std::string, long> stop() {
    set_on(false);
    if (active_) cuptiUnsubscribe(handle_), active_ = false;
    std::map<std::string, long> out;
    std::lock_guard<std::mutex> lock(mu());
    out.swap(calls());
    return out;
  }

 private:
  static std::mutex& mu() {
    static std::mutex m;
    return m;
  }
  static std::map<std::string, long>& calls() {
    static std::map<std::string, long> c;
    return c;
  }
  static bool& on() {
    static bool b = false;
    return b;
  }
  static void CUPTIAPI callback(void*, CUpti_CallbackDomain domain, CUpti_CallbackId, const void* data) {
    const auto* cb = static_cast<const CUpti_CallbackData*>(data);
    if (cb->callbackSite != CUPTI_API_ENTER) return;
    std::lock_guard<std::mutex> lock(mu());
    if (!on()) return;
    calls()[std::string(domain == CUPTI_CB_DOMAIN_RUNTIME_API ? "runtime:" : "driver:") + cb->functionName]++;
  }
  CUpti_SubscriberHandle handle_{};
  bool active_ = false;
};

}  // namespace dqn::gpu_test
#endif
