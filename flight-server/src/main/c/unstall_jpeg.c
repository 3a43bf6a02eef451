/*
 * The sidecar's fast JPEG prep (docs/ARCHITECTURE.md, "Native JPEG prep"): decodes only the rows and columns
 * that a sample's crop keeps, at a reduced DCT scale when the crop is at least 2, 4 or 8 times the output, then
 * resamples, flips and converts in two passes that write straight into the batch's staging memory.
 *
 * Called from io.unstall.flight.prep.NativeJpeg. The Java side has already read the header (ImageHeader), sampled
 * the crop (torchvision's RandomResizedCrop parameters) and reserved the memory this call may use. Resampling is
 * Pillow's ImagingResample with the bilinear (triangle) filter, fixed point as Pillow computes it, so that the
 * output stays close to torchvision's PIL path: a horizontal pass per decoded row into an 8-bit intermediate
 * (the flip is folded into it), then a vertical pass into the output tensor through a per-channel table that
 * maps 0..255 to the output dtype (normalization included).
 *
 * Errors: libjpeg's error_exit longjmps back here and becomes a BadImageException naming libjpeg's
 * reason; premature end of data (or a marker cutting the entropy-coded data) inside the rows that are decoded is
 * an error too (libjpeg only warns and fills the rest with grey).
 */
#include <jni.h>
#include <math.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jerror.h>
#include <jpeglib.h>

#if defined(__GLIBC__) && defined(__x86_64__)
/* glibc 2.34 moved these into libc under a new version, GLIBC_2.34; the original versions, which libc still
 * exports and which the JVM's libpthread provides on older glibc, keep the library loadable on glibc 2.17+. */
__asm__(".symver pthread_key_create,pthread_key_create@GLIBC_2.2.5");
__asm__(".symver pthread_getspecific,pthread_getspecific@GLIBC_2.2.5");
__asm__(".symver pthread_setspecific,pthread_setspecific@GLIBC_2.2.5");
#endif

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define HAVE_AVX2_PATH 1
#endif

#define PRECISION_BITS (32 - 8 - 2) /* Pillow's fixed point for 8-bit resampling */

enum { OK = 0, FAILED = 1 };
/* Scratch buffers above this are freed after the sample instead of kept for the thread's next one. */
#define KEEP_BYTES (16u << 20)
/* Pixels decoded beyond the window on each side (see prep()). */
#define MARGIN 2

typedef struct {
  struct jpeg_error_mgr pub;
  jmp_buf jump;
  char message[JMSG_LENGTH_MAX + 64];
} error_mgr;

/* One per thread, reused across samples: the resampling buffers, and room for libjpeg's decompressor of a sample. */
typedef struct {
  struct jpeg_decompress_struct cinfo;
  error_mgr err;
  uint8_t *line; /* line_base + LINE_OFFSET (reserve_line) */
  uint8_t *line_base;
  size_t line_cap;
  uint8_t *tmp;
  size_t tmp_cap;
  int32_t *acc;
  size_t acc_cap;
  uint8_t *row8;
  size_t row8_cap;
  int32_t *kx, *ky;
  size_t kx_cap, ky_cap;
  int *bx, *by;
  size_t bx_cap, by_cap;
  double *wd;
  size_t wd_cap;
  int32_t *kv; /* the horizontal coefficients laid out for the AVX2 pass (horizontal_avx2) */
  size_t kv_cap;
  const uint8_t **rows; /* the vertical pass's source rows */
  size_t rows_cap;
  uint8_t *spliced; /* the crop's MCUs as a JPEG of their own (splice) */
  size_t spliced_cap;
  size_t *pieces; /* their restart intervals' start and end offsets */
  size_t pieces_cap;
  uint8_t *reindexed; /* the last reindex() result, for takeReindexed */
  size_t reindexed_cap, reindexed_len;
} scratch;

static pthread_key_t scratch_key;
static jclass bad_image_class;
/* The AVX2 passes run when the CPU has AVX2 and UNSTALL_JPEG_SIMD is not "0" (tests compare both paths). */
static int use_avx2;

static void free_scratch(void *p) {
  scratch *s = p;
  if (s == NULL) {
    return;
  }
  free(s->line_base);
  free(s->tmp);
  free(s->acc);
  free(s->row8);
  free(s->kx);
  free(s->ky);
  free(s->bx);
  free(s->by);
  free(s->wd);
  free(s->kv);
  free(s->rows);
  free(s->spliced);
  free(s->pieces);
  free(s->reindexed);
  free(s);
}

JNIEXPORT jint JNICALL JNI_OnLoad(JavaVM *vm, void *reserved) {
  (void)reserved;
  JNIEnv *env;
  if ((*vm)->GetEnv(vm, (void **)&env, JNI_VERSION_1_8) != JNI_OK) {
    return JNI_ERR;
  }
  jclass c = (*env)->FindClass(env, "io/unstall/flight/prep/BadImageException");
  if (c == NULL) {
    return JNI_ERR;
  }
  bad_image_class = (*env)->NewGlobalRef(env, c);
  if (pthread_key_create(&scratch_key, free_scratch) != 0) {
    return JNI_ERR;
  }
#ifdef HAVE_AVX2_PATH
  __builtin_cpu_init();
  const char *simd = getenv("UNSTALL_JPEG_SIMD");
  use_avx2 = __builtin_cpu_supports("avx2") && !(simd != NULL && strcmp(simd, "0") == 0);
#endif
  return JNI_VERSION_1_8;
}

/* Grows *buf to hold n elements of size sz; 0 when out of memory. */
static int reserve(void **buf, size_t *cap, size_t n, size_t sz) {
  if (*cap >= n) {
    return 1;
  }
  void *p = realloc(*buf, n * sz);
  if (p == NULL) {
    return 0;
  }
  *buf = p;
  *cap = n;
  return 1;
}
#define RESERVE(s, f, n) reserve((void **)&(s)->f, &(s)->f##_cap, (n), sizeof(*(s)->f))

/*
 * Where the decoded row starts relative to a 64-byte line. libjpeg-turbo's colour conversion stores a row in 32-byte
 * pieces and the horizontal pass reads it back at once in 8-byte pieces: from a 32-byte-aligned row those reads
 * straddle the pending stores and wait for them, which slows the whole sample markedly (native_prep_bench.sh
 * measures it with -DLINE_OFFSET=0; the numbers are in benchmarks/results/2026-11-23-to-26-native-jpeg-per-core.md).
 */
#ifndef LINE_OFFSET /* native_prep_bench.sh can build it with another (NATIVE_BENCH_CFLAGS=-DLINE_OFFSET=0) */
#define LINE_OFFSET 16
#endif

static int reserve_line(scratch *s, size_t n) {
  if (s->line_cap >= n) {
    return 1;
  }
  uint8_t *p = aligned_alloc(64, (n + LINE_OFFSET + 63) / 64 * 64);
  if (p == NULL) {
    return 0;
  }
  free(s->line_base);
  s->line_base = p;
  s->line = p + LINE_OFFSET;
  s->line_cap = n;
  return 1;
}

static void on_error(j_common_ptr cinfo) {
  error_mgr *e = (error_mgr *)cinfo->err;
  (*cinfo->err->format_message)(cinfo, e->message);
  longjmp(e->jump, 1);
}

