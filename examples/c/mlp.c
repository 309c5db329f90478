/*
 * pstar-example-mlp: trains a small multilayer perceptron whose parameters
 * all live in libpstar's chunks, on the emulated device.
 *
 * The program plays the part of a training framework:
 *  - it generates its own data set: inputs drawn from a normal distribution
 *    and targets from a fixed random "teacher" network (a regression task);
 *  - it registers the student network's parameters in the order the forward
 *    pass first uses them, one square matrix being shared by two hidden
 *    layers (tied weights: two forward and two backward uses per iteration);
 *  - its forward and backward passes are plain C loops over the pointers
 *    that pstar_param_acquire() returns (compute dtype BF16 by default, read
 *    as uint16_t and converted to float); activations and gradients are
 *    computed in float, and gradients are handed over with
 *    pstar_grad_write(..., PSTAR_DTYPE_F32, PSTAR_MEM_HOST, stream);
 *  - the device capacity is small (by default a quarter of the chunks' bytes,
 *    plus what the activations and gradient buffers need), so the engine
 *    evicts chunks to the host and fetches them back every iteration;
 *  - started by a launcher (`pstar-run -n 2 pstar-example-mlp`, torchrun,
 *    mpirun, srun), it trains data-parallel: the engine reads rank and world
 *    size from the environment and holds 1/N of every chunk; every rank draws
 *    the same shuffled global batch of N x 32 samples and trains on its own
 *    slice of it; the engine averages the gradients over the ranks.
 *
 * On a CUDA device the loops would be kernels on the caller's stream; on the
 * emulated device the "device" pointers are host memory that the engine has
 * made ready before pstar_param_acquire() returns.
 *
 * Build: part of the libpstar build (target pstar-example-mlp).
 * Run:   ./build/bin/pstar-example-mlp --help
 *
 * Plain C99; needs libpstar and libm only.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "pstar/pstar.h"

/* ------------------------------------------------------------------------ */
/* Sizes of the task and of the network                                     */
/* ------------------------------------------------------------------------ */

enum {
  D_IN = 128,          /* input features */
  HIDDEN = 120,        /* width of the hidden layers */
  D_OUT = 10,          /* regression targets */
  N_HIDDEN = 8,        /* residual hidden layers */
  N_LAYERS = N_HIDDEN + 2, /* input projection + hidden layers + output projection */
  TEACHER_HIDDEN = 64, /* width of the teacher network */
  BATCH = 32,          /* samples per training step */
  N_TRAIN = 2048,      /* training samples */
  N_EVAL = 512,        /* held-out samples */
  /* Hidden layer TIED_LATE applies the weight matrix of hidden layer
   * TIED_EARLY (1-based hidden layer numbers). */
  TIED_EARLY = 3,
  TIED_LATE = 6
};

/* Defaults of the command line. */
#define DEFAULT_STEPS 200
#define DEFAULT_CHUNK_ELEMS 16384
#define DEFAULT_LR 2e-3
#define DEFAULT_SEED 42
#define PRINT_EVERY 20

/* ------------------------------------------------------------------------ */
/* Errors: every libpstar call is checked                                    */
/* ------------------------------------------------------------------------ */

/* The live engine, destroyed before exiting on an error. */
static pstar_engine *g_engine = NULL;

static void die(void) {
  pstar_engine *e = g_engine;
  g_engine = NULL;
  pstar_engine_destroy(e);
  exit(EXIT_FAILURE);
}

static void check_status(pstar_status status, const char *call, int line) {
  if (status == PSTAR_OK) return;
  /* Print the detail before any other libpstar call replaces it. */
  fprintf(stderr, "mlp.c:%d: %s\n  failed with %s (%s): %s\n", line, call, pstar_status_name(status),
          pstar_status_string(status), pstar_last_error_message());
  die();
}

#define CHECK(call) check_status((call), #call, __LINE__)

static void *xmalloc(size_t bytes) {
  void *p = calloc(1, bytes == 0 ? 1 : bytes);
  if (p == NULL) {
    fprintf(stderr, "out of host memory (%zu bytes)\n", bytes);
    die();
  }
  return p;
}

/* ------------------------------------------------------------------------ */
/* A small deterministic PRNG (splitmix64)                                   */
/* ------------------------------------------------------------------------ */

typedef struct {
  uint64_t state;
} rng;

