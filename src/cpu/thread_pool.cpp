#include "thread_pool.hpp"

#if defined(__x86_64__) || defined(__i386__) || defined(_M_X64)
#include <immintrin.h>
#define QSDPA_PAUSE() _mm_pause()
#elif defined(__aarch64__)
#define QSDPA_PAUSE() asm volatile("yield")
#else
#define QSDPA_PAUSE() ((void)0)
#endif

#include <algorithm>
#include <atomic>
#include <chrono>
#include <system_error>

namespace qsdpa::detail::cpu {

struct ThreadPool::Job {
  TaskFn fn;
  void* ctx;
  int64_t count;
  std::atomic<int64_t> next{0};
  std::atomic<bool> failed{false};
};

namespace {

// Spins until done() or for about ns nanoseconds; returns done().
template <class F>
bool spin_until(F&& done, int64_t ns) {
  if (done()) return true;
  const auto end = std::chrono::steady_clock::now() + std::chrono::nanoseconds(ns);
  for (;;) {
    for (int i = 0; i < 64; ++i) {
      QSDPA_PAUSE();
      if (done()) return true;
    }
    if (std::chrono::steady_clock::now() >= end) return done();
  }
}

}  // namespace

ThreadPool& ThreadPool::global() {
  // A function-local static: built on first use, destroyed (workers joined) at exit.
  static ThreadPool pool;
  return pool;
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    stop_.store(true);
  }
  wake_.notify_all();
  for (auto& t : workers_)
    if (t.joinable()) t.join();
}

int resolve_threads(int requested) {
  int n = requested;
  if (n <= 0) n = int(std::thread::hardware_concurrency());
  return std::clamp(n, 1, ThreadPool::max_threads);
}

void ThreadPool::run_tasks(Job& job) {
  for (;;) {
    const int64_t i = job.next.fetch_add(1, std::memory_order_relaxed);
    if (i >= job.count) return;
    try {
      job.fn(job.ctx, i);
    } catch (...) {
      job.failed.store(true, std::memory_order_relaxed);
    }
  }
}

void ThreadPool::grow(int workers) {
  while (int(workers_.size()) < workers) {
    const int id = int(workers_.size());
    try {
      workers_.emplace_back([this, id] { worker_main(id); });
    } catch (const std::system_error&) {
      return;  // the system refuses more threads: run with the ones there are
    }
  }
}

void ThreadPool::worker_main(int id) {
  uint64_t seen = 0;
  for (;;) {
    const auto posted = [&] {
      return stop_.load(std::memory_order_acquire) || generation_.load(std::memory_order_acquire) != seen;
    };
    spin_until(posted, kSpinNs);
    Job* job = nullptr;
    {
      std::unique_lock<std::mutex> lk(mu_);
      wake_.wait(lk, posted);
      if (stop_.load()) return;
      seen = generation_.load();
      if (id < active_) job = job_;
    }
    if (!job) continue;
    run_tasks(*job);
    if (pending_.fetch_sub(1, std::memory_order_acq_rel) == 1) {
      std::lock_guard<std::mutex> lk(mu_);  // the caller checks pending_ under mu_ before it sleeps
      done_.notify_one();
    }
  }
}

bool ThreadPool::run(int threads, int64_t count, TaskFn fn, void* ctx) {
  if (count <= 0) return true;
  Job job;
  job.fn = fn;
  job.ctx = ctx;
  job.count = count;
  const int64_t want = std::min<int64_t>(std::clamp(threads, 1, max_threads), count);
  if (want <= 1) {
    run_tasks(job);
    return !job.failed.load();
  }

  std::lock_guard<std::mutex> call(call_mu_);
  grow(int(want) - 1);
  {
    std::lock_guard<std::mutex> lk(mu_);
    job_ = &job;
    active_ = std::min(int(want) - 1, int(workers_.size()));
    pending_.store(active_);
    generation_.fetch_add(1, std::memory_order_release);
  }
  wake_.notify_all();
  run_tasks(job);
  const auto finished = [&] { return pending_.load(std::memory_order_acquire) == 0; };
  spin_until(finished, kSpinNs);
  {
    std::unique_lock<std::mutex> lk(mu_);
    done_.wait(lk, finished);
    job_ = nullptr;
    active_ = 0;
  }
  return !job.failed.load();
}

}  // namespace qsdpa::detail::cpu