static void on_message(j_common_ptr cinfo, int level) {
  int code = cinfo->err->msg_code;
  if (level < 0 && (code == JWRN_JPEG_EOF || code == JWRN_HIT_MARKER)) {
    error_mgr *e = (error_mgr *)cinfo->err;
    snprintf(e->message, sizeof e->message, "truncated JPEG data (%s within the decoded rows)",
             code == JWRN_JPEG_EOF ? "premature end of data" : "a marker cuts the entropy-coded data");
    longjmp(e->jump, 1);
  }
  /* Other warnings (extraneous bytes, resyncs) are decoded through, as PIL and OpenCV do. */
}

static double triangle(double x) {
  x = x < 0 ? -x : x;
  return x < 1.0 ? 1.0 - x : 0.0;
}

/*
 * Pillow's precompute_coeffs + normalize_coeffs_8bpc for the bilinear filter: out pixel i reads bounds[2i]
 * (first input index) .. + bounds[2i+1] (count) with fixed-point weights k[i * ksize ..]. Input indices are
 * relative to the clip window [0, in_size) and the box [in0, in1) is in the same coordinates.
 */
static int coeffs(scratch *s, int horizontal, int in_size, double in0, double in1, int out_size, int *ksize_out) {
  double scale = (in1 - in0) / out_size;
  double filterscale = scale < 1.0 ? 1.0 : scale;
  double support = 1.0 * filterscale;
  int ksize = (int)ceil(support) * 2 + 1;
  int32_t **k = horizontal ? &s->kx : &s->ky;
  int **b = horizontal ? &s->bx : &s->by;
  if (!(horizontal ? RESERVE(s, kx, (size_t)out_size * ksize) : RESERVE(s, ky, (size_t)out_size * ksize))
      || !(horizontal ? RESERVE(s, bx, (size_t)out_size * 2) : RESERVE(s, by, (size_t)out_size * 2))
      || !RESERVE(s, wd, (size_t)ksize)) {
    return 0;
  }
  double *w = s->wd;
  for (int xx = 0; xx < out_size; xx++) {
    double center = in0 + (xx + 0.5) * scale;
    double ww = 0.0;
    double ss = 1.0 / filterscale;
    int xmin = (int)(center - support + 0.5);
    if (xmin < 0) {
      xmin = 0;
    }
    int xmax = (int)(center + support + 0.5);
    if (xmax > in_size) {
      xmax = in_size;
    }
    xmax -= xmin;
    if (xmax < 1) { /* a box outside the window: cannot happen for boxes inside it, but never read out of it */
      xmin = xmin >= in_size ? in_size - 1 : xmin;
      xmax = 1;
      w[0] = 1.0;
      ww = 1.0;
    } else {
      for (int x = 0; x < xmax; x++) {
        w[x] = triangle((x + xmin - center + 0.5) * ss);
        ww += w[x];
      }
    }
    int32_t *kk = *k + (size_t)xx * ksize;
    for (int x = 0; x < ksize; x++) {
      double v = x < xmax ? (ww != 0.0 ? w[x] / ww : w[x]) : 0.0;
      kk[x] = v < 0 ? (int32_t)(-0.5 + v * (1 << PRECISION_BITS)) : (int32_t)(0.5 + v * (1 << PRECISION_BITS));
    }
    (*b)[xx * 2] = xmin;
    (*b)[xx * 2 + 1] = xmax;
  }
  *ksize_out = ksize;
  return 1;
}

static inline uint8_t clip8(int32_t v) {
  if (v >= (1 << PRECISION_BITS << 8)) {
    return 255;
  }
  if (v <= 0) {
    return 0;
  }
  return (uint8_t)(v >> PRECISION_BITS);
}

/* One decoded RGB row (starting at window column x0) to out_w RGB pixels, mirrored when flip. */
static void horizontal(const uint8_t *in, uint8_t *out, int out_w, const int32_t *k, const int *b, int ksize,
                       int x0, int flip) {
  for (int xx = 0; xx < out_w; xx++) {
    const int32_t *kk = k + (size_t)xx * ksize;
    const uint8_t *p = in + (size_t)(b[xx * 2] - x0) * 3;
    int n = b[xx * 2 + 1];
    int32_t r = 1 << (PRECISION_BITS - 1), g = r, bl = r;
    for (int x = 0; x < n; x++) {
      r += p[x * 3] * kk[x];
      g += p[x * 3 + 1] * kk[x];
      bl += p[x * 3 + 2] * kk[x];
    }
    uint8_t *o = out + (size_t)(flip ? out_w - 1 - xx : xx) * 3;
    o[0] = clip8(r);
    o[1] = clip8(g);
    o[2] = clip8(bl);
  }
}

/* The vertical pass of one output row into 8-bit RGB: row[i] from src[t][i], t < taps, with weights k[t]. */
static void vertical_scalar(const uint8_t *const *src, const int32_t *k, int taps, uint8_t *row, int32_t *acc,
                            size_t from, size_t n) {
  for (size_t i = from; i < n; i++) {
    acc[i] = 1 << (PRECISION_BITS - 1);
  }
  for (int t = 0; t < taps; t++) {
    for (size_t i = from; i < n; i++) {
      acc[i] += src[t][i] * k[t];
    }
  }
  for (size_t i = from; i < n; i++) {
    row[i] = clip8(acc[i]);
  }
}

#ifdef HAVE_AVX2_PATH
/*
 * The AVX2 passes: the same integer sums as the scalar ones (32-bit lanes, Pillow's 22-bit coefficients, no
 * overflow: the weights are non-negative and sum to ~1 << 22), so their output is identical, byte for byte.
 * Each step of the horizontal pass reads two input pixels (8 bytes, 6 used) into 8 lanes
 * [r0 g0 b0 r1 g1 b1 r2 g2] and multiplies them by [k0 k0 k0 k1 k1 k1 0 0] (kv, laid out by layout_kv); lanes
 * 3..5 are folded onto 0..2 once per output pixel. Every output pixel takes the same number of steps (pairs):
 * coefficients past a pixel's own taps are 0, and the row buffer is padded so that those reads stay inside it.
 */
/* One output pixel's sum in lanes 0..2 (r, g, b; lanes 3..7 are not used). */
__attribute__((target("avx2"), always_inline)) static inline __m128i h_avx2_pixel(const uint8_t *p,
                                                                                  const int32_t *kk, int pairs) {
  const __m256i bias = _mm256_setr_epi32(1 << (PRECISION_BITS - 1), 1 << (PRECISION_BITS - 1),
                                         1 << (PRECISION_BITS - 1), 0, 0, 0, 0, 0);
  const __m256i fold = _mm256_setr_epi32(3, 4, 5, 3, 3, 3, 3, 3);
  __m256i acc = bias;
  for (int j = 0; j < pairs; j++) {
    __m256i px = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(p + j * 6)));
    acc = _mm256_add_epi32(acc, _mm256_mullo_epi32(px, _mm256_loadu_si256((const __m256i *)(kk + j * 8))));
  }
  acc = _mm256_add_epi32(acc, _mm256_permutevar8x32_epi32(acc, fold));
  return _mm_srai_epi32(_mm256_castsi256_si128(acc), PRECISION_BITS);
}

