#include "thread_pool.hpp"

#include <algorithm>
#include <atomic>
#include <system_error>

namespace qsdpa::detail::cpu {

struct ThreadPool::Job {
  TaskFn fn;
  void* ctx;
  int64_t count;
  std::atomic<int64_t> next{0};
  std::atomic<bool> failed{false};
};

ThreadPool& ThreadPool::global() {
  // A function-local static: built on first use, destroyed (workers joined) at exit.
  static ThreadPool pool;
  return pool;
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    stop_ = true;
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
  std::unique_lock<std::mutex> lk(mu_);
  for (;;) {
    wake_.wait(lk, [&] { return stop_ || generation_ != seen; });
    if (stop_) return;
    seen = generation_;
    if (id >= active_) continue;
    Job* job = job_;
    lk.unlock();
    run_tasks(*job);
    lk.lock();
    if (--pending_ == 0) done_.notify_one();
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
    pending_ = active_;
    ++generation_;
  }
  wake_.notify_all();
  run_tasks(job);
  {
    std::unique_lock<std::mutex> lk(mu_);
    done_.wait(lk, [&] { return pending_ == 0; });
    job_ = nullptr;
    active_ = 0;
  }
  return !job.failed.load();
}

}  // namespace qsdpa::detail::cpu
