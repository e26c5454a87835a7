// trainkit's fused CPU kernels, called through ops.Custom(func_type="aot") (trainkit/kernels/).
// Each entry point has MindSpore's AOT signature; the last params entry is the output.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <thread>
#include <vector>

namespace {
int64_t count(int ndim, const int64_t *shape) {
  int64_t n = 1;
  for (int i = 0; i < ndim; ++i) n *= shape[i];
  return n;
}

// Where each of k tensors starts among their values one after another: k + 1 offsets, the last the total.
std::vector<int64_t> starts(int k, int *ndims, int64_t **shapes) {
  std::vector<int64_t> start(k + 1, 0);
  for (int i = 0; i < k; ++i) start[i + 1] = start[i] + count(ndims[i], shapes[i]);
  return start;
}

// Runs work(begin, end) over `rows` rows of `per_row` values each, in up to 8 threads (one below 256 Ki values:
// starting a thread costs ~50-200 us, more than copying that much).
template <typename Work>
void parallel_rows(int64_t rows, int64_t per_row, Work work) {
  unsigned threads = rows * per_row < (int64_t(1) << 18)
                         ? 1u : std::max(1u, std::min(8u, std::thread::hardware_concurrency()));
  if (int64_t(threads) > rows) threads = unsigned(std::max<int64_t>(rows, 1));
  int64_t chunk = (rows + threads - 1) / threads;
  std::vector<std::thread> pool;
  for (unsigned t = 1; t < threads; ++t) {
    int64_t begin = t * chunk, end = std::min(rows, begin + chunk);
    if (begin < end) pool.emplace_back(work, begin, end);
  }
  work(int64_t(0), std::min(rows, chunk));
  for (auto &thread : pool) thread.join();
}

// Runs work(begin, end) over [0, n) elements, as parallel_rows with rows of one value.
template <typename Work>
void parallel(int64_t n, Work work) {
  parallel_rows(n, 1, work);
}
}  // namespace

// shadow (float32, written in place), value (float32, same shape), weight (float32 scalar) -> flag (float32 [1]).
// shadow = shadow - (shadow - value) * weight: MindSpore's Sub, Mul and AssignSub in one pass.
extern "C" int TrainkitEmaUpdate(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes,
                                 void *stream, void *extra) {
  if (nparam != 4) return 1;
  float *shadow = static_cast<float *>(params[0]);
  const float *value = static_cast<const float *>(params[1]);
  const float weight = *static_cast<const float *>(params[2]);
  parallel(count(ndims[0], shapes[0]), [=](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      float difference = shadow[i] - value[i];
      float step = difference * weight;
      shadow[i] = shadow[i] - step;
    }
  });
  *static_cast<float *>(params[3]) = 0.0f;
  return 0;
}

// buffer (float32, written in place), value (float32, same shape) -> flag (float32 [1]).
// buffer = buffer + value: MindSpore's AssignAdd, multithreaded.
extern "C" int TrainkitAddInto(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes,
                               void *stream, void *extra) {
  if (nparam != 3) return 1;
  float *buffer = static_cast<float *>(params[0]);
  const float *value = static_cast<const float *>(params[1]);
  parallel(count(ndims[0], shapes[0]), [=](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) buffer[i] = buffer[i] + value[i];
  });
  *static_cast<float *>(params[2]) = 0.0f;
  return 0;
}

namespace {
// The columns' geometry, given as an int64 input [kh, kw, sh, sw, ph, pw, dh, dw, channel_major] (symmetric
// padding); channel_major 1: x is laid out (C, N, H, W), 0: (N, C, H, W).
struct Geometry {
  int64_t n, c, h, w, kh, kw, sh, sw, ph, pw, dh, dw, oh, ow;
  bool channel_major;
  Geometry(const int64_t *x_shape, const int64_t *g)
      : n(x_shape[g[8] ? 1 : 0]), c(x_shape[g[8] ? 0 : 1]), h(x_shape[2]), w(x_shape[3]), kh(g[0]), kw(g[1]),
        sh(g[2]), sw(g[3]), ph(g[4]), pw(g[5]), dh(g[6]), dw(g[7]), oh((h + 2 * ph - dh * (kh - 1) - 1) / sh + 1),
        ow((w + 2 * pw - dw * (kw - 1) - 1) / sw + 1), channel_major(g[8] != 0) {}
  // Where image n's channel c starts in x.
  int64_t plane(int64_t image, int64_t channel) const {
    return (channel_major ? channel * n + image : image * c + channel) * h * w;
  }
  int64_t length() const { return n * oh * ow; }  // columns per row
};

// For each kernel offset (i, j), where each of the oh * ow outputs reads in its input plane (ih * w + iw), or -1
// in the padding; and whether the offset reads anything at all. Computed once a call, so the loops over channels
// and images below are a gather without the bounds arithmetic, and an offset that reads only padding (most of a
// 3x3 at 1x1 or 2x2, ResNet's last layers at 32x32) is one fill or nothing.
struct Offsets {
  std::vector<int32_t> source;
  std::vector<char> reads;
  int64_t per_offset;
  explicit Offsets(const Geometry &g) : source(g.kh * g.kw * g.oh * g.ow), reads(g.kh * g.kw, 0), per_offset(g.oh * g.ow) {
    for (int64_t i = 0; i < g.kh; ++i)
      for (int64_t j = 0; j < g.kw; ++j) {
        int32_t *table = &source[(i * g.kw + j) * per_offset];
        for (int64_t oh = 0; oh < g.oh; ++oh) {
          const int64_t ih = oh * g.sh - g.ph + i * g.dh;
          for (int64_t ow = 0; ow < g.ow; ++ow) {
            const int64_t iw = ow * g.sw - g.pw + j * g.dw;
            const bool inside = ih >= 0 && ih < g.h && iw >= 0 && iw < g.w;
            table[oh * g.ow + ow] = inside ? int32_t(ih * g.w + iw) : -1;
            reads[i * g.kw + j] |= inside;
          }
        }
      }
  }
  const int32_t *table(int64_t offset) const { return &source[offset * per_offset]; }
};

}  // namespace

// x (float32 N, C, H, W or C, N, H, W), geometry (int64 [9]) -> columns (float32 C*kh*kw, N*OH*OW).
// Row (c, i, j) holds x[n, c, oh*sh - ph + i*dh, ow*sw - pw + j*dw] (0 outside) for every (n, oh, ow): ops.unfold's
// values, already in the (C*kh*kw, N*L) layout the convolution's MatMul takes (no transpose after it).
extern "C" int TrainkitIm2Col(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes,
                              void *stream, void *extra) {
  if (nparam != 3 || ndims[0] != 4) return 1;
  const float *x = static_cast<const float *>(params[0]);
  const Geometry g(shapes[0], static_cast<const int64_t *>(params[1]));
  float *cols = static_cast<float *>(params[2]);
  const int64_t length = g.length(), per_image = g.oh * g.ow, taps = g.kh * g.kw;
  const Offsets offsets(g);
  const Offsets *where = &offsets;
  parallel_rows(g.c * taps, length, [=](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const int64_t c = r / taps, tap = r % taps;
      float *row = cols + r * length;
      if (!where->reads[tap]) {
        std::fill(row, row + length, 0.0f);
        continue;
      }
      const int32_t *table = where->table(tap);
      for (int64_t n = 0; n < g.n; ++n) {
        const float *plane = x + g.plane(n, c);
        float *out = row + n * per_image;
        for (int64_t t = 0; t < per_image; ++t) out[t] = table[t] >= 0 ? plane[table[t]] : 0.0f;
      }
    }
  });
  return 0;
}