/*
 * Two output pixels a step: clip8 is a saturating pack (>> PRECISION_BITS, then 0..255), and both pixels' 6
 * bytes leave in one shuffle, in either order (flip). pairs is a constant in the callers below, so the tap loop
 * unrolls.
 */
__attribute__((target("avx2"), always_inline)) static inline void h_avx2_row(const uint8_t *in, uint8_t *out,
                                                                             int out_w, const int32_t *kv,
                                                                             int pairs, const int *b, int x0,
                                                                             int flip) {
  const __m128i keep = _mm_setr_epi8(0, 1, 2, 4, 5, 6, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1);
  const __m128i swap = _mm_setr_epi8(4, 5, 6, 0, 1, 2, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1);
  const __m128i order = flip ? swap : keep;
  size_t stride = (size_t)pairs * 8;
  int xx = 0;
  for (; xx + 2 <= out_w; xx += 2) {
    __m128i a = h_avx2_pixel(in + (size_t)(b[xx * 2] - x0) * 3, kv + xx * stride, pairs);
    __m128i c = h_avx2_pixel(in + (size_t)(b[xx * 2 + 2] - x0) * 3, kv + (xx + 1) * stride, pairs);
    __m128i v = _mm_packs_epi32(a, c); /* 16 bits: ra ga ba - rc gc bc - */
    v = _mm_shuffle_epi8(_mm_packus_epi16(v, v), order);
    uint64_t six = (uint64_t)_mm_cvtsi128_si64(v);
    memcpy(out + (size_t)(flip ? out_w - 2 - xx : xx) * 3, &six, 6);
  }
  if (xx < out_w) {
    __m128i v = h_avx2_pixel(in + (size_t)(b[xx * 2] - x0) * 3, kv + xx * stride, pairs);
    v = _mm_packs_epi32(v, v);
    v = _mm_packus_epi16(v, v);
    uint32_t rgb = (uint32_t)_mm_cvtsi128_si32(v);
    uint8_t *o = out + (size_t)(flip ? out_w - 1 - xx : xx) * 3;
    o[0] = (uint8_t)rgb;
    o[1] = (uint8_t)(rgb >> 8);
    o[2] = (uint8_t)(rgb >> 16);
  }
}

#define H_AVX2_FIXED(n)                                                                                        \
  __attribute__((target("avx2"))) static void h_avx2_##n(const uint8_t *in, uint8_t *out, int out_w,           \
                                                         const int32_t *kv, const int *b, int x0, int flip) {  \
    h_avx2_row(in, out, out_w, kv, n, b, x0, flip);                                                            \
  }
H_AVX2_FIXED(1)
H_AVX2_FIXED(2)
H_AVX2_FIXED(3)
H_AVX2_FIXED(4)

__attribute__((target("avx2"))) static void horizontal_avx2(const uint8_t *in, uint8_t *out, int out_w,
                                                            const int32_t *kv, int pairs, const int *b, int x0,
                                                            int flip) {
  switch (pairs) {
  case 1:
    h_avx2_1(in, out, out_w, kv, b, x0, flip);
    break;
  case 2:
    h_avx2_2(in, out, out_w, kv, b, x0, flip);
    break;
  case 3:
    h_avx2_3(in, out, out_w, kv, b, x0, flip);
    break;
  case 4:
    h_avx2_4(in, out, out_w, kv, b, x0, flip);
    break;
  default:
    h_avx2_row(in, out, out_w, kv, pairs, b, x0, flip);
  }
}

/* vertical_scalar, 16 bytes a step (the rest, under 16, through vertical_scalar). */
__attribute__((target("avx2"))) static void vertical_avx2(const uint8_t *const *src, const int32_t *k, int taps,
                                                          uint8_t *row, int32_t *acc, size_t n) {
  const __m256i bias = _mm256_set1_epi32(1 << (PRECISION_BITS - 1));
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    __m256i a = bias, c = bias;
    for (int t = 0; t < taps; t++) {
      __m256i w = _mm256_set1_epi32(k[t]);
      a = _mm256_add_epi32(a, _mm256_mullo_epi32(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(src[t] + i))), w));
      c = _mm256_add_epi32(
          c, _mm256_mullo_epi32(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(src[t] + i + 8))), w));
    }
    a = _mm256_srai_epi32(a, PRECISION_BITS);
    c = _mm256_srai_epi32(c, PRECISION_BITS);
    __m128i a16 = _mm_packs_epi32(_mm256_castsi256_si128(a), _mm256_extracti128_si256(a, 1));
    __m128i c16 = _mm_packs_epi32(_mm256_castsi256_si128(c), _mm256_extracti128_si256(c, 1));
    _mm_storeu_si128((__m128i *)(row + i), _mm_packus_epi16(a16, c16));
  }
  vertical_scalar(src, k, taps, row, acc, i, n);
}
#endif

/* The horizontal coefficients (stride ksize) as horizontal_avx2 reads them; 0 when out of memory. */
static int layout_kv(scratch *s, int out_w, int ksize, int pairs) {
  if (!RESERVE(s, kv, (size_t)out_w * pairs * 8)) {
    return 0;
  }
  for (int xx = 0; xx < out_w; xx++) {
    const int32_t *kk = s->kx + (size_t)xx * ksize;
    int32_t *v = s->kv + (size_t)xx * pairs * 8;
    for (int j = 0; j < pairs; j++) {
      int32_t k0 = 2 * j < ksize ? kk[2 * j] : 0, k1 = 2 * j + 1 < ksize ? kk[2 * j + 1] : 0;
      int32_t lanes[8] = {k0, k0, k0, k1, k1, k1, 0, 0};
      memcpy(v + j * 8, lanes, sizeof lanes);
    }
  }
  return 1;
}

/* The 8-bit row to the output through the table, in NHWC or NCHW, for one element type. */
#define CONVERT(T)                                                                                             \
  {                                                                                                            \
    const T *t = (const T *)lut;                                                                               \
    T *o = (T *)dst;                                                                                           \
    if (!nchw) {                                                                                               \
      for (size_t i = 0; i < n; i += 3) {                                                                      \
        o[at * 3 + i] = t[row[i]];                                                                             \
        o[at * 3 + i + 1] = t[256 + row[i + 1]];                                                               \
        o[at * 3 + i + 2] = t[512 + row[i + 2]];                                                               \
      }                                                                                                        \
    } else {                                                                                                   \
      for (int c = 0; c < 3; c++) {                                                                            \
        T *oc = o + c * plane + at;                                                                            \
        const T *tc = t + c * 256;                                                                             \
        for (int x = 0; x < out_w; x++) {                                                                      \
          oc[x] = tc[row[x * 3 + c]];                                                                          \
        }                                                                                                      \
      }                                                                                                        \
    }                                                                                                          \
  }

