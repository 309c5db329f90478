#!/usr/bin/env bash
# Compiles the SWIG-generated and the idiomatic Java sources into a jar.
# Usage: build_jar.sh JAVAC JAR GENERATED_DIR SOURCE_DIR CLASSES_DIR OUT_JAR
set -euo pipefail
javac=$1 jar=$2 gen=$3 src=$4 classes=$5 out=$6
rm -rf "$classes"
mkdir -p "$classes"
find "$gen" "$src" -name '*.java' > "$classes.sources"
"$javac" -Xlint:all -Werror -encoding UTF-8 --release 11 -d "$classes" @"$classes.sources"
"$jar" cf "$out" -C "$classes" .