// d_columns (float32 C*kh*kw, N*OH*OW), x (its shape only), geometry (int64 [9]) -> dx (x's shape and layout).
// The gradient of TrainkitIm2Col: each input value is the sum of the column values read from it, kernel offsets
// in order (i, j), from 0 -- the float32 sum NumPy's scatter-add over the offsets gives (an input value is read at
// most once per offset). Gathered, not scattered: each value is written once, from a list of where it was read
// (built once a call), one thread per channel range.
extern "C" int TrainkitCol2Im(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes,
                              void *stream, void *extra) {
  if (nparam != 4 || ndims[1] != 4) return 1;
  const float *d_cols = static_cast<const float *>(params[0]);
  const Geometry g(shapes[1], static_cast<const int64_t *>(params[2]));
  float *dx = static_cast<float *>(params[3]);
  const int64_t length = g.length(), per_image = g.oh * g.ow, taps = g.kh * g.kw, pixels = g.h * g.w;
  const Offsets offsets(g);
  // reads[first[p] .. first[p + 1]): where input pixel p went, as offsets into a channel's rows of one image, in
  // kernel-offset order.
  std::vector<int64_t> first(pixels + 1, 0), reads;
  {
    std::vector<int32_t> read_at(pixels * taps, -1);
    for (int64_t tap = 0; tap < taps; ++tap) {
      const int32_t *table = offsets.table(tap);
      for (int64_t t = 0; t < per_image; ++t)
        if (table[t] >= 0) read_at[table[t] * taps + tap] = int32_t(t);
    }
    for (int64_t p = 0; p < pixels; ++p) {
      for (int64_t tap = 0; tap < taps; ++tap)
        if (read_at[p * taps + tap] >= 0) reads.push_back(tap * length + read_at[p * taps + tap]);
      first[p + 1] = int64_t(reads.size());
    }
  }
  const int64_t *starts = first.data(), *sources = reads.data();
  parallel_rows(g.c, taps * length, [=](int64_t begin, int64_t end) {
    for (int64_t c = begin; c < end; ++c) {
      for (int64_t n = 0; n < g.n; ++n) {
        const float *columns = d_cols + c * taps * length + n * per_image;
        float *plane = dx + g.plane(n, c);
        for (int64_t p = 0; p < pixels; ++p) {
          float sum = 0.0f;
          for (int64_t e = starts[p]; e < starts[p + 1]; ++e) sum += columns[sources[e]];
          plane[p] = sum;
        }
      }
    }
  });
  return 0;
}

namespace {
// Calls update(first[j], second[j]) for every value j of k tensor pairs given as params[0..k) (written in place)
// and params[k..2k), split across threads by values, not by tensors: one call of MindSpore's for all of a
// network's tensors instead of one per tensor (a ResNet-50 EMA update: 5.0 ms against 12.8 ms for 267 tensors).
// Whether params[0..n) are all float32 (a kernel refuses anything else rather than misread it).
bool all_float32(int n, const char **dtypes) {
  for (int i = 0; i < n; ++i)
    if (std::strcmp(dtypes[i], "float32") != 0) return false;
  return true;
}

template <typename Update>
void over_pairs(int k, void **params, int *ndims, int64_t **shapes, Update update) {
  const std::vector<int64_t> start = starts(k, ndims, shapes);
  parallel(start[k], [&](int64_t begin, int64_t end) {
    int i = int(std::upper_bound(start.begin(), start.end(), begin) - start.begin()) - 1;
    for (; i < k && start[i] < end; ++i) {
      float *first = static_cast<float *>(params[i]);
      const float *second = static_cast<const float *>(params[k + i]);
      const int64_t low = std::max(begin, start[i]) - start[i], high = std::min(end, start[i + 1]) - start[i];
      for (int64_t j = low; j < high; ++j) first[j] = update(first[j], second[j]);
    }
  });
}
}  // namespace

// The k shadows of params[0..k) moved towards the values of params[k..2k) by the weight params[2k]:
// shadow - (shadow - value) * weight, rounded as MindSpore's three kernels (built with -ffp-contract=off).
void ema_pairs(int k, void **params, int *ndims, int64_t **shapes) {
  const float weight = *static_cast<const float *>(params[2 * k]);
  over_pairs(k, params, ndims, shapes, [weight](float shadow, float value) {
    float difference = shadow - value;
    float step = difference * weight;
    return shadow - step;
  });
}

// k shadows (float32, written in place), k values (float32, the same shapes), weight (float32 scalar) -> flag:
// TrainkitEmaUpdate over every pair in one call. nparam = 2k + 2.
extern "C" int TrainkitEmaUpdateAll(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes,
                                    void *stream, void *extra) {
  if (nparam < 4 || nparam % 2 != 0) return 1;
  if (!all_float32(nparam - 1, dtypes)) return 2;
  const int k = (nparam - 2) / 2;
  ema_pairs(k, params, ndims, shapes);
  *static_cast<float *>(params[nparam - 1]) = 0.0f;
  return 0;
}

// k buffers (float32, written in place), k values (float32, the same shapes) -> flag: TrainkitAddInto over every
// pair in one call. nparam = 2k + 1.
extern "C" int TrainkitAddIntoAll(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes,
                                  void *stream, void *extra) {
  if (nparam < 3 || nparam % 2 != 1) return 1;
  if (!all_float32(nparam - 1, dtypes)) return 2;
  const int k = (nparam - 1) / 2;
  over_pairs(k, params, ndims, shapes, [](float buffer, float value) { return buffer + value; });
  *static_cast<float *>(params[nparam - 1]) = 0.0f;
  return 0;
}

namespace {
// The global L2 norm's blocks: the k tensors' values one after another, cut every kNormBlock values whatever the
// tensors' boundaries. Each block's squares are summed in double over kLanes running sums (value j of the block in
// lane j % kLanes, so the loop vectorizes), the lanes added in a fixed tree, the blocks in order: the same bits
// whatever the thread count or split, and no float32 overflow (a norm is not finite only if a value is not, or
// the norm itself exceeds float32). A block is small enough that a kernel which writes it first reads it back from
// cache.
constexpr int64_t kNormBlock = int64_t(1) << 14;
constexpr int kLanes = 8;

// sum(x[j]^2) over [0, n) for values that sit at lane `lane` onwards, into acc[kLanes].
inline void add_squares(const float *x, int64_t n, int lane, double *acc) {
  int64_t j = 0;
  for (; j < n && (lane + j) % kLanes != 0; ++j) acc[(lane + j) % kLanes] += double(x[j]) * double(x[j]);
  for (; j + kLanes <= n; j += kLanes)
    for (int q = 0; q < kLanes; ++q) acc[q] += double(x[j + q]) * double(x[j + q]);
  for (; j < n; ++j) acc[(lane + j) % kLanes] += double(x[j]) * double(x[j]);
}

// The norm of k tensors of sizes `start` (offsets, k + 1 of them): segment(i, low, high) returns the float32
// values [low, high) of tensor i (having written them first, for a kernel that does), whose squares are summed.
template <typename Segment>
float blocked_norm(int k, const std::vector<int64_t> &start, Segment segment) {
  const int64_t total = start[k], blocks = (total + kNormBlock - 1) / kNormBlock;
  std::vector<double> partial(blocks, 0.0);
  parallel_rows(blocks, kNormBlock, [&](int64_t first_block, int64_t end_block) {
    int i = 0;
    for (int64_t b = first_block; b < end_block; ++b) {
      const int64_t begin = b * kNormBlock, end = std::min(total, begin + kNormBlock);
      double acc[kLanes] = {0, 0, 0, 0, 0, 0, 0, 0};
      while (start[i + 1] <= begin) ++i;
      for (int t = i; t < k && start[t] < end; ++t) {
        const int64_t low = std::max(begin, start[t]) - start[t], high = std::min(end, start[t + 1]) - start[t];
        if (low < high)
          add_squares(segment(t, low, high), high - low, int((start[t] + low - begin) % kLanes), acc);
      }
      partial[b] = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
    }
  });
  double sum = 0.0;
  for (double value : partial) sum += value;
  return float(std::sqrt(sum));
}

}  // namespace