/* The output row y from the rows of tmp: 8-bit RGB, then through the table into the tensor's layout. */
static void vertical_row(scratch *s, const uint8_t *tmp, int y0, int out_h, int out_w, int y, const int32_t *k,
                         const int *b, int ksize, uint8_t *dst, const uint8_t *lut, int elem, int nchw) {
  size_t n = (size_t)out_w * 3;
  uint8_t *row = s->row8;
  const int32_t *kk = k + (size_t)y * ksize;
  int taps = b[y * 2 + 1];
  const uint8_t **src = s->rows;
  for (int t = 0; t < taps; t++) {
    src[t] = tmp + (size_t)(b[y * 2] + t - y0) * n;
  }
#ifdef HAVE_AVX2_PATH
  if (use_avx2) {
    vertical_avx2(src, kk, taps, row, s->acc, n);
  } else
#endif
  {
    vertical_scalar(src, kk, taps, row, s->acc, 0, n);
  }
  size_t plane = (size_t)out_h * out_w;
  size_t at = (size_t)y * out_w;
  if (elem == 1) {
    if (!nchw) {
      memcpy(dst + at * 3, row, n);
    } else {
      for (int c = 0; c < 3; c++) {
        uint8_t *o = dst + c * plane + at;
        for (int x = 0; x < out_w; x++) {
          o[x] = row[x * 3 + c];
        }
      }
    }
  } else if (elem == 4) {
    CONVERT(float)
  } else {
    CONVERT(uint16_t)
  }
}

/* The largest of 8, 4, 2 (at most max_denom) that the box is at least that many times the output by; else 1. */
static int pick_denom(double bw, double bh, int out_w, int out_h, int max_denom, double gap) {
  for (int d = 8; d >= 2; d /= 2) {
    if (d <= max_denom && bw >= gap * d * out_w && bh >= gap * d * out_h) {
      return d;
    }
  }
  return 1;
}

static scratch *thread_scratch(void) {
  scratch *s = pthread_getspecific(scratch_key);
  if (s == NULL) {
    s = calloc(1, sizeof *s);
    if (s == NULL || pthread_setspecific(scratch_key, s) != 0) {
      free(s);
      return NULL;
    }
  }
  return s;
}

static int fail(JNIEnv *env, const char *message) {
  (*env)->ThrowNew(env, bad_image_class, message);
  return FAILED;
}

static int prep(JNIEnv *env, scratch *s, const uint8_t *src, int src_len, uint8_t *dst, const uint8_t *lut,
                const jint *g, const jdouble *box);

/*
 * Decoding only the MCUs a crop covers (splice). libjpeg-turbo's jpeg_crop_scanline and jpeg_skip_scanlines skip
 * the IDCT and colour conversion outside a window but still entropy-decode every MCU above its bottom edge: the
 * Huffman codes are variable-length and each block's DC is coded against the previous block's. A JPEG with restart
 * markers is different: each restart interval starts byte-aligned with the DC predictions reset, so the intervals
 * that cover a crop can be cut out and put together as a smaller JPEG (the same header, the size patched, the
 * restart markers renumbered) that decodes to exactly the pixels of that region. reindex() rewrites any JPEG
 * losslessly (the same DCT coefficients) into that form, with an interval every few MCUs of a row.
 */
typedef struct {
  int width, height;   /* the image's, from its SOF */
  int mcu_w, mcu_h;    /* an MCU's size in pixels */
  int per_row, rows;   /* MCUs across and down */
  int interval;        /* the restart interval, in MCUs (DRI); 0 without */
  size_t sof;          /* offset of the SOF's height field (the width follows) */
  size_t data;         /* where the entropy-coded data starts (after the SOS segment) */
} rst_layout;

static int be16(const uint8_t *p) { return p[0] << 8 | p[1]; }

/*
 * Reads the markers up to the scan: 1 when src is an 8-bit sequential Huffman JPEG with one interleaved scan of all
 * its components (or one component) and a restart interval that divides an MCU row, so that no interval crosses
 * a row; the layout in *l. Anything else (progressive, arithmetic, lossless, no restarts, a DNL height) is 0: the
 * caller decodes it as it is.
 */
static int read_layout(const uint8_t *src, size_t len, rst_layout *l) {
  if (len < 4 || src[0] != 0xFF || src[1] != 0xD8) {
    return 0;
  }
  size_t i = 2;
  int nf = 0, hmax = 1, vmax = 1;
  l->interval = 0;
  l->sof = 0;
  for (;;) {
    if (i + 4 > len || src[i] != 0xFF) {
      return 0;
    }
    while (i < len && src[i] == 0xFF) { /* fill bytes before a marker */
      i++;
    }
    if (i + 3 > len) {
      return 0;
    }
    int m = src[i++];
    if (m == 0xD8 || m == 0xD9 || m == 0x01 || (m >= 0xD0 && m <= 0xD7)) {
      return 0;
    }
    size_t seg = (size_t)be16(src + i);
    if (seg < 2 || i + seg > len) {
      return 0;
    }
    const uint8_t *p = src + i + 2;
    if (m == 0xC0 || m == 0xC1) {
      if (seg < 8 || p[0] != 8) {
        return 0;
      }
      l->height = be16(p + 1);
      l->width = be16(p + 3);
      nf = p[5];
      if ((nf != 1 && nf != 3) || seg != 8 + 3 * (size_t)nf || l->height == 0 || l->width == 0) {
        return 0;
      }
      for (int c = 0; c < nf; c++) {
        int h = p[7 + 3 * c] >> 4, v = p[7 + 3 * c] & 15;
        if (h < 1 || v < 1 || h > 4 || v > 4) {
          return 0;
        }
        hmax = h > hmax ? h : hmax;
        vmax = v > vmax ? v : vmax;
      }
      l->sof = i + 3;
    } else if (m >= 0xC2 && m <= 0xCF && m != 0xC4 && m != 0xCC) { /* SOF2.., arithmetic, lossless: not ours */
      return 0;
    } else if (m == 0xDD) {
      if (seg != 4) {
        return 0;
      }
      l->interval = be16(p);
    } else if (m == 0xDA) {
      if (l->sof == 0 || seg < 3 || p[0] != nf) {
        return 0;
      }
      l->data = i + seg;
      break;
    }
    i += seg;
  }
  if (nf == 1) { /* a one-component scan's MCU is one block */
    hmax = vmax = 1;
  }
  l->mcu_w = 8 * hmax;
  l->mcu_h = 8 * vmax;
  l->per_row = (l->width + l->mcu_w - 1) / l->mcu_w;
  l->rows = (l->height + l->mcu_h - 1) / l->mcu_h;
  return l->interval > 0 && l->per_row % l->interval == 0;
}

/*
 * Cuts the restart intervals covering image pixels [x0, x1) x [y0, y1) out of src (laid out as l) into
 * s->spliced as a JPEG of their own; its origin in the image (multiples of the MCU size) in *ox, *oy, its size in
 * *w, *h, its length in *out_len. 0 when the region is the whole image, or the data does not hold the intervals the
 * layout promises (a cut or damaged file: the caller decodes the original, and libjpeg says what is wrong).
 */
