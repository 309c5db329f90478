// Finds libpstar: PSTAR_LIB_DIR (a folder holding libpstar.so) if set, else
// the `pkg-config` program (pstar.pc), else the linker's default paths.  Adds
// an rpath to that folder for this crate's own tests, and passes the folder
// on as DEP_PSTAR_LIB_DIR (the `links` metadata) to the crates that depend on
// this one, whose build scripts add the rpath for their tests and examples.
use std::env;
use std::path::{Path, PathBuf};
use std::process::Command;

// A relative PSTAR_LIB_DIR is meant from where the user ran cargo (the
// README's `PSTAR_LIB_DIR=build/default/lib cargo run --manifest-path ...`),
// but the build script runs in the package's folder and the linker in yet
// another: resolved against the shell's working directory (PWD, which
// cargo passes on unchanged), else against this package's folder.
fn absolute(dir: &str) -> String {
    let path = Path::new(dir);
    if path.is_absolute() {
        return dir.to_string();
    }
    let base = env::var("PWD").map(PathBuf::from).unwrap_or_else(|_| env::current_dir().unwrap_or_default());
    let joined = base.join(path);
    let resolved = joined.canonicalize().unwrap_or(joined);
    if !resolved.join("libpstar.so").exists() {
        println!("cargo:warning=PSTAR_LIB_DIR={} (resolved to {}) holds no libpstar.so", dir, resolved.display());
    }
    resolved.to_string_lossy().into_owned()
}

fn main() {
    println!("cargo:rerun-if-env-changed=PSTAR_LIB_DIR");
    println!("cargo:rerun-if-env-changed=PKG_CONFIG_PATH");
    let mut dirs: Vec<String> = Vec::new();
    if let Ok(dir) = env::var("PSTAR_LIB_DIR") {
        if !dir.is_empty() {
            dirs.push(absolute(&dir));
        }
    }
    if dirs.is_empty() {
        if let Ok(out) = Command::new("pkg-config").args(["--libs-only-L", "pstar"]).output() {
            if out.status.success() {
                for flag in String::from_utf8_lossy(&out.stdout).split_whitespace() {
                    if let Some(dir) = flag.strip_prefix("-L") {
                        dirs.push(dir.to_string());
                    }
                }
            }
        }
    }
    for dir in &dirs {
        println!("cargo:rustc-link-search=native={}", dir);
        println!("cargo:rustc-link-arg=-Wl,-rpath,{}", dir);
    }
    if let Some(dir) = dirs.first() {
        println!("cargo:lib_dir={}", dir);
    }
    println!("cargo:rustc-link-lib=dylib=pstar");
}
