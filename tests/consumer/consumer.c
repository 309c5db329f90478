/* A program outside the tree, built against an installed libpstar: trains
 * one parameter for a few steps and checks that it moved. */
#include <pstar/pstar.h>
#include <stdio.h>
#include <string.h>

#define CHECK(call)                                                                  \
  do {                                                                               \
    pstar_status st_ = (call);                                                       \
    if (st_ != PSTAR_OK) {                                                           \
      fprintf(stderr, "%s failed: %s: %s\n", #call, pstar_status_name(st_),          \
              pstar_last_error_message());                                           \
      return 1;                                                                      \
    }                                                                                \
  } while (0)

int main(void) {
  pstar_engine_options o;
  pstar_engine *e = NULL;
  uint32_t id;
  int64_t shape[1] = {256};
  float w[256], g[256], after[256];
  void *p;
  int i, step, changed = 0;

  if (pstar_version() != PSTAR_VERSION_HEX) {
    fprintf(stderr, "header %s, library %s\n", PSTAR_VERSION_STRING, pstar_version_string());
    return 1;
  }
  CHECK(pstar_engine_options_init(&o));
  o.chunk_elems = 1024;
  CHECK(pstar_engine_create(&o, &e));
  CHECK(pstar_param_register(e, "w", 1, shape, PSTAR_PARAM_DEFAULT, &id));
  CHECK(pstar_engine_build(e));
  for (i = 0; i < 256; ++i) w[i] = (float)i / 256.0f;
  CHECK(pstar_param_write(e, id, w, 256, PSTAR_DTYPE_F32));
  for (step = 0; step < 3; ++step) {
    CHECK(pstar_iteration_begin(e, PSTAR_ITERATION_TRAIN));
    CHECK(pstar_param_acquire(e, id, PSTAR_STAGE_FORWARD, NULL, &p));
    CHECK(pstar_param_release(e, id, NULL));
    CHECK(pstar_param_acquire(e, id, PSTAR_STAGE_BACKWARD, NULL, &p));
    for (i = 0; i < 256; ++i) g[i] = 1.0f;
    CHECK(pstar_grad_write(e, id, g, 256, PSTAR_DTYPE_F32, PSTAR_MEM_HOST, NULL));
    CHECK(pstar_param_release(e, id, NULL));
    CHECK(pstar_step(e, NULL));
  }
  CHECK(pstar_param_read(e, id, after, 256, PSTAR_DTYPE_F32));
  for (i = 0; i < 256; ++i) changed += after[i] < w[i];
  CHECK(pstar_engine_destroy(e));
  printf("consumer: libpstar %s, %d of 256 weights decreased\n", pstar_version_string(), changed);
  return changed == 256 ? 0 : 1;
}