static int splice(scratch *s, const uint8_t *src, size_t len, const rst_layout *l, int x0, int y0, int x1, int y1,
                  int *ox, int *oy, int *w, int *h, size_t *out_len) {
  int per_seg = l->interval * l->mcu_w, segs = l->per_row / l->interval;
  x0 = x0 < 0 ? 0 : x0;
  y0 = y0 < 0 ? 0 : y0;
  int s0 = x0 / per_seg, s1 = (x1 + per_seg - 1) / per_seg;
  int r0 = y0 / l->mcu_h, r1 = (y1 + l->mcu_h - 1) / l->mcu_h;
  s1 = s1 > segs ? segs : s1;
  r1 = r1 > l->rows ? l->rows : r1;
  if ((s0 == 0 && s1 == segs && r0 == 0 && r1 == l->rows) || s0 >= s1 || r0 >= r1) {
    return 0;
  }
  int cols = s1 - s0;
  size_t n = (size_t)cols * (size_t)(r1 - r0);
  if (!RESERVE(s, pieces, 2 * n)) {
    return 0;
  }
  /* Walk the entropy-coded data's markers: interval k ends where restart marker k (mod 8) begins. */
  long last = (long)(r1 - 1) * segs + s1 - 1, total = (long)segs * l->rows;
  size_t p = l->data, start = p, got = 0, bytes = 0;
  for (long k = 0; k <= last;) {
    const uint8_t *f = p < len ? memchr(src + p, 0xFF, len - p) : NULL;
    if (f == NULL) {
      return 0;
    }
    size_t q = (size_t)(f - src) + 1;
    while (q < len && src[q] == 0xFF) {
      q++;
    }
    if (q >= len) {
      return 0;
    }
    int b = src[q];
    if (b == 0x00) { /* a stuffed 0xFF data byte */
      p = q + 1;
      continue;
    }
    if (b >= 0xD0 && b <= 0xD7 ? (b - 0xD0) != (k & 7) : !(b == 0xD9 && k == total - 1)) {
      return 0;
    }
    long row = k / segs, col = k % segs;
    if (row >= r0 && col >= s0 && col < s1) {
      s->pieces[got * 2] = start;
      s->pieces[got * 2 + 1] = (size_t)(f - src);
      bytes += (size_t)(f - src) - start;
      got++;
    }
    k++;
    start = p = q + 1;
  }
  size_t need = l->data + bytes + 2 * n + 2;
  if (got != n || !RESERVE(s, spliced, need)) {
    return 0;
  }
  *ox = s0 * per_seg;
  *oy = r0 * l->mcu_h;
  *w = s1 == segs ? l->width - *ox : cols * per_seg;
  *h = r1 == l->rows ? l->height - *oy : (r1 - r0) * l->mcu_h;
  uint8_t *o = s->spliced;
  memcpy(o, src, l->data);
  o[l->sof] = (uint8_t)(*h >> 8);
  o[l->sof + 1] = (uint8_t)*h;
  o[l->sof + 2] = (uint8_t)(*w >> 8);
  o[l->sof + 3] = (uint8_t)*w;
  o += l->data;
  for (size_t j = 0; j < n; j++) {
    size_t a = s->pieces[j * 2], e = s->pieces[j * 2 + 1];
    memcpy(o, src + a, e - a);
    o += e - a;
    *o++ = 0xFF;
    *o++ = j + 1 < n ? (uint8_t)(0xD0 + (j & 7)) : 0xD9;
  }
  *out_len = (size_t)(o - s->spliced);
  return 1;
}

/* run()'s and resample()'s geom (13 ints) and box (5 doubles) into g and box; FAILED with a Java exception pending. */
static int read_geometry(JNIEnv *env, jintArray geom_arr, jdoubleArray box_arr, jint *g, jdouble *box) {
  (*env)->GetIntArrayRegion(env, geom_arr, 0, 13, g);
  (*env)->GetDoubleArrayRegion(env, box_arr, 0, 5, box);
  return (*env)->ExceptionCheck(env) ? FAILED : OK;
}

/*
 * geom: {width, height (the header's), clipX0, clipY0, clipX1, clipY1 (the crop that bounds the filter, in image
 * pixels), outH, outW, flip, nchw, elemBytes, maxScaleDenom (1: no DCT scaling), window (0: decode every row and
 * column, as the reference path)}; box: {x0, y0, x1, y1} the source box in image pixels, then the reducing gap:
 * a DCT scale of 1/d only when the box is at least gap * d times the output (Pillow's reducing_gap).
 * Returns OK or FAILED (a BadImageException is pending).
 */
JNIEXPORT jint JNICALL Java_io_unstall_flight_prep_NativeJpeg_run(JNIEnv *env, jclass cls, jobject src_buf,
                                                                   jint src_pos, jint src_len, jobject dst_buf,
                                                                   jint dst_pos, jobject lut_buf, jintArray geom_arr,
                                                                   jdoubleArray box_arr) {
  (void)cls;
  jint g[13];
  jdouble box[5];
  if (read_geometry(env, geom_arr, box_arr, g, box) != OK) {
    return FAILED;
  }
  uint8_t *src = (*env)->GetDirectBufferAddress(env, src_buf);
  uint8_t *dst = (*env)->GetDirectBufferAddress(env, dst_buf);
  const uint8_t *lut = lut_buf == NULL ? NULL : (*env)->GetDirectBufferAddress(env, lut_buf);
  if (src == NULL || dst == NULL || (lut_buf != NULL && lut == NULL)) {
    return fail(env, "not a direct buffer");
  }
  src += src_pos;
  dst += dst_pos;
  scratch *s = thread_scratch();
  if (s == NULL) {
    return fail(env, "out of native memory for the JPEG decoder's scratch buffers");
  }
  return prep(env, s, src, src_len, dst, lut, g, box);
}

/*
 * Rewrites the JPEG src losslessly into splice()'s form: the same DCT coefficients, quantization tables and
 * sampling, as one sequential scan with optimized Huffman tables and a restart marker every `interval` MCUs: the
 * largest divisor of an MCU row's count whose interval spans at most span_px pixels. Progressive JPEGs come out
 * sequential. The Huffman tables are the standard ones (JPEG Annex K): one pass, where optimized tables take two
 * for few bytes saved.
 * On entry *out is a malloc'd buffer of *out_len bytes (or NULL, 0); on OK *out holds the result, *out_len bytes
 * (libjpeg may have replaced the buffer with a larger one: the caller frees whichever *out is); on FAILED,
 * err->message says why.
 * APPn markers (EXIF, ICC) are not copied: only the native prep path, which ignores them, reads the result.
 */
static int reindex(error_mgr *err, const uint8_t *src, size_t len, int span_px, unsigned char **out,
                   unsigned long *out_len) {
  struct jpeg_decompress_struct d;
  struct jpeg_compress_struct c;
  memset(&d, 0, sizeof d);
  memset(&c, 0, sizeof c);
  d.err = jpeg_std_error(&err->pub);
  err->pub.error_exit = on_error;
  err->pub.emit_message = on_message;
  err->message[0] = 0;
  c.err = &err->pub;
  if (setjmp(err->jump)) {
    jpeg_destroy_compress(&c);
    jpeg_destroy_decompress(&d);
    return FAILED;
  }
  jpeg_create_decompress(&d);
  jpeg_create_compress(&c);
  jpeg_mem_src(&d, src, (unsigned long)len);
  jpeg_read_header(&d, TRUE);
  jvirt_barray_ptr *coef = jpeg_read_coefficients(&d);
  jpeg_copy_critical_parameters(&d, &c);
  int mcu_w = d.num_components == 1 ? 8 : 8 * d.max_h_samp_factor;
  int per_row = ((int)d.image_width + mcu_w - 1) / mcu_w, interval = 1;
  for (int i = 1; i <= per_row && i * mcu_w <= span_px; i++) {
    interval = per_row % i == 0 ? i : interval;
  }
  c.restart_interval = (unsigned int)interval;
  jpeg_mem_dest(&c, out, out_len);
  jpeg_write_coefficients(&c, coef);
  jpeg_finish_compress(&c);
  jpeg_destroy_compress(&c);
  jpeg_destroy_decompress(&d);
  return OK;
}

