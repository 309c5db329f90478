package org.libpstar;

/**
 * Loads the JNI library (libpstar_java.so) once, from java.library.path;
 * it links libpstar.so.
 */
final class Native {
  private static boolean loaded;

  private Native() {}

  static synchronized void load() {
    if (loaded) return;
    System.loadLibrary("pstar_java");
    loaded = true;
  }
}