// k float32 tensors -> their global L2 norm (float32 [1]), summed as blocked_norm sums: one node in the graph and
// one pass over memory, where MindSpore's kernels take a square and two reductions per tensor (ResNet-50's
// gradients: see docs/performance.md). nparam = k + 1.
extern "C" int TrainkitNormAll(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes,
                               void *stream, void *extra) {
  if (nparam < 2) return 1;
  const int k = nparam - 1;
  if (!all_float32(nparam, dtypes)) return 2;
  *static_cast<float *>(params[k]) = blocked_norm(k, starts(k, ndims, shapes), [&](int t, int64_t low, int64_t) {
    return static_cast<const float *>(params[t]) + low;
  });
  return 0;
}

// k buffers (float32, written in place), k values (float32, the same shapes), first (bool scalar) -> the norm of
// the buffers as written (float32 [1], as TrainkitNormAll): on a window's first micro-step buffer = value, after
// it buffer = buffer + value. An accumulation window's sum and its norm with no branch in the graph (one call a
// micro-step whichever it is; the norm in the same pass over memory). nparam = 2k + 2.
extern "C" int TrainkitAccumulateAll(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes,
                                     void *stream, void *extra) {
  if (nparam < 4 || nparam % 2 != 0) return 1;
  if (!all_float32(nparam - 2, dtypes) || std::strcmp(dtypes[nparam - 2], "bool") != 0) return 2;
  const int k = (nparam - 2) / 2;
  const bool first = *static_cast<const bool *>(params[nparam - 2]);
  *static_cast<float *>(params[nparam - 1]) = blocked_norm(k, starts(k, ndims, shapes), [&](int t, int64_t low,
                                                                                          int64_t high) {
    float *buffer = static_cast<float *>(params[t]);
    const float *value = static_cast<const float *>(params[k + t]);
    if (first)
      std::memcpy(buffer + low, value + low, sizeof(float) * (high - low));
    else
      for (int64_t j = low; j < high; ++j) buffer[j] = buffer[j] + value[j];
    return static_cast<const float *>(buffer + low);
  });
  return 0;
}

// TrainkitEmaUpdateAll on an applied step only: k shadows, k values, weight, applied (bool scalar) -> flag. Lets a
// skipped window leave the shadows alone without a branch in the graph. nparam = 2k + 3.
extern "C" int TrainkitEmaUpdateAllIf(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes,
                                      void *stream, void *extra) {
  if (nparam < 5 || nparam % 2 != 1) return 1;
  if (!all_float32(nparam - 2, dtypes) || std::strcmp(dtypes[nparam - 2], "bool") != 0) return 2;
  *static_cast<float *>(params[nparam - 1]) = 0.0f;
  if (!*static_cast<const bool *>(params[nparam - 2])) return 0;
  const int k = (nparam - 3) / 2;
  ema_pairs(k, params, ndims, shapes);
  return 0;
}

// k targets (float32, written in place), k saved values -> flag, with a last bool scalar `keep`: on a skipped
// window (keep false) the targets get their saved values back (the moving statistics at the window's start);
// otherwise nothing is written. nparam = 2k + 2.
extern "C" int TrainkitRestoreAllUnless(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes,
                                        void *stream, void *extra) {
  if (nparam < 4 || nparam % 2 != 0) return 1;
  if (!all_float32(nparam - 2, dtypes) || std::strcmp(dtypes[nparam - 2], "bool") != 0) return 2;
  *static_cast<float *>(params[nparam - 1]) = 0.0f;
  if (*static_cast<const bool *>(params[nparam - 2])) return 0;
  const int k = (nparam - 2) / 2;
  over_pairs(k, params, ndims, shapes, [](float, float saved) { return saved; });
  return 0;
}

namespace {
// Runs update(i, low, high) over values [low, high) of tensor i, for k tensors of `sizes` values, split across
// threads by values (as over_pairs).
template <typename Update>
void over_tensors(int k, int *ndims, int64_t **shapes, Update update) {
  const std::vector<int64_t> start = starts(k, ndims, shapes);
  parallel(start[k], [&](int64_t begin, int64_t end) {
    int i = int(std::upper_bound(start.begin(), start.end(), begin) - start.begin()) - 1;
    for (; i < k && start[i] < end; ++i)
      update(i, std::max(begin, start[i]) - start[i], std::min(end, start[i + 1]) - start[i]);
  });
}

}  // namespace

// SGD with momentum over k tensors in one call, as mindspore.nn.Momentum with ApplyMomentum (bitwise), preceded by
// the gradient factor and the optimizer's weight decay, skipped whole on a non-finite step:
//   k weights, k moments (float32, written in place), k gradients, decay [k], lr, momentum, factor, finite,
//   global_step -> flag. nparam = 3k + 7 (the flag last).
// g = grad * factor; g = weight * decay + g (decay != 0); moment = moment * momentum + g;
// weight -= moment * lr. (No Nesterov: MindSpore 2.10's CPU ApplyMomentum ignores use_nesterov, so nn.Momentum
// with it stays on MindSpore's kernels, whose results it would change.)
extern "C" int TrainkitMomentumAll(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes,
                                   void *stream, void *extra) {
  if (nparam < 10 || (nparam - 7) % 3 != 0) return 1;
  const int k = (nparam - 7) / 3;
  if (std::strcmp(dtypes[nparam - 6], "float32") != 0 || std::strcmp(dtypes[nparam - 5], "float32") != 0 ||
      std::strcmp(dtypes[nparam - 4], "float32") != 0 || std::strcmp(dtypes[nparam - 3], "bool") != 0 ||
      std::strcmp(dtypes[nparam - 2], "int32") != 0 || !all_float32(3 * k + 1, dtypes))
    return 2;
  *static_cast<float *>(params[nparam - 1]) = 0.0f;
  if (!*static_cast<const bool *>(params[nparam - 3])) return 0;  // not finite: nothing moves
  const float *decay = static_cast<const float *>(params[3 * k]);
  const float lr = *static_cast<const float *>(params[nparam - 6]);
  const float momentum = *static_cast<const float *>(params[nparam - 5]);
  const float factor = *static_cast<const float *>(params[nparam - 4]);
  over_tensors(k, ndims, shapes, [&](int i, int64_t low, int64_t high) {
    float *weight = static_cast<float *>(params[i]);
    float *moment = static_cast<float *>(params[k + i]);
    const float *grad = static_cast<const float *>(params[2 * k + i]);
    const float wd = decay[i];
    for (int64_t j = low; j < high; ++j) {
      float g = grad[j] * factor;
      if (wd != 0.0f) g = weight[j] * wd + g;
      moment[j] = moment[j] * momentum + g;
      weight[j] -= moment[j] * lr;
    }
  });
  *static_cast<int32_t *>(params[nparam - 2]) += 1;
  return 0;
}