/*
 * NativeJpeg.reindex: rewrites src (position pos, len bytes, a direct buffer) with reindex() into this thread's
 * scratch and returns the result's length, for takeReindexed; 0 when it cannot be rewritten (not a JPEG libjpeg
 * reads to the end, or out of memory). Never throws: the caller then decodes the original.
 */
JNIEXPORT jint JNICALL Java_io_unstall_flight_prep_NativeJpeg_reindex(JNIEnv *env, jclass cls, jobject src_buf,
                                                                       jint pos, jint len, jint span_px) {
  (void)cls;
  uint8_t *src = (*env)->GetDirectBufferAddress(env, src_buf);
  scratch *s = thread_scratch();
  if (src == NULL || s == NULL || len <= 0) {
    return 0;
  }
  s->reindexed_len = 0;
  size_t want = (size_t)len * 2 + 65536; /* never grown by libjpeg in practice (a grown buffer leaks on error) */
  if (s->reindexed_cap < want) {
    free(s->reindexed);
    s->reindexed = malloc(want);
    s->reindexed_cap = s->reindexed == NULL ? 0 : want;
    if (s->reindexed == NULL) {
      return 0;
    }
  }
  error_mgr err;
  unsigned char *buf = s->reindexed;
  unsigned long size = (unsigned long)s->reindexed_cap;
  int rc = reindex(&err, src + pos, (size_t)len, span_px, &buf, &size);
  if (buf != s->reindexed) { /* libjpeg moved it to a larger buffer of its own */
    free(s->reindexed);
    s->reindexed = buf;
    s->reindexed_cap = size;
  }
  if (rc != OK || size > 0x7fffffffUL) {
    return 0;
  }
  s->reindexed_len = size;
  return (jint)size;
}

/* NativeJpeg.takeReindexed0: copies the last reindex() result of this thread (len bytes) to dst at pos. */
JNIEXPORT jint JNICALL Java_io_unstall_flight_prep_NativeJpeg_takeReindexed0(JNIEnv *env, jclass cls,
                                                                              jobject dst_buf, jint pos, jint len) {
  (void)cls;
  uint8_t *dst = (*env)->GetDirectBufferAddress(env, dst_buf);
  scratch *s = thread_scratch();
  if (dst == NULL || s == NULL || len <= 0 || s->reindexed_len != (size_t)len) {
    return FAILED;
  }
  memcpy(dst + pos, s->reindexed, (size_t)len);
  s->reindexed_len = 0;
  if (s->reindexed_cap > KEEP_BYTES) {
    free(s->reindexed);
    s->reindexed = NULL;
    s->reindexed_cap = 0;
  }
  return OK;
}

/*
 * run() once the arguments are read. A JPEG in reindex()'s form is first cut down to the restart intervals that
 * the clip window and its margin cover (splice), with the geometry moved to the cut's origin.
 */
static int decode_window(JNIEnv *env, scratch *s, const uint8_t *src, int src_len, uint8_t *dst,
                         const uint8_t *lut, const jint *g, const jdouble *box);

/* Decodes that went through splice() (NativeJpeg.splicedDecodes, prep.stats). */
static uint64_t spliced_decodes;

static int prep(JNIEnv *env, scratch *s, const uint8_t *src, int src_len, uint8_t *dst, const uint8_t *lut,
                const jint *g, const jdouble *box) {
  int width = g[0], height = g[1], out_h = g[6], out_w = g[7], max_denom = g[11], window = g[12];
  int denom = pick_denom(box[2] - box[0], box[3] - box[1], out_w, out_h, max_denom, box[4]);
  rst_layout lay = {0};
  int ox, oy, sw, sh;
  size_t len;
  if (!window || !read_layout(src, (size_t)src_len, &lay) || lay.width != width || lay.height != height
      || !splice(s, src, (size_t)src_len, &lay, (g[2] / denom - MARGIN) * denom, (g[3] / denom - MARGIN) * denom,
                 ((g[4] + denom - 1) / denom + MARGIN) * denom, ((g[5] + denom - 1) / denom + MARGIN) * denom, &ox,
                 &oy, &sw, &sh, &len)) {
    return decode_window(env, s, src, src_len, dst, lut, g, box);
  }
  jint gs[13];
  jdouble bs[5];
  memcpy(gs, g, sizeof gs);
  memcpy(bs, box, sizeof bs);
  gs[0] = sw;
  gs[1] = sh;
  gs[2] -= ox;
  gs[3] -= oy;
  gs[4] -= ox;
  gs[5] -= oy;
  bs[0] -= ox;
  bs[1] -= oy;
  bs[2] -= ox;
  bs[3] -= oy;
  __atomic_fetch_add(&spliced_decodes, 1, __ATOMIC_RELAXED);
  return decode_window(env, s, s->spliced, (int)len, dst, lut, gs, bs);
}

/*
 * Reads the header of the JPEG src and starts decoding it at 1/denom: RGB, the accurate IDCT, fancy upsampling.
 * libjpeg's errors longjmp to the caller's setjmp; NULL, or why the JPEG is not the one the header check read.
 */
static const char *start_decode(scratch *s, const uint8_t *src, int src_len, int width, int height, int denom,
                                char *why, size_t why_len) {
  struct jpeg_decompress_struct *ci = &s->cinfo;
  jpeg_mem_src(ci, src, (unsigned long)src_len);
  jpeg_read_header(ci, TRUE);
  if ((int)ci->image_width != width || (int)ci->image_height != height) {
    jpeg_abort_decompress(ci);
    snprintf(why, why_len, "libjpeg reads %ux%u pixels where the header check read %dx%d", ci->image_width,
             ci->image_height, width, height);
    return why;
  }
  if (ci->jpeg_color_space == JCS_CMYK || ci->jpeg_color_space == JCS_YCCK) { /* the caller sends those to OpenCV */
    jpeg_abort_decompress(ci);
    return "a CMYK/YCCK JPEG reached the native decoder, which only converts YCbCr, RGB and grayscale";
  }
  ci->out_color_space = JCS_RGB;
  ci->dct_method = JDCT_ISLOW;
  ci->do_fancy_upsampling = TRUE;
  ci->scale_num = 1;
  ci->scale_denom = denom;
  jpeg_start_decompress(ci);
  return NULL;
}

/* What the resampling filters of one sample read: their sizes, the rows and columns, the widest tap count. */
typedef struct {
  int kxs, kys, xa, xb, ya, yb, maxn;
} window_plan;

/*
 * The filters for geom's clip window and box (image pixels) on the image decoded at 1/denom (sw x sh): the
 * coefficients in s->kx, s->ky with bounds in decoded-image coordinates. NULL, or why not.
 */
