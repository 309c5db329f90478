/* Compiled by the header_c99 test with -std=c99 -Wall -Wextra
 * -Wstrict-prototypes -pedantic -Werror: the public header must be clean C99,
 * and its initializer macros must initialise every field. */
#include "pstar/pstar.h"

int header_check(void);

int header_check(void) {
  pstar_engine_options o = PSTAR_ENGINE_OPTIONS_INIT;
  pstar_step_result r = PSTAR_STEP_RESULT_INIT;
  pstar_stats s = PSTAR_STATS_INIT;
  return (int)(o.size + r.size + s.size) + (PSTAR_VERSION_HEX > 0 ? 0 : 1);
}
