// Small helpers of the qsdpa program: errors, threads, sizes, dates and what the machine is.
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <ctime>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "common.hpp"

namespace qsdpa_cli {

Status error(StatusCode c, std::string msg) {
  Status s;
  s.code = c;
  s.message = std::move(msg);
  return s;
}

int hardware_threads() { return std::max(1, int(std::thread::hardware_concurrency())); }

void parallel_for(int64_t n, const std::function<void(int64_t, int64_t)>& f) {
  if (n <= 0) return;
  const int64_t nt = std::min<int64_t>(hardware_threads(), n);
  if (nt == 1) {
    f(0, n);
    return;
  }
  std::vector<std::thread> threads;
  threads.reserve(size_t(nt));
  for (int64_t t = 0; t < nt; ++t) threads.emplace_back(f, n * t / nt, n * (t + 1) / nt);
  for (auto& t : threads) t.join();
}

uint64_t physical_memory_bytes() {
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
  return pages > 0 && page > 0 ? uint64_t(pages) * uint64_t(page) : 0;
}

std::string human_bytes(double bytes) {
  char buf[64];
  if (bytes >= 1e9)
    std::snprintf(buf, sizeof buf, "%.2f GB", bytes / 1e9);
  else if (bytes >= 1e6)
    std::snprintf(buf, sizeof buf, "%.2f MB", bytes / 1e6);
  else
    std::snprintf(buf, sizeof buf, "%.1f kB", bytes / 1e3);
  return buf;
}

std::string human_mib(double bytes) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.0f MiB", bytes / double(1 << 20));
  return buf;
}

std::string utc_now_iso() {
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&now, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

std::string cpu_model_name() {
  std::ifstream f("/proc/cpuinfo");
  std::string line, fallback;
  while (std::getline(f, line)) {
    const auto colon = line.find(':');
    if (colon == std::string::npos) continue;
    std::string key = line.substr(0, colon), value = line.substr(colon + 1);
    key.erase(key.find_last_not_of(" \t") + 1);
    value.erase(0, value.find_first_not_of(" \t"));
    if (key == "model name" && !value.empty()) return value;
    if ((key == "Hardware" || key == "cpu model") && fallback.empty()) fallback = value;
  }
  return fallback.empty() ? "unknown CPU" : fallback;
}

int64_t cpu_l3_bytes() {
  // The largest cache that sysfs lists for cpu0 (the last level).
  int64_t best = 0;
  for (int i = 0; i < 8; ++i) {
    std::ifstream f("/sys/devices/system/cpu/cpu0/cache/index" + std::to_string(i) + "/size");
    std::string s;
    if (!(f >> s) || s.empty()) continue;
    int64_t v = 0;
    size_t k = 0;
    while (k < s.size() && s[k] >= '0' && s[k] <= '9') v = v * 10 + (s[k++] - '0');
    if (k < s.size() && (s[k] == 'K' || s[k] == 'k')) v <<= 10;
    if (k < s.size() && (s[k] == 'M' || s[k] == 'm')) v <<= 20;
    best = std::max(best, v);
  }
  return best > 0 ? best : int64_t(32) << 20;
}

bool parse_dtype(const std::string& s, DType* t) {
  if (s == "f32")
    *t = DType::f32;
  else if (s == "f16")
    *t = DType::f16;
  else if (s == "bf16")
    *t = DType::bf16;
  else
    return false;
  return true;
}

}  // namespace qsdpa_cli