// Adam over k tensors in one call, float32 operation by operation (NumPy's rounding; MindSpore's SIMD kernels
// differ from it in the last bit of a few values), as mindspore.nn.Adam (L2 weight decay into the gradient, bias correction through
// beta powers) or, with kDecoupled, as mindspore.nn.AdamWeightDecay (decay added to the update, no bias
// correction), preceded by the gradient factor and skipped whole on a non-finite step:
//   k weights, k first moments, k second moments (float32, written in place), k gradients, decay [k], lr, beta1,
//   beta2, eps, beta1_power, beta2_power (float32 scalars, written in place: times beta on a finite step),
//   factor, finite, global_step -> flag. nparam = 4k + 11.
template <bool kDecoupled>
int adam_all(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes) {
  if (nparam < 15 || (nparam - 11) % 4 != 0) return 1;
  const int k = (nparam - 11) / 4;
  if (!all_float32(nparam - 3, dtypes) || std::strcmp(dtypes[nparam - 3], "bool") != 0 ||
      std::strcmp(dtypes[nparam - 2], "int32") != 0)
    return 2;
  *static_cast<float *>(params[nparam - 1]) = 0.0f;
  if (!*static_cast<const bool *>(params[nparam - 3])) return 0;  // not finite: nothing moves
  const float *decay = static_cast<const float *>(params[4 * k]);
  const float lr = *static_cast<const float *>(params[4 * k + 1]);
  const float beta1 = *static_cast<const float *>(params[4 * k + 2]);
  const float beta2 = *static_cast<const float *>(params[4 * k + 3]);
  const float eps = *static_cast<const float *>(params[4 * k + 4]);
  float *beta1_power = static_cast<float *>(params[4 * k + 5]);
  float *beta2_power = static_cast<float *>(params[4 * k + 6]);
  const float factor = *static_cast<const float *>(params[nparam - 4]);
  const float power1 = *beta1_power * beta1, power2 = *beta2_power * beta2;
  const float one = 1.0f;
  const float step_lr = kDecoupled ? lr : lr * std::sqrt(one - power2) / (one - power1);
  over_tensors(k, ndims, shapes, [&](int i, int64_t low, int64_t high) {
    float *weight = static_cast<float *>(params[i]);
    float *m = static_cast<float *>(params[k + i]);
    float *v = static_cast<float *>(params[2 * k + i]);
    const float *grad = static_cast<const float *>(params[3 * k + i]);
    const float wd = decay[i];
    for (int64_t j = low; j < high; ++j) {
      float g = grad[j] * factor;
      if (kDecoupled) {
        m[j] = beta1 * m[j] + (one - beta1) * g;
        v[j] = beta2 * v[j] + (one - beta2) * (g * g);
        float update = m[j] / (std::sqrt(v[j]) + eps);
        if (wd != 0.0f) update = update + wd * weight[j];
        weight[j] = weight[j] - lr * update;
      } else {
        if (wd != 0.0f) g = weight[j] * wd + g;
        m[j] = m[j] + (g - m[j]) * (one - beta1);
        v[j] = v[j] + (g * g - v[j]) * (one - beta2);
        weight[j] = weight[j] - step_lr * m[j] / (std::sqrt(v[j]) + eps);
      }
    }
  });
  *beta1_power = power1;
  *beta2_power = power2;
  *static_cast<int32_t *>(params[nparam - 2]) += 1;
  return 0;
}

extern "C" int TrainkitAdamAll(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes,
                               void *stream, void *extra) {
  return adam_all<false>(nparam, params, ndims, shapes, dtypes);
}

extern "C" int TrainkitAdamWeightDecayAll(int nparam, void **params, int *ndims, int64_t **shapes,
                                          const char **dtypes, void *stream, void *extra) {
  return adam_all<true>(nparam, params, ndims, shapes, dtypes);
}

// k float32 tensors -> their values one after another (float32 [total]): reshape(-1) and concat of them in one
// call, a copy bit for bit (the moving statistics at a window's start, the small tensors of a reduction). One node
// in the graph instead of two or three per tensor: the front end's compile time grows with the nodes.
// nparam = k + 1.
extern "C" int TrainkitConcatAll(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes,
                                 void *stream, void *extra) {
  if (nparam < 2) return 1;
  const int k = nparam - 1;
  if (!all_float32(nparam, dtypes)) return 2;
  const std::vector<int64_t> start = starts(k, ndims, shapes);
  if (count(ndims[k], shapes[k]) != start[k]) return 3;
  float *out = static_cast<float *>(params[k]);
  over_tensors(k, ndims, shapes, [&](int i, int64_t low, int64_t high) {
    std::memcpy(out + start[i] + low, static_cast<const float *>(params[i]) + low, sizeof(float) * (high - low));
  });
  return 0;
}

// k targets (float32, written in place), their saved values one after another (float32 [total], as
// TrainkitConcatAll wrote them), keep (bool scalar) -> flag: TrainkitRestoreAllUnless with the saved values in one
// tensor. nparam = k + 3.
extern "C" int TrainkitRestoreFlatUnless(int nparam, void **params, int *ndims, int64_t **shapes,
                                         const char **dtypes, void *stream, void *extra) {
  if (nparam < 4) return 1;
  const int k = nparam - 3;
  if (!all_float32(k + 1, dtypes) || std::strcmp(dtypes[nparam - 2], "bool") != 0) return 2;
  *static_cast<float *>(params[nparam - 1]) = 0.0f;
  const std::vector<int64_t> start = starts(k, ndims, shapes);
  if (count(ndims[k], shapes[k]) != start[k]) return 3;
  if (*static_cast<const bool *>(params[nparam - 2])) return 0;
  const float *saved = static_cast<const float *>(params[k]);
  over_tensors(k, ndims, shapes, [&](int i, int64_t low, int64_t high) {
    std::memcpy(static_cast<float *>(params[i]) + low, saved + start[i] + low, sizeof(float) * (high - low));
  });
  return 0;
}

namespace {
// The outputs [begin, end) of an output row whose input column o * sw + offset lies inside [0, w).
inline void inside_range(int64_t offset, int64_t sw, int64_t w, int64_t ow, int64_t *begin, int64_t *end) {
  int64_t b = offset >= 0 ? 0 : (-offset + sw - 1) / sw;
  int64_t e = w - 1 - offset < 0 ? 0 : (w - 1 - offset) / sw + 1;
  *begin = std::min(b, ow);
  *end = std::max(*begin, std::min(e, ow));
}

// Where image n's channel c starts in an output of `g` (the input's layout, oh x ow planes).
inline int64_t out_plane(const Geometry &g, int64_t image, int64_t channel) {
  return (g.channel_major ? channel * g.n + image : image * g.c + channel) * g.oh * g.ow;
}
}  // namespace

// Stride 1 (the common depthwise case: MobileNets' 3x3, ConvNeXt's 7x7): each plane goes through a zero-padded copy
// of pitch w + 2 pw, and each tap (i, j) is then one long contiguous loop over the oh rows at that pitch (columns
// past ow are computed and dropped), instead of oh short rows clipped at the borders; taps that read only padding
// are skipped. Every output adds the same taps, in the same order, as the general loops (a padding tap adds +-0).
struct StrideOne {
  int64_t pitch, rows, span;  // padded row length, padded rows, values one tap's loop covers: (oh - 1) pitch + ow
  explicit StrideOne(const Geometry &g)
      : pitch(g.w + 2 * g.pw), rows(g.h + 2 * g.ph), span((g.oh - 1) * (g.w + 2 * g.pw) + g.ow) {}
  int64_t offset(const Geometry &g, int64_t i, int64_t j) const { return i * g.dh * pitch + j * g.dw; }
  // Whether tap (i, j) reads any value inside the plane (not only padding).
  bool reads(const Geometry &g, int64_t i, int64_t j) const {
    const int64_t top = i * g.dh, left = j * g.dw;
    return top < g.ph + g.h && top + g.oh > g.ph && left < g.pw + g.w && left + g.ow > g.pw;
  }
  void pad(const Geometry &g, const float *plane, float *padded) const {
    std::fill(padded, padded + rows * pitch, 0.0f);
    for (int64_t r = 0; r < g.h; ++r) std::copy(plane + r * g.w, plane + (r + 1) * g.w, padded + (r + g.ph) * pitch + g.pw);
  }
};

