#include <algorithm>
#include <cstdio>
#include <cstdint>
#include <vector>
#include <random>
struct P { uint32_t key; uint32_t id; };
static uint64_t seedv;
static uint64_t lcg() { seedv = seedv * 6364136223846793005ULL + 1442695040888963407ULL; return seedv >> 33; }
static uint64_t fnv(const std::vector<P>& v, size_t n) { uint64_t h = 1469598103934665603ULL; for (size_t i = 0; i < n; i++) { h ^= v[i].id; h *= 1099511628211ULL; } return h; }
int main() {
  size_t ns[] = {2, 3, 5, 16, 17, 18, 33, 64, 100, 129, 300, 1000, 5000};
  uint32_t ranges[] = {1, 2, 3, 10};
  for (size_t n : ns) for (uint32_t r : ranges) {
    seedv = n * 31 + r;
    std::vector<P> v(n); for (size_t i = 0; i < n; i++) v[i] = {(uint32_t)(lcg() % r), (uint32_t)i};
    auto a = v; std::sort(a.begin(), a.end(), [](const P& x, const P& y){ return x.key > y.key; });
    printf("sort %zu %u %llu\n", n, r, (unsigned long long)fnv(a, n));
    size_t ks[] = {1, 3, 40, 128};
    for (size_t k : ks) { if (k > n) continue; auto b = v; std::partial_sort(b.begin(), b.begin()+k, b.end(), [](const P& x, const P& y){ return x.key > y.key; });
      printf("psort %zu %u %zu %llu %llu\n", n, r, k, (unsigned long long)fnv(b, k), (unsigned long long)fnv(b, n)); }
  }
  // rng checks
  std::mt19937 g(1234);
  std::uniform_real_distribution<double> d(0.0, 1.0);
  std::uniform_real_distribution<float> f(0.0f, 1.0f);
  printf("u64 %.17g\n", d(g)); printf("u32 %.9g\n", f(g)); printf("u64 %.17g\n", d(g));
  std::vector<float> w = {0.1f, 0.2f, 0.3f, 0.4f};
  for (int i = 0; i < 5; i++) { std::discrete_distribution<int> dd(w.begin(), w.end()); printf("dd %d\n", dd(g)); }
  std::vector<float> w1 = {1.0f};
  { std::discrete_distribution<int> dd(w1.begin(), w1.end()); printf("dd1 %d\n", dd(g)); }
  printf("next %u\n", (unsigned)g());
}