static uint64_t rng_next(rng *r) {
  uint64_t z = (r->state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

/* Uniform in [0, 1). */
static double rng_uniform(rng *r) { return (double)(rng_next(r) >> 11) * (1.0 / 9007199254740992.0); }

/* Standard normal (Box-Muller). */
static double rng_normal(rng *r) {
  const double u1 = 1.0 - rng_uniform(r); /* (0, 1] */
  const double u2 = rng_uniform(r);
  return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

/* ------------------------------------------------------------------------ */
/* 16-bit floats <-> float                                                   */
/* ------------------------------------------------------------------------ */

static uint32_t float_bits(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  return u;
}

static float bits_float(uint32_t u) {
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}

/* bf16 is the upper half of an fp32: widening is exact. */
static float bf16_to_float(uint16_t b) { return bits_float((uint32_t)b << 16); }

/* Round to nearest even, NaN kept quiet, fp32 subnormals to signed zero
 * (libpstar's policy, so that the --check comparison is exact). */
static uint16_t float_to_bf16(float f) {
  uint32_t x = float_bits(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((x >> 16) | 0x0040u);
  if ((x & 0x7f800000u) == 0) x &= 0x80000000u;
  x += 0x7fffu + ((x >> 16) & 1u);
  return (uint16_t)(x >> 16);
}

static float f16_to_float(uint16_t h) {
  const uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
  uint32_t e = (h >> 10) & 0x1fu;
  uint32_t m = h & 0x3ffu;
  if (e == 0) {
    if (m == 0) return bits_float(sign);
    e = 113; /* subnormal: normalise */
    while ((m & 0x400u) == 0) {
      m <<= 1;
      --e;
    }
    return bits_float(sign | (e << 23) | ((m & 0x3ffu) << 13));
  }
  if (e == 31) return bits_float(sign | 0x7f800000u | (m << 13));
  return bits_float(sign | ((e + 112u) << 23) | (m << 13));
}

/* Round to nearest even; subnormals exact; overflow to inf. */
static uint16_t float_to_f16(float f) {
  const uint32_t x = float_bits(f);
  const uint32_t sign = (x >> 16) & 0x8000u;
  const uint32_t ax = x & 0x7fffffffu;
  uint32_t r, rem;
  if (ax >= 0x7f800000u) return (uint16_t)(sign | 0x7c00u | (ax > 0x7f800000u ? (0x0200u | ((ax >> 13) & 0x3ffu)) : 0u));
  if (ax >= 0x47800000u) return (uint16_t)(sign | 0x7c00u);
  if (ax < 0x38800000u) {
    uint32_t shift, halfway, m;
    if (ax < 0x33000000u) return (uint16_t)sign;
    m = (ax & 0x7fffffu) | 0x800000u;
    shift = 126u - (ax >> 23);
    r = m >> shift;
    rem = m & ((1u << shift) - 1u);
    halfway = 1u << (shift - 1u);
    if (rem > halfway || (rem == halfway && (r & 1u))) ++r;
    return (uint16_t)(sign | r);
  }
  r = (ax - 0x38000000u) >> 13;
  rem = ax & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (r & 1u))) ++r;
  return (uint16_t)(sign | r);
}

static size_t dtype_bytes(pstar_dtype dt) { return dt == PSTAR_DTYPE_F32 ? 4u : 2u; }

static const char *dtype_label(pstar_dtype dt) {
  return dt == PSTAR_DTYPE_F32 ? "f32" : dt == PSTAR_DTYPE_F16 ? "f16" : "bf16";
}

/* Element i of a compute-dtype buffer, as float. */
static float load_elem(const void *p, pstar_dtype dt, size_t i) {
  if (dt == PSTAR_DTYPE_BF16) return bf16_to_float(((const uint16_t *)p)[i]);
  if (dt == PSTAR_DTYPE_F16) return f16_to_float(((const uint16_t *)p)[i]);
  return ((const float *)p)[i];
}

/* ------------------------------------------------------------------------ */
/* The network                                                               */
/* ------------------------------------------------------------------------ */

typedef enum {
  LAYER_INPUT,    /* y = tanh(W x + b) */
  LAYER_RESIDUAL, /* y = x + tanh(W x + b) */
  LAYER_OUTPUT    /* y = W x + b */
} layer_kind;

typedef struct {
  layer_kind kind;
  int in, out;
  uint32_t w, b;   /* libpstar parameter ids: weight [out][in], bias [out] */
  int tied_to;     /* index of the layer whose weight this one applies, or -1 */
} layer;

typedef struct {
  pstar_engine *engine;
  void *stream; /* the engine's compute stream */
  pstar_dtype dtype;
  layer layers[N_LAYERS];
  size_t max_w_numel, max_b_numel;
  uint64_t n_elems; /* parameter elements (the tied weight once) */
  /* Saved for backward: act[l] is the input of layer l (act[0] = the batch),
   * act[N_LAYERS] the prediction; tnh[l] = tanh(W x + b) of a residual layer. */
  float *act[N_LAYERS + 1];
  float *tnh[N_LAYERS];
  /* Work space. */
  float *wf, *bf;      /* a layer's weights and bias as float */
  float *gw, *gb;      /* its gradients */
  float *dy, *dx, *dz; /* gradients of activations */
  float *target;       /* the batch's targets */
} net;

static void layout_layers(net *n) {
  int l;
  for (l = 0; l < N_LAYERS; ++l) {
    layer *L = &n->layers[l];
    L->tied_to = -1;
    if (l == 0) {
      L->kind = LAYER_INPUT;
      L->in = D_IN;
      L->out = HIDDEN;
    } else if (l == N_LAYERS - 1) {
      L->kind = LAYER_OUTPUT;
      L->in = HIDDEN;
      L->out = D_OUT;
    } else {
      L->kind = LAYER_RESIDUAL;
      L->in = HIDDEN;
      L->out = HIDDEN;
      if (l == TIED_LATE) L->tied_to = TIED_EARLY; /* hidden layer l is layers[l] */
    }
  }
}

static void layer_name(int l, char *buf, size_t size, const char *what) {
  if (l == 0)
    snprintf(buf, size, "input.%s", what);
  else if (l == N_LAYERS - 1)
    snprintf(buf, size, "output.%s", what);
  else
    snprintf(buf, size, "hidden%d.%s", l, what);
}

/* Registers every parameter in the order the forward pass first uses it.
 * A tied layer registers its bias only: its weight is already registered. */
static void register_params(net *n) {
  int l;
  char name[64];
  n->max_w_numel = 0;
  n->max_b_numel = 0;
  n->n_elems = 0;
  for (l = 0; l < N_LAYERS; ++l) {
    layer *L = &n->layers[l];
    const int64_t wshape[2] = {L->out, L->in};
    const int64_t bshape[1] = {L->out};
    if (L->tied_to >= 0) {
      L->w = n->layers[L->tied_to].w;
    } else {
      layer_name(l, name, sizeof name, "weight");
      CHECK(pstar_param_register(n->engine, name, 2, wshape, PSTAR_PARAM_DEFAULT, &L->w));
      n->n_elems += (uint64_t)L->out * L->in;
    }
    layer_name(l, name, sizeof name, "bias");
    CHECK(pstar_param_register(n->engine, name, 1, bshape, PSTAR_PARAM_NO_WEIGHT_DECAY, &L->b));
    n->n_elems += (uint64_t)L->out;
    if ((size_t)L->out * L->in > n->max_w_numel) n->max_w_numel = (size_t)L->out * L->in;
    if ((size_t)L->out > n->max_b_numel) n->max_b_numel = (size_t)L->out;
  }
}

/* Initial weights (biases stay zero: pstar_engine_build zero-fills). */
static void init_params(net *n, rng *r) {
  int l;
  float *w = xmalloc(n->max_w_numel * sizeof(float));
  for (l = 0; l < N_LAYERS; ++l) {
    const layer *L = &n->layers[l];
    const size_t numel = (size_t)L->out * L->in;
    /* Uniform with standard deviation gain / sqrt(fan_in). */
    const double gain = L->kind == LAYER_RESIDUAL ? 0.5 : 1.0;
    const double a = sqrt(3.0) * gain / sqrt((double)L->in);
    size_t i;
    if (L->tied_to >= 0) continue;
    for (i = 0; i < numel; ++i) w[i] = (float)((2.0 * rng_uniform(r) - 1.0) * a);
    CHECK(pstar_param_write(n->engine, L->w, w, numel, PSTAR_DTYPE_F32));
  }
  free(w);
}

static void alloc_buffers(net *n) {
  int l;
  n->act[0] = xmalloc((size_t)BATCH * D_IN * sizeof(float));
  for (l = 0; l < N_LAYERS; ++l) {
    n->act[l + 1] = xmalloc((size_t)BATCH * n->layers[l].out * sizeof(float));
    n->tnh[l] = n->layers[l].kind == LAYER_RESIDUAL ? xmalloc((size_t)BATCH * n->layers[l].out * sizeof(float))
                                                    : NULL;
  }
  n->wf = xmalloc(n->max_w_numel * sizeof(float));
  n->gw = xmalloc(n->max_w_numel * sizeof(float));
  n->bf = xmalloc(n->max_b_numel * sizeof(float));
  n->gb = xmalloc(n->max_b_numel * sizeof(float));
  n->dy = xmalloc((size_t)BATCH * D_IN * sizeof(float)); /* D_IN >= HIDDEN >= D_OUT */
  n->dx = xmalloc((size_t)BATCH * D_IN * sizeof(float));
  n->dz = xmalloc((size_t)BATCH * D_IN * sizeof(float));
  n->target = xmalloc((size_t)BATCH * D_OUT * sizeof(float));
}

static void free_buffers(net *n) {
  int l;
  for (l = 0; l <= N_LAYERS; ++l) free(n->act[l]);
  for (l = 0; l < N_LAYERS; ++l) free(n->tnh[l]);
  free(n->wf);
  free(n->gw);
  free(n->bf);
  free(n->gb);
  free(n->dy);
  free(n->dx);
  free(n->dz);
  free(n->target);
}

/* Bytes of activations that layers 0..k-1 keep for their backward: what a
 * framework would hold in accelerator memory, reported to the engine with
 * pstar_nonmodel_report() so that chunks make room for it. */
static uint64_t saved_bytes(const net *n, int k) {
  uint64_t bytes = 0;
  int l;
  for (l = 0; l < k; ++l) {
    const layer *L = &n->layers[l];
    bytes += (uint64_t)BATCH * L->in * sizeof(float);
    if (L->kind == LAYER_RESIDUAL) bytes += (uint64_t)BATCH * L->out * sizeof(float);
  }
  return bytes;
}

static const void *acquire(net *n, uint32_t id, pstar_stage stage) {
  void *p = NULL;
  CHECK(pstar_param_acquire(n->engine, id, stage, n->stream, &p));
  return p;
}

static void release(net *n, uint32_t id) { CHECK(pstar_param_release(n->engine, id, n->stream)); }

/* Forward of one layer over `batch` samples.  w and b point at the
 * parameters in the compute dtype, as pstar_param_acquire() returned them. */
static void layer_forward(net *n, int l, const void *w, const void *b, int batch) {
  const layer *L = &n->layers[l];
  const int in = L->in, out = L->out;
  const float *x = n->act[l];
  float *y = n->act[l + 1];
  float *t = n->tnh[l];
  float *wt = n->wf; /* W transposed to [in][out]: the inner loop runs over out */
  int s, i, o;
  for (o = 0; o < out; ++o) {
    for (i = 0; i < in; ++i) wt[(size_t)i * out + o] = load_elem(w, n->dtype, (size_t)o * in + i);
    n->bf[o] = load_elem(b, n->dtype, (size_t)o);
  }
  for (s = 0; s < batch; ++s) {
    const float *xs = x + (size_t)s * in;
    float *z = n->dz; /* pre-activation of this sample */
    for (o = 0; o < out; ++o) z[o] = n->bf[o];
    for (i = 0; i < in; ++i) {
      const float xi = xs[i];
      const float *row = wt + (size_t)i * out;
      for (o = 0; o < out; ++o) z[o] += row[o] * xi;
    }
    for (o = 0; o < out; ++o) {
      float *ys = y + (size_t)s * out;
      if (L->kind == LAYER_INPUT) {
        ys[o] = tanhf(z[o]);
      } else if (L->kind == LAYER_RESIDUAL) {
        t[(size_t)s * out + o] = tanhf(z[o]);
        ys[o] = xs[o] + t[(size_t)s * out + o];
      } else {
        ys[o] = z[o];
      }
    }
  }
}

/* Backward of one layer: from dy (gradient of its output) computes the
 * weight and bias gradients into n->gw, n->gb and, unless this is the first
 * layer, the gradient of its input into dx. */
static void layer_backward(net *n, int l, const void *w, const float *dy, float *dx, int batch) {
  const layer *L = &n->layers[l];
  const int in = L->in, out = L->out;
  const float *x = n->act[l];
  const float *y = n->act[l + 1];
  float *wf = n->wf; /* W as float, [out][in] */
  float *dz = n->dz;
  int s, i, o;
  for (o = 0; o < out; ++o)
    for (i = 0; i < in; ++i) wf[(size_t)o * in + i] = load_elem(w, n->dtype, (size_t)o * in + i);
  memset(n->gw, 0, (size_t)out * in * sizeof(float));
  memset(n->gb, 0, (size_t)out * sizeof(float));
  for (s = 0; s < batch; ++s) {
    const float *xs = x + (size_t)s * in;
    const float *dys = dy + (size_t)s * out;
    /* Gradient of the pre-activation. */
    for (o = 0; o < out; ++o) {
      float d = dys[o];
      if (L->kind == LAYER_INPUT) {
        const float a = y[(size_t)s * out + o];
        d *= 1.0f - a * a;
      } else if (L->kind == LAYER_RESIDUAL) {
        const float a = n->tnh[l][(size_t)s * out + o];
        d *= 1.0f - a * a;
      }
      dz[o] = d;
      n->gb[o] += d;
    }
    /* dW += dz x^T */
    for (o = 0; o < out; ++o) {
      const float d = dz[o];
      float *grow = n->gw + (size_t)o * in;
      for (i = 0; i < in; ++i) grow[i] += d * xs[i];
    }
    /* dx = W^T dz (+ dy through the residual connection) */
    if (dx != NULL) {
      float *dxs = dx + (size_t)s * in;
      for (i = 0; i < in; ++i) dxs[i] = L->kind == LAYER_RESIDUAL ? dys[i] : 0.0f;
      for (o = 0; o < out; ++o) {
        const float d = dz[o];
        const float *wrow = wf + (size_t)o * in;
        for (i = 0; i < in; ++i) dxs[i] += d * wrow[i];
      }
    }
  }
}

/* The forward pass over n->act[0]; the prediction ends in n->act[N_LAYERS].
 * Used by TRAIN and EVAL iterations alike: both acquire for FORWARD. */
static void forward(net *n, int batch) {
  int l;
  for (l = 0; l < N_LAYERS; ++l) {
    const layer *L = &n->layers[l];
    const void *w, *b;
    /* The activations held once this layer has run, reported before its
     * parameters are acquired so that the engine makes room for both. */
    CHECK(pstar_nonmodel_report(n->engine, saved_bytes(n, l + 1)));
    w = acquire(n, L->w, PSTAR_STAGE_FORWARD);
    b = acquire(n, L->b, PSTAR_STAGE_FORWARD);
    layer_forward(n, l, w, b, batch);
    release(n, L->b);
    release(n, L->w);
  }
}

/* The backward pass, last layer first, from the loss gradient in n->dy. */
static void backward(net *n, int batch) {
  int l;
  for (l = N_LAYERS - 1; l >= 0; --l) {
    const layer *L = &n->layers[l];
    const uint64_t wn = (uint64_t)L->out * L->in;
    const void *w = acquire(n, L->w, PSTAR_STAGE_BACKWARD);
    float *tmp;
    (void)acquire(n, L->b, PSTAR_STAGE_BACKWARD);
    layer_backward(n, l, w, n->dy, l > 0 ? n->dx : NULL, batch);
    /* The engine adds these to the parameters' fp32 gradient accumulators;
     * the tied weight gets two contributions before its gradient is final. */
    CHECK(pstar_grad_write(n->engine, L->w, n->gw, wn, PSTAR_DTYPE_F32, PSTAR_MEM_HOST, n->stream));
    CHECK(pstar_grad_write(n->engine, L->b, n->gb, (uint64_t)L->out, PSTAR_DTYPE_F32, PSTAR_MEM_HOST,
                           n->stream));
    release(n, L->b);
    release(n, L->w);
    CHECK(pstar_nonmodel_report(n->engine, saved_bytes(n, l)));
    tmp = n->dy;
    n->dy = n->dx;
    n->dx = tmp;
  }
}

/* Mean squared error of the prediction against `target`. */
static double mse(const net *n, const float *target, int batch) {
  const float *y = n->act[N_LAYERS];
  double sum = 0.0;
  int i;
  for (i = 0; i < batch * D_OUT; ++i) {
    const double d = (double)y[i] - (double)target[i];
    sum += d * d;
  }
  return sum / (double)(batch * D_OUT);
}

/* ------------------------------------------------------------------------ */
/* The data set                                                              */
/* ------------------------------------------------------------------------ */

typedef struct {
  int count;
  float *x; /* [count][D_IN] */
  float *y; /* [count][D_OUT] */
} dataset;

/* A fixed random two-layer tanh network; targets scaled to unit variance. */
typedef struct {
  float w1[TEACHER_HIDDEN][D_IN];
  float b1[TEACHER_HIDDEN];
  float w2[D_OUT][TEACHER_HIDDEN];
  double scale;
} teacher;

static void teacher_init(teacher *t, rng *r) {
  int i, j;
  for (i = 0; i < TEACHER_HIDDEN; ++i) {
    for (j = 0; j < D_IN; ++j) t->w1[i][j] = (float)(rng_normal(r) * 1.5 / sqrt((double)D_IN));
    t->b1[i] = (float)(0.5 * rng_normal(r));
  }
  for (i = 0; i < D_OUT; ++i)
    for (j = 0; j < TEACHER_HIDDEN; ++j) t->w2[i][j] = (float)(rng_normal(r) / sqrt((double)TEACHER_HIDDEN));
  t->scale = 1.0;
}

static void teacher_apply(const teacher *t, const float *x, float *y) {
  double h[TEACHER_HIDDEN];
  int i, j;
  for (i = 0; i < TEACHER_HIDDEN; ++i) {
    double z = t->b1[i];
    for (j = 0; j < D_IN; ++j) z += (double)t->w1[i][j] * x[j];
    h[i] = tanh(z);
  }
  for (i = 0; i < D_OUT; ++i) {
    double z = 0.0;
    for (j = 0; j < TEACHER_HIDDEN; ++j) z += (double)t->w2[i][j] * h[j];
    y[i] = (float)(z * t->scale);
  }
}

static void dataset_make(dataset *d, int count, const teacher *t, rng *r) {
  int s, j;
  d->count = count;
  d->x = xmalloc((size_t)count * D_IN * sizeof(float));
  d->y = xmalloc((size_t)count * D_OUT * sizeof(float));
  for (s = 0; s < count; ++s) {
    for (j = 0; j < D_IN; ++j) d->x[(size_t)s * D_IN + j] = (float)rng_normal(r);
    teacher_apply(t, d->x + (size_t)s * D_IN, d->y + (size_t)s * D_OUT);
  }
}

static void dataset_free(dataset *d) {
  free(d->x);
  free(d->y);
}

/* ------------------------------------------------------------------------ */
/* Command line                                                              */
/* ------------------------------------------------------------------------ */

typedef struct {
  uint64_t steps;
  uint64_t device_capacity; /* 0: choose */
  uint64_t chunk_elems;
  double lr;
  pstar_dtype dtype;
  uint64_t seed;
  int strict;
  int check;
  pstar_policy policy;
  int prefetch;
  int hybrid;           /* options.hybrid_optimizer */
  int late_lr;          /* the schedule set after the backward, the norm read before the step */
  const char *timeline; /* Chrome-trace file written at the end, or NULL */
} config;

static void usage(FILE *f) {
  fprintf(f,
          "usage: pstar-example-mlp [options]\n"
          "Trains a %d-layer MLP (one weight matrix tied between two layers) on a\n"
          "synthetic regression task, every parameter in libpstar chunks on the\n"
          "emulated device, with a small device capacity so that chunks are evicted.\n"
          "\n"
          "  --steps N                training steps (default %d)\n"
          "  --device-capacity BYTES  emulated device capacity; suffixes k, m, g (KiB, MiB,\n"
          "                           GiB) are accepted (default: a quarter of the compute-\n"
          "                           dtype chunk bytes, at least two chunks, plus the peak of\n"
          "                           activations and gradient buffers)\n"
          "  --chunk-elems N          elements per chunk, a multiple of 128 (default %d)\n"
          "  --lr X                   peak learning rate, cosine-decayed to a tenth (default %g)\n"
          "  --dtype bf16|f16|f32     compute dtype (default bf16); f16 uses loss scaling\n"
          "  --seed N                 seed of the data, the teacher and the initial weights\n"
          "                           (default %d)\n"
          "  --strict                 the emulated device's strict mode (slow; for tests)\n"
          "  --late-lr                set each step's learning rate after its backward, inside the\n"
          "                           iteration (as a torch optimizer's step() does), and read the\n"
          "                           gradient norm there (one process)\n"
          "  --policy opt|lru|static  eviction policy (default opt: from the warm-up trace)\n"
          "  --no-prefetch            fetch chunks on demand only\n"
          "  --hybrid                 hybrid optimizer placement: the optimizer state of the\n"
          "                           chunks that fit beside the device's need is updated there\n"
          "  --timeline FILE          write the engine's timeline of moves and memory per\n"
          "                           moment as a Chrome trace (bench/plot_trace.py plots it)\n"
          "  --check                  exit non-zero unless the loss fell below half its first\n"
          "                           value, every iteration evicted chunks (with --hybrid:\n"
          "                           and some optimizer state was placed), and every\n"
          "                           compute-dtype weight equals its fp32 master rounded\n"
          "  --help                   this text\n",
          N_LAYERS, DEFAULT_STEPS, DEFAULT_CHUNK_ELEMS, DEFAULT_LR, DEFAULT_SEED);
}

static int parse_u64(const char *s, uint64_t *out, int allow_suffix) {
  char *end = NULL;
  unsigned long long v;
  if (s == NULL || *s < '0' || *s > '9') return 0;
  v = strtoull(s, &end, 10);
  if (allow_suffix && (*end == 'k' || *end == 'K')) {
    v <<= 10;
    ++end;
  } else if (allow_suffix && (*end == 'm' || *end == 'M')) {
    v <<= 20;
    ++end;
  } else if (allow_suffix && (*end == 'g' || *end == 'G')) {
    v <<= 30;
    ++end;
  }
  if (*end != '\0') return 0;
  *out = (uint64_t)v;
  return 1;
}

static int parse_double(const char *s, double *out) {
  char *end = NULL;
  double v;
  if (s == NULL || *s == '\0') return 0;
  v = strtod(s, &end);
  if (*end != '\0' || !(v >= 0.0) || v > 1e6) return 0;
  *out = v;
  return 1;
}

static void bad_option(const char *opt, const char *value) {
  fprintf(stderr, "pstar-example-mlp: bad value '%s' for %s (see --help)\n", value ? value : "", opt);
  exit(2);
}

static void parse_args(int argc, char **argv, config *c) {
  int i;
  c->steps = DEFAULT_STEPS;
  c->device_capacity = 0;
  c->chunk_elems = DEFAULT_CHUNK_ELEMS;
  c->lr = DEFAULT_LR;
  c->dtype = PSTAR_DTYPE_BF16;
  c->seed = DEFAULT_SEED;
  c->strict = 0;
  c->policy = PSTAR_POLICY_OPT;
  c->prefetch = 1;
  c->hybrid = 0;
  c->check = 0;
  c->late_lr = 0;
  c->timeline = NULL;
  for (i = 1; i < argc; ++i) {
    const char *arg = argv[i];
    const char *value = NULL;
    char opt[32];
    const char *eq = strchr(arg, '=');
    /* Accept both "--opt value" and "--opt=value". */
    if (eq != NULL && (size_t)(eq - arg) < sizeof opt) {
      memcpy(opt, arg, (size_t)(eq - arg));
      opt[eq - arg] = '\0';
      value = eq + 1;
    } else {
      snprintf(opt, sizeof opt, "%s", arg);
    }
    if (strcmp(opt, "--help") == 0 || strcmp(opt, "-h") == 0) {
      usage(stdout);
      exit(0);
    }
    if (strcmp(opt, "--no-prefetch") == 0) {
      c->prefetch = 0;
      continue;
    }
    if (strcmp(opt, "--hybrid") == 0) {
      c->hybrid = 1;
      continue;
    }
    if (strcmp(opt, "--policy") == 0 && i + 1 < argc) {
      const char *v = argv[++i];
      if (strcmp(v, "opt") == 0) {
        c->policy = PSTAR_POLICY_OPT;
      } else if (strcmp(v, "lru") == 0) {
        c->policy = PSTAR_POLICY_LRU;
      } else if (strcmp(v, "static") == 0) {
        c->policy = PSTAR_POLICY_STATIC;
      } else {
        fprintf(stderr, "pstar-example-mlp: --policy takes opt, lru or static, not '%s'\n", v);
        exit(2);
      }
      continue;
    }
    if (strcmp(opt, "--timeline") == 0 && (value != NULL || i + 1 < argc)) {
      c->timeline = value != NULL ? value : argv[++i];
      continue;
    }
    if (strcmp(opt, "--strict") == 0) {
      c->strict = 1;
      continue;
    }
    if (strcmp(opt, "--check") == 0) {
      c->check = 1;
      continue;
    }
    if (strcmp(opt, "--late-lr") == 0) {
      c->late_lr = 1;
      continue;
    }
    if (strcmp(opt, "--steps") != 0 && strcmp(opt, "--device-capacity") != 0 && strcmp(opt, "--chunk-elems") != 0 &&
        strcmp(opt, "--lr") != 0 && strcmp(opt, "--dtype") != 0 && strcmp(opt, "--seed") != 0) {
      fprintf(stderr, "pstar-example-mlp: unknown option '%s' (see --help)\n", arg);
      exit(2);
    }
    if (value == NULL) {
      if (i + 1 >= argc) bad_option(opt, NULL);
      value = argv[++i];
    }
    if (strcmp(opt, "--steps") == 0) {
      if (!parse_u64(value, &c->steps, 0) || c->steps == 0 || c->steps > 100000000u) bad_option(opt, value);
    } else if (strcmp(opt, "--device-capacity") == 0) {
      if (!parse_u64(value, &c->device_capacity, 1) || c->device_capacity == 0) bad_option(opt, value);
    } else if (strcmp(opt, "--chunk-elems") == 0) {
      /* libpstar validates it (a multiple of 128): its error is shown. */
      if (!parse_u64(value, &c->chunk_elems, 0) || c->chunk_elems == 0) bad_option(opt, value);
    } else if (strcmp(opt, "--lr") == 0) {
      if (!parse_double(value, &c->lr)) bad_option(opt, value);
    } else if (strcmp(opt, "--dtype") == 0) {
      if (strcmp(value, "bf16") == 0)
        c->dtype = PSTAR_DTYPE_BF16;
      else if (strcmp(value, "f16") == 0)
        c->dtype = PSTAR_DTYPE_F16;
      else if (strcmp(value, "f32") == 0)
        c->dtype = PSTAR_DTYPE_F32;
      else
        bad_option(opt, value);
    } else {
      if (!parse_u64(value, &c->seed, 0)) bad_option(opt, value);
    }
  }
}

/* ------------------------------------------------------------------------ */
/* Engine set-up                                                             */
/* ------------------------------------------------------------------------ */

/* world_size: 1 for this process alone, 0 for what the environment says. */
static void engine_options(const config *c, uint64_t device_capacity, int32_t world_size, pstar_engine_options *o) {
  CHECK(pstar_engine_options_init(o)); /* the library's defaults, then ours */
  o->device = PSTAR_DEVICE_EMULATED;
  o->device_capacity_bytes = device_capacity; /* 0 = unlimited */
  o->host_capacity_bytes = 0;                 /* unlimited */
  o->chunk_elems = c->chunk_elems;
  o->compute_dtype = c->dtype;
  o->strict = c->strict;
  o->placement_policy = c->policy;
  o->prefetch = c->prefetch;
  o->hybrid_optimizer = c->hybrid;
  o->record_timeline = c->timeline != NULL;
  o->strict_seed = c->seed;
  o->lr = (float)c->lr;
  o->weight_decay = 0.01f; /* AdamW; biases are registered without decay */
  o->adamw = 1;
  o->world_size = world_size;
}

/* Creates an engine, registers the network's parameters and builds it. */
static void engine_setup(net *n, const config *c, uint64_t device_capacity, int32_t world_size) {
  pstar_engine_options o;
  engine_options(c, device_capacity, world_size, &o);
  CHECK(pstar_engine_create(&o, &n->engine));
  g_engine = n->engine;
  n->dtype = c->dtype;
  layout_layers(n);
  register_params(n);
  CHECK(pstar_engine_build(n->engine));
  CHECK(pstar_engine_compute_stream(n->engine, &n->stream));
}

/* timeline: file for the engine's timeline, or NULL. */
static void engine_teardown(net *n, const char *timeline) {
  if (timeline != NULL) {
    CHECK(pstar_trace_export(n->engine, timeline));
    printf("timeline written to %s\n", timeline);
  }
  g_engine = NULL;
  CHECK(pstar_engine_destroy(n->engine));
  n->engine = NULL;
}

static pstar_stats get_stats(pstar_engine *e) {
  pstar_stats s;
  CHECK(pstar_stats_init(&s));
  CHECK(pstar_engine_get_stats(e, &s));
  return s;
}

static uint64_t align_up(uint64_t v, uint64_t a) { return (v + a - 1) / a * a; }

/* Mean loss over a data set in one EVAL iteration (forward uses only). */
static double evaluate(net *n, const dataset *d) {
  double sum = 0.0;
  int s;
  CHECK(pstar_iteration_begin(n->engine, PSTAR_ITERATION_EVAL));
  for (s = 0; s + BATCH <= d->count; s += BATCH) {
    memcpy(n->act[0], d->x + (size_t)s * D_IN, (size_t)BATCH * D_IN * sizeof(float));
    forward(n, BATCH);
    sum += mse(n, d->y + (size_t)s * D_OUT, BATCH);
  }
  CHECK(pstar_nonmodel_report(n->engine, 0));
  CHECK(pstar_iteration_end(n->engine));
  return sum / (double)(d->count / BATCH);
}

/* --check: every parameter's compute-dtype copy (what acquire hands out)
 * equals its fp32 master (what pstar_param_read returns) rounded. */
static int check_compute_copies(net *n) {
  uint32_t count, id;
  uint64_t total = 0, offset = 0, mismatches = 0;
  float *master;
  CHECK(pstar_param_count(n->engine, &count));
  for (id = 0; id < count; ++id) {
    uint64_t numel;
    CHECK(pstar_param_numel(n->engine, id, &numel));
    total += numel;
  }
  master = xmalloc((size_t)total * sizeof(float));
  for (id = 0; id < count; ++id) { /* reads are legal outside iterations only */
    uint64_t numel;
    CHECK(pstar_param_numel(n->engine, id, &numel));
    CHECK(pstar_param_read(n->engine, id, master + offset, numel, PSTAR_DTYPE_F32));
    offset += numel;
  }
  offset = 0;
  CHECK(pstar_iteration_begin(n->engine, PSTAR_ITERATION_EVAL));
  for (id = 0; id < count; ++id) {
    uint64_t numel, i;
    const void *p;
    CHECK(pstar_param_numel(n->engine, id, &numel));
    p = acquire(n, id, PSTAR_STAGE_FORWARD);
    for (i = 0; i < numel; ++i) {
      const float m = master[offset + i];
      int same;
      if (n->dtype == PSTAR_DTYPE_BF16)
        same = ((const uint16_t *)p)[i] == float_to_bf16(m);
      else if (n->dtype == PSTAR_DTYPE_F16)
        same = ((const uint16_t *)p)[i] == float_to_f16(m);
      else
        same = float_bits(((const float *)p)[i]) == float_bits(m);
      if (!same) ++mismatches;
    }
    release(n, id);
    offset += numel;
  }
  CHECK(pstar_iteration_end(n->engine));
  free(master);
  if (mismatches != 0) {
    fprintf(stderr, "check failed: %llu of %llu compute-dtype elements differ from their rounded fp32 master\n",
            (unsigned long long)mismatches, (unsigned long long)total);
    return 0;
  }
  printf("check: all %llu compute-dtype elements equal their fp32 master rounded to %s\n",
         (unsigned long long)total, dtype_label(n->dtype));
  return 1;
}

/* ------------------------------------------------------------------------ */
/* Training                                                                  */
/* ------------------------------------------------------------------------ */

int main(int argc, char **argv) {
  config cfg;
  net n;
  teacher *tch;
  dataset train, held_out;
  rng data_rng, init_rng, order_rng;
  int *order;
  uint64_t step, capacity, chunk_bytes, grad_peak, act_peak, chunk_share, minimum;
  uint64_t evict_min = UINT64_MAX, evict_max = 0, gathered_min = UINT64_MAX;
  int rank = 0, world = 1;
  double first_loss = 0.0, last_loss = 0.0, eval_before, eval_after;
  int pos = N_TRAIN, i, ok = 1;
  pstar_stats st;
  clock_t t0;

  setvbuf(stdout, NULL, _IOLBF, 0); /* keep stdout and stderr in order */
  parse_args(argc, argv, &cfg);
  memset(&n, 0, sizeof n);
  printf("libpstar %s: MLP example, compute dtype %s, %llu steps\n", pstar_version_string(),
         dtype_label(cfg.dtype), (unsigned long long)cfg.steps);

  /* Data: a teacher network labels normally distributed inputs. */
  data_rng.state = cfg.seed * 0x100000001B3ull + 1;
  init_rng.state = cfg.seed * 0x100000001B3ull + 2;
  order_rng.state = cfg.seed * 0x100000001B3ull + 3;
  tch = xmalloc(sizeof *tch);
  teacher_init(tch, &data_rng);
  {
    /* Scale the targets to unit variance over a sample of inputs. */
    dataset probe;
    double sum = 0.0, sumsq = 0.0, var;
    rng probe_rng = data_rng;
    dataset_make(&probe, 256, tch, &probe_rng);
    for (i = 0; i < 256 * D_OUT; ++i) {
      sum += probe.y[i];
      sumsq += (double)probe.y[i] * probe.y[i];
    }
    var = sumsq / (256.0 * D_OUT) - (sum / (256.0 * D_OUT)) * (sum / (256.0 * D_OUT));
    tch->scale = var > 0.0 ? 1.0 / sqrt(var) : 1.0;
    dataset_free(&probe);
  }
  dataset_make(&train, N_TRAIN, tch, &data_rng);
  dataset_make(&held_out, N_EVAL, tch, &data_rng);
  free(tch);

  /* 1. Learn the layout with a throwaway engine of unlimited capacity: the
   *    capacity is an engine option, and the default one derives from the
   *    chunk bytes that pstar_engine_get_stats() reports after the build. */
  engine_setup(&n, &cfg, 0, 1); /* this process alone */
  st = get_stats(n.engine);
  engine_teardown(&n, NULL);
  /* What must fit at once: the chunks of one weight and one bias acquired
   * together (a parameter larger than a chunk gets a jumbo chunk of its
   * own), the fp32 gradient accumulators of the current layer plus the
   * tied weight's pending one, and the saved activations. */
  chunk_bytes = align_up(cfg.chunk_elems > n.max_w_numel ? cfg.chunk_elems : n.max_w_numel, 128) *
                dtype_bytes(cfg.dtype);
  grad_peak = (2 * n.max_w_numel + 2 * n.max_b_numel) * sizeof(float);
  act_peak = saved_bytes(&n, N_LAYERS);
  minimum = 2 * chunk_bytes + grad_peak + act_peak;
  chunk_share = st.compute_list_bytes / 4 > 2 * chunk_bytes ? st.compute_list_bytes / 4 : 2 * chunk_bytes;
  capacity = cfg.device_capacity != 0 ? cfg.device_capacity : chunk_share + grad_peak + act_peak;
  printf("model: %d layers, hidden%d applies hidden%d.weight (tied), %u chunks of %llu elements,\n"
         "       compute list %llu bytes, fp32 optimizer lists 3 x %llu bytes, fill ratio %.3f\n",
         N_LAYERS, TIED_LATE, TIED_EARLY, st.compute_chunks, (unsigned long long)cfg.chunk_elems,
         (unsigned long long)st.compute_list_bytes, (unsigned long long)st.optimizer_list_bytes, st.fill_ratio);
  printf("device capacity: %llu bytes (activations up to %llu, gradient buffers up to %llu, the rest for chunks)\n",
         (unsigned long long)capacity, (unsigned long long)act_peak, (unsigned long long)grad_peak);
  if (capacity < minimum) {
    printf("note: below the estimated %llu bytes that may have to be resident at once; the engine\n"
           "      will report PSTAR_ERR_OUT_OF_MEMORY if they do not fit\n",
           (unsigned long long)minimum);
  }

  /* 2. The real engine. */
  engine_setup(&n, &cfg, capacity, 0); /* data-parallel under a launcher */
  st = get_stats(n.engine);
  rank = st.rank;
  world = st.world_size;
  if (world > 1) {
    printf("data parallel: rank %d of %d, each holding 1/%d of every chunk; global batch %d, this rank's slice "
           "%d..%d\n",
           rank, world, world, world * BATCH, rank * BATCH, (rank + 1) * BATCH - 1);
  }
  init_params(&n, &init_rng);
  alloc_buffers(&n);
  order = xmalloc(N_TRAIN * sizeof(int));
  for (i = 0; i < N_TRAIN; ++i) order[i] = i;

  eval_before = evaluate(&n, &held_out);
  printf("held-out loss before training: %.6f\n", eval_before);

  t0 = clock();
  for (step = 1; step <= cfg.steps; ++step) {
    pstar_step_result res;
    double loss, scale, lr, norm_before;
    const pstar_stats before = get_stats(n.engine);
    uint64_t evictions_before = before.evictions, evictions_now, gathered_now;
    const float *y;
    int s, j;

    /* A schedule: hyperparameters are set between iterations (or, with
     * --late-lr, after the backward: legal until the step). */
    lr = cfg.lr * (0.55 + 0.45 * cos(3.141592653589793 * (double)(step - 1) / (double)cfg.steps));
    if (!cfg.late_lr) CHECK(pstar_hparam_set(n.engine, PSTAR_HPARAM_LR, lr));

    /* Next batch of a shuffled epoch: with several ranks, every rank draws
     * the same global batch and keeps its slice. */
    for (s = 0; s < world * BATCH; ++s) {
      int idx;
      if (pos == N_TRAIN) { /* reshuffle (Fisher-Yates) */
        for (j = N_TRAIN - 1; j > 0; --j) {
          const int k = (int)(rng_next(&order_rng) % (uint64_t)(j + 1));
          const int tmp = order[j];
          order[j] = order[k];
          order[k] = tmp;
        }
        pos = 0;
      }
      idx = order[pos++];
      if (s / BATCH != rank) continue;
      memcpy(n.act[0] + (size_t)(s % BATCH) * D_IN, train.x + (size_t)idx * D_IN, D_IN * sizeof(float));
      memcpy(n.target + (size_t)(s % BATCH) * D_OUT, train.y + (size_t)idx * D_OUT, D_OUT * sizeof(float));
    }

    CHECK(pstar_iteration_begin(n.engine, PSTAR_ITERATION_TRAIN));
    forward(&n, BATCH);
    loss = mse(&n, n.target, BATCH);

    /* Gradient of the loss, multiplied by the loss scale (F16; 1 otherwise). */
    CHECK(pstar_hparam_get(n.engine, PSTAR_HPARAM_LOSS_SCALE, &scale));
    y = n.act[N_LAYERS];
    for (j = 0; j < BATCH * D_OUT; ++j)
      n.dy[j] = (float)(2.0 * scale * ((double)y[j] - n.target[j]) / (BATCH * D_OUT));
    backward(&n, BATCH);

    norm_before = -1.0;
    if (cfg.late_lr) {
      if (world == 1) CHECK(pstar_grad_norm(n.engine, &norm_before));
      CHECK(pstar_hparam_set(n.engine, PSTAR_HPARAM_LR, lr));
    }
    CHECK(pstar_step_result_init(&res));
    CHECK(pstar_step(n.engine, &res));
    if (cfg.late_lr && world == 1 && !res.skipped && memcmp(&norm_before, &res.grad_norm, sizeof(double)) != 0) {
      fprintf(stderr, "step %llu: pstar_grad_norm gave %.17g, the step %.17g\n", (unsigned long long)step, norm_before,
              res.grad_norm);
      return 1;
    }

    st = get_stats(n.engine);
    evictions_now = st.evictions - evictions_before;
    gathered_now = st.bytes_all_gathered - before.bytes_all_gathered;
    if (gathered_now < gathered_min) gathered_min = gathered_now;
    if (evictions_now < evict_min) evict_min = evictions_now;
    if (evictions_now > evict_max) evict_max = evictions_now;
    if (step == 1) first_loss = loss;
    last_loss = loss;
    if (step == 1 || step % PRINT_EVERY == 0 || step == cfg.steps) {
      st = get_stats(n.engine);
      printf("step %5llu  loss %.6f  grad-norm %8.4f  lr %.2e  loss-scale %g%s  evictions %llu (this step %llu)\n",
             (unsigned long long)step, loss, res.grad_norm, lr, (double)res.loss_scale,
             res.skipped ? " (skipped)" : "", (unsigned long long)st.evictions, (unsigned long long)evictions_now);
    }
  }
  printf("training time: %.2f s (CPU)\n", (double)(clock() - t0) / CLOCKS_PER_SEC);

  eval_after = evaluate(&n, &held_out);
  st = get_stats(n.engine);
  printf("\nsummary\n");
  printf("  held-out loss:      %.6f before, %.6f after\n", eval_before, eval_after);
  printf("  steps:              %llu applied, %llu skipped\n", (unsigned long long)st.steps,
         (unsigned long long)st.skipped_steps);
  printf("  chunks:             %u compute-dtype (%u jumbo), %u optimizer (x3: master, m, v), fill ratio %.3f\n",
         st.compute_chunks, st.jumbo_chunks, st.optimizer_chunks, st.fill_ratio);
  printf("  model data:         %llu bytes on the host: %.0f per chunk element (%s param or gradient,\n"
         "                      fp32 master, m, v) for %llu parameter elements\n",
         (unsigned long long)(st.compute_list_bytes + 3 * st.optimizer_list_bytes),
         (double)(st.compute_list_bytes + 3 * st.optimizer_list_bytes) /
             (double)(st.compute_list_bytes / dtype_bytes(cfg.dtype)),
         dtype_label(cfg.dtype), (unsigned long long)n.n_elems);
  if (world > 1) {
    printf("                      (the full lists: each of the %d ranks holds 1/%d of them, %llu bytes)\n", world,
           world, (unsigned long long)((st.compute_list_bytes + 3 * st.optimizer_list_bytes) / (uint64_t)world));
  }
  printf("  host -> device:     %llu bytes in %llu chunk moves\n", (unsigned long long)st.bytes_host_to_device,
         (unsigned long long)st.moves_to_device);
  printf("  prefetched:         %llu bytes ahead of use; %llu bytes waited for (critical path)\n",
         (unsigned long long)st.bytes_prefetched, (unsigned long long)st.bytes_critical);
  printf("  trace:              %llu moments, %llu fallbacks\n", (unsigned long long)st.trace_moments,
         (unsigned long long)st.trace_fallbacks);
  printf("  device -> host:     %llu bytes in %llu evictions\n", (unsigned long long)st.bytes_device_to_host,
         (unsigned long long)st.evictions);
  if (cfg.hybrid)
    printf("  optimizer state on the device: %u of %u chunks (%llu bytes)\n", st.optimizer_chunks_on_device,
           st.optimizer_chunks, (unsigned long long)st.optimizer_device_bytes);
  printf("  evictions per step: min %llu, max %llu\n", (unsigned long long)evict_min, (unsigned long long)evict_max);
  printf("  device peak:        %llu bytes, capacity %llu\n", (unsigned long long)st.peak_device_bytes,
         (unsigned long long)capacity);
  if (st.peak_device_bytes > capacity) {
    printf("                      (the reported activations did not fit even after evicting\n"
           "                      every movable chunk)\n");
  }
  printf("  host peak:          %llu bytes\n", (unsigned long long)st.peak_host_bytes);

  if (cfg.check) {
    if (!(last_loss < 0.5 * first_loss)) {
      fprintf(stderr, "check failed: the loss did not fall below half its first value (%.6f -> %.6f)\n",
              first_loss, last_loss);
      ok = 0;
    }
    if (world > 1) {
      /* Sharded: chunks are gathered for their uses and dropped after them,
       * so eviction is not needed to cycle them through the device. */
      if (gathered_min == 0) {
        fprintf(stderr, "check failed: some iterations gathered no chunk\n");
        ok = 0;
      }
    } else if (evict_min == 0) {
      fprintf(stderr, "check failed: some iterations evicted no chunk (capacity too large?)\n");
      ok = 0;
    }
    if (cfg.hybrid && st.optimizer_chunks_on_device == 0) {
      fprintf(stderr, "check failed: --hybrid placed no optimizer state on the device (capacity too small?)\n");
      ok = 0;
    }
    if (!check_compute_copies(&n)) ok = 0;
    if (ok) printf("check: passed\n");
  }

  free(order);
  free_buffers(&n);
  dataset_free(&train);
  dataset_free(&held_out);
  engine_teardown(&n, cfg.timeline);
  printf("final loss: %.6f (first: %.6f)\n", last_loss, first_loss);
  return ok ? EXIT_SUCCESS : EXIT_FAILURE;
}