// x (float32 N, C, H, W or C, N, H, W), weight (float32 C, 1, kh, kw), geometry (int64 [9]) -> y (x's layout,
// oh x ow planes): the depthwise convolution (groups = channels, one filter each) without im2col, which writes
// kh * kw copies of the input for a product with one row each. y[n, c] = sum over (i, j), in that order, of
// weight[c, i, j] * x[n, c] shifted, padding read as 0. One thread per range of planes.
extern "C" int TrainkitDepthwise(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes,
                                 void *stream, void *extra) {
  if (nparam != 4 || ndims[0] != 4 || ndims[1] != 4) return 1;
  const float *x = static_cast<const float *>(params[0]);
  const float *weight = static_cast<const float *>(params[1]);
  const Geometry g(shapes[0], static_cast<const int64_t *>(params[2]));
  float *y = static_cast<float *>(params[3]);
  const Geometry *geometry = &g;
  if (g.sh == 1 && g.sw == 1) {
    const StrideOne one(g);
    const StrideOne *layout = &one;
    parallel_rows(g.n * g.c, g.oh * g.ow * g.kh * g.kw, [=](int64_t begin, int64_t end) {
      const Geometry &g = *geometry;
      const StrideOne &one = *layout;
      std::vector<float> padded(one.rows * one.pitch), sums(g.oh * one.pitch);
      for (int64_t r = begin; r < end; ++r) {
        const int64_t n = r / g.c, c = r % g.c;
        const float *filter = weight + c * g.kh * g.kw;
        one.pad(g, x + g.plane(n, c), padded.data());
        std::fill(sums.begin(), sums.end(), 0.0f);
        for (int64_t i = 0; i < g.kh; ++i)
          for (int64_t j = 0; j < g.kw; ++j) {
            if (!one.reads(g, i, j)) continue;
            const float tap = filter[i * g.kw + j];
            const float *in = padded.data() + one.offset(g, i, j);
            float *acc = sums.data();
            for (int64_t t = 0; t < one.span; ++t) acc[t] += tap * in[t];
          }
        float *out = y + out_plane(g, n, c);
        for (int64_t oh = 0; oh < g.oh; ++oh)
          std::copy(sums.data() + oh * one.pitch, sums.data() + oh * one.pitch + g.ow, out + oh * g.ow);
      }
    });
    return 0;
  }
  parallel_rows(g.n * g.c, g.oh * g.ow * g.kh * g.kw, [=](int64_t begin, int64_t end) {
    const Geometry &g = *geometry;
    for (int64_t r = begin; r < end; ++r) {
      const int64_t n = r / g.c, c = r % g.c;
      const float *plane = x + g.plane(n, c);
      const float *filter = weight + c * g.kh * g.kw;
      float *out = y + out_plane(g, n, c);
      std::fill(out, out + g.oh * g.ow, 0.0f);
      for (int64_t i = 0; i < g.kh; ++i)
        for (int64_t oh = 0; oh < g.oh; ++oh) {
          const int64_t ih = oh * g.sh - g.ph + i * g.dh;
          if (ih < 0 || ih >= g.h) continue;
          const float *row = plane + ih * g.w;
          float *out_row = out + oh * g.ow;
          for (int64_t j = 0; j < g.kw; ++j) {
            const float tap = filter[i * g.kw + j];
            const int64_t offset = j * g.dw - g.pw;
            int64_t first, last;
            inside_range(offset, g.sw, g.w, g.ow, &first, &last);
            if (g.sw == 1) {
              for (int64_t o = first; o < last; ++o) out_row[o] += tap * row[o + offset];
            } else {
              for (int64_t o = first; o < last; ++o) out_row[o] += tap * row[o * g.sw + offset];
            }
          }
        }
    }
  });
  return 0;
}

// dy (float32, y's shape and layout), weight (float32 C, 1, kh, kw), x (its shape only), geometry (int64 [9])
// -> dx (x's shape and layout): the depthwise convolution's gradient by its input, each input plane the sum of
// the output plane's values scattered back through the same taps, (i, j) in order. One thread per range of planes,
// so no two threads write one value.
extern "C" int TrainkitDepthwiseGradInput(int nparam, void **params, int *ndims, int64_t **shapes,
                                          const char **dtypes, void *stream, void *extra) {
  if (nparam != 5 || ndims[2] != 4) return 1;
  const float *dy = static_cast<const float *>(params[0]);
  const float *weight = static_cast<const float *>(params[1]);
  const Geometry g(shapes[2], static_cast<const int64_t *>(params[3]));
  float *dx = static_cast<float *>(params[4]);
  const Geometry *geometry = &g;
  if (g.sh == 1 && g.sw == 1) {
    const StrideOne one(g);
    const StrideOne *layout = &one;
    parallel_rows(g.n * g.c, g.oh * g.ow * g.kh * g.kw, [=](int64_t begin, int64_t end) {
      const Geometry &g = *geometry;
      const StrideOne &one = *layout;
      std::vector<float> padded(one.rows * one.pitch), spread(g.oh * one.pitch, 0.0f);
      for (int64_t r = begin; r < end; ++r) {
        const int64_t n = r / g.c, c = r % g.c;
        const float *filter = weight + c * g.kh * g.kw;
        const float *grad = dy + out_plane(g, n, c);
        for (int64_t oh = 0; oh < g.oh; ++oh)  // the columns past ow stay 0: they add nothing below
          std::copy(grad + oh * g.ow, grad + (oh + 1) * g.ow, spread.data() + oh * one.pitch);
        std::fill(padded.begin(), padded.end(), 0.0f);
        for (int64_t i = 0; i < g.kh; ++i)
          for (int64_t j = 0; j < g.kw; ++j) {
            if (!one.reads(g, i, j)) continue;
            const float tap = filter[i * g.kw + j];
            float *in = padded.data() + one.offset(g, i, j);
            const float *from = spread.data();
            for (int64_t t = 0; t < one.span; ++t) in[t] += tap * from[t];
          }
        float *plane = dx + g.plane(n, c);
        for (int64_t row = 0; row < g.h; ++row) {
          const float *source = padded.data() + (row + g.ph) * one.pitch + g.pw;
          std::copy(source, source + g.w, plane + row * g.w);
        }
      }
    });
    return 0;
  }
  parallel_rows(g.n * g.c, g.oh * g.ow * g.kh * g.kw, [=](int64_t begin, int64_t end) {
    const Geometry &g = *geometry;
    for (int64_t r = begin; r < end; ++r) {
      const int64_t n = r / g.c, c = r % g.c;
      float *plane = dx + g.plane(n, c);
      const float *filter = weight + c * g.kh * g.kw;
      const float *grad = dy + out_plane(g, n, c);
      std::fill(plane, plane + g.h * g.w, 0.0f);
      for (int64_t i = 0; i < g.kh; ++i)
        for (int64_t oh = 0; oh < g.oh; ++oh) {
          const int64_t ih = oh * g.sh - g.ph + i * g.dh;
          if (ih < 0 || ih >= g.h) continue;
          float *row = plane + ih * g.w;
          const float *grad_row = grad + oh * g.ow;
          for (int64_t j = 0; j < g.kw; ++j) {
            const float tap = filter[i * g.kw + j];
            const int64_t offset = j * g.dw - g.pw;
            int64_t first, last;
            inside_range(offset, g.sw, g.w, g.ow, &first, &last);
            if (g.sw == 1) {
              for (int64_t o = first; o < last; ++o) row[o + offset] += tap * grad_row[o];
            } else {
              for (int64_t o = first; o < last; ++o) row[o * g.sw + offset] += tap * grad_row[o];
            }
          }
        }
    }
  });
  return 0;
}

