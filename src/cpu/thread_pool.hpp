// The CPU backend's persistent thread pool.
//
// One pool per process, created on first use and grown (never shrunk) to the largest number of
// threads a call asks for; between calls its workers first spin for a short while (kSpinNs: calls
// that follow each other closely, like the layers of a decode step, then find them awake) and then
// sleep on a condition variable; they are joined when the process exits. A call runs `count` tasks on up to `threads` threads, the calling thread
// being one of them, and returns when every task has returned. Calls from several caller threads
// are serialized (one job runs at a time); a call that needs a single thread runs inline on the
// caller and never waits for the pool. Tasks are handed out one at a time from an atomic counter,
// so a thread that is slowed down (a core shared with another process) takes fewer of them.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <thread>
#include <vector>

namespace qsdpa::detail::cpu {

class ThreadPool {
 public:
  // The process-wide pool.
  static ThreadPool& global();

  // Calls fn(i) for every i in [0, count) on at most `threads` threads and waits for all of them.
  // Returns false when a task threw (the other tasks still run; the exception is swallowed).
  template <class F>
  bool parallel_for(int threads, int64_t count, F&& fn) {
    auto call = [](void* ctx, int64_t i) { (*static_cast<F*>(ctx))(i); };
    return run(threads, count, call, &fn);
  }

  ~ThreadPool();

  // The hard upper bound on the threads of one call.
  static constexpr int max_threads = 256;

 private:
  using TaskFn = void (*)(void*, int64_t);
  struct Job;

  ThreadPool() = default;
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  bool run(int threads, int64_t count, TaskFn fn, void* ctx);
  void grow(int workers);  // with call_mu_ held
  void worker_main(int id);
  static void run_tasks(Job& job);

  std::mutex call_mu_;  // one job at a time

  // How long an idle worker (and a caller waiting for its workers) spins before it sleeps.
  static constexpr int64_t kSpinNs = 200000;

  std::mutex mu_;  // guards everything below; the atomics are also read without it while spinning
  std::condition_variable wake_;
  std::condition_variable done_;
  std::vector<std::thread> workers_;
  Job* job_ = nullptr;
  std::atomic<uint64_t> generation_{0};  // written under mu_
  int active_ = 0;                 // workers 0..active_-1 take part in the current job
  std::atomic<int> pending_{0};    // of those, how many have not finished it yet
  std::atomic<bool> stop_{false};  // written under mu_
};

// Threads a call uses when it asks for `requested` (0 or less: every hardware thread).
int resolve_threads(int requested);

}  // namespace qsdpa::detail::cpu
