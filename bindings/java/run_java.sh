#!/usr/bin/env bash
# Compiles and runs the JUnit 5 tests or the example against the binding.
# Usage: run_java.sh test|example JAVAC JAVA PSTAR_JAR LIB_DIR WORK_DIR
# Tests run with Debian's junit-platform-console-standalone.jar (junit5);
# exit 77 (CTest's skip) where it is missing.
set -uo pipefail
mode=$1 javac=$2 java=$3 jar=$4 lib=$5 work=$6
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
console=/usr/share/java/junit-platform-console-standalone.jar
rm -rf "$work" && mkdir -p "$work"
if [ "$mode" = test ]; then
  if [ ! -f "$console" ]; then
    echo "skipped: $console not found (Debian: apt install junit5)"
    exit 77
  fi
  "$javac" -encoding UTF-8 --release 11 -d "$work" -cp "$jar:$console" $(find "$here/tests" -name '*.java') || exit 1
  exec "$java" -Djava.library.path="$lib" -jar "$console" --disable-banner --details=summary \
    -cp "$work:$jar" --select-package org.libpstar
else
  "$javac" -encoding UTF-8 --release 11 -d "$work" -cp "$jar" $(find "$root/examples/java" -name '*.java') || exit 1
  exec "$java" -Djava.library.path="$lib" -cp "$work:$jar" org.libpstar.examples.Mlp
fi