// dy (float32, y's shape and layout), x (float32), weight (its shape only), geometry (int64 [9]) -> dweight
// (float32 C, 1, kh, kw): the depthwise convolution's gradient by its weight, each tap's sum over images, rows and
// columns of dy times the input it read. Each row's products go into 8 float lanes (o mod 8, so the loop
// vectorises), the lanes and rows into a double, all in a fixed order: the same bits whatever the thread count.
// One thread per range of channels.
extern "C" int TrainkitDepthwiseGradWeight(int nparam, void **params, int *ndims, int64_t **shapes,
                                           const char **dtypes, void *stream, void *extra) {
  if (nparam != 5 || ndims[1] != 4) return 1;
  const float *dy = static_cast<const float *>(params[0]);
  const float *x = static_cast<const float *>(params[1]);
  const Geometry g(shapes[1], static_cast<const int64_t *>(params[3]));
  float *dweight = static_cast<float *>(params[4]);
  const Geometry *geometry = &g;
  if (g.sh == 1 && g.sw == 1) {
    const StrideOne one(g);
    const StrideOne *layout = &one;
    parallel_rows(g.c, g.n * g.oh * g.ow * g.kh * g.kw, [=](int64_t begin, int64_t end) {
      const Geometry &g = *geometry;
      const StrideOne &one = *layout;
      std::vector<float> padded(one.rows * one.pitch), spread(g.oh * one.pitch, 0.0f);
      std::vector<double> sums(g.kh * g.kw);
      for (int64_t c = begin; c < end; ++c) {
        std::fill(sums.begin(), sums.end(), 0.0);
        for (int64_t n = 0; n < g.n; ++n) {
          one.pad(g, x + g.plane(n, c), padded.data());
          const float *grad = dy + out_plane(g, n, c);
          for (int64_t oh = 0; oh < g.oh; ++oh)  // the columns past ow stay 0: they add nothing below
            std::copy(grad + oh * g.ow, grad + (oh + 1) * g.ow, spread.data() + oh * one.pitch);
          for (int64_t i = 0; i < g.kh; ++i)
            for (int64_t j = 0; j < g.kw; ++j) {
              if (!one.reads(g, i, j)) continue;
              const float *in = padded.data() + one.offset(g, i, j);
              const float *from = spread.data();
              float lanes[8] = {0, 0, 0, 0, 0, 0, 0, 0};
              int64_t t = 0;
              for (; t + 8 <= one.span; t += 8)
                for (int k = 0; k < 8; ++k) lanes[k] += from[t + k] * in[t + k];
              double sum = 0.0;
              for (int k = 0; k < 8; ++k) sum += lanes[k];
              for (; t < one.span; ++t) sum += double(from[t] * in[t]);
              sums[i * g.kw + j] += sum;
            }
        }
        for (int64_t t = 0; t < g.kh * g.kw; ++t) dweight[c * g.kh * g.kw + t] = float(sums[t]);
      }
    });
    return 0;
  }
  parallel_rows(g.c, g.n * g.oh * g.ow * g.kh * g.kw, [=](int64_t begin, int64_t end) {
    const Geometry &g = *geometry;
    std::vector<double> sums(g.kh * g.kw);
    for (int64_t c = begin; c < end; ++c) {
      std::fill(sums.begin(), sums.end(), 0.0);
      for (int64_t n = 0; n < g.n; ++n) {
        const float *plane = x + g.plane(n, c);
        const float *grad = dy + out_plane(g, n, c);
        for (int64_t i = 0; i < g.kh; ++i)
          for (int64_t oh = 0; oh < g.oh; ++oh) {
            const int64_t ih = oh * g.sh - g.ph + i * g.dh;
            if (ih < 0 || ih >= g.h) continue;
            const float *row = plane + ih * g.w;
            const float *grad_row = grad + oh * g.ow;
            for (int64_t j = 0; j < g.kw; ++j) {
              const int64_t offset = j * g.dw - g.pw;
              int64_t first, last;
              inside_range(offset, g.sw, g.w, g.ow, &first, &last);
              float lanes[8] = {0, 0, 0, 0, 0, 0, 0, 0};
              int64_t o = first;
              if (g.sw == 1) {
                for (; o + 8 <= last; o += 8)
                  for (int k = 0; k < 8; ++k) lanes[k] += grad_row[o + k] * row[o + k + offset];
              }
              double sum = 0.0;
              for (int k = 0; k < 8; ++k) sum += lanes[k];
              for (; o < last; ++o) sum += double(grad_row[o] * row[o * g.sw + offset]);
              sums[i * g.kw + j] += sum;
            }
          }
      }
      for (int64_t t = 0; t < g.kh * g.kw; ++t) dweight[c * g.kh * g.kw + t] = float(sums[t]);
    }
  });
  return 0;
}

// x (float32 N, C, H, W), geometry (int64 [9]: kh, kw, sh, sw, ph, pw, dh, dw, ceil_mode) -> y (float32 N, C, OH,
// OW), where (int32, y's shape): max pooling, padding read as -inf, as PyTorch's max_pool2d. `where` is the
// index in its input plane (ih * w + iw) of the value each output took: the first largest in the window's row-major
// order, or the first NaN (a NaN wins, as in PyTorch). OH and OW are y's (the caller's shape function decides them).
// One thread per range of planes.
extern "C" int TrainkitMaxPool(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes,
                               void *stream, void *extra) {
  if (nparam != 4 || ndims[0] != 4) return 1;
  const float *x = static_cast<const float *>(params[0]);
  const int64_t *g = static_cast<const int64_t *>(params[1]);
  float *y = static_cast<float *>(params[2]);
  int32_t *where = static_cast<int32_t *>(params[3]);
  const int64_t planes = shapes[0][0] * shapes[0][1], h = shapes[0][2], w = shapes[0][3];
  const int64_t kh = g[0], kw = g[1], sh = g[2], sw = g[3], ph = g[4], pw = g[5], dh = g[6], dw = g[7];
  const int64_t oh = shapes[2][2], ow = shapes[2][3];
  parallel_rows(planes, oh * ow * kh * kw, [=](int64_t begin, int64_t end) {
    for (int64_t p = begin; p < end; ++p) {
      const float *plane = x + p * h * w;
      float *out = y + p * oh * ow;
      int32_t *index = where + p * oh * ow;
      for (int64_t r = 0; r < oh; ++r)
        for (int64_t q = 0; q < ow; ++q) {
          float best = -INFINITY;
          int64_t at = -1;
          for (int64_t i = 0; i < kh; ++i) {
            const int64_t ih = r * sh - ph + i * dh;
            if (ih < 0 || ih >= h) continue;
            for (int64_t j = 0; j < kw; ++j) {
              const int64_t iw = q * sw - pw + j * dw;
              if (iw < 0 || iw >= w) continue;
              const float v = plane[ih * w + iw];
              if (at < 0 || v > best || (std::isnan(v) && !std::isnan(best))) {
                best = v;
                at = ih * w + iw;
              }
            }
          }
          out[r * ow + q] = best;
          index[r * ow + q] = int32_t(at);
        }
    }
  });
  return 0;
}

// dy (float32 N, C, oh, ow), where (int32, dy's shape), x (its shape only) -> dx (x's shape): max pooling's
// gradient, each output's gradient added to the input value it took, outputs in row-major order (overlapping
// windows add up). One thread per range of planes.
extern "C" int TrainkitMaxPoolGrad(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes,
                                   void *stream, void *extra) {
  if (nparam != 4 || ndims[0] != 4 || ndims[2] != 4) return 1;
  const float *dy = static_cast<const float *>(params[0]);
  const int32_t *where = static_cast<const int32_t *>(params[1]);
  float *dx = static_cast<float *>(params[3]);
  const int64_t planes = shapes[2][0] * shapes[2][1], area = shapes[2][2] * shapes[2][3];
  const int64_t outputs = shapes[0][2] * shapes[0][3];
  parallel_rows(planes, outputs + area, [=](int64_t begin, int64_t end) {
    for (int64_t p = begin; p < end; ++p) {
      float *plane = dx + p * area;
      std::fill(plane, plane + area, 0.0f);
      const float *grad = dy + p * outputs;
      const int32_t *index = where + p * outputs;
      for (int64_t o = 0; o < outputs; ++o)
        if (index[o] >= 0) plane[index[o]] += grad[o];
    }
  });
  return 0;
}

// Rows summed in blocks of this many, each block's sums then added in block order: the gradients of gamma and beta
// come out the same whatever the thread count.
constexpr int64_t kLayerNormBlock = 64;

