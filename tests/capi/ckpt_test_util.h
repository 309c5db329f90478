/*
 * Helpers for the checkpoint tests (test_checkpoint.c, test_nvme.c,
 * test_abort.c): whole
 * files in and out, the current checkpoint's files, and resealing an edited
 * manifest (its last line, "checksum <XXH3-64 of every byte before it>",
 * recomputed as a deliberate editor would; docs/checkpoints.md).
 */
#ifndef PSTAR_TESTS_CKPT_TEST_UTIL_H
#define PSTAR_TESTS_CKPT_TEST_UTIL_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "capi_test_util.h"

#if defined(__has_include)
#if __has_include(<xxhash.h>)
#define XXH_INLINE_ALL
#include <xxhash.h>
#define CK_HAVE_XXHASH 1
#endif
#endif
#ifndef CK_HAVE_XXHASH
#define CK_HAVE_XXHASH 0
#endif

/* `file` of the checkpoint dir/LATEST names. */
static inline void ck_latest_path(const char *dir, const char *file, char *out, size_t cap) {
  char p[512];
  snprintf(p, sizeof p, "%s/LATEST", dir);
  FILE *f = fopen(p, "r");
  cr_assert_not_null(f, "%s", p);
  char name[128] = {0};
  cr_assert_not_null(fgets(name, sizeof name, f));
  fclose(f);
  name[strcspn(name, "\n")] = 0;
  snprintf(out, cap, "%s/%s/%s", dir, name, file);
}

/* The whole file (NUL-terminated, one byte of room beyond *len). */
static inline unsigned char *ck_slurp(const char *path, size_t *len) {
  FILE *f = fopen(path, "rb");
  cr_assert_not_null(f, "%s", path);
  cr_assert_eq(fseek(f, 0, SEEK_END), 0);
  const long n = ftell(f);
  cr_assert_geq(n, 0);
  cr_assert_eq(fseek(f, 0, SEEK_SET), 0);
  unsigned char *data = (unsigned char *)malloc((size_t)n + 2);
  cr_assert_not_null(data);
  cr_assert_eq(fread(data, 1, (size_t)n, f), (size_t)n);
  fclose(f);
  data[n] = 0;
  *len = (size_t)n;
  return data;
}

static inline void ck_spit(const char *path, const unsigned char *data, size_t len) {
  FILE *f = fopen(path, "wb");
  cr_assert_not_null(f, "%s", path);
  cr_assert_eq(fwrite(data, 1, len, f), len);
  cr_assert_eq(fclose(f), 0);
}

/* Where the manifest's checksum line begins (the byte after the last
 * newline but one). */
static inline size_t ck_checksum_line(const unsigned char *text, size_t len) {
  cr_assert_geq(len, 2);
  size_t i = len - 1; /* the final newline */
  while (i > 0 && text[i - 1] != '\n') --i;
  cr_assert_eq(memcmp(text + i, "checksum ", 9), 0, "no checksum line at the end of the manifest");
  return i;
}

#if CK_HAVE_XXHASH
/* Rewrites the checksum line that begins at byte `at` of `text` for the
 * bytes before it (which may have been edited). */
static inline void ck_reseal_at(unsigned char *text, size_t at) {
  char hex[17];
  snprintf(hex, sizeof hex, "%016llx", (unsigned long long)XXH3_64bits(text, at));
  memcpy(text + at + 9, hex, 16);
}

/* The same, for the checksum line found at the end of `text`. */
static inline void ck_reseal(unsigned char *text, size_t len) {
  const size_t at = ck_checksum_line(text, len);
  cr_assert_eq(len - at, 9 + 16 + 1u);
  ck_reseal_at(text, at);
}
#endif

#endif /* PSTAR_TESTS_CKPT_TEST_UTIL_H */
