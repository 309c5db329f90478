package org.libpstar;

/**
 * Receives libpstar's log records (see {@link Engine#setLogHandler}). Called
 * on whichever thread logs, the library's own threads included (attached to
 * the JVM for the call), possibly concurrently. It must not set another
 * handler from inside log().
 */
@FunctionalInterface
public interface LogHandler {
  /** `level` is one of PstarC.PSTAR_LOG_DEBUG ... PSTAR_LOG_ERROR. */
  void log(int level, String message);
}