// x (float32 [rows, d] in any shape whose last axis is d), gamma, beta (float32 [d]), epsilon (float32 [1]) -> y
// (x's shape), mean, rstd (float32 [rows]): the layer norm over the last axis, y = (x - mean) * rstd * gamma + beta
// with rstd = 1 / sqrt(var + epsilon) and var the biased variance, as MindSpore's and PyTorch's LayerNorm. Each
// row's mean and variance are summed in double, in two passes. One thread per range of rows.
extern "C" int TrainkitLayerNorm(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes,
                                 void *stream, void *extra) {
  if (nparam != 7) return 1;
  const float *x = static_cast<const float *>(params[0]);
  const float *gamma = static_cast<const float *>(params[1]);
  const float *beta = static_cast<const float *>(params[2]);
  const float epsilon = *static_cast<const float *>(params[3]);
  float *y = static_cast<float *>(params[4]);
  float *mean = static_cast<float *>(params[5]);
  float *rstd = static_cast<float *>(params[6]);
  const int64_t d = count(ndims[1], shapes[1]), rows = count(ndims[0], shapes[0]) / std::max<int64_t>(d, 1);
  parallel_rows(rows, d, [=](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const float *row = x + r * d;
      double sum = 0.0;
      for (int64_t k = 0; k < d; ++k) sum += row[k];
      const double mu = sum / double(d);
      double squares = 0.0;
      for (int64_t k = 0; k < d; ++k) squares += (row[k] - mu) * (row[k] - mu);
      const double s = 1.0 / std::sqrt(squares / double(d) + double(epsilon));
      mean[r] = float(mu);
      rstd[r] = float(s);
      float *out = y + r * d;
      // x - mean in double: a row far from 0 with a small spread (mean 3, std 1e-3) would lose a quarter of its
      // digits to the mean's float32 rounding
      for (int64_t k = 0; k < d; ++k) out[k] = float((row[k] - mu) * s) * gamma[k] + beta[k];
    }
  });
  return 0;
}

// dy (float32, x's shape), x, gamma (float32 [d]), mean, rstd (float32 [rows]) -> dx (x's shape), dgamma, dbeta
// (float32 [d]): the layer norm's gradients (the mean summed again in double, not read). With xhat = (x - mean) * rstd and g = dy * gamma, dx = rstd * (g -
// mean(g) - xhat * mean(g * xhat)) row by row; dgamma and dbeta sum dy * xhat and dy over the rows in blocks of
// kLayerNormBlock rows (in double), the blocks added in order.
extern "C" int TrainkitLayerNormGrad(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes,
                                     void *stream, void *extra) {
  if (nparam != 8) return 1;
  const float *dy = static_cast<const float *>(params[0]);
  const float *x = static_cast<const float *>(params[1]);
  const float *gamma = static_cast<const float *>(params[2]);
  const float *mean = static_cast<const float *>(params[3]);
  const float *rstd = static_cast<const float *>(params[4]);
  float *dx = static_cast<float *>(params[5]);
  float *dgamma = static_cast<float *>(params[6]);
  float *dbeta = static_cast<float *>(params[7]);
  const int64_t d = count(ndims[2], shapes[2]), rows = count(ndims[1], shapes[1]) / std::max<int64_t>(d, 1);
  const int64_t blocks = (rows + kLayerNormBlock - 1) / kLayerNormBlock;
  std::vector<double> partial(blocks * 2 * d, 0.0);
  double *sums = partial.data();
  parallel_rows(blocks, kLayerNormBlock * d, [=](int64_t begin, int64_t end) {
    for (int64_t b = begin; b < end; ++b) {
      double *block_gamma = sums + b * 2 * d, *block_beta = block_gamma + d;
      for (int64_t r = b * kLayerNormBlock; r < std::min(rows, (b + 1) * kLayerNormBlock); ++r) {
        const float *row = x + r * d, *grad = dy + r * d;
        const float s = rstd[r];
        double sum = 0.0;  // the row's mean again, in double (the forward's float32 mean loses digits: see there)
        for (int64_t k = 0; k < d; ++k) sum += row[k];
        const double m = sum / double(d);
        double g_sum = 0.0, gx_sum = 0.0;
        for (int64_t k = 0; k < d; ++k) {
          const float xhat = float((row[k] - m) * s), g = grad[k] * gamma[k];
          g_sum += g;
          gx_sum += double(g) * xhat;
          block_gamma[k] += double(grad[k]) * xhat;
          block_beta[k] += grad[k];
        }
        const float g_mean = float(g_sum / double(d)), gx_mean = float(gx_sum / double(d));
        float *out = dx + r * d;
        for (int64_t k = 0; k < d; ++k) {
          const float xhat = float((row[k] - m) * s);
          out[k] = s * (grad[k] * gamma[k] - g_mean - xhat * gx_mean);
        }
      }
    }
  });
  for (int64_t k = 0; k < d; ++k) {
    double total_gamma = 0.0, total_beta = 0.0;
    for (int64_t b = 0; b < blocks; ++b) {
      total_gamma += sums[b * 2 * d + k];
      total_beta += sums[b * 2 * d + d + k];
    }
    dgamma[k] = float(total_gamma);
    dbeta[k] = float(total_beta);
  }
  return 0;
}