static const char *plan_window(scratch *s, int sw, int sh, int denom, const jint *g, const jdouble *box,
                               window_plan *p) {
  int out_h = g[6], out_w = g[7];
  int cx0 = g[2] / denom, cy0 = g[3] / denom;
  int cx1 = (g[4] + denom - 1) / denom, cy1 = (g[5] + denom - 1) / denom;
  cx1 = cx1 > sw ? sw : cx1;
  cy1 = cy1 > sh ? sh : cy1;
  if (cx0 >= cx1 || cy0 >= cy1) {
    return "empty crop window";
  }
  if (!coeffs(s, 1, cx1 - cx0, box[0] / denom - cx0, box[2] / denom - cx0, out_w, &p->kxs)
      || !coeffs(s, 0, cy1 - cy0, box[1] / denom - cy0, box[3] / denom - cy0, out_h, &p->kys)) {
    return "out of native memory for the resampling coefficients";
  }
  p->xa = sw, p->xb = 0, p->ya = sh, p->yb = 0, p->maxn = 1;
  for (int i = 0; i < out_w; i++) {
    p->maxn = s->bx[i * 2 + 1] > p->maxn ? s->bx[i * 2 + 1] : p->maxn;
    s->bx[i * 2] += cx0;
    p->xa = s->bx[i * 2] < p->xa ? s->bx[i * 2] : p->xa;
    p->xb = s->bx[i * 2] + s->bx[i * 2 + 1] > p->xb ? s->bx[i * 2] + s->bx[i * 2 + 1] : p->xb;
  }
  for (int i = 0; i < out_h; i++) {
    s->by[i * 2] += cy0;
    p->ya = s->by[i * 2] < p->ya ? s->by[i * 2] : p->ya;
    p->yb = s->by[i * 2] + s->by[i * 2 + 1] > p->yb ? s->by[i * 2] + s->by[i * 2 + 1] : p->yb;
  }
  return NULL;
}

/* The horizontal pass's steps per output pixel (horizontal_avx2). */
static int plan_pairs(const window_plan *p) { return (p->maxn + 1) / 2; }

/* Buffers for decoded rows of line_bytes and the plan's rows and filters; 0 when out of memory. */
static int reserve_rows(scratch *s, size_t line_bytes, const window_plan *p, int out_w) {
  size_t row_bytes = (size_t)out_w * 3;
  size_t line_pad = (size_t)plan_pairs(p) * 6 + 16; /* horizontal_avx2's reads past a row's end (multiplied by 0) */
  if (!reserve_line(s, line_bytes + line_pad) || !RESERVE(s, tmp, (size_t)(p->yb - p->ya) * row_bytes)
      || !RESERVE(s, acc, row_bytes) || !RESERVE(s, row8, row_bytes) || !RESERVE(s, rows, (size_t)p->kys)
      || (use_avx2 && !layout_kv(s, out_w, p->kxs, plan_pairs(p)))) {
    return 0;
  }
  memset(s->line + line_bytes, 0, line_pad);
  return 1;
}

/* One row in s->line (starting at decoded column x0) through the horizontal pass into the plan's row y. */
static void horizontal_row(scratch *s, const window_plan *p, int y, int out_w, int x0, int flip) {
  uint8_t *out = s->tmp + (size_t)(y - p->ya) * out_w * 3;
#ifdef HAVE_AVX2_PATH
  if (use_avx2) {
    horizontal_avx2(s->line, out, out_w, s->kv, plan_pairs(p), s->bx, x0, flip);
    return;
  }
#endif
  horizontal(s->line, out, out_w, s->kx, s->bx, p->kxs, x0, flip);
}

/* The vertical pass into the output tensor (geom's size, layout and element), then scratch a huge image left. */
static void vertical_rows(scratch *s, const window_plan *p, uint8_t *dst, const uint8_t *lut, const jint *g) {
  for (int yy = 0; yy < g[6]; yy++) {
    vertical_row(s, s->tmp, p->ya, g[6], g[7], yy, s->ky, s->by, p->kys, dst, lut, g[10], g[9]);
  }
  if (s->tmp_cap > KEEP_BYTES || s->line_cap > KEEP_BYTES || s->spliced_cap > KEEP_BYTES) { /* a huge image */
    free(s->tmp);
    free(s->line_base);
    free(s->spliced);
    s->tmp = s->line = s->line_base = s->spliced = NULL;
    s->tmp_cap = s->line_cap = s->spliced_cap = 0;
  }
}

/*
 * Runs body(env, s, args) on a decompressor made for this one image, with libjpeg's errors caught: error_exit
 * longjmps back to this frame, which throws a BadImageException naming libjpeg's reason.
 * libjpeg keeps the quantization and Huffman tables in a decompressor from one image to the next (abbreviated
 * datastreams), where a scan whose table the image leaves out would be decoded with the previous image's. A fresh
 * one holds none: it fills the standard Huffman tables 0 and 1 into the empty slots of a sequential JPEG
 * (Motion-JPEG frames) and refuses any other scan whose table is not defined. The tables are allocated from the
 * decompressor's permanent pool, so emptying the slots of a kept one would leak them; destroying it frees them.
 */
static __attribute__((noinline)) int with_decoder(JNIEnv *env, scratch *s,
                                                  int (*body)(JNIEnv *, scratch *, const void *), const void *args) {
  s->cinfo.err = jpeg_std_error(&s->err.pub);
  s->err.pub.error_exit = on_error;
  s->err.pub.emit_message = on_message;
  s->err.message[0] = 0;
  if (setjmp(s->err.jump)) {
    jpeg_destroy_decompress(&s->cinfo);
    char m[sizeof s->err.message + 32];
    snprintf(m, sizeof m, "libjpeg: %s", s->err.message);
    return fail(env, m);
  }
  jpeg_create_decompress(&s->cinfo);
  int rc = body(env, s, args);
  jpeg_destroy_decompress(&s->cinfo);
  return rc;
}

typedef struct {
  const uint8_t *src;
  int src_len;
  uint8_t *dst;
  const uint8_t *lut;
  const jint *g;
  const jdouble *box;
} window_args;

/* prep() on the JPEG to decode, within with_decoder. */
static int window_body(JNIEnv *env, scratch *s, const void *args) {
  const window_args *a = args;
  const uint8_t *src = a->src, *lut = a->lut;
  int src_len = a->src_len;
  uint8_t *dst = a->dst;
  const jint *g = a->g;
  const jdouble *box = a->box;
  int width = g[0], height = g[1], out_h = g[6], out_w = g[7], flip = g[8];
  int max_denom = g[11], window = g[12];
  struct jpeg_decompress_struct *ci = &s->cinfo;
  int denom = pick_denom(box[2] - box[0], box[3] - box[1], out_w, out_h, max_denom, box[4]);
  char why[160];
  const char *bad = start_decode(s, src, src_len, width, height, denom, why, sizeof why);
  if (bad != NULL) {
    return fail(env, bad);
  }
  int sw = (int)ci->output_width, sh = (int)ci->output_height;
  window_plan p;
  bad = plan_window(s, sw, sh, denom, g, box, &p);
  if (bad != NULL) {
    jpeg_abort_decompress(ci);
    return fail(env, bad);
  }
  /*
   * Chroma upsampling at a window's edge replicates the edge instead of reading its neighbour: a margin of
   * MARGIN pixels (where the image has them) keeps the pixels the filters read equal to the full decode's.
   */
  int wa = p.xa - MARGIN < 0 ? 0 : p.xa - MARGIN, wb = p.xb + MARGIN > sw ? sw : p.xb + MARGIN;
  JDIMENSION x0 = 0, cw = (JDIMENSION)sw;
  if (window && (wa > 0 || wb < sw)) {
    x0 = (JDIMENSION)wa;
    cw = (JDIMENSION)(wb - wa);
    jpeg_crop_scanline(ci, &x0, &cw); /* widens to iMCU boundaries */
  }
  if (!reserve_rows(s, (size_t)ci->output_width * ci->output_components, &p, out_w)) {
    jpeg_abort_decompress(ci);
    return fail(env, "out of native memory for the decoded rows");
  }
  int y = 0;
  if (window && p.ya > MARGIN) {
    y = (int)jpeg_skip_scanlines(ci, (JDIMENSION)(p.ya - MARGIN));
  }
  JSAMPROW line = s->line;
  while (y < p.yb) {
    if (jpeg_read_scanlines(ci, &line, 1) != 1) {
      jpeg_abort_decompress(ci);
      return fail(env, "libjpeg returned no row (suspended decoder)");
    }
    if (y >= p.ya) {
      horizontal_row(s, &p, y, out_w, (int)x0, flip);
    }
    y++;
  }
  jpeg_abort_decompress(ci); /* the rows below the window are never decoded */
  vertical_rows(s, &p, dst, lut, g);
  return OK;
}

