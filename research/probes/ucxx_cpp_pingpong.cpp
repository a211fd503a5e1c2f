// Research probe (research/probes/ucxx_cpp_probe.py builds and calls it).
// Per-message cost of UCXX's C++ API with completion callbacks (no Python between messages).
#include <ucxx/api.h>
#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>

extern "C" double cpp_pingpong(void* ep_ptr, void* worker_ptr, void* sbuf, void* rbuf, size_t len, int n,
                               unsigned long long tag)
{
  auto* ep     = static_cast<ucxx::Endpoint*>(ep_ptr);
  auto* worker = static_cast<ucxx::Worker*>(worker_ptr);
  std::mutex m;
  std::condition_variable cv;
  int done = 0;
  auto cb  = [&](ucs_status_t, std::shared_ptr<void>) {
    std::lock_guard<std::mutex> g(m);
    done++;
    cv.notify_one();
  };
  auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < n; i++) {
    std::shared_ptr<ucxx::Request> r =
      worker->tagRecvBuilder(rbuf, len, ucxx::Tag{tag}, ucxx::TagMaskFull).callbackFunction(cb).build();
    std::shared_ptr<ucxx::Request> s = ep->tagSendBuilder(sbuf, len, ucxx::Tag{tag}).callbackFunction(cb).build();
    std::unique_lock<std::mutex> l(m);
    cv.wait(l, [&] { return done >= 2 * (i + 1); });
  }
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / n;
}