namespace {
// Sums of a row in 8 float lanes (lane k takes the values at k mod 8, so the loop vectorises), the lanes and the
// tail then added in a fixed order in double: the same bits whatever the thread count, and the rounding of a sum
// of a few thousand values, not of one running float.
inline double lane_sum(const float *a, int64_t n) {
  float lanes[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t t = 0;
  for (; t + 8 <= n; t += 8)
    for (int k = 0; k < 8; ++k) lanes[k] += a[t + k];
  double sum = 0.0;
  for (int k = 0; k < 8; ++k) sum += lanes[k];
  for (; t < n; ++t) sum += a[t];
  return sum;
}

// The sum of (a - centre)^2, lanes as lane_sum.
inline double lane_centered_squares(const float *a, int64_t n, float centre) {
  float lanes[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t t = 0;
  for (; t + 8 <= n; t += 8)
    for (int k = 0; k < 8; ++k) lanes[k] += (a[t + k] - centre) * (a[t + k] - centre);
  double sum = 0.0;
  for (int k = 0; k < 8; ++k) sum += lanes[k];
  for (; t < n; ++t) sum += double(a[t] - centre) * (a[t] - centre);
  return sum;
}

// The sum of b * (a - centre) * scale, lanes as lane_sum.
inline double lane_centered_dot(const float *a, const float *b, int64_t n, float centre, float scale) {
  float lanes[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t t = 0;
  for (; t + 8 <= n; t += 8)
    for (int k = 0; k < 8; ++k) lanes[k] += b[t + k] * ((a[t + k] - centre) * scale);
  double sum = 0.0;
  for (int k = 0; k < 8; ++k) sum += lanes[k];
  for (; t < n; ++t) sum += double(b[t]) * ((a[t] - centre) * scale);
  return sum;
}
}  // namespace

// x (float32 N, C, H, W), gamma, beta (float32 [C]), moving_mean, moving_variance (float32 [C], written in place),
// settings (float32 [2]: epsilon, momentum) -> y (x's shape), mean, rstd (float32 [C]): batch norm in training, as
// MindSpore's BatchNorm(is_training=True) and PyTorch's: each channel's mean and biased variance over N, H, W
// (two passes), y = (x - mean) * rstd * gamma + beta with rstd = 1 / sqrt(var + epsilon); the
// moving statistics become (1 - momentum) * moving + momentum * batch's, the variance unbiased (times M / (M - 1),
// M = N * H * W). Sums per plane in float lanes, across planes in double (lane_sum). One thread per range of
// channels.
extern "C" int TrainkitBatchNorm(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes,
                                 void *stream, void *extra) {
  if (nparam != 9 || ndims[0] != 4) return 1;
  const float *x = static_cast<const float *>(params[0]);
  const float *gamma = static_cast<const float *>(params[1]);
  const float *beta = static_cast<const float *>(params[2]);
  float *moving_mean = static_cast<float *>(params[3]);
  float *moving_variance = static_cast<float *>(params[4]);
  const float epsilon = static_cast<const float *>(params[5])[0], momentum = static_cast<const float *>(params[5])[1];
  float *y = static_cast<float *>(params[6]);
  float *mean = static_cast<float *>(params[7]);
  float *rstd = static_cast<float *>(params[8]);
  const int64_t n = shapes[0][0], c = shapes[0][1], area = shapes[0][2] * shapes[0][3], m = n * area;
  parallel_rows(c, m, [=](int64_t begin, int64_t end) {
    for (int64_t k = begin; k < end; ++k) {
      double sum = 0.0;
      for (int64_t i = 0; i < n; ++i) sum += lane_sum(x + (i * c + k) * area, area);
      const double mu = sum / double(m);
      double squares = 0.0;
      for (int64_t i = 0; i < n; ++i) squares += lane_centered_squares(x + (i * c + k) * area, area, float(mu));
      const double variance = squares / double(m), s = 1.0 / std::sqrt(variance + double(epsilon));
      const float scale = float(s) * gamma[k], shift = beta[k] - float(mu) * scale;
      for (int64_t i = 0; i < n; ++i) {
        const float *plane = x + (i * c + k) * area;
        float *out = y + (i * c + k) * area;
        for (int64_t t = 0; t < area; ++t) out[t] = plane[t] * scale + shift;
      }
      mean[k] = float(mu);
      rstd[k] = float(s);
      const float unbiased = float(m > 1 ? variance * double(m) / double(m - 1) : variance);
      moving_mean[k] = (1.0f - momentum) * moving_mean[k] + momentum * float(mu);
      moving_variance[k] = (1.0f - momentum) * moving_variance[k] + momentum * unbiased;
    }
  });
  return 0;
}

// dy (float32, x's shape), x, gamma (float32 [C]), mean, rstd (float32 [C]) -> dx (x's shape), dgamma, dbeta
// (float32 [C]): batch norm's gradients in training. With xhat = (x - mean) * rstd, dgamma = sum(dy * xhat), dbeta
// = sum(dy) over N, H, W (as the forward sums) and dx = gamma * rstd * (dy - dbeta / M - xhat * dgamma / M). One thread per
// range of channels.
extern "C" int TrainkitBatchNormGrad(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes,
                                     void *stream, void *extra) {
  if (nparam != 8 || ndims[1] != 4) return 1;
  const float *dy = static_cast<const float *>(params[0]);
  const float *x = static_cast<const float *>(params[1]);
  const float *gamma = static_cast<const float *>(params[2]);
  const float *mean = static_cast<const float *>(params[3]);
  const float *rstd = static_cast<const float *>(params[4]);
  float *dx = static_cast<float *>(params[5]);
  float *dgamma = static_cast<float *>(params[6]);
  float *dbeta = static_cast<float *>(params[7]);
  const int64_t n = shapes[1][0], c = shapes[1][1], area = shapes[1][2] * shapes[1][3], m = n * area;
  parallel_rows(c, m, [=](int64_t begin, int64_t end) {
    for (int64_t k = begin; k < end; ++k) {
      const float mu = mean[k], s = rstd[k];
      double sum_dy = 0.0, sum_dy_xhat = 0.0;
      for (int64_t i = 0; i < n; ++i) {
        sum_dy += lane_sum(dy + (i * c + k) * area, area);
        sum_dy_xhat += lane_centered_dot(x + (i * c + k) * area, dy + (i * c + k) * area, area, mu, s);
      }
      dgamma[k] = float(sum_dy_xhat);
      dbeta[k] = float(sum_dy);
      const float a = gamma[k] * s, mean_dy = float(sum_dy / double(m)), mean_dy_xhat = float(sum_dy_xhat / double(m));
      for (int64_t i = 0; i < n; ++i) {
        const float *plane = x + (i * c + k) * area, *grad = dy + (i * c + k) * area;
        float *out = dx + (i * c + k) * area;
        for (int64_t t = 0; t < area; ++t) out[t] = a * (grad[t] - mean_dy - (plane[t] - mu) * s * mean_dy_xhat);
      }
    }
  });
  return 0;
}

// The GELU kernels are compiled without trapping math, which lets GCC vectorise their loops (branch-free
// polynomials, no libm call); no value changes: it only allows speculating operations that cannot trap here.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC push_options
#pragma GCC optimize("no-trapping-math")
#endif
namespace {
// exp(x) for x <= 0, branch-free (glibc's expf and erff branch on ranges, and mispredict on activations):
// x = k ln2 + r with |r| <= ln2 / 2, Cephes' degree-6 polynomial for e^r, 2^k written into the exponent bits.
// Below -87 it returns exp(-87) (1.6e-38): as good as 0 next to the 1 it is subtracted from or the x it scales.
inline float exp_nonpositive(float x) {
  x = x < -87.0f ? -87.0f : x;
  // k = round(x / ln2) by the 1.5 x 2^23 trick: no call into libm (fmaxf and nearbyintf are calls in a shared
  // library, and cost more than the polynomial)
  const float k = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
  const float r = (x - k * 0.693359375f) + k * 2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  const int32_t bits = (int32_t(k) + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, sizeof(scale));
  return (p * r * r + r + 1.0f) * scale;
}

// erf(x), branch-free: Abramowitz and Stegun 7.1.26 (absolute error below 1.5e-7), the formula PyTorch's vectorized
// CPU erf uses for its GELU.
inline float erf_branch_free(float x) {
  const float ax = __builtin_fabsf(x);  // builtins: std:: wrappers do not inline across option regions
  const float t = 1.0f / (1.0f + 0.3275911f * ax);
  const float poly = ((((1.061405429f * t - 1.453152027f) * t + 1.421413741f) * t - 0.284496736f) * t + 0.254829592f) * t;
  return __builtin_copysignf(1.0f - poly * exp_nonpositive(-ax * ax), x);
}

// The loops themselves, out of line: a lambda's body does not take this region's options.
void gelu_range(const float *x, float *y, int64_t begin, int64_t end) {
  for (int64_t i = begin; i < end; ++i) {
    const float v = x[i];
    y[i] = 0.5f * v * (1.0f + erf_branch_free(v * 0.70710678118654752f));
  }
}

void gelu_grad_range(const float *dy, const float *x, float *dx, int64_t begin, int64_t end) {
  for (int64_t i = begin; i < end; ++i) {
    const float v = x[i];
    const float cdf = 0.5f * (1.0f + erf_branch_free(v * 0.70710678118654752f));
    const float pdf = 0.39894228040143268f * exp_nonpositive(-0.5f * v * v);
    dx[i] = dy[i] * (cdf + v * pdf);
  }
}
}  // namespace

// x (float32) -> y (float32, x's shape): the exact GELU, x * Phi(x) = 0.5 x (1 + erf(x / sqrt 2)), PyTorch's
// nn.GELU() and MindSpore's nn.GELU(approximate=False), in one pass (MindSpore's CPU GeLU ran at a tenth of
// PyTorch's on ConvNeXt's activations). Within 3e-7 x max(1, |y|) of the exact function.
extern "C" int TrainkitGelu(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes,
                            void *stream, void *extra) {
  if (nparam != 2) return 1;
  const float *x = static_cast<const float *>(params[0]);
  float *y = static_cast<float *>(params[1]);
  parallel(count(ndims[0], shapes[0]), [=](int64_t begin, int64_t end) { gelu_range(x, y, begin, end); });
  return 0;
}

// dy (float32), x (float32, dy's shape) -> dx: the exact GELU's gradient, dy * (Phi(x) + x * phi(x)) with phi the
// standard normal density, in one pass.
extern "C" int TrainkitGeluGrad(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes,
                                void *stream, void *extra) {
  if (nparam != 3) return 1;
  const float *dy = static_cast<const float *>(params[0]);
  const float *x = static_cast<const float *>(params[1]);
  float *dx = static_cast<float *>(params[2]);
  parallel(count(ndims[0], shapes[0]),
           [=](int64_t begin, int64_t end) { gelu_grad_range(dy, x, dx, begin, end); });
  return 0;
}
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC pop_options
#endif

#ifndef TRAINKIT_DIGEST
#define TRAINKIT_DIGEST "unknown"
#endif
// The digest trainkit named this build by (source, compiler, flags): a library found under that name that says
// otherwise is not this build, and is built again rather than run.
extern "C" const char *TrainkitDigest() { return TRAINKIT_DIGEST; }