static int decode_window(JNIEnv *env, scratch *s, const uint8_t *src, int src_len, uint8_t *dst,
                         const uint8_t *lut, const jint *g, const jdouble *box) {
  window_args a = {src, src_len, dst, lut, g, box};
  return with_decoder(env, s, window_body, &a);
}

typedef struct {
  const uint8_t *src;
  int src_len, width, height, denom;
  uint8_t *dst;
  int dst_w, dst_h;
} whole_args;

/* The decodeScaled call within with_decoder: every row of the image at 1/denom into dst. */
static int whole_body(JNIEnv *env, scratch *s, const void *args) {
  const whole_args *a = args;
  int dst_w = a->dst_w, dst_h = a->dst_h, denom = a->denom;
  uint8_t *dst = a->dst;
  struct jpeg_decompress_struct *ci = &s->cinfo;
  char why[160];
  const char *bad = start_decode(s, a->src, a->src_len, a->width, a->height, denom, why, sizeof why);
  if (bad != NULL) {
    return fail(env, bad);
  }
  if ((int)ci->output_width != dst_w || (int)ci->output_height != dst_h) {
    jpeg_abort_decompress(ci);
    snprintf(why, sizeof why, "libjpeg decodes %ux%u pixels at 1/%d where %dx%d were expected", ci->output_width,
             ci->output_height, denom, dst_w, dst_h);
    return fail(env, why);
  }
  for (int y = 0; y < dst_h; y++) {
    JSAMPROW line = dst + (size_t)y * dst_w * 3;
    if (jpeg_read_scanlines(ci, &line, 1) != 1) {
      jpeg_abort_decompress(ci);
      return fail(env, "libjpeg returned no row (suspended decoder)");
    }
  }
  jpeg_abort_decompress(ci); /* what follows the last row (the end marker) is not read, as run() does */
  return OK;
}

/*
 * NativeJpeg.decodeScaled: the whole JPEG src at 1/denom, RGB, into dst (dst_w x dst_h x 3 bytes, libjpeg's
 * output size: the header's size divided by denom, rounded up), the pixels that run() would decode at that scale.
 */
JNIEXPORT jint JNICALL Java_io_unstall_flight_prep_NativeJpeg_decodeScaled(JNIEnv *env, jclass cls, jobject src_buf,
                                                                            jint src_pos, jint src_len, jint width,
                                                                            jint height, jint denom, jobject dst_buf,
                                                                            jint dst_pos, jint dst_w, jint dst_h) {
  (void)cls;
  uint8_t *src = (*env)->GetDirectBufferAddress(env, src_buf);
  uint8_t *dst = (*env)->GetDirectBufferAddress(env, dst_buf);
  if (src == NULL || dst == NULL) {
    return fail(env, "not a direct buffer");
  }
  scratch *s = thread_scratch();
  if (s == NULL) {
    return fail(env, "out of native memory for the JPEG decoder's scratch buffers");
  }
  whole_args a = {src + src_pos, src_len, width, height, denom, dst + dst_pos, dst_w, dst_h};
  return with_decoder(env, s, whole_body, &a);
}

/*
 * NativeJpeg.resample: run()'s resampling on an image decodeScaled() kept (px: sw x sh RGB pixels, decoded at
 * 1/denom). geom and box are run()'s, in the original image's pixels; the clip window and box are mapped to the
 * kept image as run() maps them at that scale, so a kept image at run()'s scale gives run()'s bytes.
 */
JNIEXPORT jint JNICALL Java_io_unstall_flight_prep_NativeJpeg_resample(JNIEnv *env, jclass cls, jobject px_buf,
                                                                        jint px_pos, jint sw, jint sh, jint denom,
                                                                        jobject dst_buf, jint dst_pos, jobject lut_buf,
                                                                        jintArray geom_arr, jdoubleArray box_arr) {
  (void)cls;
  jint g[13];
  jdouble box[5];
  if (read_geometry(env, geom_arr, box_arr, g, box) != OK) {
    return FAILED;
  }
  const uint8_t *px = (*env)->GetDirectBufferAddress(env, px_buf);
  uint8_t *dst = (*env)->GetDirectBufferAddress(env, dst_buf);
  const uint8_t *lut = lut_buf == NULL ? NULL : (*env)->GetDirectBufferAddress(env, lut_buf);
  if (px == NULL || dst == NULL || (lut_buf != NULL && lut == NULL)) {
    return fail(env, "not a direct buffer");
  }
  scratch *s = thread_scratch();
  if (s == NULL) {
    return fail(env, "out of native memory for the resampling scratch buffers");
  }
  px += px_pos;
  dst += dst_pos;
  window_plan p;
  const char *bad = plan_window(s, sw, sh, denom, g, box, &p);
  if (bad != NULL) {
    return fail(env, bad);
  }
  size_t row_in = (size_t)sw * 3;
  if (!reserve_rows(s, row_in, &p, g[7])) {
    return fail(env, "out of native memory for the resampled rows");
  }
  for (int y = p.ya; y < p.yb; y++) {
    memcpy(s->line, px + (size_t)y * row_in, row_in); /* the padded line: the AVX2 pass reads past a row's end */
    horizontal_row(s, &p, y, g[7], 0, g[8]);
  }
  vertical_rows(s, &p, dst, lut, g);
  return OK;
}

/* NativeJpeg.splicedDecodes: how many run() calls decoded only the restart intervals their crop covers. */
JNIEXPORT jlong JNICALL Java_io_unstall_flight_prep_NativeJpeg_splicedDecodes(JNIEnv *env, jclass cls) {
  (void)env;
  (void)cls;
  return (jlong)__atomic_load_n(&spliced_decodes, __ATOMIC_RELAXED);
}

/* The DCT scale denominator run() picks for a box and output size (for the Java side's stats and tests). */
JNIEXPORT jint JNICALL Java_io_unstall_flight_prep_NativeJpeg_scaleDenom(JNIEnv *env, jclass cls, jdouble bw,
                                                                          jdouble bh, jint out_w, jint out_h,
                                                                          jint max_denom, jdouble gap) {
  (void)env;
  (void)cls;
  return pick_denom(bw, bh, out_w, out_h, max_denom, gap);
}
